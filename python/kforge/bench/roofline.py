"""Roofline floors: the least time a workload can take on this machine under a precision policy.

floor = max(FLOPs / peak FLOP rate of the policy, minimum bytes / peak memory bandwidth).
Peaks come from a micro-benchmark run on the machine (`measure_peaks`: a large device copy and
8192^3 matrix products on random data, through PyTorch) or, when measuring is switched off, from
DESIGN.md's H200 table; the report says which.

Peak FLOP rate per policy (the fastest arithmetic the policy allows):
  strict  16-bit tensor-core rate / 3: an fp32-accurate product costs three tensor-core
          products, and the fastest such scheme (fp16x3: hi/lo fp16 planes) runs at the fp16 rate
  tf32    TF32 tensor-core rate
  bf16    bf16 tensor-core rate
The baselines run the model as written (fp32, TF32 off), so their floor uses the fp32 rate; that
floor is reported too, to show how close PyTorch already is to what fp32 allows.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from kforge.targets.base import Peaks as TargetPeaks
from kforge.targets.cuda import CudaTarget

POLICIES = ("strict", "tf32", "bf16")


@dataclass(frozen=True)
class Peaks:
    fp32_tflops: float
    tf32_tflops: float
    bf16_tflops: float
    bandwidth_tbs: float          # device copy, bytes read + bytes written per second
    source: str                   # "measured" or "table"
    details: str

    def target_peaks(self) -> TargetPeaks:
        """The same peaks in the form the targets use, so the bench and the tuner share one
        rule for what each policy's compute floor is."""
        return TargetPeaks(fp32=self.fp32_tflops * 1e12, tf32=self.tf32_tflops * 1e12,
                           bf16=self.bf16_tflops * 1e12, bytes_per_s=self.bandwidth_tbs * 1e12)

    def flops_per_s(self, policy: str) -> float:
        return self.target_peaks().flops_for(_known(policy))

    def to_json(self) -> dict:
        d = asdict(self)
        d["policy_tflops"] = {p: self.flops_per_s(p) / 1e12 for p in ("fp32",) + POLICIES}
        return d


# DESIGN.md, "Precision policies": measured on an H200 (2026-11); the cuda target holds them.
_H200 = CudaTarget.archs["sm_90"].peaks
DESIGN_H200 = Peaks(fp32_tflops=_H200.fp32 / 1e12, tf32_tflops=_H200.tf32 / 1e12,
                    bf16_tflops=_H200.bf16 / 1e12, bandwidth_tbs=_H200.bytes_per_s / 1e12,
                    source="table", details="DESIGN.md table: H200, 2026-11")


def floor_ms(flops: float, min_bytes: float, peaks: Peaks, policy: str) -> float:
    return peaks.target_peaks().floor_ms(flops, min_bytes, _known(policy))


def _known(policy: str) -> str:
    """`policy`, or a ValueError: the targets' peaks count an unknown one at the fp32 rate."""
    if policy not in ("fp32",) + POLICIES:
        raise ValueError(f"unknown precision policy {policy!r}; expected one of {POLICIES}")
    return policy


def table_peaks(target) -> Peaks:
    """The peaks a target's architecture lists (kforge.targets: measured for cuda:sm_90,
    datasheets otherwise); the H200's for the interpreter, whose own are nominal."""
    from kforge.targets import get_target
    tgt = get_target(target)
    if tgt.interpreter:
        return DESIGN_H200
    a = tgt.arch_info
    return Peaks(fp32_tflops=a.peaks.fp32 / 1e12, tf32_tflops=a.peaks.tf32 / 1e12,
                 bf16_tflops=a.peaks.bf16 / 1e12, bandwidth_tbs=a.peaks.bytes_per_s / 1e12,
                 source="table", details=f"{tgt.label} table ({a.device}): {a.source}")


def measure_peaks(target, timer) -> Peaks:
    """Measure copy bandwidth and matrix-product rates on this machine with PyTorch, on the
    target's device (a name or kforge.targets.Target)."""
    import torch

    from kforge.targets import get_target
    tgt = get_target(target)
    if not tgt.interpreter:
        dev, n, copy_elems = tgt.device, 8192, 1 << 28      # 1 GiB of fp32 per copy buffer
    else:
        dev, n, copy_elems = "cpu", 1024, 1 << 24           # small: the CPU peaks are context only
    gen = torch.Generator(device=dev).manual_seed(0)
    src = torch.randn(copy_elems, device=dev, generator=gen)
    dst = torch.empty_like(src)
    t = timer.measure(lambda: dst.copy_(src))
    bandwidth = 2 * src.numel() * 4 / (t.median_ms * 1e-3) / 1e12
    del src, dst

    a = torch.randn(n, n, device=dev, generator=gen)
    b = torch.randn(n, n, device=dev, generator=gen)
    flops = 2.0 * n ** 3

    def rate(x, y, tf32: bool) -> float:
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            ms = timer.measure(lambda: torch.matmul(x, y)).median_ms
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        return flops / (ms * 1e-3) / 1e12

    fp32 = rate(a, b, False)
    # torch.backends.cuda.matmul.allow_tf32 is the switch for CUDA devices only
    tf32 = rate(a, b, True) if dev == "cuda" else fp32
    bf16 = rate(a.bfloat16(), b.bfloat16(), False)
    name = tgt.device_name() if not tgt.interpreter else "cpu"
    return Peaks(fp32_tflops=fp32, tf32_tflops=tf32, bf16_tflops=bf16, bandwidth_tbs=bandwidth,
                 source="measured",
                 details=(f"measured on {name}: device copy of {copy_elems * 4 >> 20} MiB "
                          f"(read + write), {n}^3 matmul on random data (fp32, TF32, bf16), "
                          f"median of timed runs"))


def count_flops(model, inputs) -> int:
    """FLOPs of one forward pass as PyTorch's FlopCounterMode counts them (matrix products and
    convolutions; elementwise work is not counted, which only matters where bytes dominate)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    return int(counter.get_total_flops())


def min_bytes(model, inputs, outputs, policy: str | None) -> int:
    """Each input, parameter, buffer and output moved once. Under bf16 the policy lets weights be
    cast once at load, and under tf32 be stored once as TF32-grade scaled fp16 (fp16x1), so
    parameters count at 2 bytes; activations stay fp32."""
    import torch

    def nbytes(t):
        return t.numel() * t.element_size()

    tensors_in = [t for t in inputs if isinstance(t, torch.Tensor)]
    outs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    total = sum(nbytes(t) for t in tensors_in) + sum(nbytes(t) for t in outs if isinstance(t, torch.Tensor))
    for p in list(model.parameters()) + list(model.buffers()):
        total += p.numel() * 2 if (policy in ("bf16", "tf32") and p.is_floating_point()) \
            else nbytes(p)
    return int(total)
