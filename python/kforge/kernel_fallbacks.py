"""Fallback ops that get kernels: attention, and mixture-of-experts layers.

Most fallback ops (docs/fallback-ops.md) are memory-bound glue that PyTorch runs as fast as
anyone: gathers, scans, concatenation. Attention is not: it is a large share of a transformer's
time, and its linalg form (two contractions around a masked softmax, with the all-masked-row
handling of PyTorch's decomposition) is a poor fit for a region. So the frontend keeps
`aten.scaled_dot_product_attention` whole, as a fallback op, and here each such host-plan step
becomes a *single-op region*: a kernel spec whose one op is the fallback op itself.

    host plan step  {"op": "fallback", "name": "aten.scaled_dot_product_attention", ...}
      ─► regions/<hash>.json  (root_kind "attention"; its reference is torch's own SDPA)
      ─► host plan step {"call": "<hash>", ...}

From there it is a region like any other: the synthesis loop asks the provider for kernels
(the builtin writes a fused flash-attention Triton kernel, `kforge.kernels.attention`), the
verifier checks them against the reference — PyTorch's SDPA in float64 — on fresh inputs, the
cache and the manifest keep the verified one, and a region without one runs torch's SDPA: at
PyTorch's speed, never slower. Needs only torch.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from kforge.spec import (SCHEMA_VERSION, Arg, CallStep, FallbackOp, GenericOp, HostPlan,
                         KernelSpec, Value, load_host_plan, to_json)

ATTENTION = "aten.scaled_dot_product_attention"
SINK_ATTENTION = "kforge.attention"          # kforge.attention_op: attention with sinks
ATTENTION_KV = "kforge.attention_kv"         # kforge.attention_op: over a cache + new keys
MOE = "kforge.moe_experts"                   # kforge.moe_op: experts over routed tokens
KERNEL_FALLBACKS = {ATTENTION: "attention", SINK_ATTENTION: "attention",
                    ATTENTION_KV: "attention", MOE: "moe"}


def attention_flops(q_shape, k_shape, value_head_dim: int | None = None, causal: bool = False,
                    window: int = 0) -> int:
    """QK^T and PV: 2 * B * Hq * pairs * (D + Dv) (Dv: the values' head dim, default D), where
    pairs is Sq * Skv, or under `causal`/`window` the (query, key) pairs of the band
    (bottom-right aligned, as kforge.attention_op defines it), which is all the kernel
    computes."""
    b, h, sq, d = (s or 1 for s in q_shape)
    skv = k_shape[-2] or 1
    pairs = sq * skv
    if causal or window:
        off = skv - sq
        pairs = sum(max(0, (min(skv - 1, i + off) if causal else skv - 1) -
                        (max(0, i + off - window + 1) if window else 0) + 1)
                    for i in range(sq))
    return 2 * b * h * pairs * (d + (value_head_dim or d))


def _band_of(op: FallbackOp) -> tuple[bool, int]:
    """(causal, window) of an attention fallback op: SDPA's is_causal (top-left aligned: the
    same band where Sq == Skv, the only case the kernel takes), or kforge.attention's causal
    and window."""
    values = _attention_arguments(op)
    return bool(values["is_causal"]), int(values["window"] or 0)


def moe_flops(x_shape, index_shape, weight_shape, w1_shape, b1_shape, w2_shape) -> int:
    """The routed pairs' two products: 2 * T*K * H * 2I + 2 * T*K * I * H."""
    pairs = (index_shape[0] or 1) * (index_shape[1] or 1)
    hidden, inter = (w1_shape[1] or 1), (w2_shape[1] or 1)
    return 2 * pairs * hidden * 2 * inter + 2 * pairs * inter * hidden


def promote(plan: HostPlan) -> tuple[HostPlan, list[KernelSpec]]:
    """The plan with every kernel-backed fallback step replaced by a call of a one-op region,
    and those regions' specs."""
    steps, specs = [], []
    producers = {r: s for s in plan.steps for r in getattr(s, "results", ())}
    for step in plan.steps:
        kind = KERNEL_FALLBACKS.get(step.name) if isinstance(step, FallbackOp) else None
        if kind is None:
            steps.append(step)
            continue
        spec = _region_of(plan, step, kind, producers)
        specs.append(spec)
        steps.append(CallStep(spec.hash, step.operands, step.results))
    return replace(plan, steps=tuple(steps)), specs


def _weight_of(plan: HostPlan, name: str, producers: dict) -> str | None:
    """The weight that the value `name` is: a weight input of the plan, or one read through
    transposes (which the host plan runs as views: kforge.reference). A transformers MoE's
    experts read their nn.Linear-oriented weights transposed (kforge.moe_op). Tagged, the
    runtime and the verifier give such an argument to the kernel's `prepare_weights` once
    (the MoE kernel's fp16 split planes) instead of the kernel re-storing it at every call."""
    from kforge.reference import _is_permutation, _moves_only   # what runs them as views
    for _ in range(8):                        # a chain of transposes is short
        t = plan.tensor(name)
        if isinstance(t, Arg):
            return t.weight
        op = producers.get(name)
        if not isinstance(op, GenericOp) or op.reduction_dims or op.num_inputs != 1 \
                or len(op.results) != 1 or not _moves_only(op, [0]):
            return None
        n = len(op.iterator_types)
        if not all(_is_permutation(m, n) for m in op.indexing_maps):
            return None                       # a broadcast or a slice, not a transpose
        name = op.operands[0]
    return None


def _region_of(plan: HostPlan, step: FallbackOp, kind: str, producers: dict) -> KernelSpec:
    args = []
    for i, name in enumerate(step.operands):
        t = plan.tensor(name)
        weight = _weight_of(plan, name, producers) if kind == "moe" else None
        args.append(Arg(f"arg{i}", tuple(t.shape), t.dtype, weight))
    values = []
    for j, name in enumerate(step.results):
        t = plan.tensor(name)
        values.append(Value(f"v{j}", tuple(t.shape), t.dtype))
    # one argument a position, also where one value fills two (a MoE's two zero biases of one
    # shape are one constant after export; attention(x, x, x)): the op reads its own argument
    # at each position, as the kernel does
    op = FallbackOp(step.name, tuple(a.name for a in args),
                    tuple(v.name for v in values), step.args, step.symbol)
    k_shape = args[1].shape
    if step.name == ATTENTION_KV and len(args) > 2:        # the cache, then the new keys
        k_shape = k_shape[:-2] + ((k_shape[-2] or 0) + (args[2].shape[-2] or 0), k_shape[-1])
    flops = attention_flops(args[0].shape, k_shape, values[0].shape[-1] if values else None,
                            *_band_of(op)) \
        if kind == "attention" else \
        moe_flops(*(a.shape for a in args[:6])) if kind == "moe" and len(args) >= 6 else 0
    elem = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i1": 1}
    min_bytes = sum(_numel(t.shape) * elem.get(t.dtype, 4) for t in args + values)
    # a weight tag changes what the runtime and the verifier do with an argument (its
    # prepare_weights), so it is part of the region's identity; untagged args hash as before
    body = {"kind": kind, "name": step.name,
            "args": [[a.shape, a.dtype] + (["weight"] if a.weight else []) for a in args],
            "results": [[v.shape, v.dtype] for v in values], "template": step.args}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=list).encode())
    h = digest.hexdigest()[:16]
    return KernelSpec(hash=h, name=f"kforge_{kind}_{h}", args=tuple(args), values=tuple(values),
                      ops=(op,), results=tuple(v.name for v in values), root_kind=kind,
                      fused=(step.name.split(".", 1)[1],), flops=flops, min_bytes=min_bytes,
                      version=SCHEMA_VERSION)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s or 1
    return n


def promote_regions_dir(regions_dir: str | Path) -> list[str]:
    """Rewrites `regions_dir/host_plan.json` in place and writes the new regions' specs beside
    it; returns their hashes. Idempotent: a promoted plan has no kernel-backed fallbacks left."""
    regions_dir = Path(regions_dir)
    plan_path = regions_dir / "host_plan.json"
    if not plan_path.is_file():
        return []
    plan = load_host_plan(plan_path)
    new_plan, specs = promote(plan)
    if not specs:
        return []
    for spec in specs:
        to_json(spec, regions_dir / f"{spec.hash}.json")
    to_json(new_plan, plan_path)
    return [s.hash for s in specs]


def attention_parameters(spec: KernelSpec) -> dict:
    """What an attention region computes, from its fallback op's argument list:
    sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
    enable_gqa=False)."""
    op = spec.ops[0]
    if not isinstance(op, FallbackOp) or op.name not in (ATTENTION, SINK_ATTENTION,
                                                         ATTENTION_KV):
        raise ValueError(f"{spec.name} is not an attention region")
    values = _attention_arguments(op)
    tensor_index = {f"@{i}": i for i in range(len(op.operands))}
    for key in ("query", "key", "key_new", "value", "value_new", "attn_mask", "sinks"):
        v = values[key]
        values[key] = tensor_index.get(v) if isinstance(v, str) else None
    return values


# kforge.attention_op's ops' arguments, in order, with their defaults (kforge.attention's
# `causal` under SDPA's name, is_causal)
_SINK_ARGS = {"query": None, "key": None, "value": None, "attn_mask": None, "sinks": None,
              "scale": None, "is_causal": False, "window": 0}
_KV_ARGS = {"query": None, "key": None, "key_new": None, "value": None, "value_new": None,
            "attn_mask": None, "sinks": None, "scale": None}


def _attention_arguments(op: FallbackOp) -> dict:
    """An attention fallback op's arguments by name, every op's names present (defaults
    filled in); tensors as the markers "@i" of the op's i-th operand."""
    from kforge.attention_op import SDPA_ARGS
    from kforge.fallbacks import build_args
    args = build_args(op.arg_list(), [f"@{i}" for i in range(len(op.operands))], None)
    table = {SINK_ATTENTION: _SINK_ARGS, ATTENTION_KV: _KV_ARGS}.get(op.name, SDPA_ARGS)
    values = {**SDPA_ARGS, **_SINK_ARGS, **_KV_ARGS, **table, **dict(zip(table, args))}
    if op.name in (SINK_ATTENTION, ATTENTION_KV):   # k and v may have fewer heads than q
        values["enable_gqa"] = True
    return values


def is_kernel_fallback(spec) -> bool:
    return len(spec.ops) == 1 and isinstance(spec.ops[0], FallbackOp) and \
        spec.ops[0].name in KERNEL_FALLBACKS


def compare_with_pytorch(entry: dict, spec, target: str) -> dict:
    """A kernel-backed fallback keeps its kernel only where the kernel beats the op it replaces:
    the region's reference *is* PyTorch's op, so it is timed on the same device and inputs
    drawn the verifier's way (triton.testing.do_bench, as candidates are timed), and the
    entry records `pytorch_ms` and `faster_than_pytorch`; the runtime runs the reference when
    the kernel is not faster. Nothing is timed on the cpu target (the interpreter)."""
    if target == "cpu" or not is_kernel_fallback(spec) or not entry.get("time_ms") or \
            (entry.get("verification") or {}).get("status") != "verified":
        return entry
    import torch
    import triton.testing

    from kforge.reference import reference_fn
    from kforge.verify.inputs import make_inputs, signature_of
    if not torch.cuda.is_available():
        return entry
    args = [t.cuda() for t in make_inputs(signature_of(spec), 1, 8)]
    fn = reference_fn(spec)
    with torch.no_grad():
        ms = float(triton.testing.do_bench(lambda: fn(*args)))
    entry["pytorch_ms"] = ms
    entry["faster_than_pytorch"] = bool(entry["time_ms"] < ms)
    return entry


__all__ = ["ATTENTION", "ATTENTION_KV", "KERNEL_FALLBACKS", "promote", "promote_regions_dir",
           "attention_parameters", "attention_flops", "compare_with_pytorch",
           "is_kernel_fallback"]
