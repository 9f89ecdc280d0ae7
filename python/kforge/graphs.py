"""CUDA graphs for a package's host plan: the whole plan captured once per input signature and
replayed, so a run costs the GPU work and not the Python that issues it.

A host plan issues hundreds of small launches (kernels, fallback ops, the aten ops of regions
without a kernel, host steps); eager PyTorch issues as many, and on models whose layers are
small the GPU waits for the CPU. Replaying a captured graph removes that: the plan is run twice
to warm up (Triton and torch.compile compile then), captured on static input buffers, and each
call copies its inputs in, replays, and returns copies of the outputs (the next replay writes
the same buffers).

A plan that cannot be captured (a fallback op that synchronizes, like a boolean-mask index or
`nonzero`) runs as before; the reason is kept in `PlanGraphs.skipped` and said once as a warning.
`KFORGE_CUDA_GRAPHS=0` turns graphs off.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Sequence

import torch

# Captures kept per model (one per distinct input signature), oldest dropped first.
MAX_GRAPHS = 8


def graphs_wanted(device: torch.device) -> bool:
    return device.type == "cuda" and os.environ.get("KFORGE_CUDA_GRAPHS", "1") != "0"


class _Captured:
    def __init__(self, graph, inputs, outputs):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


class PlanGraphs:
    """`graphs(args)` == `run_plan(args)`, replayed from a CUDA graph per input signature."""

    def __init__(self, run_plan: Callable, device):
        self.run_plan = run_plan
        self.device = device
        self.captured: dict[tuple, _Captured] = {}
        self.skipped: dict[tuple, str] = {}
        self.pool = None

    def reset(self) -> None:
        self.captured.clear()
        self.skipped.clear()

    @staticmethod
    def signature(args: Sequence[torch.Tensor]) -> tuple:
        return tuple((tuple(a.shape), a.dtype, a.stride()) for a in args)

    def __call__(self, args: Sequence[torch.Tensor]) -> tuple:
        key = self.signature(args)
        if key in self.skipped:
            return self.run_plan(args)
        entry = self.captured.get(key)
        if entry is None:
            entry = self._capture(key, args)
            if entry is None:
                return self.run_plan(args)
        for static, a in zip(entry.inputs, args):
            static.copy_(a)
        entry.graph.replay()
        return tuple(t.clone() for t in entry.outputs)

    def _capture(self, key, args) -> _Captured | None:
        static = [a.clone() for a in args]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        current: list = []            # the step being captured, to name it if capture fails
        try:
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(2):           # compiles every kernel outside the capture
                    self.run_plan(static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            def track(step, run):
                current[:] = [step]
                return run()

            with torch.cuda.graph(graph, pool=self.pool), torch.no_grad():
                outputs = self.run_plan(static, track)
        except Exception as exc:  # noqa: BLE001 - any step that cannot be captured
            torch.cuda.synchronize(self.device)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if current:
                why = f"step {_describe(current[0])}: {why}"
            self.skipped[key] = why
            warnings.warn(f"kforge: this package's plan cannot run as a CUDA graph ({why}); "
                          "it runs step by step", stacklevel=3)
            return None
        if len(self.captured) >= MAX_GRAPHS:
            self.captured.pop(next(iter(self.captured)))
        entry = _Captured(graph, static, tuple(outputs))
        self.captured[key] = entry
        return entry


def _describe(step) -> str:
    name = getattr(step, "call", None) or getattr(step, "name", None) or type(step).__name__
    return f"{type(step).__name__} {name} -> {', '.join(getattr(step, 'results', ()))}"


__all__ = ["PlanGraphs", "graphs_wanted", "MAX_GRAPHS"]
