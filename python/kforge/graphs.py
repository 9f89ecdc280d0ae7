"""CUDA graphs for a package's host plan: the whole plan captured once per input signature and
replayed, so a run costs the GPU work and not the Python that issues it.

A host plan issues hundreds of small launches (kernels, fallback ops, the aten ops of regions
without a kernel, host steps); eager PyTorch issues as many, and on models whose layers are
small the GPU waits for the CPU. Replaying a captured graph removes that: the plan is run twice
to warm up (Triton and torch.compile compile then), captured on static input buffers, and each
call copies its inputs in, replays, and returns copies of the outputs (the next replay writes
the same buffers).

Large inputs are not copied: an input of BORROW_BYTES or more (a decode step's KV cache, 4 GB
for Llama-3-8B's four layers at batch 64, where the copy alone would cost 2 ms of a 5 ms step)
is read where the caller keeps it. Its address is then part of the capture's key: a call with
the same tensor (or another view of the same memory, same shape and strides) replays, a call
with another tensor gets a capture of its own. The graph holds a reference to the tensor it
reads, so that address cannot be given to another tensor while the capture exists. A caller
that passes new large tensors of the same shapes again and again (ADDRESS_MISSES captures for
one signature) gets copies from then on: one capture, and no references held to its old
tensors. A plan that writes to one of its inputs (seen by the tensor's version counter during
the warm-up runs) is captured on copies again, as before.

A graph pays only where launches cost more than the copies it needs. Right after a capture the
replay (with its input and output copies) and the plan run step by step are each timed on the
device as calls issued back to back (CUDA events around BACK_TO_BACK calls issued after one
that fills the queue; the faster of TIMING_RUNS such runs, per call): a plan whose Python is
shorter than its GPU work then costs its GPU work, as it does when a caller issues calls
without waiting for each, and one whose launches outlast the GPU work costs its Python. Unless
the replay is more than GRAPH_MARGIN faster (within it, noise would decide from one run to the
next), that signature runs step by step from then on and the graph is dropped. Timing one
call from an idle GPU instead counted the plan's launch time in full: a bf16 GEMM package with
a 64 MiB output kept its graph at 0.272 ms a call where step by step ran 0.240 ms (H200,
2026-12-04). A region that streams a 1 GB activation (a row softmax: 0.27 ms of kernel) took
0.78 ms replayed, with 0.5 ms of copies; a decode step's 200 launches ran 6 ms step by step,
1.2 ms replayed (H200, 2026-12-04).

A plan that cannot be captured (a fallback op that synchronizes, like a boolean-mask index or
`nonzero`) runs as before; the reason is kept in `PlanGraphs.skipped` and said once as a warning
(a plan as fast step by step is kept in `PlanGraphs.slower`, without a warning). After a capture
that fails, the caller's stream is current again and CUDA's random generator is out of its
capturing state (`_after_failed_capture`), so later CUDA work in the process runs as before.
`KFORGE_CUDA_GRAPHS=0` turns
graphs off; `KFORGE_CUDA_GRAPHS=always` replays every plan that can be captured, untimed.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Sequence

import torch

# Captures kept per model (one per distinct input signature), oldest dropped first.
MAX_GRAPHS = 8
# inputs this large are read in place rather than copied into the graph's buffers
BORROW_BYTES = 32 << 20
# new addresses for the same shapes before large inputs are copied instead
ADDRESS_MISSES = 2
# runs of each way timed after a capture, to keep the graph only where it pays, and the calls
# issued back to back in each run
TIMING_RUNS = 3
BACK_TO_BACK = 4
# the replay is kept only if step by step is this much slower: within it the two are a tie
# that timing noise decides (and a graph holds memory and copies its outputs every call)
GRAPH_MARGIN = 1.05


def _large(t: torch.Tensor) -> bool:
    return t.numel() * t.element_size() >= BORROW_BYTES


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
        # shapes (no addresses) whose replay did not pay: new tensors of these shapes run step
        # by step without another capture
        self.slower: dict[tuple, str] = {}
        self.pool = None
        self.borrow = True          # False once a plan wrote to an input it would have borrowed
        self.address_misses = 0     # captures made only because a large input moved

    def reset(self) -> None:
        self.captured.clear()
        self.skipped.clear()
        self.slower.clear()

    def run_as(self) -> dict:
        """How the signatures seen so far run: replayed graphs, and the reasons others run step
        by step (timed as no faster, or not capturable)."""
        return {"graphs": len(self.captured), "step_by_step": sorted(set(self.slower.values())),
                "not_capturable": sorted(set(self.skipped.values()))}

    def borrowed(self, t: torch.Tensor) -> bool:
        return self.borrow and _large(t)

    def signature(self, args: Sequence[torch.Tensor]) -> tuple:
        """Shapes, dtypes and strides; and the address of each input read in place."""
        return tuple((tuple(a.shape), a.dtype, a.stride(),
                      a.data_ptr() if self.borrowed(a) else None) for a in args)

    def __call__(self, args: Sequence[torch.Tensor]) -> tuple:
        key = self.signature(args)
        if key in self.skipped or _shapes(key) in self.slower:
            return self.run_plan(args)
        entry = self.captured.get(key)
        if entry is None and self.borrow and any(_shapes(k) == _shapes(key)
                                                 for k in self.captured):
            self.address_misses += 1
            if self.address_misses >= ADDRESS_MISSES:
                # new large tensors every call: copy them in, and let the old ones go
                self.borrow = False
                self.captured = {k: e for k, e in self.captured.items()
                                 if all(ptr is None for *_, ptr in k)}
                key = self.signature(args)
                entry = self.captured.get(key)
        if entry is None:
            entry = self._capture(key, args)
            if entry is None:
                return self.run_plan(args)
        return _replay(entry, args)

    def _capture(self, key, args) -> _Captured | None:
        # a borrowed input is the caller's tensor itself: `static is a` on replay, no copy
        static = [a if self.borrowed(a) else a.clone() for a in args]
        versions = [a._version for a in args]
        caller = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(caller)
        current: list = []            # the step being captured, to name it if capture fails
        try:
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(2):           # compiles every kernel outside the capture
                    self.run_plan(static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            if any(s is a and a._version != v for s, a, v in zip(static, args, versions)):
                # the plan writes to an input: never in place again (the caller's tensor
                # would change under it); the captures are keyed afresh, on copies
                self.borrow = False
                return self._capture(self.signature(args), args)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None or not self.captured:
                # a pool lives while a graph captured into it does: once the last one is gone
                # (dropped after address misses, or a capture that failed) its use count is 0
                # and capturing into it again trips the caching allocator's assert
                # ("use_count > 0", seen on the H200 in a bf16 decode package)
                self.pool = torch.cuda.graph_pool_handle()
            def track(step, run):
                current[:] = [step]
                return run()

            with torch.cuda.graph(graph, pool=self.pool), torch.no_grad():
                outputs = self.run_plan(static, track)
        except Exception as exc:  # noqa: BLE001 - any step that cannot be captured
            _after_failed_capture(caller, self.device)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if current:
                why = f"step {_describe(current[0])}: {why}"
            self.skipped[key] = why
            warnings.warn(f"kforge: this package's plan cannot run as a CUDA graph ({why}); "
                          "it runs step by step", stacklevel=3)
            return None
        entry = _Captured(graph, static, tuple(outputs))
        if os.environ.get("KFORGE_CUDA_GRAPHS") != "always":
            slower = self._slower(entry, args)
            if slower:
                self.slower[_shapes(key)] = slower   # the graph and its buffers go with `entry`
                return None
        if len(self.captured) >= MAX_GRAPHS:
            self.captured.pop(next(iter(self.captured)))
        self.captured[key] = entry
        return entry

    def _slower(self, entry: _Captured, args) -> str | None:
        """Why the replay does not pay for this signature (step by step is as fast), or None.
        Both ways run on the capture's own inputs (copies, or the borrowed tensors the warm-up
        found the plan does not write), so the caller's tensors are read, never written."""
        stream = torch.cuda.current_stream(self.device)

        def best(run) -> float:
            # per call, calls issued back to back: the GPU waits for the Python only where
            # the Python is the longer of the two. One call is issued before the start event,
            # so that the GPU is already busy when the timed calls are issued (the first
            # call's Python, with nothing queued, would count in full otherwise)
            times = []
            for _ in range(TIMING_RUNS):
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                run()
                start.record(stream)
                for _ in range(BACK_TO_BACK):
                    run()
                end.record(stream)
                end.synchronize()
                times.append(start.elapsed_time(end) / BACK_TO_BACK)
            return min(times)

        with torch.no_grad():
            entry.graph.replay()                   # the first replay uploads the graph
            graph_ms = best(lambda: _replay(entry, args))
            plan_ms = best(lambda: self.run_plan(entry.inputs))
        if plan_ms > graph_ms * GRAPH_MARGIN:
            return None
        copied = sum(s.numel() * s.element_size() for s, a in zip(entry.inputs, args)
                     if s is not a) + sum(t.numel() * t.element_size() for t in entry.outputs)
        return (f"step by step is as fast (within {GRAPH_MARGIN - 1:.0%}): {plan_ms:.3f} ms, "
                f"replayed {graph_ms:.3f} ms with "
                f"{copied / 2**20:.0f} MiB of input and output copies")


def _after_failed_capture(caller, device) -> None:
    """Leave the process as it was before a capture that failed, so that what runs next
    (the plan step by step, torch.compile, the caller's own CUDA work) does not inherit it.

    When the capture is invalidated (a step that synchronizes, or copies from pageable host
    memory), `torch.cuda.graph` raises from `capture_end` before two things: it leaves the
    capture stream current (its stream context is not exited), and PyTorch's CUDA random
    generator stays marked as capturing, so that every later use of it fails with "Offset
    increment outside graph capture encountered unexpectedly" (H100, 2026-12-07: after a bf16
    package's failed capture, torch.compile's max-autotune failed so in the same process).
    The caller's stream is made current again, and a capture of nothing but a fill, which
    ends cleanly, takes the generator out of its capturing state."""
    try:
        torch.cuda.set_stream(caller)
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 - a device error surfaces in the caller's next CUDA call
        return
    try:
        probe = torch.empty(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            probe.fill_(0.0)
        del graph
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - said, never raised: the plan still runs
        warnings.warn(f"kforge: after a failed CUDA graph capture, CUDA's state could not be "
                      f"restored ({type(exc).__name__}: {str(exc)[:160]}); random numbers "
                      "drawn on this GPU may fail in this process", stacklevel=4)
    finally:
        torch.cuda.set_stream(caller)


def _replay(entry: _Captured, args) -> tuple:
    for static, a in zip(entry.inputs, args):
        if static is not a:
            static.copy_(a)
    entry.graph.replay()
    return tuple(t.clone() for t in entry.outputs)


def _shapes(key: tuple) -> tuple:
    """A capture key without the addresses of the inputs read in place."""
    return tuple(part[:3] for part in key)


def _describe(step) -> str:
    name = getattr(step, "call", None) or getattr(step, "name", None) or type(step).__name__
    return f"{type(step).__name__} {name} -> {', '.join(getattr(step, 'results', ()))}"


__all__ = ["ADDRESS_MISSES", "BACK_TO_BACK", "BORROW_BYTES", "GRAPH_MARGIN", "MAX_GRAPHS",
           "PlanGraphs", "graphs_wanted"]
