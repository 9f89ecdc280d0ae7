"""Runs untrusted candidate code in a separate process with a time and a memory limit.

A hanging candidate is killed (its whole process group) when the time limit passes; a crashing
one (abort, segfault, out of memory) ends its own process only. Either way the caller gets a
SandboxResult that says what happened, and the compile goes on.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

WORKER = Path(__file__).with_name("_worker.py")
# how often the parent's `while_waiting` runs while a worker runs (a worker waits for the
# parent's comparisons before it is timed)
POLL_S = 0.05


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None
    timed_out: bool
    elapsed_s: float
    stderr_tail: str

    @property
    def crashed(self) -> bool:
        return not self.timed_out and self.returncode not in (0, None)

    def describe_exit(self) -> str:
        if self.timed_out:
            return f"did not finish within the time limit ({self.elapsed_s:.0f} s); killed"
        rc = self.returncode
        if rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"the process was killed by {name}"
        return f"the process exited with status {rc}"


def _limits(memory_mb: int | None):
    def apply():
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb:
            limit = int(memory_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def worker_env(target_name: str) -> dict:
    env = dict(os.environ)
    # the worker ends when this process is gone before it hands over a job (_worker.py)
    env["KFORGE_VERIFY_PARENT"] = str(os.getpid())
    if target_name == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
    else:
        env.pop("TRITON_INTERPRET", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        try:        # a forked worker not yet in its own session (_Zygote)
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


class _Forked:
    """A worker forked by the zygote, with the part of subprocess.Popen's interface that
    WorkerProcess uses: its exit status is the zygote's `exit_status` file."""

    def __init__(self, pid: int, job_dir: Path):
        self.pid, self.returncode = pid, None
        self._status = Path(job_dir) / "exit_status"

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = int(self._status.read_text())
            except (OSError, ValueError):
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:      # gone unreaped by the zygote (it ended)
                    self.returncode = -signal.SIGKILL
                except PermissionError:
                    pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(0.002)
        return self.returncode


class _Zygote:
    """`_worker.py --zygote` (the cpu target): forks workers with torch and Triton imported,
    so that a verification does not wait 1.5-2 s for a new Python's imports. One per process,
    started at the first cpu worker; KFORGE_VERIFY_FORK=0 starts every worker as a new
    process instead."""

    _lock = threading.Lock()
    _proc: subprocess.Popen | None = None
    _broken = False

    script = WORKER

    @classmethod
    def fork(cls, job_dir: Path, memory_mb: int | None) -> _Forked | None:
        if cls._broken or os.environ.get("KFORGE_VERIFY_FORK", "1") == "0" or \
                WORKER != cls.script:       # another worker script (a test's): its own process
            return None
        with cls._lock:
            try:
                if cls._proc is None or cls._proc.poll() is not None:
                    cls._proc = subprocess.Popen(
                        [sys.executable, str(cls.script), "--zygote"], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        env=worker_env("cpu"), cwd=str(cls.script.parent))
                    if json.loads(cls._proc.stdout.readline() or b"{}").get("ready") is not True:
                        raise OSError("the zygote did not start")
                req = {"job_dir": str(job_dir), "memory_mb": memory_mb, "env": worker_env("cpu")}
                cls._proc.stdin.write(json.dumps(req).encode() + b"\n")
                cls._proc.stdin.flush()
                pid = int(json.loads(cls._proc.stdout.readline())["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                # a new process per worker from here on: slower, never wrong
                cls._broken = True
                if cls._proc is not None and cls._proc.poll() is None:
                    cls._proc.kill()
                return None
        return _Forked(pid, job_dir)


class WorkerProcess:
    """A sandboxed worker started ahead of its job (start_worker): it imports torch and Triton
    and opens the device while the parent computes its references, then waits for job.json.
    On the cpu target the zygote forks it with its imports done (_Zygote)."""

    def __init__(self, job_dir: Path, target_name: str, memory_mb: int | None,
                 device: str = ""):
        self.job_dir = Path(job_dir)
        self.stderr_path = self.job_dir / "stderr.txt"
        self.started_at = time.time()
        if target_name == "cpu" and device in ("", "cpu"):
            self.stderr_path.touch()        # the worker's own output goes on after this
            self.proc = _Zygote.fork(self.job_dir, memory_mb)
            if self.proc is not None:
                return
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(WORKER), str(job_dir)] + ([device] if device else []),
                stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=worker_env(target_name), cwd=str(job_dir),
                preexec_fn=_limits(memory_mb if target_name == "cpu" else None))

    def wait(self, timeout_s: float,
             while_waiting: Callable[[], None] | None = None) -> SandboxResult:
        """Wait for the worker to finish its job, at most `timeout_s` from now (the job was
        handed to it just before: its time before then, starting up, is not the candidate's).
        `while_waiting` is called every POLL_S seconds meanwhile (the verifier compares outputs
        there; the time it takes extends the limit); if it raises, the worker is killed and the
        error propagates."""
        proc = self.proc
        start = time.monotonic()
        timed_out = False
        deadline = start + timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    proc.wait(timeout=max(0.0, min(left, POLL_S) if while_waiting else left))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        timed_out = True
                        _kill(proc)
                        break
                    if while_waiting is not None:
                        # the parent's time (comparing outputs while the worker may wait for
                        # it) is not the candidate's: the limit is the worker's own
                        t0 = time.monotonic()
                        while_waiting()
                        deadline += time.monotonic() - t0
        except BaseException:
            _kill(proc)
            raise
        elapsed = time.monotonic() - start
        try:
            tail = self.stderr_path.read_bytes()[-4000:].decode("utf-8", "replace")
        except OSError:
            tail = ""
        return SandboxResult(None if timed_out else proc.returncode, timed_out, elapsed, tail)

    def kill(self) -> None:
        """End the worker (and anything it started) if it still runs."""
        if self.proc.poll() is None:
            _kill(self.proc)


def start_worker(job_dir: Path, target_name: str, memory_mb: int | None,
                 device: str = "") -> WorkerProcess:
    """Start kforge/verify/_worker.py on job_dir before its job.json exists: it gets ready
    (imports; on `device`, its context and Triton's driver) and waits for it. `memory_mb` limits
    the address space on the cpu target only (GPU drivers reserve far more address space than
    they use)."""
    return WorkerProcess(job_dir, target_name, memory_mb, device)


def run_worker(job_dir: Path, target_name: str, timeout_s: float,
               memory_mb: int | None,
               while_waiting: Callable[[], None] | None = None) -> SandboxResult:
    """Runs kforge/verify/_worker.py on job_dir (its job.json written) within `timeout_s`:
    start_worker and WorkerProcess.wait."""
    return start_worker(job_dir, target_name, memory_mb).wait(timeout_s, while_waiting)
