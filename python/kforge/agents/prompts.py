"""The words the agents read.

A generation prompt has three parts, ordered from most to least stable so that prompt caching
pays: the fixed instructions (same for every region and round), the region's context (same for
every round of one region: IR, reference, shapes, precision, target) and the round itself (best
kernel so far, last round's feedback, cross-target reference).
"""
from __future__ import annotations

import json
from typing import Any

from kforge.providers.base import Candidate, Feedback, GenerationRequest

PRECISION_CONTRACTS = {
    "strict": "fp32 results, verified with atol = rtol = 1e-4. Tensor cores only through "
              "fp32-accurate emulation: tl.dot(..., input_precision=\"tf32x3\"), or operands split "
              "into hi + lo parts (weights split once in prepare_weights) and three products. "
              "Plain TF32 or bf16 dots fail verification.",
    "tf32": "TF32 tensor cores allowed (tl.dot(..., input_precision=\"tf32\")), or fp16 "
            "operands scaled by powers of two (per row of A, per column of B; the same 11 "
            "significant bits at twice the rate), fp32 accumulation, verified with atol = "
            "rtol = 1e-2.",
    "bf16": "bf16 operands with fp32 accumulation allowed; weights may be cast once in "
            "prepare_weights; verified with atol = rtol = 1e-2 against the fp32 reference.",
}

_RULES = """\
Rules (the verifier enforces them; a candidate that breaks one is rejected):
- Every result element is computed by your Triton kernel(s). torch may allocate outputs
  (torch.empty, torch.empty_like), make views and read sizes/strides; it must not compute
  (no torch.matmul, F.*, tensor arithmetic, .sum(), etc.), not even as a fallback.
- No try/except around the kernel, no state kept between calls (no caches of inputs or results,
  no globals written by launch), inputs are never modified.
- Write every output element: outputs are poisoned with NaN before each check. Mask the tails:
  sizes need not be multiples of your block sizes, and a dynamic dimension is checked at a
  second size.
- Checks use fresh random inputs with mixed signs and magnitudes, several seeds."""

_FORMAT = """\
Answer format: a few sentences on your approach, then the complete module in ONE fenced block
```python
import torch
import triton
import triton.language as tl
...
def launch(...):
    ...
```
When asked for several candidates, give one complete ```python block per candidate, each
self-contained. Put tuning choices (block sizes, num_warps, num_stages) in the code itself."""

_TOOLS = """\
Tools, when offered: compile_kernel, verify_kernel and time_kernel run your source through the
project's own compiler, verifier and timer on the target. Use them instead of guessing: verify
before you answer, and in optimization rounds time your candidate against the incumbent. Your
final answer must still contain the complete module as a ```python block."""


def generation_instructions() -> str:
    """The fixed part of every generation prompt (cacheable across regions and rounds)."""
    return "\n\n".join([
        "You are an expert GPU kernel engineer. You write Triton kernels that replace one fused "
        "region of a model's linalg IR. Each region is a small function: its arguments, its "
        "MLIR, a PyTorch reference that is the correctness oracle, and the precision policy the "
        "user chose. Your kernel must match the reference within that policy's tolerance and be "
        "as fast as the target allows.",
        "The candidate contract (a kernel is a Python module):\n" + _contract(),
        _RULES, _FORMAT, _TOOLS])


def _contract() -> str:
    doc = Candidate.__doc__ or ""
    return "\n".join(line.strip() for line in doc.strip().splitlines())


def region_context(request: GenerationRequest) -> str:
    """The per-region part (cacheable across the rounds of one region)."""
    parts = [
        "# The region\n" + describe_spec(request.spec),
        f"# Precision policy: {request.precision}\n"
        + PRECISION_CONTRACTS.get(request.precision, request.precision) + _dot_note(request),
        "# Target\n" + describe_target(request.target),
        "# Region MLIR (linalg on tensors)\n```mlir\n" + request.region_mlir.strip() + "\n```",
        "# PyTorch reference (the correctness oracle)\n```python\n"
        + request.reference_source.strip() + "\n```",
    ]
    return "\n\n".join(parts)


def _dot_note(request: GenerationRequest) -> str:
    allowed = getattr(request.target, "dot_input_precisions", None)
    if not callable(allowed):
        return ""
    try:
        values = allowed(request.precision)
    except Exception:  # noqa: BLE001 - a prompt can do without it
        return ""
    spelled = ", ".join("bf16 operands (cast)" if v is None else f'input_precision="{v}"'
                        for v in values)
    return f"\nOn this target, tl.dot on fp32 operands may use: {spelled}."


def round_prompt(request: GenerationRequest, notes: tuple[str, ...] = ()) -> str:
    """The per-round part: the task, the incumbent, the feedback."""
    n = request.num_candidates
    want = "one candidate" if n == 1 else f"{n} different candidates"
    if request.phase == "functional":
        task = (f"Round {request.round}, functional pass: write {want} that passes verification. "
                "Correctness first; a simple, clearly correct kernel is a good answer.")
    else:
        task = (f"Round {request.round}, optimization pass: write {want} faster than the "
                "incumbent below while still passing verification. Follow the recommendations "
                "where they make sense.")
    parts = [task]
    if request.best is not None:
        parts.append(_incumbent(request))
    if request.feedback:
        parts.append("# Feedback from the last round\n"
                     + "\n\n".join(describe_feedback(f) for f in request.feedback))
    for note in notes:
        parts.append("# Note\n" + note)
    ref = request.cross_target_reference
    if ref is not None:
        other = (ref.config or {}).get("target", "another target")
        parts.append(
            f"# A verified kernel for the same region on {other} (reference)\n"
            "It is correct for that target. Reuse its decomposition and indexing; adapt block "
            "sizes, warps and target-specific instructions to this target.\n"
            f"```python\n{ref.source.strip()}\n```")
    return "\n\n".join(parts)


def floor_ms(request: GenerationRequest) -> float | None:
    """The region's roofline floor on the request's target, when the target can say."""
    floor = getattr(request.target, "floor_ms", None)
    flops, nbytes = _get(request.spec, "flops", 0), _get(request.spec, "min_bytes", 0)
    if not callable(floor) or not (flops or nbytes):
        return None
    try:
        return float(floor(flops, nbytes, request.precision))
    except Exception:  # noqa: BLE001 - a prompt can do without it
        return None


def _incumbent(request: GenerationRequest) -> str:
    best = request.best
    timing = ""
    for f in request.feedback:
        if f.candidate_id == best.id and f.time_ms is not None:
            timing = f" It runs in {f.time_ms:.4g} ms"
            floor = f.floor_ms or floor_ms(request)
            if floor:
                timing += f" (roofline floor {floor:.4g} ms, {f.time_ms / floor:.2f}x)"
            timing += "."
    return (f"# Best verified kernel so far ({best.provider}, id {best.id})\n"
            f"It passes verification.{timing} Improve on it; do not regress correctness.\n"
            f"```python\n{best.source.strip()}\n```")


def describe_feedback(f: Feedback) -> str:
    head = f"- candidate {f.candidate_id}: {f.status.upper()}"
    if f.time_ms is not None:
        head += f", {f.time_ms:.4g} ms"
        if f.floor_ms:
            head += f" (floor {f.floor_ms:.4g} ms, {f.time_ms / f.floor_ms:.2f}x)"
    lines = [head]
    if f.message:
        lines.append("  " + f.message.strip().replace("\n", "\n  "))
    if f.recommendations:
        lines.append("  Recommendations:")
        lines.extend(f"  * {r}" for r in f.recommendations)
    return "\n".join(lines)


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def describe_spec(spec: Any) -> str:
    """Name, kind, arguments, results, flops and bytes of a kernel spec (dataclass or dict)."""
    lines = [f"name: {_get(spec, 'name', '?')}  (hash {_get(spec, 'hash', '?')})",
             f"kind: {_get(spec, 'root_kind', '?')}; fused ops: "
             f"{', '.join(_get(spec, 'fused', ()) or ()) or '?'}"]
    args = _get(spec, "args", ()) or ()
    lines.append("arguments, in launch() order (shape: None = dynamic):")
    for i, a in enumerate(args):
        shape = list(_get(a, "shape", ()) or ())
        weight = _get(a, "weight")
        role = (f"  model weight '{weight}': the same tensor at every call; prepare_weights "
                "may transform it once") if weight else ""
        lines.append(f"  {i}: {_get(a, 'name', f'arg{i}')}  {_get(a, 'dtype', '?')}{shape}{role}")
    values = {_get(v, "name"): v for v in (_get(spec, "values", ()) or ())}
    results = _get(spec, "results", ()) or ()
    lines.append("results, returned by launch() as a tuple in this order:")
    for r in results:
        v = values.get(r, {})
        lines.append(f"  {r}  {_get(v, 'dtype', '?')}{list(_get(v, 'shape', ()) or ())}")
    flops, nbytes = _get(spec, "flops"), _get(spec, "min_bytes")
    if flops is not None or nbytes is not None:
        lines.append(f"work: {flops} flops, {nbytes} bytes minimum traffic (dynamic dimensions "
                     "counted as 1)")
    return "\n".join(lines)


def describe_target(target: Any) -> str:
    if target is None:
        return "unknown"
    describe = getattr(target, "describe", None)
    text = describe() if callable(describe) else target
    if isinstance(text, str):
        return text
    return json.dumps(text, indent=1, default=str)


# --- The performance-analysis agent -------------------------------------------------------

def analysis_instructions() -> str:
    return (
        "You are a GPU performance engineer. You read the profile of one verified Triton kernel "
        "(kforge.profile JSON: its time and spread, its roofline position: achieved FLOP/s and "
        "bytes/s against the policy's peaks; Triton's compile metadata per kernel: registers, "
        "spills, shared memory, warps, stages; code facts: wgmma, TMA, DPAS, load widths; and "
        "Nsight Compute counters when present: DRAM and L2 throughput, tensor-pipe and SM "
        "utilization, achieved occupancy, top warp stalls, L2 hit rate; sources marked absent "
        "were not measured, which is not zero) and say what limits it and what to change next. "
        "Be concrete and quantitative: name block sizes, warps, stages, memory layouts, "
        "precision tricks allowed by the policy. Rank the changes by expected gain, most "
        "promising first, and give each the profile numbers it rests on as its evidence (e.g. "
        "\"DRAM 91% of peak, FLOP/s 40% of peak\"). Do not recommend anything the precision "
        "policy forbids or that computes results outside Triton. Answer by calling "
        "report_analysis.")


def analysis_prompt(request: GenerationRequest, profile: dict) -> str:
    profile = dict(profile)
    source = profile.pop("source", None) or (request.best.source if request.best else None)
    tried = profile.pop("tried_configs", None) or ()
    summary = ""
    if profile.get("schema"):
        from kforge.profiling.report import for_prompt, summarize
        from kforge.profiling.schema import Profile
        try:
            summary = summarize(Profile.from_json(profile))
        except Exception:  # noqa: BLE001 - the JSON below still says it all
            summary = ""
        profile = for_prompt(profile)
    if not profile.get("floor_ms"):
        profile["floor_ms"] = floor_ms(request)
    time_ms, floor = profile.get("time_ms"), profile.get("floor_ms")
    parts = [f"Region {_get(request.spec, 'name', '?')}, precision {request.precision}.\n"
             + PRECISION_CONTRACTS.get(request.precision, "")]
    if time_ms and floor:
        parts.append(f"Measured {time_ms:.4g} ms against a roofline floor of {floor:.4g} ms: "
                     f"{time_ms / floor:.2f}x the floor.")
    parts.append("# Region\n" + describe_spec(request.spec))
    parts.append("# Target\n" + describe_target(request.target))
    if summary:
        parts.append("# Profile in numbers\n" + summary)
    parts.append("# Profile\n```json\n" + json.dumps(profile, indent=1, default=str) + "\n```")
    if tried:
        parts.append(f"# Tried already ({len(tried)} configurations)\n"
                     + "\n".join(json.dumps(c, sort_keys=True) for c in tried[-12:]))
    if source:
        parts.append("# Kernel\n```python\n" + source.strip() + "\n```")
    return "\n\n".join(parts)


def format_recommendation(limiter: str, rec: dict) -> str:
    """One recommendation as the line the generation agent reads in Feedback.recommendations."""
    gain = rec.get("expected_gain", "?")
    text = f"[{limiter}] {rec.get('change', '').strip()} (expected gain: {gain})"
    if rec.get("rationale"):
        text += f" — {rec['rationale'].strip()}"
    if rec.get("evidence"):
        text += f" [evidence: {rec['evidence'].strip()}]"
    return text
