"""The builtin's attention regions: a fused flash-attention kernel (kforge.kernels.attention).

An attention region (kforge.kernel_fallbacks) is one `aten.scaled_dot_product_attention` op;
its arguments say what the kernel must compute (mask kind, causal, scale, GQA, the head dims of
queries and keys and of values, which may differ: multi-head latent attention), the policy says
how its products are taken:

| policy | q@k^T and p@v |
|---|---|
| strict | fp32 operands through 3xTF32 (`tf32x3`), then plain fp32 FMA (`ieee`) as the fallback |
| tf32 | TF32 tensor cores, then one fp16 product each on power-of-two-scaled operands (`fp16x1`, fp32 operands only: TF32's 11 significant bits at the 16-bit rate), then 3xTF32 |
| bf16 | bf16 operands with fp32 accumulation, then `fp16x1` (8x finer operand rounding at the same rate), then q@k^T as three fp16 products with one fp16 p@v (`fp16x3`), then 3xTF32 |

Each precision scheme is tried over the target's tile configurations
(`kforge.kernels.attention.attention_configs`), the policy's own scheme first.
"""
from __future__ import annotations

from kforge.kernel_fallbacks import ATTENTION, ATTENTION_KV, SINK_ATTENTION, attention_parameters
from kforge.providers.builtin.emitter import CannotGenerate

# MLIR element types the generators take, and each policy's precision schemes, in order (the
# MoE kernels share both: providers/builtin/moe.py)
OPERAND_DTYPES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
PRECISION_SCHEMES = {
    "strict": [{"dot_precision": "ieee", "fp32_dot": "tf32x3"},
               {"dot_precision": "ieee", "fp32_dot": "ieee"}],
    "tf32": [{"dot_precision": "tf32"}, {"dot_precision": "fp16x1"},
             {"dot_precision": "ieee", "fp32_dot": "tf32x3"}],
    "bf16": [{"dot_precision": "bf16"}, {"dot_precision": "fp16x1"},
             {"dot_precision": "fp16x3"}, {"dot_precision": "ieee", "fp32_dot": "tf32x3"}],
}


def is_attention(spec) -> bool:
    return getattr(spec, "root_kind", "") == "attention" and len(spec.ops) == 1 and \
        getattr(spec.ops[0], "name", "") in (ATTENTION, SINK_ATTENTION, ATTENTION_KV)


def _options(spec, target) -> dict:
    """attention_source keywords fixed by the region (everything but tiles and precision)."""
    p = attention_parameters(spec)
    kv_append = p["key_new"] is not None
    # the kernel's launch takes (q, k, v[, mask][, sinks]), or (q, k, k_new, v, v_new[, mask]
    # [, sinks]) over a cache and the new keys: the operands must come in that order
    head = [p["query"], p["key"], p["key_new"], p["value"], p["value_new"]] if kv_append \
        else [p["query"], p["key"], p["value"]]
    if head != list(range(len(head))):
        raise CannotGenerate("attention: q, k, v must be the first operands")
    order = [i for i in (p["attn_mask"], p["sinks"]) if i is not None]
    n = len(head)
    if order != list(range(n, n + len(order))) or len(spec.args) != n + len(order):
        raise CannotGenerate("attention: unexpected operand order")
    q, k = spec.args[0], spec.args[1]
    if len(q.shape) != 4 or any(s is None for s in q.shape + k.shape):
        raise CannotGenerate("attention: only static 4-d q/k/v are supported")
    if float(p["dropout_p"] or 0.0) != 0.0:
        raise CannotGenerate("attention with dropout")
    dtype = OPERAND_DTYPES.get(q.dtype)
    if dtype is None or any(a.dtype != q.dtype for a in spec.args[1:n]):
        raise CannotGenerate(f"attention on {q.dtype} operands")
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    if kv_append:
        new = spec.args[2]
        if len(new.shape) != 4 or any(s is None for s in new.shape):
            raise CannotGenerate("attention: only static 4-d new keys are supported")
        skv += new.shape[2]
    if p["enable_gqa"]:
        if hq % hkv:
            raise CannotGenerate("attention: query heads not a multiple of kv heads")
        group = hq // hkv
    elif hq != hkv:
        raise CannotGenerate("attention: head counts differ without enable_gqa")
    else:
        group = 1
    if p["is_causal"] and sq != skv and spec.ops[0].name == ATTENTION:
        # torch's is_causal is top-left aligned; the kernel's causal (and kforge.attention's)
        # is bottom-right
        raise CannotGenerate("attention: is_causal with Sq != Skv")
    mask = None
    if p["attn_mask"] is not None:
        m = spec.args[p["attn_mask"]]
        if len(m.shape) > 4:
            raise CannotGenerate("attention: mask of rank > 4")
        mask = "bool" if m.dtype == "i1" else "additive" if m.dtype in OPERAND_DTYPES else None
        if mask is None:
            raise CannotGenerate(f"attention: {m.dtype} mask")
    from kforge.kernels.attention import MAX_HEAD_DIM, head_dim_ok
    if not head_dim_ok(d):
        raise CannotGenerate(f"attention: query head dim {d}: the builtin's kernel takes 1 to "
                             f"{MAX_HEAD_DIM}")
    if k.shape[3] != d:
        raise CannotGenerate(f"attention: query and key head dims differ ({d}, {k.shape[3]})")
    # values may be narrower (or wider) than queries and keys: DeepSeek's multi-head latent
    # attention, queries and keys 192 wide, values 128
    v = spec.args[p["value"]]
    dv = v.shape[3] if len(v.shape) == 4 else None
    if not head_dim_ok(dv):
        raise CannotGenerate(f"attention: value head dim {dv}: the builtin's kernel takes 1 to "
                             f"{MAX_HEAD_DIM}")
    sinks = p["sinks"] is not None
    if sinks and (spec.args[p["sinks"]].shape != (hq,) or spec.args[p["sinks"]].dtype
                  not in OPERAND_DTYPES):
        raise CannotGenerate("attention: sinks must be one float per query head")
    return {"head_dim": d, "value_head_dim": dv, "causal": bool(p["is_causal"]),
            "window": int(p["window"]) or None,
            "scale": p["scale"], "mask": mask, "gqa_group": group, "dtype": dtype,
            "interpret": target.name == "cpu", "sinks": sinks, "kv_append": kv_append,
            "_seq_q": sq}


def attention_space(spec, target, precision: str) -> list[dict]:
    from kforge.kernels.attention import FP16_SPLITS, attention_configs
    opts = _options(spec, target)
    where = "cpu" if target.name == "cpu" else "cuda"
    schemes = PRECISION_SCHEMES.get(precision, PRECISION_SCHEMES["strict"])
    if precision == "bf16" and opts["dtype"] == "fp32" and opts["_seq_q"] <= 16:
        # decoding over an fp32 cache: the time is reading the cache, whatever the products;
        # fp32-accurate ones cost nothing, where bf16-rounded q, k, v (a 2049-key softmax on
        # Llama-3-8B decode) missed the policy's margin on the H200
        schemes = schemes[::-1]
    if opts["dtype"] != "fp32":      # fp16x3 splits fp32 operands, fp16x1 scales them
        schemes = [sc for sc in schemes if sc["dot_precision"] not in FP16_SPLITS]
    space = []
    for scheme in schemes:
        tiles = attention_configs(opts["head_dim"], opts["dtype"], where, seq_q=opts["_seq_q"],
                                  dot_precision=scheme["dot_precision"],
                                  fp32_dot=scheme.get("fp32_dot", "tf32x3"),
                                  value_head_dim=opts["value_head_dim"],
                                  kv_append=opts["kv_append"])
        for tile in tiles:
            space.append({**tile, **scheme})
    return space


def attention_source_for(spec, target, precision: str, config: dict) -> str:
    from kforge.kernels.attention import attention_source
    opts = {k: v for k, v in _options(spec, target).items() if not k.startswith("_")}
    source = attention_source(**opts, **config)
    return f"# region {spec.name}: aten.scaled_dot_product_attention\n" + source


__all__ = ["is_attention", "attention_space", "attention_source_for"]
