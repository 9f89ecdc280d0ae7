"""Regions upstream of a discrete selection, and the precision they are compiled at.

A mixture-of-experts router picks each token's experts with `topk` over its logits. Under a
reduced-precision policy (bf16, tf32) every region is verified on its own against that policy's
tolerance, and a region's rounding error can pass that check and still flip a token's choice
of experts downstream: that token's output then differs by the experts' difference, not by
rounding. On gpt-oss-20b's decode step (benchmarks/llm/emulate_rounding.py, CPU, 2 layers,
2026-12-02), fp16x1 attention projections put 1 sequence of 64 outside the bf16 policy, and
bf16 experts all 64. With the same products in fp32 or float64 no route flips, and the LM head
alone in fp16x1 stays at 0.12 of the tolerance.

So under a reduced-precision policy a region whose results reach a selection op (through any
chain of steps of the host plan) is compiled and verified under `strict`. A strict kernel meets
every policy (`meets`). Regions downstream of the last selection (a final norm, the LM head)
keep the package's policy. Regions are deduplicated across layers: a region is upstream where
any of its calls is; with KFORGE_SPLIT_UNSELECTED=1, at compile time the calls of such a region
that reach no selection op are split off as regions of their own (`unselected_calls`,
kforge.package.split_unselected_calls), which keep the policy.

The whole-model check (kforge.modelcheck, `kforge tune --check`) raises regions the same way:
each region passes its own check, yet their errors can add up through a deep model beyond the
policy at its outputs; the regions it raises to strict are recorded in the manifest
("strict_regions": hash -> why) and read by every caller of region_precision.

Before strict, the check may take a region one rung up its own policy's ladder of precision
schemes: a bf16 attention on fp16x1 products (11 significant bits in q, k, v) to fp16x3 scores
(fp32-grade q@k^T, the fp16 p@v): four fp16 products a tile where fp16x1 takes two (not timed
on a GPU yet), where strict's 3xTF32 took 1.07 ms against about 0.2-0.27 ms for fp16x1 on
Llama-3-8B's prefill (benchmarks/results/2026-12-05i-h200-llama-prefill-check/, 2026-12-05g).
On the CPU's emulation of that 2-layer package (benchmarks/llm/emulate_rounding.py) fp16x3
attention put the logits at 0.93 of the bf16 allowance, 3xTF32's exact ones at 0.90, fp16x1 at
1.03. The manifest's
"finer_schemes" (hash -> {"finer_than": bits, "why": ...}) holds such a floor: the region keeps
its policy and tolerance, and only kernels whose scheme keeps more than `bits` significant bits
in its products' operands (scheme_bits) are generated, reused or run for it.
"""
from __future__ import annotations

# ops whose result is a choice among their inputs (indices, or values picked by rank)
SELECTION_OPS = frozenset({
    "aten.topk", "aten.sort", "aten.argsort", "aten.argmax", "aten.argmin", "aten.max.dim",
    "aten.min.dim", "aten.kthvalue", "aten.mode", "aten.multinomial",
})

# how accurate each policy is, most accurate first: a kernel verified under a policy meets
# every policy after it
_ORDER = ("strict", "tf32", "bf16")


def meets(verified: str | None, policy: str) -> bool:
    """Whether a kernel verified under `verified` satisfies `policy`."""
    if verified == policy:
        return True
    if verified not in _ORDER or policy not in _ORDER:
        return False
    return _ORDER.index(verified) < _ORDER.index(policy)


def _feeding_steps(plan) -> dict[int, tuple]:
    """id(step) -> (the step, the selection op its results reach first) for every step of
    `plan` upstream of a selection op."""
    producer = {}
    for step in plan.steps:
        for r in getattr(step, "results", ()):
            producer[r] = step
    out: dict[int, tuple] = {}
    for step in plan.steps:
        name = getattr(step, "name", "")
        if name not in SELECTION_OPS:
            continue
        stack = [producer[o] for o in step.operands if o in producer]
        while stack:
            s = stack.pop()
            if id(s) in out:
                continue
            out[id(s)] = (s, name)
            stack.extend(producer[o] for o in getattr(s, "operands", ()) if o in producer)
    return out


def selection_feeders(plan) -> dict[str, str]:
    """Region hash -> the selection op its results reach first ("aten.topk"), for every region
    (a CallStep or KernelStep of `plan`) upstream of a selection op."""
    out: dict[str, str] = {}
    for s, name in _feeding_steps(plan).values():
        h = getattr(s, "call", None)
        if h:
            out.setdefault(h, name)
    return out


def unselected_calls(plan) -> dict[str, list[int]]:
    """Region hash -> its calls (k: the region's k-th call in `plan`, from 0) whose results reach
    no selection op, for each region that has another call whose results do: the calls that
    kforge.package.split_unselected_calls splits off, so that they keep the package's policy
    (gpt-oss's last layer's experts, after its last router)."""
    feeding = _feeding_steps(plan)
    calls: dict[str, list[bool]] = {}
    for step in plan.steps:
        h = getattr(step, "call", None)
        if h:
            calls.setdefault(h, []).append(id(step) in feeding)
    return {h: [k for k, feeds in enumerate(fs) if not feeds]
            for h, fs in calls.items() if any(fs) and not all(fs)}


def raised_regions(manifest: dict) -> dict[str, str]:
    """Region hash -> why the whole-model check raised it to strict (kforge.modelcheck)."""
    return dict(manifest.get("strict_regions") or {})


# significant bits a precision scheme keeps in its products' operands (the builtin's
# configuration keys: a GEMM's `input_precision`, attention's and MoE's `dot_precision` and
# `fp32_dot`); a scheme of 22 bits or more is fp32-grade, as strict's kernels are
SCHEME_BITS = {"bf16": 8, "fp16x1": 11, "tf32": 11, "fp16x3": 22, "tf32x3": 22, "3xtf32": 22,
               "ieee": 24}
# what a configuration without a scheme key takes under each policy (tl.dot's default for the
# policy: bf16 operands, TF32, exact fp32; kforge.targets.Target.dot_input_precisions)
NATIVE_BITS = {"bf16": 8, "tf32": 11, "strict": 24}
FP32_GRADE = 22
# attention's fp16x3: q@k^T from three fp16 products of hi/lo splits (fp32-grade scores, which
# the softmax amplifies), p@v one fp16 product: between fp16x1 and fp32-grade
ATTENTION_FP16X3_BITS = 16


def scheme_bits(config: dict | None, policy: str) -> int | None:
    """The significant bits the scheme of a builtin configuration keeps in its products'
    operands under `policy` (a configuration without a scheme key: the policy's own; another
    provider's kernel, whose configuration is its own, counts so); None without one."""
    if config is None:
        return None
    if "dot_precision" in config:
        dot = config["dot_precision"]
        if dot == "ieee":
            return SCHEME_BITS.get(config.get("fp32_dot") or "tf32x3")
        if dot == "fp16x3":
            return ATTENTION_FP16X3_BITS
        return SCHEME_BITS.get(dot)
    if config.get("input_precision") is not None:
        return SCHEME_BITS.get(config["input_precision"])
    return NATIVE_BITS.get(policy)


def scheme_floors(manifest: dict) -> dict[str, int]:
    """Region hash -> the bits its kernel's scheme must keep more than (the manifest's
    "finer_schemes", set by kforge.modelcheck)."""
    out = {}
    for h, v in (manifest.get("finer_schemes") or {}).items():
        bits = v.get("finer_than") if isinstance(v, dict) else None
        if isinstance(bits, (int, float)) and not isinstance(bits, bool) and bits > 0:
            out[h] = int(bits)        # (an entry edited into something else: no floor)
    return out


def above_floor(config: dict | None, policy: str, floor: int) -> bool:
    """Whether a kernel of `config` may serve a region whose floor is `floor` (0: none)."""
    if not floor:
        return True
    bits = scheme_bits(config, policy)
    return bits is not None and bits > floor


def region_precision(policy: str, feeders: dict[str, str], h: str,
                     raised: dict[str, str] | None = None) -> tuple[str, str]:
    """The policy region `h` is compiled under, and why (empty: the package's own); `raised`:
    the regions the whole-model check raised (raised_regions)."""
    if policy != "strict" and h in feeders:
        return "strict", (f"its results reach {feeders[h]} (a discrete selection, such as an "
                          f"MoE router's): compiled strict so that {policy} rounding cannot "
                          "change what is selected")
    if policy != "strict" and raised and h in raised:
        return "strict", raised[h]
    return policy, ""
