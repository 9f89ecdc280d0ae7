"""The builtin's mixture-of-experts regions: grouped GEMMs over the routed tokens
(kforge.kernels.moe).

An MoE region (kforge.kernel_fallbacks) is one `kforge.moe_experts` op (kforge.moe_op); its
arguments say the activation and its constants, the operands' shapes the experts and top-k.
The policy says how the products are taken:

| policy | x @ w1 and h @ w2 (fp32 model) |
|---|---|
| strict | 3xTF32 (`tf32x3`), then plain fp32 FMA |
| tf32 | TF32, then 3xTF32 |
| bf16 | bf16 operands with fp32 accumulation, then 3xTF32 |

A 16-bit model multiplies on its own tensor cores under every policy.
"""
from __future__ import annotations

from kforge.kernel_fallbacks import MOE
from kforge.providers.builtin.attention import OPERAND_DTYPES, PRECISION_SCHEMES
from kforge.providers.builtin.emitter import CannotGenerate

def is_moe(spec) -> bool:
    return getattr(spec, "root_kind", "") == "moe" and len(spec.ops) == 1 and \
        getattr(spec.ops[0], "name", "") == MOE


def _options(spec, target) -> dict:
    from kforge.fallbacks import build_args
    op = spec.ops[0]
    markers = [f"@{i}" for i in range(len(op.operands))]
    args = build_args(op.arg_list(), markers, None)
    if args[:7] != markers[:7] or len(spec.args) != 7:
        raise CannotGenerate("moe: expected the operands x, index, weight, w1, b1, w2, b2")
    activation, alpha, limit = args[7], args[8], args[9]
    x, index, _, w1, _, w2, _ = spec.args
    if any(s is None for a in spec.args for s in a.shape):
        raise CannotGenerate("moe: only static shapes are supported")
    dtype = OPERAND_DTYPES.get(x.dtype)
    if dtype is None or any(a.dtype != x.dtype for a in (w1, w2)):
        raise CannotGenerate(f"moe on {x.dtype} operands")
    if index.dtype not in ("i64", "i32"):
        raise CannotGenerate(f"moe: {index.dtype} expert ids")
    return {"num_experts": w1.shape[0], "top_k": index.shape[1], "activation": activation,
            "alpha": float(alpha), "limit": float(limit), "dtype": dtype,
            "interpret": target.name == "cpu", "_rows": x.shape[0] * index.shape[1]}


def moe_space(spec, target, precision: str) -> list[dict]:
    from kforge.kernels.moe import moe_configs
    opts = _options(spec, target)
    where = "cpu" if target.name == "cpu" else "cuda"
    rows_per_expert = opts["_rows"] // max(1, opts["num_experts"])
    space = []
    for scheme in PRECISION_SCHEMES.get(precision, PRECISION_SCHEMES["strict"]):
        for tile in moe_configs(opts["dtype"], where, rows=rows_per_expert):
            space.append({**tile, **scheme})
    return space


def moe_source_for(spec, target, precision: str, config: dict) -> str:
    from kforge.kernels.moe import moe_source
    opts = {k: v for k, v in _options(spec, target).items() if not k.startswith("_")}
    return f"# region {spec.name}: kforge.moe_experts\n" + moe_source(**opts, **config)


__all__ = ["is_moe", "moe_space", "moe_source_for"]
