"""Executors on this machine: this process (the default), or a pool of N processes."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Iterator, Sequence

from kforge.workers import Event, Executor, RegionTask, TaskOutcome


class InlineExecutor(Executor):
    """One region after another in this process; events are delivered as they happen, logs are
    written straight into the package, a provider instance is used as it is."""
    name = "local"

    def run(self, tasks: Sequence[RegionTask],
            on_event: Callable[[Event], None]) -> Iterator[TaskOutcome]:
        from kforge.workers.tasks import run_task
        for task in tasks:
            yield run_task(task, on_event)

    def remote(self) -> bool:
        return False

    def describe(self) -> dict:
        return {"executor": "local", "workers": 1}


# -- the process pool ---------------------------------------------------------------------------
_events = None          # in a pool process: the queue its events go to


def _init_pool_process(events, python_path: str, interpret: bool) -> None:
    global _events
    _events = events
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    if python_path not in sys.path:
        sys.path.insert(0, python_path)


def _run_in_pool(task: RegionTask) -> TaskOutcome:
    from kforge.workers.tasks import run_task
    return run_task(task, _events.put)


class PoolExecutor(Executor):
    """N processes on this machine (spawned, so that each imports torch and triton afresh). A
    process that dies breaks the pool: the tasks that had not finished are given to a new pool
    (up to `max_retries` times); what finished, and every kernel verified into the cache, is
    kept."""
    name = "local-pool"

    def __init__(self, processes: int, *, max_retries: int = 3):
        self.processes = processes
        self.max_retries = max_retries
        self.failed_attempts = 0

    def run(self, tasks: Sequence[RegionTask],
            on_event: Callable[[Event], None]) -> Iterator[TaskOutcome]:
        ctx = multiprocessing.get_context("spawn")
        # a manager's queue: put returns once the event is delivered, so a task's events
        # arrive before its outcome
        with ctx.Manager() as manager:
            events = manager.Queue()
            yield from self._run(ctx, events, list(tasks), on_event)

    def _run(self, ctx, events, todo: list, on_event) -> Iterator[TaskOutcome]:
        python_path = str(Path(__file__).resolve().parents[2])
        interpret = any(t.options.target == "cpu" for t in todo)
        attempts = 0
        while todo:
            pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=min(self.processes, len(todo)), mp_context=ctx,
                initializer=_init_pool_process, initargs=(events, python_path, interpret))
            futures = {pool.submit(_run_in_pool, t): t for t in todo}
            broken = False
            try:
                pending = set(futures)
                while pending:
                    done, pending = concurrent.futures.wait(pending, timeout=0.2)
                    _drain(events, on_event)
                    for fut in done:
                        try:
                            outcome = fut.result()
                        except BrokenProcessPool:
                            broken = True
                            continue
                        todo.remove(futures[fut])
                        yield outcome
            finally:
                pool.shutdown(wait=not broken, cancel_futures=True)
            _drain(events, on_event)
            if todo:
                attempts += 1
                self.failed_attempts += 1
                if attempts > self.max_retries:
                    for t in todo:
                        yield TaskOutcome(t.hash, error=f"a worker process died {attempts} "
                                                        "times while this region ran")
                    return

    def describe(self) -> dict:
        return {"executor": "local-pool", "workers": self.processes,
                "broken_pools": self.failed_attempts}


def _drain(events, on_event) -> None:
    import queue
    while True:
        try:
            ev = events.get_nowait()
        except queue.Empty:
            return
        on_event(ev)


__all__ = ["InlineExecutor", "PoolExecutor"]
