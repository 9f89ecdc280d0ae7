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
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from kforge.verify.inputs import Signature, TORCH_DTYPES, make_inputs, seed_scale, signature_of
from kforge.verify.policy import PrecisionPolicy, get_policy
from kforge.verify.sandbox import run_worker
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
    time_ms: float | None = None         # median, when timing was asked for
    time_noise: float | None = None      # relative spread of the timing samples
    time_lo_ms: float | None = None      # 20th and 80th percentiles of the samples
    time_hi_ms: float | None = None
    elapsed_s: float = 0.0
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
    """Can kernels for this target run on this machine?"""
    if name == "cpu":
        return True
    if name == "cuda":
        return torch.cuda.is_available()
    if name == "xpu":
        return bool(getattr(torch, "xpu", None)) and torch.xpu.is_available()
    return False


def device_name(name: str) -> str:
    if name == "cpu":
        return "Triton interpreter (cpu)"
    if name == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    if name == "xpu" and target_available("xpu"):
        return torch.xpu.get_device_name()
    return name


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


def _reference_outputs(ref: Callable, args: list[torch.Tensor], device: str) -> tuple:
    on_device = [a.to(device) for a in args]
    outs = ref(*on_device)
    if isinstance(outs, torch.Tensor):
        outs = (outs,)
    # Kept on the device: the comparison runs there too (outputs of GPU-sized regions are
    # hundreds of MB; comparing them in float64 on the host took longer than the checks).
    return tuple(o.detach() for o in outs)


def _non_finite(outs) -> int:
    return sum(int((~torch.isfinite(o)).sum()) for o in outs if o.is_floating_point())


def _build_checks(sig: Signature, ref: Callable, device: str, seeds: Sequence[int],
                  sizes: Sequence[int], policy_ref: Callable | None = None) -> list[_Check]:
    """Inputs per check (regenerated in the worker from the same seed), their reference and,
    with `policy_ref`, the result of the policy's own arithmetic on them."""
    plan = [(s, sizes[0]) for s in seeds]
    if sig.is_dynamic:
        plan += [(100 + s, sizes[1]) for s in seeds[:2]]
    checks = []
    for seed, size in plan:
        domain = "mixed"
        inputs = make_inputs(sig, seed, size, domain)
        outs = _reference_outputs(ref, inputs, device)
        # the region is undefined on some negative inputs (log, sqrt, pow...): positives, first
        # for the arguments that are not contraction operands only
        for other in ("positive_rest", "positive"):
            bad = _non_finite(outs)
            if not bad or (other == "positive_rest" and not any(a.operand for a in sig.args)):
                continue
            trial = make_inputs(sig, seed, size, other)
            trial_outs = _reference_outputs(ref, trial, device)
            if _non_finite(trial_outs) < bad:
                domain, outs, inputs = other, trial_outs, trial
        alt, tol_scale = (), 1.0
        if policy_ref is not None:
            if seed_scale(seed) > 1:
                alt = _reference_outputs(policy_ref, inputs, device)
            else:
                tol_scale = REDUCED_PRECISION_MARGIN
        checks.append(_Check(seed, size, domain, outs, alt, tol_scale))
    return checks


@dataclass
class _Comparison:
    ok: bool
    message: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0


def _index_text(flat: int, shape: Sequence[int]) -> str:
    idx = []
    for d in reversed(shape):
        idx.append(flat % d if d else 0)
        flat = flat // d if d else 0
    return "(" + ", ".join(str(i) for i in reversed(idx)) + ")"


def _compare_check(outs: Sequence[torch.Tensor], c: _Check, sig: Signature,
                   policy: PrecisionPolicy) -> _Comparison:
    """A candidate's outputs for check `c`, at the share of the policy's tolerance the check
    allows, with its policy-arithmetic alternative where it has one."""
    return compare_outputs(outs, c.reference, sig, c.size, policy.atol * c.tol_scale,
                           policy.rtol * c.tol_scale, c.alternative)


def compare_outputs(outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor],
                    sig: Signature, size: int, atol: float, rtol: float,
                    alternatives: Sequence[torch.Tensor] | None = None) -> _Comparison:
    """Compare every element, on the reference's device: |out - ref| <= atol * max(1,
    RMS(ref)) + rtol * |ref|. With `alternatives` (per result, the exact result of a
    reduced-precision policy's own arithmetic), an element may instead be that close to the
    alternative. The message says where and how it is wrong."""
    if len(outs) != len(refs):
        return _Comparison(False, f"launch returned {len(outs)} results; the region has "
                           f"{len(refs)}")
    max_abs = max_rel = 0.0
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
        o, r = out.to(ref.device).double(), ref.double()
        finite = torch.isfinite(r)
        scale = max(1.0, float(r[finite].pow(2).mean().sqrt())) if finite.any() else 1.0
        err = (o - r).abs()
        tol = atol * scale + rtol * r.abs()
        alt = alternatives[k] if alternatives and k < len(alternatives) else None
        if alt is not None:          # a float result's alternative (ints returned above)
            a = alt.to(r.device).double()
            err_alt, tol_alt = (o - a).abs(), atol * scale + rtol * a.abs()
            near_alt = torch.isfinite(a) & (err_alt <= tol_alt)
            err = torch.where(near_alt, torch.minimum(err, err_alt), err)
            tol = torch.where(near_alt, torch.maximum(tol, tol_alt), tol)
        bad = torch.where(finite, ~(err <= tol), ~((o == r) | (torch.isnan(o) & torch.isnan(r))))
        if finite.any():
            e = err[finite]
            e_max = float(e.max()) if torch.isfinite(e).all() else float("inf")
            max_abs = max(max_abs, e_max)
            big = finite & (r.abs() > atol * scale)
            if big.any():
                rel = (err[big] / r[big].abs())
                max_rel = max(max_rel, float(rel.max()) if torch.isfinite(rel).all()
                              else float("inf"))
        if bad.any():
            n_bad = int(bad.sum())
            n_nan = int((bad & torch.isnan(o)).sum())
            first = int(bad.flatten().nonzero()[0])
            msg = (f"{label} {list(want_shape)}: {n_bad} of {bad.numel()} elements outside "
                   f"atol {atol:g}*{scale:.3g} + rtol {rtol:g}"
                   + (" of the exact result and of the policy's own arithmetic"
                      if alt is not None else ""))
            if n_nan:
                msg += f" ({n_nan} of them NaN: never written, or NaN computed)"
            msg += (f"; first at {_index_text(first, want_shape)}: got "
                    f"{o.flatten()[first].item():.6g}, expected {r.flatten()[first].item():.6g}")
            if len(want_shape) >= 2:
                rows = bad.reshape(want_shape[0], -1).any(dim=1).nonzero().flatten().tolist()
                shown = ", ".join(str(x) for x in rows[:8]) + (", ..." if len(rows) > 8 else "")
                msg += f"; wrong rows (dim 0): {shown} of {want_shape[0]}"
            if finite.any():
                msg += f"; max abs err {float(err[finite].max()):.3g}"
            return _Comparison(False, msg, max_abs, max_rel)
    return _Comparison(True, "", max_abs, max_rel)


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
                     work_dir: str | Path | None = None) -> VerificationRecord:
    """Verify one candidate for a region; never raises for a bad candidate.

    `spec`: a kforge.spec.KernelSpec; `candidate`: a providers.base.Candidate (or its source
    text); `reference`: the oracle (default: kforge.reference.reference_fn(spec, float64));
    `measure`: also time it (record.time_ms, time_noise). When the target's device is not on
    this machine the candidate is only statically checked: status "candidate".
    """
    started = _dt.datetime.now(_dt.timezone.utc)
    source = candidate if isinstance(candidate, str) else candidate.source
    tname = target_name(target)
    policy = get_policy(precision)
    sig = signature_of(spec)
    dynamic_sizes = tuple(dynamic_sizes)
    base = dict(target=tname, precision=policy.name, atol=policy.atol, rtol=policy.rtol,
                triton_version=_triton_version())

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
    if reference is None:
        from kforge.reference import reference_fn
        reference = reference_fn(spec, torch.float64)
        policy_ref = (reference_fn(spec, torch.float64, operand_format=policy.operand_format)
                      if policy.operand_format else None)
    else:
        policy_ref = None
    try:
        checks = _build_checks(sig, reference, device, tuple(seeds), dynamic_sizes, policy_ref)
    except Exception as exc:  # the oracle itself failed: not the candidate's fault
        raise OracleError(f"the reference of region {getattr(spec, 'name', '?')} failed: "
                          f"{type(exc).__name__}: {exc}") from exc
    size_list = []
    for c in checks:
        if c.size not in [s for s, _ in size_list]:
            size_list.append((c.size, sig.results[0].concrete(c.size) if sig.results else ()))
    common = dict(device=device_name(tname), seeds=tuple(c.seed for c in checks),
                  sizes=tuple(s for _, s in size_list),
                  dynamic_sizes=tuple(s for s, _ in size_list) if sig.is_dynamic else (),
                  checks=len(checks))

    tmp_root = Path(work_dir) if work_dir else None
    if tmp_root:
        tmp_root.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix="kforge-verify-", dir=tmp_root))
    try:
        (job_dir / "kernel.py").write_text(source)
        job = {"device": device, "source_path": str(job_dir / "kernel.py"),
               "signature": sig.to_json(),
               "checks": [{"seed": c.seed, "size": c.size, "domain": c.domain} for c in checks],
               "timing": {"reps": timing_reps} if measure else None}
        (job_dir / "job.json").write_text(json.dumps(job))
        limit = timeout_s or DEFAULT_TIMEOUT_S.get(tname, 120.0)
        run = run_worker(job_dir, tname, limit, memory_mb)
        result = _read_json(job_dir / "result.json")
        progress = _read_json(job_dir / "progress.json") or {}
        if result is None:
            where = _progress_text(progress)
            tail = run.stderr_tail.strip()
            if progress.get("stage") in (None, "starting") and not run.timed_out and \
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
            outs = torch.load(job_dir / f"outputs_{i}.pt", weights_only=True)
            cmp = _compare_check(outs, c, sig, policy)
            max_abs, max_rel = max(max_abs, cmp.max_abs), max(max_rel, cmp.max_rel)
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
                              max_abs_err=cmp.max_abs, max_rel_err=cmp.max_rel)
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
            outs = torch.load(job_dir / "outputs_timed.pt", weights_only=True)
            cmp = _compare_check(outs, checks[0], sig, policy)
            if not cmp.ok:
                return record("rejected", "mismatch", "wrong result while being timed: "
                              + cmp.message, **common)
            time_ms, noise, lo, hi = _timing_stats(timing["samples_ms"])
        return record("verified", "", "", max_abs_err=max_abs, max_rel_err=max_rel,
                      time_ms=time_ms, time_noise=noise, time_lo_ms=lo, time_hi_ms=hi,
                      **common)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


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
