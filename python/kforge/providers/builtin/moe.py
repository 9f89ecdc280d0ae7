"""The builtin's mixture-of-experts regions: grouped GEMMs over the routed tokens
(kforge.kernels.moe).

An MoE region (kforge.kernel_fallbacks) is one `kforge.moe_experts` op (kforge.moe_op); its
arguments say the activation and its constants, the operands' shapes the experts and top-k.
The policy says how the products are taken:

| policy | x @ w1 and h @ w2 (fp32 model) |
|---|---|
| strict | fp16 hi/lo splits, three fp16 products (`fp16x3`), then 3xTF32 (`tf32x3`) |
| tf32 | TF32, then fp16x3 |
| bf16 | fp16x1 (fp16x3's hi planes alone), then fp16x3, then bf16 operands (fp32 accumulation) |

(a region upstream of a router's selection is compiled strict under every policy:
kforge.selection; with KFORGE_SPLIT_UNSELECTED=1 a call of a shared region that reaches no
router is split off at compile time and keeps the policy: kforge.package.split_unselected_calls).
fp16x1 comes first under bf16: in a CPU emulation of gpt-oss-20b's prefill (benchmarks/results/
2026-12-05k-cpu-gptoss-last-experts/) the last layer's experts on fp16x1 left the logits at 0.20
of the bf16 allowance, on bf16 operands at 1.28. On the H100 (2026-12-06, 2026-12-06f-h100-
gptoss-prefill-last-experts) the verifier rejected the fp16x1 kernel for those experts on its
mixed-magnitude inputs (8 of 11.8M elements outside: gpt-oss's clamp at 7 turns the rounding of
pre-activations near it into jumps); a compile with repair rounds goes on to the next scheme.

A 16-bit model multiplies on its own tensor cores under every policy.
"""
from __future__ import annotations

from kforge.kernel_fallbacks import MOE
from kforge.providers.builtin.attention import OPERAND_DTYPES
from kforge.providers.builtin.emitter import CannotGenerate

_FP16X3 = {"dot_precision": "ieee", "fp32_dot": "fp16x3"}
_FP16X1 = {"dot_precision": "ieee", "fp32_dot": "fp16x1"}
_TF32X3 = {"dot_precision": "ieee", "fp32_dot": "tf32x3"}
SCHEMES = {
    "strict": [_FP16X3, _TF32X3],
    "tf32": [{"dot_precision": "tf32"}, _FP16X3],
    "bf16": [_FP16X1, _FP16X3, {"dot_precision": "bf16"}],
}


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
    per_scheme = []
    schemes = SCHEMES.get(precision, SCHEMES["strict"])
    if opts["dtype"] != "fp32":
        schemes = schemes[:1]      # 16-bit operands multiply on their own tensor cores
    for scheme in schemes:
        split = opts["dtype"] == "fp32" and scheme.get("fp32_dot") in ("fp16x3", "fp16x1") \
            and scheme["dot_precision"] == "ieee"
        per_scheme.append([{**tile, **scheme} for tile in
                           moe_configs(opts["dtype"], where, rows=rows_per_expert, split=split)])
    if precision == "strict":
        return [c for configs in per_scheme for c in configs]
    # under a reduced policy a kernel the verifier rejects is mostly rejected for its scheme's
    # accuracy, which another tile does not change: each scheme's first tile comes before the
    # other tiles, so that `kforge tune`'s two repair rounds reach the next scheme (H100,
    # 2026-12-06: gpt-oss's split last-layer experts, fp16x1 rejected, were repaired to two
    # more fp16x1 tiles and ran their reference)
    return [configs[0] for configs in per_scheme if configs] + \
        [c for configs in per_scheme for c in configs[1:]]


def moe_source_for(spec, target, precision: str, config: dict) -> str:
    from kforge.kernels.moe import moe_source
    opts = {k: v for k, v in _options(spec, target).items() if not k.startswith("_")}
    return f"# region {spec.name}: kforge.moe_experts\n" + moe_source(**opts, **config)


__all__ = ["is_moe", "moe_space", "moe_source_for"]
