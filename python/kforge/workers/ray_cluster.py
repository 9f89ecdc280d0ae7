"""Region tasks on Ray (https://docs.ray.io): a local cluster, or one Ray's launchers made.

Each region task is a Ray task that asks for what its work needs:

    cpu target (the interpreter), or a GPU target on a cluster without GPUs (cross-compile:
    generate and statically check)            num_cpus=1
    cuda / xpu on a cluster with GPUs           num_gpus=1, num_cpus=1: verification and timing
                                                on a GPU the task holds alone
    the same with --gpu-share K                 num_gpus=1/K, and the task is admitted by the
                                                GPU's free memory (kforge.workers.admission);
                                                its timed runs still have the GPU alone

With `--candidates N` a task asks for N CPUs (at most a node's) and verifies each round's N
candidates side by side (SynthOptions.parallel_verify), their timed runs one at a time.

A task whose worker dies (killed, out of memory, node lost) is retried on another worker by
Ray (`max_retries`); nothing verified is lost, because a task puts its kernel into the shared
kernel cache the moment it verifies and reports it to the driver, which writes it into the
package. Exceptions raised by KForge itself are not retried: they are answers (a CacheMiss
under --cache-only). What travels: the task (spec, options, the region's MLIR text for
prompts, the cache's path) to the worker, its TaskOutcome back; with a ray:// address the
driver's kforge package is shipped as a Ray `py_modules` runtime environment, so workers run
the driver's code.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from kforge.errors import UserError
from kforge.workers import Event, Executor, RegionTask, TaskOutcome


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--workers ray needs Ray: `pip install ray` (it is in kforge's dev "
                        "extras: `pip install -e .[dev]`)") from None
    return ray


class _Events:
    """A Ray actor the tasks send their events to; the driver drains it while it waits."""

    def __init__(self):
        self.items = []

    def put(self, event) -> None:
        self.items.append(event)

    def drain(self) -> list:
        out, self.items = self.items, []
        return out


def _ray_task(task: RegionTask, events, admit_bytes: int, device_lock: bool) -> TaskOutcome:
    """The body of every Ray task (runs on a worker). `device_lock`: its GPU is its own, but
    it verifies several candidates at once: their timed runs take the device's lock."""
    import ray

    from kforge.workers.admission import admitted, device_lock_path, device_tag
    from kforge.workers.tasks import run_task
    ctx = ray.get_runtime_context()

    def emit(event: Event) -> None:
        # not waited for: a task blocked in ray.get gives its CPU back and Ray would start
        # another task beside it. The driver copes with events that arrive after the outcome.
        events.put.remote(event)

    def run() -> TaskOutcome:
        return run_task(task, emit, node=ctx.get_node_id(), worker=ctx.get_worker_id())

    if not admit_bytes:
        if not device_lock:
            return run()
        os.environ["KFORGE_GPU_LOCK"] = str(device_lock_path(device_tag(task.options.target)))
        try:
            return run()
        finally:
            os.environ.pop("KFORGE_GPU_LOCK", None)
    with admitted(admit_bytes, device_tag(task.options.target),
                  on_wait=lambda msg: emit(Event("note", task.hash, msg))):
        return run()


class RayExecutor(Executor):
    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None,
                 num_gpus: int | None = None, gpu_share: int = 1, max_retries: int = 3,
                 ship_code: bool | None = None):
        """`num_cpus`, `num_gpus`: the size of a local cluster (default: what Ray detects)."""
        self.address = address
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.gpu_share = gpu_share
        self.max_retries = max_retries
        # ray:// (Ray Client): the cluster's Python is not ours; elsewhere it is this machine's
        self.ship_code = address is not None and address.startswith("ray://") \
            if ship_code is None else ship_code
        self._ray = None
        self._started = False
        self.lost: list[str] = []             # tasks given up after max_retries worker deaths

    # -- the cluster ------------------------------------------------------------------------
    def _connect(self):
        if self._ray is not None:
            return self._ray
        ray = _import_ray()
        if not ray.is_initialized():
            kforge_dir = Path(__file__).resolve().parents[1]
            if self.ship_code:
                runtime_env = {"py_modules": [str(kforge_dir)], "excludes": ["__pycache__"]}
            else:
                path = os.pathsep.join(filter(None, [str(kforge_dir.parent),
                                                     os.environ.get("PYTHONPATH")]))
                runtime_env = {"env_vars": {"PYTHONPATH": path}}
            kwargs = dict(log_to_driver=False, runtime_env=runtime_env)
            if self.address is None:      # our own cluster, never one `ray start` left here
                kwargs.update(address="local", num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                              include_dashboard=False)
            else:                         # (Ray Client refuses include_dashboard)
                kwargs["address"] = self.address
            try:
                ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                hint = "" if self.address is None else (
                    "; start one with `ray start --head` (or use --workers ray for a cluster of "
                    "this command's own); Ray 2.59+ clusters also need RAY_AUTH_MODE=token and "
                    "their token here (docs/scale-out.md)")
                raise UserError(f"--workers {self.describe_address()}: cannot start or reach "
                                f"the Ray cluster: {str(exc).rstrip('.')}{hint}") from None
            self._started = True
        self._ray = ray
        return ray

    def prepare(self) -> None:
        self._connect()

    def describe_address(self) -> str:
        if self.address is None:
            return "ray" if self.num_cpus is None else f"ray:{self.num_cpus}"
        return self.address if self.address.startswith("ray://") else f"ray:{self.address}"

    def _gpus(self) -> float:
        return float(self._connect().cluster_resources().get("GPU", 0))

    def has_device(self, target: str) -> bool:
        return target == "cpu" or self._gpus() > 0

    def parallel(self, task: RegionTask) -> int:
        """Candidates the task verifies at once: --candidates, at most a node's CPUs."""
        want = max(1, int(task.options.num_candidates or 1))
        if want == 1:
            return 1
        cpus = [n.get("Resources", {}).get("CPU", 0) for n in self._connect().nodes()
                if n.get("Alive")]
        return max(1, min(want, int(max(cpus, default=1))))

    def resources(self, task: RegionTask) -> tuple[dict, int]:
        """Ray options for the task, and the bytes it must be admitted with (0: none)."""
        k = self.parallel(task)
        if task.options.target == "cpu" or self._gpus() == 0:
            return {"num_cpus": k}, 0
        if self.gpu_share == 1:
            return {"num_cpus": k, "num_gpus": 1}, 0
        from kforge.workers.admission import estimate_bytes
        return {"num_cpus": k, "num_gpus": 1.0 / self.gpu_share}, k * estimate_bytes(task.spec)

    # -- running ----------------------------------------------------------------------------
    def run(self, tasks: Sequence[RegionTask],
            on_event: Callable[[Event], None]) -> Iterator[TaskOutcome]:
        if not tasks:
            return
        ray = self._connect()
        events = ray.remote(num_cpus=0)(_Events).remote()
        body = ray.remote(_ray_task)
        refs = {}
        for task in tasks:
            opts, admit = self.resources(task)
            k = int(opts["num_cpus"])
            if k > 1:
                task = replace(task, options=replace(task.options, parallel_verify=k))
            lock = k > 1 and "num_gpus" in opts
            ref = body.options(**opts, max_retries=self.max_retries, retry_exceptions=False,
                               name=f"kforge-{task.kind}-{task.hash}").remote(
                task, events, admit, lock)
            refs[ref] = task
        try:
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0.25)
                for event in ray.get(events.drain.remote()):
                    on_event(event)
                for ref in ready:
                    task = refs.pop(ref)
                    yield self._outcome(ray, ref, task)
            for event in ray.get(events.drain.remote()):
                on_event(event)
        finally:
            for ref in refs:
                ray.cancel(ref, force=True)
            ray.kill(events)

    def _outcome(self, ray, ref, task: RegionTask) -> TaskOutcome:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:          # KForge raised: not retried
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise
        except ray.exceptions.RayError as exc:              # the worker died every time
            self.lost.append(task.hash)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return TaskOutcome(task.hash, error=f"its Ray worker died on {self.max_retries + 1} "
                                                f"attempt(s) ({first[:300]})")

    def describe(self) -> dict:
        out = {"executor": "ray", "address": self.describe_address(),
               "gpu_share": self.gpu_share, "max_retries": self.max_retries, "lost": self.lost}
        if self._ray is not None and self._ray.is_initialized():
            res = self._ray.cluster_resources()
            out["cluster"] = {"nodes": len([n for n in self._ray.nodes() if n.get("Alive")]),
                              "CPU": res.get("CPU", 0), "GPU": res.get("GPU", 0)}
        return out

    def close(self) -> None:
        if self._started and self._ray is not None:
            self._ray.shutdown()
        self._ray, self._started = None, False


__all__ = ["RayExecutor"]
