"""Where region work runs: one small executor interface, three executors.

A region's synthesis (or its tuning) is one task: it needs the region's spec, the options and
where the kernel cache is, and it returns the region's result, the cache entries it wrote, its
log and a record of where it ran. Regions are independent, so tasks run in any order on any
worker; `kforge.package` and `kforge.tune` hand a list of tasks to an executor and apply the
outcomes to the package as they arrive.

    local     (the default) this process, one region after another: what KForge always did
    local:N   a pool of N processes on this machine
    ray       Ray (an existing distributed engine): `ray` starts a local cluster (`ray:N`: of N
              worker CPUs), `ray://HOST:PORT` connects through Ray Client, `ray:auto` /
              `ray:HOST:PORT` joins a cluster this machine is a node of (see docs/scale-out.md)

Events flow back while tasks run (started, a progress note, a verified kernel), so a package
records a region's kernel the moment it verifies, wherever it verified. The executor used by a
command is passed explicitly or set for a block with `use_workers(...)` (kforge.build's
compile_model does not take one).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from kforge.errors import UserError

WORKERS_HELP = ("where regions are synthesized: local (this process, the default), local:N (N "
                "processes here), ray (a local Ray cluster; ray:N with N worker CPUs), "
                "ray://HOST:PORT (Ray Client), ray:auto or ray:HOST:PORT (join a running cluster)")


@dataclass(frozen=True)
class TuneJob:
    """What `kforge tune` does to one manifest entry (kforge.tune.tune_entry's arguments)."""
    entry: dict
    source: str
    rounds: int = 0
    provider: str | None = None
    repair: int = 2
    dynamic_sizes: tuple = ()


@dataclass(frozen=True)
class RegionTask:
    """One region's work. `kind`: "synth" (the synthesis loop) or "tune" (`kforge tune`)."""
    kind: str
    hash: str
    spec: object                              # kforge.spec.KernelSpec
    options: object                           # kforge.synth.SynthOptions
    region_mlir: str = ""
    cache_root: str | None = None             # None: no kernel cache
    cache_mode: str = "use"
    log_dir: str | None = None                # a directory the worker sees; None: shipped back
    tune: TuneJob | None = None
    provider: object = None                   # a provider instance (must pickle off-process)


@dataclass(frozen=True)
class TaskRecord:
    """Where and when one attempt of a task ran."""
    hash: str
    host: str
    pid: int
    node: str = ""                            # Ray node id; "" elsewhere
    worker: str = ""                          # Ray worker id; "" elsewhere
    gpus: str = ""                            # CUDA_VISIBLE_DEVICES the attempt held
    started_at: str = ""
    elapsed_s: float | None = None            # None: the attempt did not finish

    def to_json(self) -> dict:
        return {"hash": self.hash, "host": self.host, "pid": self.pid, "node": self.node,
                "worker": self.worker, "gpus": self.gpus, "started_at": self.started_at,
                "elapsed_s": self.elapsed_s}


@dataclass(frozen=True)
class TaskOutcome:
    """What a finished task sends back. `error`: it failed (on every attempt); the region then
    runs its reference and the compile goes on."""
    hash: str
    record: TaskRecord | None = None
    result: object = None                     # synth: kforge.synth.RegionResult
    entry: dict | None = None                 # the manifest entry to record (None: drop it)
    kernel_source: str | None = None          # entry["source"]'s text, to write into the package
    cache_writes: tuple = ()                  # ((CacheKey, CacheEntry), ...) the worker wrote
    log_text: str = ""                        # the region's log.jsonl lines (when shipped back)
    error: str = ""


@dataclass(frozen=True)
class Event:
    """A worker's message while its task runs: started (data: TaskRecord), note (data: text),
    verified (data: RegionResult, before its optimization passes). An executor may deliver a
    task's events after its outcome (Ray does not wait for them): a receiver ignores a
    verified event of a finished region and a started event of a recorded attempt."""
    kind: str
    hash: str
    data: object = None


class Executor:
    """Runs region tasks; `run` yields their outcomes as they finish and calls `on_event` in
    the caller's thread for the workers' events."""
    name = "executor"

    def run(self, tasks: Sequence[RegionTask],
            on_event: Callable[[Event], None]) -> Iterator[TaskOutcome]:
        raise NotImplementedError

    def prepare(self) -> None:
        """Start or reach the workers now (a bad address fails before the import stage)."""

    def has_device(self, target: str) -> bool:
        """Do the workers have the target's device (so tasks verify and time there)?"""
        from kforge.verify import target_available
        return target_available(target)

    def remote(self) -> bool:
        """Do tasks run in other processes (provider instances and logs must travel)?"""
        return True

    def describe(self) -> dict:
        return {"executor": self.name}

    def close(self) -> None:
        pass


_current: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "kforge_workers", default=None)


def current_executor() -> Executor:
    """The executor set by `use_workers`, else the default (this process)."""
    ex = _current.get()
    if ex is None:
        from kforge.workers.local import InlineExecutor
        return InlineExecutor()
    return ex


@contextlib.contextmanager
def use_workers(workers: "str | Executor | None", **kwargs):
    """Run the package stages inside the block on `workers` (a --workers text or an Executor);
    an executor made here is closed (a Ray cluster it started is shut down) on the way out."""
    made = not isinstance(workers, Executor)
    ex = parse_workers(workers, **kwargs) if made else workers
    token = _current.set(ex)
    try:
        ex.prepare()
        yield ex
    finally:
        _current.reset(token)
        if made:
            ex.close()


def parse_workers(text: str | None, *, gpu_share: int = 1) -> Executor:
    """The executor a --workers value names (see the module's docstring)."""
    from kforge.workers.local import InlineExecutor, PoolExecutor
    if gpu_share < 1:
        raise UserError(f"--gpu-share {gpu_share}: give a whole number of tasks per GPU, 1 or "
                        "more")
    text = (text or "local").strip()
    m = re.fullmatch(r"(?:local:)?(\d+)", text)
    if text == "local" or m:
        n = int(m.group(1)) if m else 1
        if n < 1:
            raise UserError(f"--workers {text}: the number of local workers must be 1 or more")
        return InlineExecutor() if n == 1 else PoolExecutor(n)
    if text == "ray" or text.startswith("ray:"):
        from kforge.workers.ray_cluster import RayExecutor
        rest = text[4:]
        if rest.isdigit():
            if int(rest) < 1:
                raise UserError(f"--workers {text}: a local Ray cluster needs 1 or more CPUs")
            return RayExecutor(None, num_cpus=int(rest), gpu_share=gpu_share)
        if rest.startswith("//"):
            if not rest[2:]:
                raise UserError(f"--workers {text}: give the Ray Client address, e.g. "
                                "ray://head-node:10001")
            return RayExecutor(text, gpu_share=gpu_share)
        return RayExecutor(rest or None, gpu_share=gpu_share)
    raise UserError(f"--workers {text!r}: expected {WORKERS_HELP}")


def cache_location(cache) -> tuple[str | None, str]:
    """(root, mode) of a kforge.cache.KernelCache, for a task (None: no cache)."""
    if cache is None:
        return None, "off"
    return os.fspath(cache.root), cache.mode


def absorb(outcome: TaskOutcome, cache, regions_dir, attempts: list[dict]) -> None:
    """The driver's share of a finished task, besides the manifest: its log into the package,
    the cache entries it wrote into this cache where they are not there already (a worker whose
    cache directory is not this one's), and its elapsed time into its attempt's record."""
    from pathlib import Path
    if outcome.log_text:
        log = Path(regions_dir) / outcome.hash / "log.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(outcome.log_text)
    if cache is not None:
        for key, entry in outcome.cache_writes:
            cache.put_missing(key, entry)
    rec = outcome.record
    if rec is not None:
        a = find_attempt(attempts, rec)
        if a is None:                 # its started event is still on the way
            attempts.append(rec.to_json())
        else:
            a["elapsed_s"] = rec.elapsed_s


def find_attempt(attempts: list[dict], rec: TaskRecord) -> dict | None:
    for a in attempts:
        if (a["hash"], a["host"], a["pid"], a["started_at"]) == \
                (rec.hash, rec.host, rec.pid, rec.started_at):
            return a
    return None


__all__ = ["Event", "Executor", "RegionTask", "TaskOutcome", "TaskRecord", "TuneJob",
           "WORKERS_HELP", "absorb", "cache_location", "current_executor", "find_attempt",
           "parse_workers", "use_workers"]
