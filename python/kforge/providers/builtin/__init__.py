"""The builtin provider: a deterministic Triton code generator plus a rule-based analyst.

`generate` turns the kernel spec into candidates, one per configuration of the target's
configuration space for the region's kernel kind (docs/builtin-provider.md), in a fixed order;
`analyze` compares a measured kernel with its roofline floor and its compile metadata
(registers, spills, shared memory) and names the configurations to try next, which `generate`
then puts first. Regions no template fits get no candidate: the loop runs their reference.
"""
from __future__ import annotations

import json

from kforge.providers.base import Candidate, GenerationRequest, Provider
from kforge.providers.builtin.analyst import analyze_profile, kernel_metadata
from kforge.providers.builtin.attention import attention_source_for, attention_space, is_attention
from kforge.providers.builtin.moe import is_moe, moe_source_for, moe_space
from kforge.providers.builtin.emitter import CannotGenerate
from kforge.providers.builtin.analysis import (FUSED, NARROW, SPLIT, RegionShape, analyze_region,
                                               problem_of)
from kforge.providers.builtin.kernels import generate_source
from kforge.providers.builtin.schemes import (FP16X3, gemm_input_precisions, stage_configs,
                                              tma_configs)
from kforge.selection import above_floor
from kforge.targets import get_target

__all__ = ["BuiltinProvider", "CannotGenerate", "analyze_region", "region_shape",
           "config_space", "generate_source", "candidates", "kernel_metadata"]


def _op_region(spec):
    """(space, source, kind) of a one-op region with a kernel generator of its own (attention,
    mixture of experts; kforge.kernel_fallbacks), else None."""
    if is_attention(spec):
        return attention_space, attention_source_for, "attention"
    if is_moe(spec):
        return moe_space, moe_source_for, "moe"
    return None


def _shape_and_space(spec, target, precision: str) -> tuple[RegionShape | None, list[dict]]:
    """The region's shape (None for a one-op region) and its configuration space; raises
    CannotGenerate where the builtin writes no kernel for the region."""
    shape = None if _op_region(spec) is not None else region_shape(spec, target, precision)
    return shape, config_space(spec, target, precision, shape)


def region_shape(spec, target, precision: str) -> RegionShape:
    """The region's cut (kernels.analyze_region): the fused one where the emitter generates a
    kernel for some configuration of its space, else the first finer one where it does (SPLIT:
    Swin's window reverse permutes a GEMM's rows before its layer norm; NARROW: OLMo-2's q norm
    over rows the head transpose reorders), else the fused one, whose refusals unsupported()
    reports. One cut a region: the configurations of a region the fused cut serves are what
    they were before the finer cuts existed."""
    target = get_target(target)
    fused = analyze_region(spec)
    if not any(st.reductions for st in fused.stages or [fused]):
        return fused
    for cut in (FUSED, SPLIT, NARROW):
        shape = fused if cut == FUSED else analyze_region(spec, cut)
        if _refusals(spec, target, precision, shape,
                     config_space(spec, target, precision, shape)) is None:
            return shape
    return fused


def _refusals(spec, target, precision: str, shape: RegionShape,
              space: list[dict]) -> list[str] | None:
    """None where the emitter generates a kernel for some configuration of `space` in this
    cut (it stops at the first), else what it said for each, without repeats."""
    reasons: list[str] = []
    for config in space:
        try:
            generate_source(spec, target, precision, config, shape)
            return None
        except (CannotGenerate, ValueError) as exc:
            if str(exc) not in reasons:
                reasons.append(str(exc))
    return reasons


def config_space(spec, target, precision: str, shape: RegionShape | None = None) -> list[dict]:
    """Every configuration the builtin provider may try for this region, in its fixed order."""
    target = get_target(target)
    op_region = _op_region(spec)
    if op_region is not None:
        return op_region[0](spec, target, precision)
    shape = shape or region_shape(spec, target, precision)
    if shape.kind == "gemm":
        out, fallback = [], []
        schemes = gemm_input_precisions(spec, target, precision, shape)
        for p in schemes:
            configs = stage_configs(spec, target, precision, shape, p)
            # the persistent TMA kernel's tiles first, where it is wanted and fits the policy's
            # scheme (kernels.tma_eligible; fp16x3 only with KFORGE_BUILTIN_TMA=1), and before
            # them the opt-in kernels asked for (schemes.tma_configs: WS, INSPLIT)
            configs = tma_configs(spec, target, precision, shape, p) + configs
            for c in configs:
                if _accuracy_fallback(precision, p, schemes):
                    fallback.append(dict(c, input_precision=p))
                else:
                    out.append(dict(c, input_precision=p) if p else dict(c))
        # a reduced-precision policy's more accurate schemes (bf16: fp16x1, then fp32 operands;
        # tf32: fp16x3): the first one second, where the loop's next round (or tune's repair)
        # reaches it when the first candidate misses the tolerance; the rest last
        return out[:1] + fallback[:1] + out[1:] + fallback[1:]
    return target.configs(shape.kind, dict(problem_of(spec, shape), precision=precision))


def _accuracy_fallback(precision: str, scheme, schemes: tuple) -> bool:
    """A scheme more accurate than the policy's own, offered for candidates the verifier
    rejects: under bf16 every scheme but bf16 operands (None) and the first (fp16x1 for a
    decode step's GEMMs); under tf32 fp16x3 where it is not already first (an N-major B puts
    it first, for speed)."""
    if precision == "bf16":
        return bool(scheme) and scheme != schemes[0]
    return precision == "tf32" and scheme == FP16X3 and schemes[0] != FP16X3


def _config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def candidates(spec, target, precision: str, configs: list[dict] | None = None, *,
               shaped: tuple | None = None) -> list[Candidate]:
    """Candidates for the given configurations (default: the whole space), in order.
    `shaped`: the region's (shape, space) where the caller has it (_shape_and_space)."""
    target = get_target(target)
    op_region = _op_region(spec)
    try:
        shape, space = shaped or _shape_and_space(spec, target, precision)
    except CannotGenerate:
        return []
    out = []
    for config in configs if configs is not None else space:
        index = next((i for i, c in enumerate(space) if c == config), len(space))
        if index < len(space):
            # the space's own dict (a manifest's config has its keys sorted): the source, its
            # docstring included, is the one the space's order generates
            config = space[index]
        try:
            source = op_region[1](spec, target, precision, config) if shape is None \
                else generate_source(spec, target, precision, config, shape)
        except (CannotGenerate, ValueError):
            continue
        kind = op_region[2] if shape is None else shape.kind
        out.append(Candidate(id=candidate_id_prefix(spec.hash, precision, target.name)
                             + str(index),
                             provider="builtin", source=source, config=config,
                             notes=f"{kind} kernel, config {index} of {len(space)}"))
    return out


XCOMPILE_TRIES = 4     # configurations compiled for the absent GPU before giving up on a clean one


def _screen_here(target) -> bool:
    """Compile candidates for the target's GPU before proposing them: where its device is
    absent and its compiler is here (Target.screens_candidates), unless KFORGE_XCOMPILE=0."""
    try:
        return target.screens_candidates()
    except Exception:   # noqa: BLE001 - the screen must never stop a compile
        return False


def _screened(spec, target, precision: str, eligible: list[dict], want: int,
              shaped: tuple) -> list[Candidate]:
    """Where the GPU is absent nothing can be timed, but everything can be compiled for it
    (Target.cross_compile): propose, in the usual order, configurations whose kernels compile
    for the target's architecture without register spills (where the compiler reports them;
    op regions too: gpt-oss's prefill MoE kernel took its first configuration, whose up
    projection spills, and ran at about 10x its floor on the H200);
    after XCOMPILE_TRIES without one, the first in order. The screen's finding goes into the
    candidate's notes."""
    from kforge.crosscompile import candidate_job
    shape = shaped[0]
    if shape is not None and shape.kind == "gemm" and precision in ("bf16", "tf32"):
        # the more accurate schemes are for a rejected kernel, not for a spill
        schemes = gemm_input_precisions(spec, target, precision, shape)
        accurate = [c for c in eligible
                    if _accuracy_fallback(precision, c.get("input_precision"), schemes)]
        eligible = [c for c in eligible if c not in accurate] + accurate
    picked, fallback = [], []
    for config in eligible[:XCOMPILE_TRIES + want - 1]:
        found = candidates(spec, target, precision, [config], shaped=shaped)
        if not found:
            continue
        cand = found[0]
        try:
            reports = target.cross_compile([candidate_job(cand.source, spec,
                                                          name=f"r{spec.hash}")])[0]
        except Exception:   # noqa: BLE001 - the screen must never stop a compile
            return candidates(spec, target, precision, eligible[:want], shaped=shaped)
        spills = sum((r.spill_stores or 0) for r in reports)
        errors = [r for r in reports if not r.ok]
        mma = next((r.mma for r in reports if r.mma), "")
        what = f"{target.label} compile ({reports[0].compiler or 'local Triton'}): " + (
            f"{len(errors)} kernel(s) failed: {errors[0].error.splitlines()[0][:160]}" if errors
            else f"matrix unit {mma or 'none'}" + (
                f", registers {max((r.registers or 0) for r in reports)}, spills {spills} bytes"
                if any(r.registers is not None for r in reports) else
                f", SPIR-V {sum(r.spirv_bytes or 0 for r in reports)} bytes, registers not "
                "reported"))
        cand = Candidate(cand.id, cand.provider, cand.source, cand.config,
                         notes=f"{cand.notes}; {what}")
        if not errors and spills == 0:
            picked.append(cand)
            if len(picked) >= want:
                return picked
        else:
            fallback.append(cand)
    return (picked + fallback)[:want] if picked or fallback else \
        candidates(spec, target, precision, eligible[:want], shaped=shaped)


def candidate_id_prefix(spec_hash: str, precision: str, target_name: str) -> str:
    """A builtin candidate's id less its index in the configuration space."""
    return f"builtin-{spec_hash}-{precision}-{target_name}-c"


def _after_mismatches(order: list[dict], space: list[dict], feedback, spec_hash: str,
                      precision: str, target_name: str) -> list[dict]:
    """Configurations whose product scheme (`input_precision`: bf16 operands, fp16x1, tf32...)
    already gave a mismatch go last: another tile of the same scheme rounds the same operands
    the same way, so the next try is a more accurate scheme (on Llama-3-8B decode's GEMM +
    RMSNorm regions, K = 4096 and 14336, bf16 operands alone exceed the bf16 policy's margin;
    fp16x1 products are as fast and 8x finer)."""
    prefix = candidate_id_prefix(spec_hash, precision, target_name)
    failed = set()
    for f in feedback:
        if f.status == "mismatch" and f.candidate_id.startswith(prefix):
            idx = f.candidate_id[len(prefix):]
            if idx.isdigit() and int(idx) < len(space):
                failed.add(_scheme(space[int(idx)]))
    if not failed:
        return order
    keep = [c for c in order if _scheme(c) not in failed]
    return keep + [c for c in order if _scheme(c) in failed]


def _scheme(config: dict) -> tuple:
    """How a configuration rounds its products: a GEMM's `input_precision`, attention's
    `dot_precision` and `fp32_dot` (the tiles aside)."""
    return tuple(config.get(k) for k in ("input_precision", "dot_precision", "fp32_dot"))


class BuiltinProvider(Provider):
    name = "builtin"

    def generate(self, request: GenerationRequest) -> list[Candidate]:
        target = get_target(request.target)
        spec = request.spec
        try:
            shape, space = _shape_and_space(spec, target, request.precision)
        except CannotGenerate:
            return []
        tried = {f.candidate_id for f in request.feedback} | set(request.tried)
        if request.best is not None:
            tried.add(request.best.id)
        wanted: list[dict] = []
        for f in request.feedback:                   # the analyst's picks first
            for rec in f.recommendations:
                if rec.startswith("config: "):
                    try:
                        wanted.append(json.loads(rec[len("config: "):].split("  #")[0]))
                    except json.JSONDecodeError:
                        pass
        order = _after_mismatches(wanted + space, space, request.feedback, spec.hash,
                                  request.precision, target.name)
        seen: set[str] = set()
        eligible = []
        for config in order:
            key = _config_key(config)
            if key in seen:
                continue
            seen.add(key)
            idx = next((i for i, c in enumerate(space) if _config_key(c) == key), None)
            if idx is None:
                continue
            cid = candidate_id_prefix(spec.hash, request.precision, target.name) + str(idx)
            if cid in tried or not above_floor(config, request.precision, request.finer_than):
                continue
            eligible.append(config)
        if _screen_here(target):
            return _screened(spec, target, request.precision, eligible, request.num_candidates,
                             (shape, space))
        return candidates(spec, target, request.precision, eligible[:request.num_candidates],
                          shaped=(shape, space))

    def unsupported(self, request: GenerationRequest) -> str | None:
        target = get_target(request.target)
        try:
            shape, space = _shape_and_space(request.spec, target, request.precision)
        except CannotGenerate as exc:
            return str(exc)
        if shape is None:
            return None
        # the region's shape is one the builtin knows, but its emitter may still refuse every
        # configuration (an output it cannot store from the kernel's tile): say what it said
        reasons = _refusals(request.spec, target, request.precision, shape, space)
        if reasons is None:
            return None
        return "; ".join(reasons) if reasons else "no configuration fits the region"

    def analyze(self, request: GenerationRequest, profile: dict) -> tuple[str, ...]:
        target = get_target(request.target)
        if _op_region(request.spec) is not None:
            return ()           # the loop times every tile configuration in order
        try:
            shape, space = _shape_and_space(request.spec, target, request.precision)
        except CannotGenerate:
            return ()
        return analyze_profile(request.spec, target, request.precision, shape, space, profile)
