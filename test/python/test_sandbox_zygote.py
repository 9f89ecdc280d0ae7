"""On the cpu target the verifier's sandboxed workers are forked by a zygote that has imported
torch and Triton once (kforge.verify.sandbox._Zygote): a worker is the same sandbox (its own
session, its exit status as subprocess reports it, killed with its group) without a new
Python's 1.5-2 s of imports, and it ends with the verifier."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from pathlib import Path

from kforge.verify import sandbox

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_cpu_worker_is_forked_in_its_own_session_and_killed_with_its_status(tmp_path):
    (tmp_path / "a").mkdir()
    a = sandbox.start_worker(tmp_path / "a", "cpu", None)
    assert isinstance(a.proc, sandbox._Forked), type(a.proc)
    zygote = sandbox._Zygote._proc
    assert zygote is not None and zygote.poll() is None
    assert _ppid(a.proc.pid) == zygote.pid
    deadline = time.time() + 10
    while os.getpgid(a.proc.pid) != a.proc.pid and time.time() < deadline:
        time.sleep(0.01)
    assert os.getpgid(a.proc.pid) == a.proc.pid        # setsid: its own session and group
    # it waits for its job; the limit passes and it is killed, as a subprocess would be
    res = a.wait(0.5)
    assert res.timed_out and not _alive(a.proc.pid)
    # a worker that crashes reports the signal (the job: a candidate that kills itself)
    (tmp_path / "b").mkdir()
    b = sandbox.start_worker(tmp_path / "b", "cpu", None)
    os.kill(b.proc.pid, signal.SIGSEGV)
    res = b.wait(20)
    assert res.returncode == -signal.SIGSEGV and res.crashed, res
    assert "SIGSEGV" in res.describe_exit()


def test_without_the_zygote_a_worker_is_a_new_process(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_VERIFY_FORK", "0")
    w = sandbox.start_worker(tmp_path, "cpu", None)
    assert isinstance(w.proc, subprocess.Popen)
    w.kill()


def test_the_zygote_and_its_workers_end_with_the_verifier(tmp_path):
    code = f"""
import json, sys, time
sys.path.insert(0, {str(PYTHON_DIR)!r})
from pathlib import Path
from kforge.verify import sandbox
w = sandbox.start_worker(Path({str(tmp_path)!r}), "cpu", None)
print(json.dumps({{"worker": w.proc.pid, "zygote": sandbox._Zygote._proc.pid}}), flush=True)
time.sleep(120)
"""
    verifier = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(verifier.stdout.readline())
        assert _alive(pids["worker"]) and _alive(pids["zygote"])
    finally:
        verifier.kill()             # SIGKILL: no cleanup of its own runs
        verifier.wait()
    deadline = time.time() + 15
    while (_alive(pids["worker"]) or _alive(pids["zygote"])) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pids["zygote"]) and not _alive(pids["worker"]), pids


def test_a_zygote_that_does_not_start_leaves_a_new_process_per_worker(tmp_path, monkeypatch):
    """A zygote that fails (here: a script that exits at once) is given up for the process and
    every worker is a new Python again: slower, never wrong."""
    bad = tmp_path / "bad_zygote.py"
    bad.write_text("import sys\nsys.exit(1)\n")
    monkeypatch.setattr(sandbox._Zygote, "script", bad)
    monkeypatch.setattr(sandbox, "WORKER", bad)
    monkeypatch.setattr(sandbox._Zygote, "_proc", None)
    monkeypatch.setattr(sandbox._Zygote, "_broken", False)
    assert sandbox._Zygote.fork(tmp_path, None) is None
    assert sandbox._Zygote._broken
    w = sandbox.start_worker(tmp_path, "cpu", None)
    assert isinstance(w.proc, subprocess.Popen)
    assert w.wait(30).returncode == 1
