"""The fp32-grade strict contract (DESIGN.md "Precision policies"; issue 13, item 3).

Under `strict`, besides |out - ref| <= atol * max(1, RMS(ref)) + rtol * |ref| (the policy's
rule, kforge.verify.verifier), every element of a result must be as close to the float64
reference as PyTorch's own fp32 computation of the region gets, within a factor:

    |out_i - ref64_i| <= max(FACTOR * E32, ULP_FLOOR * eps(dtype) * |ref64_i|)
    E32 = max_j |fp32_j - ref64_j|     (PyTorch's fp32 result of the same region, same inputs,
                                         TF32 off for matmuls and cuDNN, measured by the verifier)

FACTOR = 2 (SMALL_FACTOR = 3 for a result of fewer than SMALL_RESULT = 4096 elements: there
E32, the largest of a few hundred errors, is a noisy estimate of fp32's error. Measured on the
CPU, 2026-12-08: the textbook attention formula in fp32 against PyTorch's own fp32 SDPA, both
against float64, 300 random checks a size: at 256 elements its error was over 2x SDPA's in 11,
at most 2.89x; at 1,024 in 1 (2.24x); at 4,096 and 16,384 in none (at most 1.40x). Two
computations of equal accuracy then fail each other's 2x now and then, and which one fails
depends on the CPU's fp32 kernels: benchmarks/contract/small_results_noise.py.) The RMS-scaled
atol alone lets a kernel through whose error is far above what fp32
arithmetic gives: a row sum over a GEMM output with large cancellation was 2.3e-2 off where
fp32 eager was 3.5e-3 off float64 (H200, 2026-12-01), inside 1e-4 * RMS(ref). The floor of a
few units in the last place of each element keeps regions where fp32 is exact or nearly so
(a copy, a ReLU, an elementwise tail) from demanding bit-identical results of a kernel that
computes the same formula in another order.

Everything here works in chunks of CHUNK elements, so a check of a GB-sized result needs only a
few chunk-sized float64 temporaries on the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

FACTOR = 2.0
SMALL_FACTOR = 3.0
SMALL_RESULT = 4096      # elements: below, SMALL_FACTOR (above)
ULP_FLOOR = 4.0
CHUNK = 1 << 22          # elements per chunk (32 MB of float64)


def chunks(*tensors: torch.Tensor, device=None, chunk: int | None = None) -> Iterator[tuple]:
    """(start, float64 pieces...) over the flattened tensors, each piece moved to `device`
    (default: the first tensor's) one chunk (default CHUNK elements) at a time."""
    flats = [t.reshape(-1) for t in tensors]
    n = flats[0].numel()
    device = device if device is not None else flats[0].device
    # on a GPU, 4x larger chunks: a few hundred MB of float64 temporaries, and a quarter of the
    # launches and copies (a prefill region's results are 10^8-10^9 elements)
    chunk = chunk or (CHUNK if torch.device(device).type == "cpu" else 4 * CHUNK)
    for start in range(0, n, chunk):
        yield (start, *[f[start:start + chunk].to(device=device, dtype=torch.float64)
                        for f in flats])


def factor(numel: int) -> float:
    """The contract's factor on E32 for a result of `numel` elements (above)."""
    return SMALL_FACTOR if numel < SMALL_RESULT else FACTOR


def fp32_error(fp32: torch.Tensor, ref64: torch.Tensor, device=None) -> float:
    """E32: the largest |fp32 - ref64| over the elements where the reference is finite (inf
    where PyTorch's fp32 result is not finite there: it then bounds nothing). Computed on
    `device` (default: the reference's), a chunk at a time."""
    worst = None
    for _, f, r in chunks(fp32, ref64, device=ref64.device if device is None else device):
        e = _worst(f, r, torch.isfinite(r))
        worst = e if worst is None else torch.maximum(worst, e)
    return 0.0 if worst is None else float(worst)      # one synchronization


def _worst(o: torch.Tensor, r: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """max |o - r| over the finite elements of r, as a 0-d tensor (inf where an error there is
    not finite, NaN included; 0 where none is finite), without synchronizing."""
    err = (o - r).abs()
    err = torch.where(torch.isnan(err), torch.inf, err)
    return torch.where(finite, err, 0.0).amax()


@dataclass(frozen=True)
class ContractResult:
    ok: bool
    fp32_err: float            # E32
    max_err: float             # the candidate's largest error where the reference is finite
    bad: int = 0               # elements over the bound
    first_bad: int | None = None   # flat index of the first one
    got: float | None = None
    expected: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.max_err / self.fp32_err if self.fp32_err > 0 else None


def check(out: torch.Tensor, ref64: torch.Tensor, fp32_err: float,
          dtype: torch.dtype | None = None, device=None,
          fac: float | None = None) -> ContractResult:
    """Every element of `out` against the bound above (`fac` x E32, default factor(out's
    elements)), on `device` (default: the reference's). Elements where the reference is not
    finite are left to the policy's rule (NaN/inf must match there)."""
    eps = eps_of(dtype or out.dtype)
    where = ref64.device if device is None else device
    fac = factor(out.numel()) if fac is None else fac

    # one pass accumulating on the device, one synchronization; a second pass finds the
    # first element over the bound only where there is one
    acc = None
    for _, o, r in chunks(out, ref64, device=where):
        acc = accumulate(acc, chunk_stats(o, r, fp32_err, eps, fac))
    if acc is None:
        return ContractResult(True, fp32_err, 0.0)
    return finish(acc, out, ref64, fp32_err, eps, where, fac)


# the 16-bit float types (a bf16 or fp16 model's values)
NARROW_DTYPES = (torch.bfloat16, torch.float16)


def eps_of(dt: torch.dtype) -> float:
    return torch.finfo(dt if dt.is_floating_point else torch.float32).eps


def _over(o: torch.Tensor, r: torch.Tensor, fp32_err: float, eps: float, fac: float):
    finite = torch.isfinite(r)
    bound = torch.clamp(ULP_FLOOR * eps * r.abs(), min=fac * fp32_err)
    return finite, finite & ~((o - r).abs() <= bound)       # NaN error counts as over


def chunk_stats(o: torch.Tensor, r: torch.Tensor, fp32_err: float, eps: float,
                fac: float = FACTOR) -> tuple:
    """(elements over the bound, largest error where r is finite) of one chunk (float64
    pieces), as 0-d tensors: no synchronization. The verifier's comparison accumulates these in
    its own pass over the chunks, so that a result crosses to the device once. `fac`: the
    factor on E32 for the whole result (factor(its elements), not the chunk's)."""
    finite, over = _over(o, r, fp32_err, eps, fac)
    return over.sum(), _worst(o, r, finite)


def accumulate(acc: tuple | None, stats: tuple) -> tuple:
    if acc is None:
        return stats
    return acc[0] + stats[0], torch.maximum(acc[1], stats[1])


def finish(acc: tuple, out: torch.Tensor, ref64: torch.Tensor, fp32_err: float, eps: float,
           where, fac: float = FACTOR) -> ContractResult:
    """The result of the accumulated chunk_stats; where elements are over the bound, another
    pass finds the first."""
    bad, max_err = int(acc[0]), float(acc[1])
    first = got = expected = None
    if bad:
        for start, o, r in chunks(out, ref64, device=where):
            _, over = _over(o, r, fp32_err, eps, fac)
            if over.any():
                i = int(over.nonzero()[0])
                first, got, expected = start + i, float(o[i]), float(r[i])
                break
    return ContractResult(bad == 0, fp32_err, max_err, bad, first, got, expected)


__all__ = ["CHUNK", "FACTOR", "SMALL_FACTOR", "SMALL_RESULT", "ULP_FLOOR", "ContractResult",
           "accumulate", "check", "chunk_stats", "chunks", "eps_of", "factor", "finish",
           "fp32_error"]
