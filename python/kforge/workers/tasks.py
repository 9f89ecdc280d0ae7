"""The worker side: one region task, run wherever the executor put it.

Everything a task needs travels in its RegionTask (the spec, the options, the cache's location);
everything it produced comes back in its TaskOutcome, with the cache entries it wrote (so the
driver can write them back where the cache is not shared) and its region log. The package
itself is written by the driver only.

Two workers never write the same cache entry: a task holds the entry's claim
(KernelCache.claim, a lock the kernel drops when its process dies) while it synthesizes, and
a second task for the same key waits, then finds the first one's kernel in the cache.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from kforge.cache import KernelCache
from kforge.workers import Event, RegionTask, TaskOutcome, TaskRecord


class RecordingCache(KernelCache):
    """A KernelCache that remembers what it wrote (it goes back with the outcome)."""

    def __init__(self, root, mode):
        super().__init__(root, mode)
        self.writes: dict[str, tuple] = {}       # key digest -> (CacheKey, CacheEntry), last

    def put(self, key, entry):
        path = super().put(key, entry)
        if path is not None:
            self.writes[key.digest] = (key, entry)
        return path


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def run_task(task: RegionTask, emit: Callable[[Event], None], *, node: str = "",
             worker: str = "") -> TaskOutcome:
    """Run one task here. Raises what the loop raises for the user (CacheMiss, ProviderError
    of the builtin); a bad kernel is a result, never an exception."""
    if task.options.target == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"     # the interpreter, for anything run in-process
    t0 = time.monotonic()
    record = TaskRecord(task.hash, socket.gethostname(), os.getpid(), node, worker,
                        os.environ.get("CUDA_VISIBLE_DEVICES", ""), _now())
    emit(Event("started", task.hash, record))
    cache = RecordingCache(task.cache_root, task.cache_mode) if task.cache_root else None
    from kforge.synth import cache_key
    with tempfile.TemporaryDirectory(prefix="kforge-task-") as tmp:
        log_dir = Path(task.log_dir) if task.log_dir else Path(tmp)
        claim = cache.claim(cache_key(task.spec, task.options)) if cache is not None \
            else contextlib.nullcontext()
        with claim:
            if task.kind == "synth":
                outcome = _synth(task, cache, log_dir, emit)
            elif task.kind == "tune":
                outcome = _tune(task, cache, log_dir, emit)
            else:
                raise ValueError(f"unknown task kind {task.kind!r}")
        log_path = log_dir / task.hash / "log.jsonl"
        log_text = "" if task.log_dir or not log_path.is_file() else log_path.read_text()
    return replace(outcome, record=replace(record, elapsed_s=round(time.monotonic() - t0, 3)),
                   cache_writes=tuple(cache.writes.values()) if cache is not None else (),
                   log_text=log_text)


def _synth(task: RegionTask, cache, log_dir: Path, emit) -> TaskOutcome:
    from kforge.kernel_fallbacks import compare_with_pytorch
    from kforge.package import entry_fields
    from kforge.synth import synthesize_region
    h = task.hash
    result = synthesize_region(
        task.spec, task.options, provider=task.provider, cache=cache, log_dir=log_dir,
        region_mlir=task.region_mlir, progress=lambda msg: emit(Event("note", h, msg)),
        on_verified=lambda partial: emit(Event("verified", h, partial)))
    if result.candidate is None or result.status not in ("verified", "candidate"):
        return TaskOutcome(h, result=result)
    entry = compare_with_pytorch(entry_fields(result, task.options), task.spec,
                                 task.options.target)
    return TaskOutcome(h, result=result, entry=entry, kernel_source=result.candidate.source)


def _tune(task: RegionTask, cache, log_dir: Path, emit) -> TaskOutcome:
    from kforge.tune import tune_entry
    from kforge.verify import OracleError
    job = task.tune
    try:
        entry, source = tune_entry(
            task.spec, job.entry, job.source, target=task.options.target,
            precision=task.options.precision, rounds=job.rounds, provider=job.provider,
            cache=cache, repair=job.repair, dynamic_sizes=job.dynamic_sizes, log_dir=log_dir,
            say=lambda msg: emit(Event("note", task.hash, msg)),
            finer_than=task.options.finer_than)
    except OracleError as exc:
        # the region's reference failed (or the device ran out of memory outside the plain
        # verification): not the kernel's fault; the region keeps its entry, the others go on
        return TaskOutcome(task.hash, error=f"{type(exc).__name__}: {exc}")
    return TaskOutcome(task.hash, entry=entry, kernel_source=source)
