"""Device timers. One small class per device kind, answering the same question: how long does
`fn()` take, as the median of many runs with warm-up and a cache flush before every run.

CUDA: `triton.testing.do_bench`, which records CUDA events around every run and writes a 256 MB
buffer (its L2 flush) before each one; we only choose `rep` so that at least `min_reps` runs are
timed, and ask for all samples to report the median and spread.
CPU: the host clock, with a buffer write between runs (the interpreter's speed is not the point
there; the numbers only show that the pipeline works).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from kforge.bench import stats


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    method: str

    @staticmethod
    def from_samples(samples: list[float], method: str) -> "Timing":
        return Timing(median_ms=stats.median(samples), p20_ms=stats.percentile(samples, 20),
                      p80_ms=stats.percentile(samples, 80), reps=len(samples), method=method)


class CudaTimer:
    name = "cuda"
    flush_bytes = 256 * 1024 * 1024   # do_bench's own flush buffer size

    def __init__(self, warmup_ms: float = 25.0, rep_ms: float = 200.0, min_reps: int = 20,
                 max_rep_ms: float = 3000.0):
        self.warmup_ms, self.rep_ms, self.min_reps, self.max_rep_ms = warmup_ms, rep_ms, min_reps, max_rep_ms

    def describe(self) -> str:
        return ("triton.testing.do_bench: CUDA events per run, 256 MB L2-flush write before "
                f"each run, warm-up first, median of >= {self.min_reps} runs")

    def measure(self, fn: Callable[[], object]) -> Timing:
        import torch
        import triton.testing

        fn()                                  # compile / autotune / first-touch outside the numbers
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate_ms = max(start.elapsed_time(end) / 3, 1e-3)
        # do_bench times int(rep / its own estimate) runs; ask for enough to get min_reps, capped.
        rep = min(max(self.rep_ms, 1.5 * self.min_reps * estimate_ms), self.max_rep_ms)
        warmup = max(self.warmup_ms, 3 * estimate_ms)
        try:
            samples = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="all")
            method = "triton.testing.do_bench (CUDA events, 256 MB L2 flush per run)"
        except (AssertionError, TypeError):      # a Triton without return_mode="all"
            samples = self._event_loop(fn, warmup, rep, estimate_ms)
            method = "CUDA events per run, 256 MB L2 flush per run (do_bench's method)"
        torch.cuda.synchronize()
        return Timing.from_samples([float(s) for s in samples], method)

    def _event_loop(self, fn, warmup_ms: float, rep_ms: float, estimate_ms: float) -> list[float]:
        import torch

        flush = torch.empty(self.flush_bytes // 4, dtype=torch.int32, device="cuda")
        for _ in range(max(1, int(warmup_ms / estimate_ms))):
            fn()
        n = max(1, int(rep_ms / estimate_ms))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in zip(starts, ends)]


class CpuTimer:
    name = "cpu"
    flush_bytes = 64 * 1024 * 1024

    def __init__(self, reps: int = 5, warmup: int = 1):
        self.reps, self.warmup = reps, warmup
        self._flush = None

    def describe(self) -> str:
        return (f"host clock (time.perf_counter), {self.warmup} warm-up, cache-flush write "
                f"before each run, median of {self.reps} runs")

    def measure(self, fn: Callable[[], object]) -> Timing:
        import torch

        if self._flush is None:
            self._flush = torch.empty(self.flush_bytes // 4, dtype=torch.float32)
        for _ in range(self.warmup):
            fn()
        samples = []
        for _ in range(self.reps):
            self._flush.fill_(1.0)            # evict the caches like the CUDA flush does for L2
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return Timing.from_samples(samples, "time.perf_counter (host clock), cache flush per run")


_TIMERS = {"cuda": CudaTimer}       # device timers by backend; the interpreter: CpuTimer


def timer_for(target, **device_kwargs):
    """The timer for a target (name or kforge.targets.Target): CudaTimer on cuda (device
    keywords: warmup_ms, rep_ms, min_reps), CpuTimer for the Triton interpreter. xpu has none:
    no Intel GPU was here to check one against."""
    from kforge.errors import UserError
    from kforge.targets import get_target
    tgt = get_target(target)
    if tgt.interpreter:
        return CpuTimer()
    if tgt.name not in _TIMERS:
        raise UserError(f"kforge bench has no timer for {tgt.label} (timed here: "
                        f"{', '.join(_TIMERS)}, and cpu through the interpreter)")
    return _TIMERS[tgt.name](**device_kwargs)
