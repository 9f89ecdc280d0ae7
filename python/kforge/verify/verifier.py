"""`verify_candidate`: what "verified" means (DESIGN.md, Verification), as code.

1. Static checks on the source (kforge.verify.static): a candidate that cheats never runs.
2. Checks: several seeds at the primary size, and where a dimension is dynamic two more at a
   second, different (odd) size. Each check's inputs are fresh random tensors (mixed signs and
   magnitudes, never zero; positive only if the region is undefined on negatives); the
   reference is computed here, in float64, before the candidate runs.
3. The candidate runs all checks in one sandboxed process (kforge.verify.sandbox), so results
   cached between calls, or correct at one size only, show up as mismatches. Its outputs start
   as NaN; the worker also reports launches, torch ops executed by `launch` itself and inputs it
   modified.
4. Every element of every output is compared here:
   |out - ref| <= atol * scale + rtol * |ref|, with the policy's atol/rtol and
   scale = max(1, RMS of the reference output), so that atol means the same for outputs of
   magnitude 1 and of magnitude sqrt(K). NaN/inf must appear exactly where the reference has them.
   Under strict, also the fp32-grade contract (kforge.verify.contract): no element farther from
   the float64 reference than 2x PyTorch's own fp32 error on the same inputs (or 4 ulp; 3x
   for a result under 4,096 elements, where that error is a noisy estimate).
5. Memory: references live in host memory between checks and are compared on the device a
   chunk at a time; the parent gives cached device memory back before the worker runs. A
   device out-of-memory is retried, then raised as VerificationOutOfMemory (the candidate is
   neither verified nor rejected), never a raw traceback.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from kforge.verify import contract
from kforge.verify.inputs import Signature, TORCH_DTYPES, make_inputs, seed_scale, signature_of
from kforge.verify.policy import PrecisionPolicy, get_policy
from kforge.verify.sandbox import start_worker
from kforge.verify.static import static_check

DEFAULT_SEEDS = (1, 2, 3)
DEFAULT_DYNAMIC_SIZES = (8, 11)
DEFAULT_TIMEOUT_S = {"cpu": 120.0, "cuda": 120.0, "xpu": 120.0}
DEFAULT_MEMORY_MB = 12 * 1024

# Feedback.status for each rejection reason
_FEEDBACK_STATUS = {"compile_error": "compile_error", "syntax_error": "compile_error",
                    "mismatch": "mismatch", "timeout": "timeout", "crash": "crash",
                    "runtime_error": "crash", "out_of_memory": "crash", "verified": "verified"}


class OracleError(RuntimeError):
    """The region's reference itself failed: no candidate can be judged (not its fault)."""


class VerificationOutOfMemory(OracleError):
    """The device ran out of memory while verifying a region (its reference, the comparison,
    or the sandboxed run on a GPU, after waiting and retrying): the candidate is neither
    verified nor rejected. The message names the region and what was being done."""


# Retries of a step that ran out of device memory, and the waits before them (seconds): memory
# other processes held may be free by then (kforge tune --jobs N on one GPU).
OOM_RETRY_WAITS_S = (2.0, 10.0)


def is_out_of_memory(exc: BaseException) -> bool:
    """A device allocation failure, as PyTorch raises it (torch.OutOfMemoryError; older or
    other backends: a RuntimeError that says so)."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _device_memory(device: str) -> tuple[int, int] | None:
    """(free, total) bytes on the GPU; None on the cpu target or where it cannot say."""
    try:
        if device == "cuda" and torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            return int(free), int(total)
    except Exception:  # noqa: BLE001 - then the caller does without
        pass
    return None


def _free_memory_text(device: str) -> str:
    mem = _device_memory(device)
    if mem is None:
        return ""
    return f"; {mem[0] / 2 ** 30:.1f} of {mem[1] / 2 ** 30:.1f} GiB free on the device now"


def _on_device_memory(step: Callable, device: str, region: str, what: str, sleep=None):
    """Run `step`; on a device out-of-memory, release cached memory, wait and retry
    (OOM_RETRY_WAITS_S); then raise VerificationOutOfMemory naming the region."""
    import gc
    sleep = sleep or time.sleep
    for attempt in range(len(OOM_RETRY_WAITS_S) + 1):
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - only memory errors are handled here
            if not is_out_of_memory(exc):
                raise
            # the text only: the exception's traceback holds the failed step's frames, and
            # with them its device tensors, through every retry (measured on the H200: 101 GiB
            # held by the parent after three attempts at a 26 GB reference)
            last = _first_line(exc)
            exc.__traceback__ = None
            del exc
        gc.collect()
        _release(device)
        if attempt < len(OOM_RETRY_WAITS_S):
            sleep(OOM_RETRY_WAITS_S[attempt])
    raise VerificationOutOfMemory(
        f"region {region}: out of {device} memory while {what} ({len(OOM_RETRY_WAITS_S) + 1} "
        f"attempts){_free_memory_text(device)}: {last}. Verify it with fewer "
        "jobs on the device at a time (kforge tune admits them by free memory)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


@dataclass(frozen=True)
class VerificationRecord:
    """The outcome of verifying one candidate; JSON on disk (manifest.json, logs, cache)."""
    status: str                          # verified | rejected | candidate (not run: no device)
    reason: str = ""                     # "" when verified; else e.g. mismatch, torch_compute
    message: str = ""                    # for the kernel writer and the report
    target: str = ""
    device: str = ""
    precision: str = "strict"
    atol: float = 0.0
    rtol: float = 0.0
    seeds: tuple = ()
    sizes: tuple = ()                    # concrete shape of the first result, per size tried
    dynamic_sizes: tuple = ()            # the size given to dynamic dims, per size tried
    checks: int = 0
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    # strict: the largest ratio, over checks and results, of the candidate's error against
    # float64 to PyTorch's own fp32 error (kforge.verify.contract allows 2)
    fp32_error_ratio: float | None = None
    time_ms: float | None = None         # median, when timing was asked for
    time_noise: float | None = None      # relative spread of the timing samples
    time_lo_ms: float | None = None      # 20th and 80th percentiles of the samples
    time_hi_ms: float | None = None
    elapsed_s: float = 0.0
    # where elapsed_s went, in seconds: reference (inputs and the float64 reference), worker
    # (the sandboxed process: its inputs, launches, saving outputs, timing) and compare
    stage_s: dict | None = None
    # device memory at its peak (GPUs): the parent's (inputs, float64 reference, comparison) and
    # the sandboxed worker's (inputs, their pristine copies, outputs), in bytes, beside the
    # region's least bytes (inputs + weights + outputs at the spec's size)
    memory: dict | None = None
    checked_at: str = ""
    torch_version: str = torch.__version__
    triton_version: str = ""

    @property
    def verified(self) -> bool:
        return self.status == "verified"

    @property
    def feedback_status(self) -> str:
        """The status a provider sees (kforge.providers.base.Feedback.status)."""
        if self.verified:
            return "verified"
        return _FEEDBACK_STATUS.get(self.reason, "rejected")

    def to_json(self) -> dict:
        d = asdict(self)
        d["seeds"] = list(self.seeds)
        d["sizes"] = [list(s) for s in self.sizes]
        d["dynamic_sizes"] = list(self.dynamic_sizes)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in d.items()}

    @staticmethod
    def from_json(d: dict) -> "VerificationRecord":
        known = VerificationRecord.__dataclass_fields__
        kw = {k: v for k, v in d.items() if k in known}
        for k in ("seeds", "dynamic_sizes"):
            if k in kw:
                kw[k] = tuple(kw[k] or ())
        if "sizes" in kw:
            kw["sizes"] = tuple(tuple(s) for s in kw["sizes"] or ())
        return VerificationRecord(**kw)


def target_name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "name")


def target_available(name: str) -> bool:
    """Can kernels for this target run on this machine? (Target.available: a ROCm build's
    "cuda" devices are not NVIDIA GPUs.)"""
    from kforge.targets import get_target, target_names
    return name.partition(":")[0] in target_names() and get_target(name).available()


def device_name(name: str) -> str:
    """The device a target's kernels run on here, or the target's name where it is absent."""
    from kforge.targets import get_target
    return get_target(name).device_name() if target_available(name) else name


def _triton_version() -> str:
    try:
        from importlib.metadata import version
        return version("triton")
    except Exception:  # noqa: BLE001 - version is informational
        return ""


@dataclass(frozen=True)
class _Check:
    seed: int
    size: int
    domain: str
    reference: tuple = field(default=(), compare=False, repr=False)
    # the policy's own arithmetic on the same inputs (operands rounded): on the wide-magnitude
    # checks of a reduced-precision policy; () elsewhere
    alternative: tuple = field(default=(), compare=False, repr=False)
    # the fraction of the policy's tolerance this check allows (REDUCED_PRECISION_MARGIN on
    # the unit-scale checks of a reduced-precision policy)
    tol_scale: float = 1.0
    # the alternative's tolerance as a multiple of the check's (a 16-bit model's own
    # arithmetic: the policy's whole tolerance on every check, narrows_itself below)
    alt_scale: float = 1.0
    # strict: per result, PyTorch's own fp32 error against the reference on these inputs (the
    # bound of kforge.verify.contract; None for results it does not apply to); () elsewhere
    fp32_errors: tuple = ()
    # a check whose references would not fit the host budget (host_reference_budget) keeps
    # none: this recomputes (reference, alternative) from its seed when it is compared
    recompute: Callable | None = field(default=None, compare=False, repr=False)
    # per result, (sum of squares, count) of the reference's finite elements, taken where the
    # reference was computed (on the device), so that the comparison needs no pass of its own
    # for the RMS (None for results that are not floats)
    ref_sums: tuple = field(default=(), compare=False, repr=False)

    def references(self) -> tuple[tuple, tuple]:
        if self.recompute is not None:
            return self.recompute()
        return self.reference, self.alternative


# The float64 references of every check are kept in host memory unless together they exceed
# this share of the memory available when verification starts: then each check's reference is
# recomputed (from its seed, deterministically) when the candidate's outputs are compared.
# Measured on the H200 host (128 GiB, 2026-12-02): three checks of gpt-oss-20b's prefill LM
# head ([16384, 201088] float64 logits, 26 GB each) and the worker's outputs killed the process.
HOST_REFERENCE_SHARE = 0.25


def host_reference_budget() -> int:
    """Bytes of float64 references verification may keep in host memory: the environment's
    KFORGE_VERIFY_HOST_REF_BYTES, else HOST_REFERENCE_SHARE of the memory available now."""
    env = os.environ.get("KFORGE_VERIFY_HOST_REF_BYTES")
    if env:
        return int(float(env))
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62
    return int(HOST_REFERENCE_SHARE * avail)


def _nbytes(outs) -> int:
    return sum(o.numel() * o.element_size() for o in outs)


# A reduced-precision policy (tf32, bf16) promises atol = rtol = 1e-2 against the exact result.
# Our inputs are not the user's, and operand rounding that uses most of the tolerance on ours
# exceeds it on theirs (measured on the H200, 2026-11-30: bf16 GEMM + layer / group / batch
# norm kernels within 1e-2 on the verifier's inputs were 0.0126-0.0145 off eager on the
# workloads'). So on unit-scale inputs (seed scale <= 1) a candidate must be within half the
# tolerance of the exact result. On the wide-magnitude check (scale 2, values up to 4) no
# computation with operands rounded to the policy's format can promise 1e-2 on a bounded
# output (tanh, clamp, a norm), so there an element may instead be within the tolerance of
# the exact result of the policy's own arithmetic: the candidate computes what it claims.
REDUCED_PRECISION_MARGIN = 0.5

# A region of a bf16 (or fp16) model narrows values itself (torch-mlir's arith.truncf after
# each product, bf16 elementwise ops): those roundings are the model's arithmetic, not the
# kernel's approximation, and the float64 reference (every float widened) leaves them out. A
# kernel that reproduces them can then be farther from float64 than the policy's tolerance
# (measured: a bf16 Llama's RoPE on the q projection, one element of 2,048 0.025 from float64
# where half the tolerance allowed 0.0248; the other layer's same region passed). So for such
# a region the alternative is the model's own arithmetic (the spec's own element types, the
# contraction operands rounded to the policy's format), on every check, and an element within
# the policy's whole tolerance of it passes: the kernel computes what the model says.
def narrows_itself(spec) -> bool:
    """The region holds 16-bit float values of its own (a bf16 or fp16 model's region)."""
    tensors = list(getattr(spec, "args", ())) + list(getattr(spec, "values", ()))
    return narrow_dtype(tensors) is not None


def narrow_dtype(tensors) -> torch.dtype | None:
    """bf16 if any of `tensors` (spec tensors or signature arguments) is bf16, else fp16 if one
    is fp16, else None."""
    kinds = {getattr(t, "dtype", None) for t in tensors}
    return torch.bfloat16 if "bf16" in kinds else torch.float16 if "f16" in kinds else None


def _reference_outputs(ref: Callable, args: list[torch.Tensor], device: str) -> tuple:
    on_device = [a.to(device) for a in args]
    outs = ref(*on_device)
    if isinstance(outs, torch.Tensor):
        outs = (outs,)
    return tuple(o.detach() for o in outs)


@contextlib.contextmanager
def fp32_numerics():
    """PyTorch's fp32 as the strict contract means it: TF32 off for matmuls and cuDNN
    (PyTorch's default leaves TF32 convolutions on)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    old = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = old


def _to_host(outs: tuple, device: str) -> tuple:
    """A check's reference outputs are kept in host memory and compared on the device a chunk
    at a time (compare_outputs): device memory then holds one check's reference computation at
    a time, not every check's float64 results for the whole verification."""
    if device == "cpu":
        return outs
    return tuple(o.to("cpu") for o in outs)


def _release(device: str) -> None:
    """Give the caching allocator's free blocks back, so that the sandboxed worker (another
    process) and other verifications on the device can have them."""
    if device != "cpu" and hasattr(torch, device):
        getattr(torch, device).empty_cache()


def _non_finite(outs) -> int:
    return sum(int((~torch.isfinite(o)).sum()) for o in outs if o.is_floating_point())


def _build_checks(sig: Signature, ref: Callable, device: str, seeds: Sequence[int],
                  sizes: Sequence[int], policy_ref: Callable | None = None,
                  fp32_ref: Callable | None = None,
                  model_arithmetic: bool = False) -> list[_Check]:
    """Inputs per check (regenerated in the worker from the same seed), their reference and,
    with `policy_ref`, the result of the policy's own arithmetic on them; with `fp32_ref`
    (strict), the error of PyTorch's own fp32 computation of the region on them.
    `model_arithmetic`: `policy_ref` is a 16-bit model's own arithmetic (narrows_itself),
    an alternative on every check at the policy's whole tolerance."""
    plan = _check_plan(sig, seeds, sizes)
    checks = []
    budget, kept, lazy = host_reference_budget(), 0, False
    for i, (seed, size) in enumerate(plan):
        domain = "mixed"
        inputs = make_inputs(sig, seed, size, domain, device=device)
        outs = _reference_outputs(ref, inputs, device)
        # the region is undefined on some negative inputs (log, sqrt, pow...): positives, first
        # for the arguments that are not contraction operands only
        for other in ("positive_rest", "positive"):
            bad = _non_finite(outs)
            if not bad or (other == "positive_rest" and not any(a.operand for a in sig.args)):
                continue
            trial = make_inputs(sig, seed, size, other, device=device)
            trial_outs = _reference_outputs(ref, trial, device)
            if _non_finite(trial_outs) < bad:
                domain, outs, inputs = other, trial_outs, trial
            del trial, trial_outs
        e32 = ()
        if fp32_ref is not None:
            with fp32_numerics(), torch.no_grad():
                outs32 = _reference_outputs(fp32_ref, inputs, device)
            e32 = tuple(contract.fp32_error(o32, r) if r.is_floating_point() and
                        o32.is_floating_point() else None for o32, r in zip(outs32, outs))
            del outs32
        sums = tuple(_rms_sums(o, device) if o.is_floating_point() else None for o in outs)
        # the policy's own arithmetic (a reduced-precision policy): on the wide-magnitude
        # checks; the unit-scale ones allow a share of the tolerance instead
        with_alt = policy_ref is not None and (seed_scale(seed) > 1 or model_arithmetic)
        tol_scale = REDUCED_PRECISION_MARGIN if policy_ref is not None and \
            seed_scale(seed) <= 1 else 1.0
        alt_scale = 1.0 / tol_scale if model_arithmetic else 1.0
        # if what is kept and this check's references for every check left would exceed the
        # budget, from here on none is kept: each is recomputed when compared
        nbytes = _nbytes(outs) * (2 if with_alt else 1)
        lazy = lazy or kept + (len(plan) - i) * nbytes > budget
        if lazy:
            del outs
            checks.append(_Check(seed, size, domain, (), (), tol_scale, alt_scale, e32,
                                 recompute=_recompute(sig, ref, policy_ref, seed, size, domain,
                                                      device, with_alt), ref_sums=sums))
        else:
            kept += nbytes
            # the reference goes to the host before the alternative is computed, and these
            # inputs before the next check's are drawn: the device holds one reference
            # computation at a time (a bf16 check of an 8192x8192 GELU peaked at 3.2x the
            # region's bytes with both)
            outs = _to_host(outs, device)
            alt = _to_host(_reference_outputs(policy_ref, inputs, device), device) \
                if with_alt else ()
            checks.append(_Check(seed, size, domain, outs, alt, tol_scale, alt_scale, e32,
                                 ref_sums=sums))
            del outs, alt
        del inputs
        _release(device)
    return checks


def _recompute(sig: Signature, ref: Callable, policy_ref: Callable | None, seed: int,
               size: int, domain: str, device: str,
               with_alt: bool) -> Callable[[], tuple[tuple, tuple]]:
    """(reference, alternative) of one check, computed again from its seed and domain: the
    inputs are the same tensors (make_inputs is deterministic), so the references are too."""
    def again() -> tuple[tuple, tuple]:
        inputs = make_inputs(sig, seed, size, domain, device=device)
        outs = _reference_outputs(ref, inputs, device)
        # compared where they were computed when the device has room for them (and the
        # alternative) twice over: a 26 GB reference's trip to the host and back in chunks
        # took most of a check's time on the H200
        stay = _device_room(device) > (2 if with_alt else 1) * 2 * _nbytes(outs)
        if not stay:
            outs = _to_host(outs, device)
        alt = ()
        if with_alt:
            alt = _reference_outputs(policy_ref, inputs, device)
            alt = alt if stay else _to_host(alt, device)
        del inputs
        _release(device)
        return outs, alt
    return again


def _device_room(device: str) -> int:
    """Free bytes on the GPU (0 on the cpu target or where it cannot say: the references then
    go to the host)."""
    mem = _device_memory(device)
    return 0 if mem is None else mem[0]


@dataclass
class _Comparison:
    ok: bool
    message: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    fp32_ratio: float | None = None      # strict contract: error / fp32's error, the largest
    contract: object = None              # one float result's contract.ContractResult


def _index_text(flat: int, shape: Sequence[int]) -> str:
    idx = []
    for d in reversed(shape):
        idx.append(flat % d if d else 0)
        flat = flat // d if d else 0
    return "(" + ", ".join(str(i) for i in reversed(idx)) + ")"


def _compare_check(outs: Sequence[torch.Tensor], c: _Check, sig: Signature,
                   policy: PrecisionPolicy, device: str = "cpu") -> _Comparison:
    """A candidate's outputs for check `c`, at the share of the policy's tolerance the check
    allows, with its policy-arithmetic alternative where it has one."""
    reference, alternative = c.references()
    return compare_outputs(outs, reference, sig, c.size, policy.atol * c.tol_scale,
                           policy.rtol * c.tol_scale, alternative, c.fp32_errors,
                           device=device, ref_sums=c.ref_sums, alt_scale=c.alt_scale)


def compare_outputs(outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor],
                    sig: Signature, size: int, atol: float, rtol: float,
                    alternatives: Sequence[torch.Tensor] | None = None,
                    fp32_errors: Sequence[float | None] | None = None,
                    device=None, ref_sums: Sequence | None = None,
                    alt_scale: float = 1.0) -> _Comparison:
    """Compare every element: |out - ref| <= atol * max(1, RMS(ref)) + rtol * |ref|. With
    `alternatives` (per result, the exact result of a reduced-precision policy's own
    arithmetic), an element may instead be that close to the alternative. With `fp32_errors`
    (per result, PyTorch's own fp32 error against the reference: the strict contract,
    kforge.verify.contract), every element must also be within that bound. The comparison runs
    on `device` (default: the reference's) in chunks (contract.CHUNK elements), so its float64
    temporaries stay small whatever the size of the result. The message says where and how it
    is wrong. `ref_sums` (per result, _rms_sums of the reference, taken where it was computed)
    spares the comparison its pass for the RMS; the strict contract's bound is checked in the
    same pass over the chunks as the policy's rule, so each result crosses to the device once.
    `alt_scale` multiplies the tolerance around the alternative."""
    if len(outs) != len(refs):
        return _Comparison(False, f"launch returned {len(outs)} results; the region has "
                           f"{len(refs)}")
    max_abs = max_rel = 0.0
    ratio = None
    # a 16-bit model's region (its arguments bf16 or fp16): the roundings of its own arithmetic
    # are of that type, also where it widens its result at the end (a bf16 GELU, then extf)
    narrow = narrow_dtype(sig.args)
    for k, (out, ref, rsig) in enumerate(zip(outs, refs, sig.results)):
        want_shape = rsig.concrete(size)
        want_dtype = TORCH_DTYPES[rsig.dtype]
        label = f"result {k} ({rsig.name})"
        if tuple(out.shape) != tuple(want_shape):
            return _Comparison(False, f"{label} has shape {list(out.shape)}, expected "
                               f"{list(want_shape)}")
        if out.dtype != want_dtype:
            return _Comparison(False, f"{label} has dtype {str(out.dtype)[6:]}, expected "
                               f"{str(want_dtype)[6:]} ({rsig.dtype})")
        if not out.is_floating_point():
            # a region without tensor arguments (a mask built from indices) has its
            # reference on the CPU
            bad = out.to(torch.int64) != ref.to(device=out.device, dtype=torch.int64)
            if bad.any():
                first = int(bad.flatten().nonzero()[0])
                return _Comparison(False, f"{label}: {int(bad.sum())} of {bad.numel()} elements "
                                   f"differ; first at {_index_text(first, want_shape)}: got "
                                   f"{out.flatten()[first].item()}, expected "
                                   f"{ref.flatten()[first].item()}")
            continue
        where = device if device is not None else ref.device
        alt = alternatives[k] if alternatives and k < len(alternatives) else None
        e32 = fp32_errors[k] if fp32_errors and k < len(fp32_errors) else None
        # strict: where PyTorch's own fp32 computation of the region is itself farther from
        # float64 than the policy's rule allows (measured: gpt-oss's RoPE projections, whose
        # fp32 result is 1.2x outside 1e-4 on our inputs), PyTorch's own fp32 result does not
        # meet the rule; there the contract's bound (FACTOR x fp32's error) is the tolerance
        fac = contract.factor(out.numel())
        floor = fac * e32 if e32 is not None and math.isfinite(e32) else None
        sums = ref_sums[k] if ref_sums and k < len(ref_sums) else None
        cmp = _compare_float(out, ref, alt, atol, rtol, where, want_shape, label, floor,
                             sums=sums, fp32_err=e32, dtype=want_dtype, alt_scale=alt_scale,
                             narrow=narrow, fac=fac)
        max_abs, max_rel = max(max_abs, cmp.max_abs), max(max_rel, cmp.max_rel)
        if not cmp.ok:
            return _Comparison(False, cmp.message, max_abs, max_rel)
        if e32 is not None:
            c = cmp.contract
            if c.ratio is not None:
                ratio = max(ratio or 0.0, c.ratio)
            if not c.ok:
                msg = (f"{label} {list(want_shape)}: {c.bad} of {out.numel()} elements are "
                       f"farther from the float64 result than the strict contract allows: "
                       f"{fac:g} x PyTorch's own fp32 error on these inputs "
                       f"({e32:.3g}), or {contract.ULP_FLOOR:g} ulp; first at "
                       f"{_index_text(c.first_bad, want_shape)}: got {c.got:.9g}, expected "
                       f"{c.expected:.9g} (error {abs(c.got - c.expected):.3g}); max error "
                       f"{c.max_err:.3g} = {c.max_err / e32 if e32 else float('inf'):.3g} x "
                       "fp32's. Accumulate in fp32 at least as carefully as PyTorch does "
                       "(no low-precision partial sums, no lossy reassociation of a "
                       "cancelling reduction)")
                return _Comparison(False, msg, max_abs, max_rel, ratio)
    return _Comparison(True, "", max_abs, max_rel, ratio)


def _rms_sums(ref: torch.Tensor, device) -> tuple[float, int]:
    """(sum of squares, count) of the finite elements of a reference, chunk by chunk on
    `device` (its RMS: the scale of the policy's atol)."""
    total = count = None
    for _, r in contract.chunks(ref, device=device):
        f = torch.isfinite(r)
        t, c = torch.where(f, r, 0.0).pow(2).sum(), f.sum()
        total, count = (t, c) if total is None else (total + t, count + c)
    return (float(total), int(count)) if total is not None else (0.0, 0)


def rms_scale(ref: torch.Tensor, device=None) -> float:
    """max(1, RMS of the reference's finite elements): the factor the policy's atol is scaled
    by (_compare_float's, from the same sums; kforge.modelcheck.margin's and the bench's
    allclose rule's)."""
    total, count = _rms_sums(ref, ref.device if device is None else device)
    return max(1.0, math.sqrt(total / count)) if count else 1.0


def _ulp(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at each |a| (that of its least normal value
    below it)."""
    info = torch.finfo(dtype)
    return torch.exp2(torch.floor(torch.log2(a.abs().clamp_min(info.tiny)))) * info.eps


def _compare_float(out, ref, alt, atol, rtol, device, want_shape, label,
                   floor: float | None = None, sums: tuple | None = None,
                   fp32_err: float | None = None, dtype=None,
                   alt_scale: float = 1.0, narrow=None,
                   fac: float = contract.FACTOR) -> _Comparison:
    """The policy's rule for one float result, chunk by chunk: a pass for the RMS (none when
    `sums` has it already), a pass over every element accumulating on the device (two
    synchronizations in all, whatever the size), and, only for a result that fails, a pass that
    finds where. `floor` (strict: the contract's factor `fac` x PyTorch's own fp32 error on these
    inputs) is the least tolerance of every element. With `fp32_err` (strict), the same pass
    also checks the contract's bound (kforge.verify.contract) for elements of `dtype`: the
    Comparison's `contract`, when the rule holds."""
    # pass 1: RMS of the reference where it is finite
    total, count = sums if sums is not None else _rms_sums(ref, device)
    scale = max(1.0, math.sqrt(total / count)) if count else 1.0
    threshold = atol * scale
    if floor is not None and floor <= threshold:
        floor = None                   # below the rule's tolerance everywhere: no change
    row_len = max(1, math.prod(want_shape[1:])) if len(want_shape) >= 2 else 1
    pieces = (out, ref) if alt is None else (out, ref, alt)
    # a 16-bit result's alternative is its model's own arithmetic, which is defined only up to
    # the order of its sums: an intermediate rounding (a product's bf16 result before its
    # activation) goes either way at a tie, and the two results then sit a unit in the last
    # place apart. So the alternative also allows one unit in the last place of the result's
    # type (H100, 2026-12-07: a bf16 model's Linear + SiLU, 1 of 67 M elements 2 bf16 ulps
    # from the model's own arithmetic, 0.03125 against 0.0308), or of the region's own 16-bit
    # type (`narrow`) where it widens its result
    narrow = narrow if narrow is not None else dtype if dtype is not None else out.dtype
    narrow = narrow if narrow in contract.NARROW_DTYPES else None

    def judged(o, r, rest):
        finite = torch.isfinite(r)
        err = raw = (o - r).abs()
        tol = threshold + rtol * r.abs()
        if floor is not None:
            tol = tol.clamp_min(floor)
        if rest:                       # a float result's alternative (ints are compared above)
            a = rest[0]
            err_alt, tol_alt = (o - a).abs(), (threshold + rtol * a.abs()) * alt_scale
            if narrow is not None:
                tol_alt = tol_alt + _ulp(a, narrow)
            near_alt = torch.isfinite(a) & (err_alt <= tol_alt)
            err = torch.where(near_alt, torch.minimum(err, err_alt), err)
            tol = torch.where(near_alt, torch.maximum(tol, tol_alt), tol)
        bad = torch.where(finite, ~(err <= tol), ~((o == r) | (torch.isnan(o) & torch.isnan(r))))
        return finite, raw, bad

    # pass 2: every element, the counts and maxima kept on the device
    acc = c_acc = None
    eps = contract.eps_of(dtype or out.dtype) if fp32_err is not None else 0.0
    for _, o, r, *rest in contract.chunks(*pieces, device=device):
        if fp32_err is not None:
            c_acc = contract.accumulate(c_acc, contract.chunk_stats(o, r, fp32_err, eps, fac))
        finite, err, bad = judged(o, r, rest)
        e = torch.where(torch.isnan(err), torch.inf, err)
        big = finite & (r.abs() > threshold)
        stats = torch.stack([
            torch.where(finite, e, 0.0).amax(),
            torch.where(big, e / r.abs().clamp_min(threshold), 0.0).amax(),
            bad.sum().to(torch.float64), (bad & torch.isnan(o)).sum().to(torch.float64)])
        acc = stats if acc is None else torch.stack([torch.maximum(acc[0], stats[0]),
                                                     torch.maximum(acc[1], stats[1]),
                                                     acc[2] + stats[2], acc[3] + stats[3]])
    max_abs, max_rel, n_bad, n_nan = (acc.tolist() if acc is not None else (0.0, 0.0, 0, 0))
    n_bad, n_nan = int(n_bad), int(n_nan)
    if not count:
        max_abs = max_rel = 0.0
    first = got = expected = None
    rows: list[int] = []
    if n_bad:
        # pass 3, a failing result only: where it is wrong
        for start, o, r, *rest in contract.chunks(*pieces, device=device):
            _, _, bad = judged(o, r, rest)
            idx = bad.nonzero().flatten()
            if not idx.numel():
                continue
            if first is None:
                i = int(idx[0])
                first, got, expected = start + i, o[i].item(), r[i].item()
            for row in torch.unique((idx[:4096] + start) // row_len).tolist():
                if row not in rows:
                    rows.append(int(row))
            if len(rows) > 8:
                break
    if not n_bad:
        held = None
        if fp32_err is not None:
            held = contract.finish(c_acc, out, ref, fp32_err, eps, device, fac) \
                if c_acc is not None else contract.ContractResult(True, fp32_err, 0.0)
        return _Comparison(True, "", max_abs, max_rel, contract=held)
    numel = math.prod(want_shape)
    msg = (f"{label} {list(want_shape)}: {n_bad} of {numel} elements outside "
           f"atol {atol:g}*{scale:.3g} + rtol {rtol:g}"
           + (f" (at least {floor:.3g}: {fac:g} x PyTorch's own fp32 error here)"
              if floor is not None else "")
           + (" of the exact result and of the policy's own arithmetic" if alt is not None else ""))
    if n_nan:
        msg += f" ({n_nan} of them NaN: never written, or NaN computed)"
    msg += (f"; first at {_index_text(first, want_shape)}: got {got:.6g}, expected "
            f"{expected:.6g}")
    if len(want_shape) >= 2:
        rows = sorted(rows)
        shown = ", ".join(str(x) for x in rows[:8]) + (", ..." if len(rows) > 8 else "")
        msg += f"; wrong rows (dim 0): {shown} of {want_shape[0]}"
    if count:
        msg += f"; max abs err {max_abs:.3g}"
    return _Comparison(False, msg, max_abs, max_rel)


def _timing_stats(samples: Sequence[float]) -> tuple[float, float, float, float]:
    """(median, relative spread, 20th percentile, 80th percentile) of timing samples."""
    s = sorted(samples)
    median = s[len(s) // 2]
    lo, hi = s[int(0.2 * (len(s) - 1))], s[int(round(0.8 * (len(s) - 1)))]
    noise = max((hi - lo) / median if median > 0 else 0.0, 0.01)
    return median, noise, lo, hi


def verify_candidate(spec, candidate, target="cpu", precision: str = "strict", *,
                     reference: Callable | None = None,
                     seeds: Sequence[int] = DEFAULT_SEEDS,
                     dynamic_sizes: Sequence[int] = DEFAULT_DYNAMIC_SIZES,
                     timeout_s: float | None = None,
                     memory_mb: int | None = DEFAULT_MEMORY_MB,
                     measure: bool = False, timing_reps: int = 3,
                     run_static_checks: bool = True,
                     work_dir: str | Path | None = None,
                     fp32_reference: Callable | None = None) -> VerificationRecord:
    """Verify one candidate for a region; never raises for a bad candidate.

    `spec`: a kforge.spec.KernelSpec; `candidate`: a providers.base.Candidate (or its source
    text); `reference`: the oracle (default: kforge.reference.reference_fn(spec, float64));
    `measure`: also time it (record.time_ms, time_noise). When the target's device is not on
    this machine the candidate is only statically checked: status "candidate".
    `fp32_reference` (strict): PyTorch's fp32 computation of the region, whose error against
    `reference` bounds the candidate's (kforge.verify.contract; default: the spec's reference
    in its own element types).

    Raises OracleError when no verdict can be reached (the reference failed), and its
    subclass VerificationOutOfMemory when the device ran out of memory for the reference, the
    comparison or (on a GPU, twice) the sandboxed run: not the candidate's fault, so it is not
    rejected for it; the caller records a per-region error.
    """
    started = _dt.datetime.now(_dt.timezone.utc)
    source = candidate if isinstance(candidate, str) else candidate.source
    tname = target_name(target)
    policy = get_policy(precision)
    sig = signature_of(spec)
    dynamic_sizes = tuple(dynamic_sizes)
    stages: dict = {}
    base = dict(target=tname, precision=policy.name, atol=policy.atol, rtol=policy.rtol,
                triton_version=_triton_version(), stage_s=stages)

    def record(status: str, reason: str = "", message: str = "", **kw) -> VerificationRecord:
        elapsed = (_dt.datetime.now(_dt.timezone.utc) - started).total_seconds()
        return VerificationRecord(status=status, reason=reason, message=message,
                                  elapsed_s=round(elapsed, 3),
                                  checked_at=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                  **base, **kw)

    if run_static_checks:
        violations = static_check(source)
        if violations:
            return record("rejected", violations[0].reason,
                          "static check: " + "; ".join(str(v) for v in violations[:6]))
    if not target_available(tname):
        return record("candidate", "target_unavailable",
                      f"no {tname} device on this machine: statically checked only; run "
                      "`kforge tune PKG` on a machine with the device to verify it")

    device = "cpu" if tname == "cpu" else tname
    memory = base["memory"] = _start_peak(tname, spec)     # GPUs: the peaks from here on
    region = getattr(spec, "name", None) or (spec.get("name") if isinstance(spec, dict) else "?")
    if reference is None:
        from kforge.reference import reference_fn
        reference = reference_fn(spec, torch.float64)
    # the policy's own arithmetic, also where the caller made the reference (a compile's region
    # loop: before, its candidates were judged without it, and `kforge tune` with it)
    policy_ref, model_arithmetic = None, False
    if policy.operand_format and getattr(spec, "ops", None):
        from kforge.reference import reference_fn
        model_arithmetic = narrows_itself(spec)
        policy_ref = reference_fn(spec, None if model_arithmetic else torch.float64,
                                  operand_format=policy.operand_format)
    if policy.fp32_grade and fp32_reference is None and getattr(spec, "ops", None):
        from kforge.reference import reference_fn
        fp32_reference = reference_fn(spec)          # the spec's own element types: fp32
    plan = _check_plan(sig, tuple(seeds), dynamic_sizes)
    stream = _output_bytes(sig, [size for _, size in plan]) >= STREAM_OUTPUT_BYTES
    tmp_root = Path(work_dir) if work_dir else _memory_dir(sig, plan, device, stream)
    if tmp_root:
        tmp_root.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix="kforge-verify-", dir=tmp_root))
    worker = None
    try:
        (job_dir / "kernel.py").write_text(source)
        # the sandboxed worker starts now: its imports and the device's context (about 5 s on
        # the H200) overlap the references; it waits for job.json, written once they are done
        worker = start_worker(job_dir, tname, memory_mb, device)
        return _verify_in(
            job_dir, worker, sig=sig, source=source, reference=reference,
            policy_ref=policy_ref, fp32_reference=fp32_reference, policy=policy, device=device,
            model_arithmetic=model_arithmetic, tname=tname, region=region, seeds=tuple(seeds), dynamic_sizes=dynamic_sizes,
            stream=stream, measure=measure, timing_reps=timing_reps, timeout_s=timeout_s,
            memory_mb=memory_mb, memory=memory, stages=stages, record=record)
    finally:
        if worker is not None:
            worker.kill()
        _remove_job_dir(job_dir)


def _remove_job_dir(job_dir: Path, tries: int = 100) -> None:
    """Remove the job directory. A forked worker's zygote writes its `exit_status` into it
    right after reaping the worker; a worker seen gone before that (sandbox._Forked.poll) can
    have that file land while the directory is being removed, which then leaves it behind (seen
    once in CI on a loaded machine). So: remove, and again while it is still there."""
    for _ in range(tries):
        shutil.rmtree(job_dir, ignore_errors=True)
        if not job_dir.exists():
            return
        time.sleep(0.01)


def _verify_in(job_dir: Path, worker, *, sig, source, reference, policy_ref,
               fp32_reference, policy, device, model_arithmetic, tname, region, seeds, dynamic_sizes, stream,
               measure, timing_reps, timeout_s, memory_mb, memory, stages, record
               ) -> VerificationRecord:
    """verify_candidate's checks, with the job directory made and the worker starting."""
    t0 = time.monotonic()
    try:
        checks = _on_device_memory(
            lambda: _build_checks(sig, reference, device, seeds, dynamic_sizes,
                                  policy_ref, fp32_reference if policy.fp32_grade else None,
                                  model_arithmetic),
            device, region, "computing the float64 reference")
        stages["reference"] = round(time.monotonic() - t0, 3)
    except OracleError:
        raise
    except Exception as exc:  # the oracle itself failed: not the candidate's fault
        raise OracleError(f"the reference of region {region} failed: "
                          f"{type(exc).__name__}: {exc}") from exc
    size_list = []
    for c in checks:
        if c.size not in [s for s, _ in size_list]:
            size_list.append((c.size, sig.results[0].concrete(c.size) if sig.results else ()))
    common = dict(device=device_name(tname), seeds=tuple(c.seed for c in checks),
                  sizes=tuple(s for _, s in size_list),
                  dynamic_sizes=tuple(s for s, _ in size_list) if sig.is_dynamic else (),
                  checks=len(checks))

    job = {"device": device, "source_path": str(job_dir / "kernel.py"),
           "signature": sig.to_json(),
           "checks": [{"seed": c.seed, "size": c.size, "domain": c.domain} for c in checks],
           "timing": {"reps": timing_reps} if measure else None,
           "stream": stream, "compared_as_they_come": True}
    _write_job(job_dir, job)         # the worker, started before, goes on from here
    handed_at = time.time()
    started_at = worker.started_at
    streamed: dict[int, _Comparison] = {}
    overlapped = [0.0]

    def consume() -> None:
        """Compare each check's outputs as the worker writes them (while it runs the next
        check), and delete them: a streaming worker waits for that after each check, and
        every worker before it is timed."""
        for i, c in enumerate(checks):
            path = job_dir / f"outputs_{i}.pt"
            if i in streamed or not path.exists():
                continue
            t = time.monotonic()
            outs = load_outputs(path)
            streamed[i] = _on_device_memory(
                lambda: _compare_check(outs, c, sig, policy, device), device, region,
                f"comparing check {i + 1}")
            del outs
            remove_outputs(path)
            overlapped[0] += time.monotonic() - t
    limit = timeout_s or DEFAULT_TIMEOUT_S.get(tname, 120.0)
    t0 = time.monotonic()
    for attempt in range(len(OOM_RETRY_WAITS_S) + 1):
        streamed.clear()
        if worker is None:
            worker = start_worker(job_dir, tname, memory_mb, device)
        run = worker.wait(limit, consume)
        worker = None
        result = _read_json(job_dir / "result.json")
        progress = _read_json(job_dir / "progress.json") or {}
        if device == "cpu" or not _worker_out_of_memory(result):
            break
        # On a GPU the device is shared (other verifications, other jobs): a sandboxed run
        # that ran out of its memory is retried, and never rejected for it. On the cpu
        # target the limit is the sandbox's own (memory_mb), and exceeding it rejects.
        if attempt == len(OOM_RETRY_WAITS_S):
            err = result["error"]
            raise VerificationOutOfMemory(
                f"region {region}: the sandboxed run of the candidate ran out of {device} "
                f"memory {len(OOM_RETRY_WAITS_S) + 1} times{_free_memory_text(device)}: "
                f"{err.get('type')}: {str(err.get('message', ''))[:300]}")
        for f in job_dir.glob("outputs_*"):
            f.unlink()
        (job_dir / "result.json").unlink(missing_ok=True)
        _release(device)
        time.sleep(OOM_RETRY_WAITS_S[attempt])
    # worker: from the job's hand-over to its end, the comparisons made meanwhile included
    # (compare_during_worker); worker_startup: its start (imports, the device's context) while
    # the references were computed; worker_idle: how long it then waited for them
    stages["worker"] = round(time.monotonic() - t0, 3)
    stages["compare_during_worker"] = round(overlapped[0], 3)
    ready_at = (result or {}).get("ready_at")
    if isinstance(ready_at, (int, float)):
        stages["worker_startup"] = round(ready_at - started_at, 3)
        stages["worker_idle"] = round(max(0.0, handed_at - ready_at), 3)
    for k, v in ((result or {}).get("stage_s") or {}).items():
        stages[f"worker_{k}"] = v
    if memory is not None and (result or {}).get("peak_bytes") is not None:
        memory["worker_peak_bytes"] = int(result["peak_bytes"])
        if result.get("candidate_peak_bytes"):
            # of which while the candidate's own code ran (its weight preparation, launch)
            memory["worker_candidate_peak_bytes"] = int(result["candidate_peak_bytes"])
    t0 = time.monotonic()
    if result is None:
        where = _progress_text(progress)
        tail = run.stderr_tail.strip()
        if progress.get("stage") in (None, "starting", "waiting") and \
                not run.timed_out and \
                run.returncode == 1:
            raise RuntimeError(f"the verification worker failed before loading the "
                               f"candidate (a KForge or environment problem):\n{tail}")
        detail = f"\n{tail[-1500:]}" if tail else ""
        if run.timed_out:
            return record("rejected", "timeout", f"{run.describe_exit()} {where}{detail}",
                          **common)
        return record("rejected", "crash", f"{run.describe_exit()} {where}{detail}",
                      **common)
    max_abs = max_rel = 0.0
    ratio = None
    for entry in result["checks"]:
        i = entry["index"]
        c = checks[i]
        if "outputs" not in entry:
            continue
        if entry.get("launches", 0) == 0:
            return record("rejected", "no_triton_kernel",
                          "launch returned without launching any Triton kernel", **common)
        if entry.get("torch_ops"):
            return record("rejected", "torch_compute",
                          "launch computed with torch outside Triton kernels: "
                          + ", ".join(entry["torch_ops"][:6]), **common)
        if entry.get("inputs_modified"):
            names = [sig.args[j].name for j in entry["inputs_modified"]]
            return record("rejected", "input_mutated",
                          f"launch modified its input(s) {', '.join(names)}; inputs must "
                          "be left unchanged", **common)
        if i in streamed:
            cmp = streamed[i]
        else:
            outs = load_outputs(job_dir / f"outputs_{i}.pt")
            cmp = _on_device_memory(lambda: _compare_check(outs, c, sig, policy, device),
                                    device, region, f"comparing check {i + 1}")
            del outs
        max_abs, max_rel = max(max_abs, cmp.max_abs), max(max_rel, cmp.max_rel)
        if cmp.fp32_ratio is not None:
            ratio = max(ratio or 0.0, cmp.fp32_ratio)
        if not cmp.ok:
            kind = "mismatch"
            if "has shape" in cmp.message or "has dtype" in cmp.message or \
                    "returned" in cmp.message:
                kind = "wrong_signature"
            return record("rejected", kind, f"check {i + 1}/{len(checks)} (seed {c.seed}"
                          + (f", dynamic dims = {c.size}" if sig.is_dynamic else "")
                          + f", inputs {c.domain}): {cmp.message}"
                          + (f" [{c.tol_scale:g} of the {policy.name} tolerance: the margin "
                             "on unit-scale inputs]" if c.tol_scale < 1 else ""), **common,
                          max_abs_err=cmp.max_abs, max_rel_err=cmp.max_rel,
                          fp32_error_ratio=ratio)
    err = result.get("error")
    if err:
        where = f" (check {err['check'] + 1})" if "check" in err else \
            f" (during {err.get('stage')})"
        kind = err["kind"]
        return record("rejected", kind, f"{err['type']}{where}: {err['message']}\n"
                      f"{_trim_traceback(err.get('traceback', ''))}", **common)
    if len(result["checks"]) != len(checks):
        return record("rejected", "crash", "the worker stopped before finishing all checks",
                      **common)
    time_ms = noise = lo = hi = None
    timing = result.get("timing")
    if measure and timing:
        outs = load_outputs(job_dir / "outputs_timed.pt")
        cmp = _on_device_memory(lambda: _compare_check(outs, checks[0], sig, policy, device),
                                device, region, "comparing the timed run's results")
        if not cmp.ok:
            return record("rejected", "mismatch", "wrong result while being timed: "
                          + cmp.message, **common)
        time_ms, noise, lo, hi = _timing_stats(timing["samples_ms"])
    stages["compare"] = round(time.monotonic() - t0, 3)
    _end_peak(memory, tname)
    return record("verified", "", "", max_abs_err=max_abs, max_rel_err=max_rel,
                  fp32_error_ratio=ratio,
                  time_ms=time_ms, time_noise=noise, time_lo_ms=lo, time_hi_ms=hi,
                  **common)


def _write_job(job_dir: Path, job: dict) -> None:
    """job.json, whole or not at all (renamed into place): a waiting worker reads it as soon
    as it appears."""
    tmp = job_dir / "job.json.part"
    tmp.write_text(json.dumps(job))
    os.replace(tmp, job_dir / "job.json")


def _check_plan(sig: Signature, seeds: Sequence[int], sizes: Sequence[int]
                ) -> list[tuple[int, int]]:
    """(seed, dynamic size) of every check: each seed at the first size, and where a dimension
    is dynamic two more at the second."""
    plan = [(s, sizes[0]) for s in seeds]
    if sig.is_dynamic:
        plan += [(100 + s, sizes[1]) for s in seeds[:2]]
    return plan


def _start_peak(tname: str, spec) -> dict | None:
    """The memory record of a GPU verification, its peak counter reset (None elsewhere)."""
    mod = getattr(torch, tname, None) if tname != "cpu" else None
    if mod is None or not hasattr(mod, "reset_peak_memory_stats"):
        return None
    try:
        mod.reset_peak_memory_stats()
    except Exception:   # noqa: BLE001 - no device context: nothing to record
        return None
    return {"region_bytes": int(getattr(spec, "min_bytes", 0) or 0)}


def _end_peak(memory: dict | None, tname: str) -> None:
    if memory is None:
        return
    try:
        memory["parent_peak_bytes"] = int(getattr(torch, tname).max_memory_allocated())
    except Exception:   # noqa: BLE001 - informational
        return
    peak = max(memory.get("parent_peak_bytes", 0), memory.get("worker_peak_bytes", 0))
    if memory["region_bytes"]:
        memory["peak_over_region"] = round(peak / memory["region_bytes"], 2)


# A region whose results take this many bytes a check has them streamed: the worker waits
# after each check until the parent has compared its outputs and deleted them, so that the host
# holds one check's outputs at a time, not every check's and the timed run's (5 x 13 GB for
# gpt-oss-20b's prefill logits, past the H200 host's disk).
STREAM_OUTPUT_BYTES = 2 << 30


def _output_bytes(sig, sizes: Sequence[int]) -> int:
    """A check's result bytes at the largest of the checks' dynamic sizes."""
    size = max(sizes, default=1)
    return sum(TORCH_DTYPES[r.dtype].itemsize * math.prod(r.concrete(size))
               for r in sig.results)


def _memory_dir(sig, plan, device: str, stream: bool) -> Path | None:
    """Where the worker's outputs go for a GPU verification: /dev/shm (memory) when it has room
    for them twice over, since a prefill region's gigabytes of outputs written to disk and read
    back took longer than the rest of its verification; else the default temporary directory."""
    shm = Path("/dev/shm")
    if device == "cpu" or not shm.is_dir() or not os.access(shm, os.W_OK):
        return None
    # every check's outputs and the timed run's lie there until the worker ends (streamed: one
    # check's and the timed run's)
    one = _output_bytes(sig, [size for _, size in plan])
    need = (2 if stream else len(plan) + 1) * one
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    return shm if st.f_bavail * st.f_frsize > 2 * need + (256 << 20) else None


def load_outputs(path: Path) -> list[torch.Tensor]:
    """A worker's outputs file (kforge/verify/_worker.py): a JSON list of {shape, dtype, file},
    each file an output's raw bytes beside it, mapped rather than read (torch.from_file); a
    torch.save'd list, as workers wrote before, is loaded as such. The worker is untrusted:
    files outside the job directory and dtypes that are not torch's are refused."""
    with open(path, "rb") as f:
        if f.read(1) != b"[":
            return torch.load(path, weights_only=True)
    outs = []
    for m in json.loads(path.read_text()):
        dtype = getattr(torch, str(m["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{path.name}: not a torch dtype: {m['dtype']!r}")
        shape = [int(d) for d in m["shape"]]
        raw = path.parent / Path(str(m["file"])).name
        n = math.prod(shape)
        if raw.stat().st_size != n * dtype.itemsize:
            raise ValueError(f"{raw.name}: {raw.stat().st_size} bytes for {n} {m['dtype']}")
        t = torch.from_file(str(raw), shared=False, size=n, dtype=dtype) if n else \
            torch.empty(0, dtype=dtype)
        outs.append(t.reshape(shape))
    return outs


def remove_outputs(path: Path) -> None:
    """Delete an outputs file and its raw files, the list last (a streaming worker waits for
    it to go)."""
    for raw in path.parent.glob(path.name + ".*"):
        raw.unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def _worker_out_of_memory(result) -> bool:
    err = (result or {}).get("error") or {}
    return err.get("kind") == "out_of_memory"


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _progress_text(progress: dict) -> str:
    stage = progress.get("stage")
    if stage == "check":
        return f"during check {progress.get('check', 0) + 1} (seed {progress.get('seed')})"
    if stage == "import":
        return "while importing the candidate"
    if stage == "timing":
        return "while timing"
    return "while starting"


def _trim_traceback(tb: str, limit: int = 2500) -> str:
    """Keep the candidate's own frames and the error: what a kernel writer needs."""
    lines = tb.strip().splitlines()
    keep = [ln for ln in lines if "kforge/verify/_worker.py" not in ln]
    text = "\n".join(keep)
    return text if len(text) <= limit else "...\n" + text[-limit:]
