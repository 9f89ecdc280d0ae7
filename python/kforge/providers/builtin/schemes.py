"""Which GEMM scheme and which kernel a region's contraction gets, and with which tiles: the
builtin's precision schemes (fp16x3, fp16x1, tf32, bf16 operands) per policy and target, the
measured rules that put one first, and when the persistent TMA kernel is offered.
"""
from __future__ import annotations

import math
import os

from kforge.providers.builtin import indexing as ix
from kforge.providers.builtin.analysis import (Contraction, RegionShape, is_widening,
                                               partial_reductions, problem_of, weight_source)
from kforge.providers.builtin.emitter import WIDE_OFFSETS, CannotGenerate, Emitter, KVar, Scope
from kforge.spec import AffineDim, GenericOp, KernelSpec, ReshapeOp


# x = s * (hi + lo) with hi = fp16(x / s), lo = fp16(x / s - hi) and s a power of two per row of
# A and per output column of B, chosen so that max |x / s| over the row (column) is below 2**15:
# fp16 cannot overflow (max 65504), and lo (2**-11 below hi) stays far above fp16's subnormals
# for every element that matters to the row's dot products. Three fp16 products per K step
# (lo*hi + hi*lo + hi*hi; lo*lo is below fp32's rounding) run at twice the tf32 rate with tf32's
# 11-bit significands; the scales are undone exactly on the accumulator (benchmarks/gemm/NOTES.md:
# more accurate than cuBLAS fp32, 3.35x eager on the H200). Weights are scaled and split once in
# prepare_weights; activations (A, and B when it is not a weight) by a pass kernel per call that
# writes fp16 [hi, lo] planes K-major plus one fp32 scale per row.
FP16X3 = "fp16x3"


# fp16x1: the same power-of-two-scaled fp16 operands, hi planes only, one product per K step: the
# bf16 rate with fp16's 11-bit significands (operand rounding 8x smaller than bf16's), for
# bf16-policy regions whose output amplifies operand rounding (a norm over the GEMM output
# divides by a small spread) past the 1e-2 tolerance. The scales keep fp16 from overflowing.
FP16X1 = "fp16x1"


FP16_SCHEMES = (FP16X3, FP16X1)


def fp16x3_eligible(spec: KernelSpec, stage: RegionShape) -> bool:
    """fp16x3 applies to fp32 contractions with an fp32 result."""
    if stage.kind != "gemm":
        return False
    op = stage.contraction.op
    return all(spec.tensor(v).dtype == "f32"
               for v in (op.operands[stage.contraction.a], op.operands[stage.contraction.b],
                         op.results[0]))


def widened_from(spec: KernelSpec, name: str, depth: int = 0) -> str | None:
    """The 16-bit type (bf16, f16) that the tensor `name` holds exactly: it is an `arith.extf`
    of such a tensor, through copies, transposes and reshapes (a bf16 model's Linear reads its
    activation and weight so: torch-mlir widens both to f32 for the product). None otherwise."""
    dtype = spec.tensor(name).dtype
    if dtype in ("bf16", "f16"):
        return dtype
    op = spec.producer(name)
    if depth > 8 or op is None:
        return None
    if isinstance(op, ReshapeOp) or is_widening(op):
        return widened_from(spec, op.operands[0], depth + 1)
    if isinstance(op, GenericOp) and not op.reduction_dims and op.num_inputs == 1 \
            and len(op.results) == 1 and op.body.yields[0] == op.body.args[0]:
        return widened_from(spec, op.operands[0], depth + 1)      # a copy or transpose
    return None


def bf16_a_source(spec: KernelSpec, con: Contraction) -> str | None:
    """The bf16 region argument [M, K] that the product's A widens as it lies (a bf16 model's
    activation, or a bf16 argument that the product's body widens itself): a descriptor reads
    it with no cast pass. None otherwise."""
    src = con.op.operands[con.a]
    op = spec.producer(src)
    if op is not None:
        if not is_widening(op) \
                or any(m.result_dims() != tuple(range(m.num_dims)) for m in op.indexing_maps):
            return None
        src = op.operands[0]
    arg = next((a for a in spec.args if a.name == src), None)
    if arg is None or arg.dtype != "bf16":
        return None
    return src if _read_as_it_lies(spec, con, src) else None


def exact_in_bf16(spec: KernelSpec, stage: RegionShape) -> bool:
    """Both operands of the stage's product are widened bf16 values: bf16 operands are then
    the operands themselves, and no finer scheme (or split pass) is more accurate."""
    op = stage.contraction.op
    return all(widened_from(spec, op.operands[i]) == "bf16"
               for i in (stage.contraction.a, stage.contraction.b))


def gemm_input_precisions(spec: KernelSpec, target, precision: str,
                          stage: RegionShape) -> tuple:
    """The contraction schemes to try under `precision`, best first: the target's list, with
    fp16x3 first on GPUs (measured fastest strict scheme) and last in the interpreter (tested,
    not timed); under bf16 and tf32, fp16x1 first on GPUs wherever its pass pays."""
    schemes = tuple(target.dot_input_precisions(precision))
    if precision == "bf16" and fp16x3_eligible(spec, stage) and not exact_in_bf16(spec, stage):
        # for products whose bf16-rounded operands miss the 1e-2 tolerance: first fp16x1 (the
        # bf16 rate, 8x finer rounding), last fp32 operands at the tf32 policy's precision
        # (the interpreter: ieee)
        fallbacks = (FP16X1,) + tuple(p for p in target.dot_input_precisions("tf32")
                                      if p not in schemes)[:1]
        if not target.interpreter and fp16x1_first(spec, target, stage):
            return fallbacks[:1] + schemes + fallbacks[1:]
        return schemes + fallbacks
    if precision == "tf32" and fp16x3_eligible(spec, stage):
        own = _tf32_own_schemes(spec, target, stage, schemes)
        if target.interpreter:
            # (tested, not timed: the tf32 kernel stays the tests' first candidate)
            return own[:1] + (FP16X1,) + own[1:]
        if fp16x1_first(spec, target, stage):
            # fp16x1 products round each operand to 11 significant bits, as TF32 does (fp16's
            # 10 stored bits + the implicit one; the power-of-two scales per row of A and per
            # column of B keep every element that matters to a row's products in fp16's normal
            # range), on the 16-bit tensor cores at twice the TF32 rate, reading 2-byte weights
            # instead of 4: first wherever its pass pays (fp16x1_first); then tf32's own
            # schemes, fp16x3 (fp32-accurate) for what the verifier rejects
            return (FP16X1,) + own
        return own
    if precision != "strict" or not fp16x3_eligible(spec, stage) or FP16X3 in schemes:
        return schemes
    if target.interpreter:
        return schemes + (FP16X3,)
    if fp16x3_pass_pays(spec, target, stage):
        return (FP16X3,) + schemes
    return schemes[:1] + (FP16X3,) + schemes[1:]


def _tf32_own_schemes(spec: KernelSpec, target, stage: RegionShape, schemes: tuple) -> tuple:
    """The tf32 policy's schemes for an fp32 contraction, fp16x1 aside: the target's tf32, with
    fp16x3 first for an N-major B and last elsewhere (the interpreter: tf32 alone)."""
    if not target.interpreter and b_n_major(spec, stage.contraction):
        # Hopper's tf32 wgmma takes B only K-major: an N-major B (bmm's second operand, or
        # `x @ W`, read as it is in memory) drops tf32 to ~70 TFLOP/s on the H200 (bmm
        # 16x2048x1024x2048: 1.91 ms tf32 vs 1.26 ms fp16x3; x @ W + leaky ReLU + softmax
        # 4096x2048x4096: 1.55x vs 3.19x over torch.compile). 16-bit wgmma takes either
        # layout, and fp16x3 is more accurate than tf32, so it is a valid tf32-policy kernel.
        return (FP16X3,) + schemes
    if target.interpreter:
        return schemes
    # the fallback for a tf32 kernel the verifier rejects (its half-tolerance margin: tf32
    # rounding amplified by a norm after the product): fp32-accurate, at 3/4 of the rate
    return schemes + (FP16X3,)


def fp16x1_first(spec: KernelSpec, target, stage: RegionShape) -> bool:
    """Whether a GPU kernel under bf16 tries fp16x1 before bf16 operands (and under tf32
    before TF32's own products, which take twice as long as the time this compares with):
    wherever its activation pass (A read twice in fp32, one fp16 plane written: 10 bytes an
    element) costs no more than the product itself at the bf16 rate. Both run on the same
    16-bit tensor cores, and fp16x1 rounds 8x finer. bf16 operands spend most of the policy's
    1e-2 in one product, so a model of several layers of them misses it at its output although
    every region passes its own check (H200, 2026-12-02, four Llama-3-8B layers: decode max abs
    0.051 on the logits against about 1e-2; prefill 0.018, 1.8x the allowance); fp16x1
    products kept decode within it (emulated: 0.71 of the allowance; measured: correct).
    A decode step's GEMM (few rows) is bound by reading its weights, and fp16x1 reads as many
    (2 bytes a weight) as bf16. Small GEMMs whose A is large against the product (a
    convolution's implicit GEMM, a narrow N) keep bf16 operands first and fp16x1 second."""
    if decode_shaped(stage):
        return True
    c = stage.contraction
    batch, M, N, K = c.extent(c.batch), c.extent(c.m), c.extent(c.n), c.extent(c.k)
    pass_s = 10 * batch * M * K / target.peaks.bytes_per_s
    product_s = 2 * batch * M * N * K / target.peaks.bf16
    return pass_s <= product_s


def decode_shaped(stage: RegionShape, rows: int = 128) -> bool:
    """A GEMM of at most `rows` output rows (batch x M): a decode step's projections, bound by
    reading the weights."""
    c = stage.contraction
    return c is not None and c.extent(c.batch) * c.extent(c.m) <= rows


def b_n_major(spec: KernelSpec, c: Contraction) -> bool:
    """B is a region argument read as it lies (no producer op: bmm's second operand, or a
    weight used as `x @ W`), and its contiguous (last) dimension is an output-column (N)
    dimension. (nn.Linear's weight reaches the product through a transpose: K-major.)"""
    name = c.op.operands[c.b]
    if spec.producer(name) is not None:
        return False
    if not any(a.name == name for a in spec.args):
        return False
    results = c.op.indexing_maps[c.b].results
    return bool(results) and isinstance(results[-1], AffineDim) and results[-1].d in c.n


def fp16x3_pass_pays(spec: KernelSpec, target, stage: RegionShape) -> bool:
    """Whether fp16x3's operand passes cost less than its products save over 3xtf32 (three tf32
    products at a third of the tf32 peak): a pass reads its operand twice in fp32 and writes
    two fp16 planes, 12 bytes an element. A convolution's implicit GEMM has an A of
    (kernel window) times the input's size, so small ones stay with 3xtf32 first (measured on
    the H200: 16x64x34x34 conv, fp16x3 0.072 ms vs eager 0.043 ms)."""
    c = stage.contraction
    batch, M, N, K = c.extent(c.batch), c.extent(c.m), c.extent(c.n), c.extent(c.k)
    elements = batch * M * K
    if weight_source(spec, c.op.operands[c.b]) is None:
        elements += batch * N * K
    pass_s = 12 * elements / target.peaks.bytes_per_s
    saved_s = 2 * batch * M * N * K * 3 * (1 / target.peaks.tf32 - 1 / target.peaks.bf16)
    return pass_s < saved_s


def fp16x3_configs(configs: list[dict]) -> list[dict]:
    """GEMM tiles for fp16x3: 2-byte operands take BLOCK_K 64; the per-step partial product
    doubles the accumulator registers, so at most 64 fp32 values of each a thread (128x128 with
    8 warps; 128x256 spills); stages capped by shared memory (4 fp16 planes per stage)."""
    out, seen = [], set()
    for c in configs:
        c = dict(c)
        if c["BLOCK_M"] * c["BLOCK_N"] > 64 * 32 * c["num_warps"]:
            continue
        per_stage = 2 * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2
        c["num_stages"] = max(1, min(c["num_stages"] or 1, 220 * 1024 // per_stage))
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


# Offered first where it fits (tma_configs); KFORGE_BUILTIN_TMA=0 never, =1 also where the
# measured rule below leaves it out. H200, 2026-12-04 (benchmarks/results/
# 2026-12-04b-h200-builtin-tma), its first tile against the pointer kernel the builtin took
# first: fp16x1 1.03-1.54x faster on 6 of 8 shapes (8192^3 1.761 vs 1.811 ms; 4096^3 0.229 vs
# 0.288; 256 x 4096^2 0.042 vs 0.065), even on 512 x 8192^2 (0.153 vs 0.150; its second tile
# 0.129) and a fused norm + softmax over N = 128 (0.108 vs 0.108); bf16 operands (plus a cast
# pass) 1.17-1.20x faster on the four largest, even at 4096^3 and 512 x 8192^2, slower where
# few tiles fill the SMs (256 x 4096^2: 0.050 vs 0.037) and with a fused row reduction over
# N = 128 (0.106 vs 0.064: the cast pass is most of the time).
#
# tf32 (the tf32 policy's scheme) on the same kernel: A and the weight read by TMA in fp32 as they
# lie, no pass at all (kernels/gemm.py's persistent tf32 kernel ran 13 % ahead of the pointer
# kernel's tiles on the H200, NOTES.md run 4). Not timed in the builtin yet: only with
# KFORGE_BUILTIN_TMA=1.
#
# fp16x3 (the strict policy's scheme, and tf32's where fp16x3 is offered) on the same kernel: A's
# hi and lo planes from the split pass and the weight's from prepare_weights, four tiles a K
# step, the three products into a fresh `part` as the pointer kernel does. Not timed on a GPU
# yet: offered only with KFORGE_BUILTIN_TMA=1 (first for its scheme then), never by default.
TMA_ENV = "KFORGE_BUILTIN_TMA"


TMA_DEFAULT = True


# Sibling products (a stage with a partner: SwiGLU's gate and up) computed by one persistent
# kernel from one pass over A, the weights' rows interleaved (gemm.py, config key PAIRED): first
# by default at more than 512 rows (KFORGE_BUILTIN_PAIRED=0: never; =1: at any row count). H100,
# 2026-12-06 (benchmarks/results/2026-12-06c-h100-sibling-split-profile), Llama-3-8B's 16384 x
# 14336 x 4096 gate and up: 6.01 ms paired against 6.48 for the two regions before the merge
# and 6.56 for the two products one after the other in one region (cuBLAS bf16: 2 x 2.69).
# After the paired tiles, the single-product tile: the partner's GEMM first with it, then the
# stage, both reading one pass over A (kernels._same_a_pass).
# KFORGE_BUILTIN_PARTIAL=1: a GEMM stage whose row reductions span a wider N than its tile
# (partial_reductions: sums, maxes and mins of the product, none reading another, one value a
# row stored) is offered first the TMA kernel that reduces each tile's columns into partials,
# and a rows kernel that reduces those, instead of storing the product for a rows kernel to
# read back (kernels._build_stage). By default (partial_wanted) only where K is at most 1024 and
# A is read as it lies (bf16 operands, no pass). H100, 2026-12-07
# (benchmarks/results/2026-12-07d-h100-ab-rows-norms), the bf16 models' packages timed in one
# process, partials against the bf16 handoff: K = 1024 won (gemm_row_mean_tall 32768 x 1024 x
# 1024: 0.117 against 0.143 ms; chain_hardswish_clamp_row_max 0.140 against 0.143); K >= 4096
# lost 3-14 % (gemm_row_max, _sum, _min, chain_scale_sigmoid_row_sum), where the partials'
# 128 x 128 tile runs the long main loop slower than the handoff's 128 x 256 and the stored
# product is a smaller share of the time. =1: wherever eligible; =0: never.
PARTIAL_ENV = "KFORGE_BUILTIN_PARTIAL"
# strict's fp16x3 by the Gluon kernel (gluon.py) first on sm_90 GPUs; =0: never (gluon_wanted)
GLUON_ENV = "KFORGE_BUILTIN_GLUON"
# strict's fp16x3 with A's planes made in the GEMM kernel, no split pass (_insplit_configs);
# opt-in: 0.69-0.85x the split pass's kernel on an H100 (2026-12-07)
INSPLIT_ENV = "KFORGE_BUILTIN_INSPLIT"
# the warp-specialized Gluon GEMM under bf16 (gluon_ws.py): offered first only when asked (=1,
# =pingpong); timed on an H100 2026-12-07 (_ws_configs)
WS_ENV = "KFORGE_BUILTIN_WS"
PAIRED_ENV = "KFORGE_BUILTIN_PAIRED"


def partial_wanted(K: int, bf16_operands: bool, interpreter: bool) -> bool:
    """Whether an eligible GEMM stage is offered the partial row reductions first (PARTIAL_ENV
    above): `bf16_operands`, A bf16 read where it lies (a bf16 model's activation, no pass: what
    was timed); the interpreter only when asked (=1)."""
    env = os.environ.get(PARTIAL_ENV)
    if env in ("0", "1"):
        return env == "1"
    return not interpreter and bf16_operands and K <= 1024


def paired_wanted(rows: int) -> bool:
    """Whether a stage with a partner is offered the PAIRED tiles first (PAIRED_ENV above)."""
    env = os.environ.get(PAIRED_ENV)
    if env in ("0", "1"):
        return env == "1"
    return rows > 512


def tma_wanted(target) -> bool:
    """Whether the persistent TMA kernel is offered: KFORGE_BUILTIN_TMA=0/1, else TMA_DEFAULT on
    GPUs (the interpreter runs it only when asked: tested, not timed)."""
    env = os.environ.get(TMA_ENV)
    if env in ("0", "1"):
        return env == "1"
    return TMA_DEFAULT and not target.interpreter


def tma_eligible(spec: KernelSpec, target, precision: str, stage: RegionShape,
                 scheme: str | None = None) -> bool:
    """Whether the persistent TMA kernel fits this GEMM stage under the bf16 policy with bf16
    operands (scheme None) or fp16x1 (A's fp16 plane from the split pass, the weight's fp16
    plane from prepare_weights, the power-of-two scales undone on the tile; under tf32 too),
    under strict and tf32 with fp16x3 (both planes of each), or under tf32 with its own scheme
    (A, an argument read as it lies, and the weight both in fp32, no pass): a 2-D product (no
    batch) whose B is a weight [N, K] read as it lies (nn.Linear's weight, cast to bf16 or split
    to its fp16 planes once by prepare_weights), K a multiple of 8 (TMA's 16-byte aligned
    rows), an fp32 product and int32 offsets throughout, on sm_90 or later (or the
    interpreter). Under bf16 operands A is cast to a bf16 [M, K] copy by a pass. The output is
    stored with masked tl.store, so N needs no alignment."""
    if stage.kind != "gemm" or target.name not in ("cuda", "cpu"):
        return False
    tf32 = precision == "tf32" and scheme == tf32_scheme(target)
    if precision == "bf16" or (precision == "tf32" and scheme == FP16X1):
        if scheme not in (None, FP16X1):
            return False
    elif not tf32 and (precision not in ("strict", "tf32") or scheme != FP16X3):
        return False
    if scheme in FP16_SCHEMES and not fp16x3_eligible(spec, stage):
        return False
    if target.name == "cuda" and target.sm < 90:        # TMA is Hopper's
        return False
    con = stage.contraction
    op = con.op
    N, K = con.extent(con.n), con.extent(con.k)
    if con.batch or K % 8 or spec.tensor(op.results[0]).dtype != "f32":
        return False
    if spec.tensor(op.operands[con.a]).dtype not in ("f32", "bf16", "f16"):
        return False
    if any(math.prod(t.shape) >= WIDE_OFFSETS for t in (*spec.args, *spec.values)):
        return False
    M = con.extent(con.m)
    if scheme == FP16X3 and 2 * max(M, N) * K + N >= WIDE_OFFSETS:
        return False            # both planes (and the exponents after them) in int32 offsets
    if tf32 and not (spec.tensor(op.operands[con.a]).dtype == "f32" and _a_as_it_lies(spec, con)):
        return False            # tf32 reads A by TMA where it lies: no pass to compute it
    weight = weight_source(spec, op.operands[con.b], widened=precision == "bf16" and not scheme)
    if weight is None or tuple(spec.tensor(weight).shape) != (N, K):
        return False
    return _weight_read_index(spec, target, con, weight) == (ix.IVar("rn"), ix.IVar("kb"))


def tf32_scheme(target):
    """The tf32 policy's own product scheme on this target ("tf32"; the interpreter: "ieee")."""
    return target.dot_input_precisions("tf32")[0]


def _a_as_it_lies(spec: KernelSpec, con: Contraction) -> bool:
    """A is a region argument [M, K] read as it lies (row m, column k): a descriptor can read
    it with no pass."""
    name = con.op.operands[con.a]
    if spec.producer(name) is not None or not any(a.name == name for a in spec.args):
        return False
    return _read_as_it_lies(spec, con, name)


def _read_as_it_lies(spec: KernelSpec, con: Contraction, name: str) -> bool:
    """The product reads A at [m, k] and `name` (A, or what A is elementwise of) is [M, K]."""
    results = con.op.indexing_maps[con.a].results
    return len(con.m) == 1 and len(con.k) == 1 and len(results) == 2 \
        and all(isinstance(r, AffineDim) for r in results) \
        and [r.d for r in results] == [con.m[0], con.k[0]] \
        and tuple(spec.tensor(name).shape) == (con.extent(con.m), con.extent(con.k))


def _weight_read_index(spec: KernelSpec, target, con: Contraction, weight: str):
    """The index at which the product reads `weight` for its B tile [kb, rn] (None when the
    emitter cannot read it)."""
    N, K = con.extent(con.n), con.extent(con.k)
    kvars = {"rn": KVar("rn", None, ("1", "BLOCK_N")), "kb": KVar("kb", None, ("BLOCK_K", "1"))}
    em = Emitter(spec, target, kvars, {weight: weight})
    p = dict(zip(con.n, ix.unravel(ix.IVar("rn"), [con.sizes[d] for d in con.n])))
    p.update(zip(con.k, ix.unravel(ix.IVar("kb"), [con.sizes[d] for d in con.k])))
    with ix.ranges({"rn": (0, N), "kb": (0, K)}):
        try:
            em.body_value(con.op, p, con.op.body.args[con.b], Scope(None, binds={"rn", "kb"}))
        except CannotGenerate:
            return None
    return em.load_index.get(weight)


def tma_configs(spec: KernelSpec, target, precision: str, stage: RegionShape,
                scheme: str | None = None) -> list[dict]:
    """The configurations offered before the target's tiles: the warp-specialized Gluon
    kernel's where asked (_ws_configs), fp16x3 with A split in the kernel where asked
    (_insplit_configs), then the TMA kernel's (_tma_configs)."""
    return _ws_configs(spec, target, precision, stage, scheme) \
        + _insplit_configs(spec, target, precision, stage, scheme) \
        + _tma_configs(spec, target, precision, stage, scheme)


def _ws_configs(spec: KernelSpec, target, precision: str, stage: RegionShape,
                scheme: str | None) -> list[dict]:
    """KFORGE_BUILTIN_WS=1: a bf16-policy product (bf16 operands, or fp16x1's planes with their
    power-of-two scales undone on the tile) and its epilogue by the warp-specialized
    Gluon kernel first (gluon_ws.py: a TMA loader warp and two consumer warpgroups, sharing a
    128 x 256 tile, then taking 128 x 128 tiles in turn; =pingpong: the other order; the
    epilogue in 4 column slices), where the stage is a 2-D product of a weight, on an sm_90
    or later GPU, not decode-shaped; a stage with a partner (SwiGLU's gate beside its up
    projection) by the cooperative schedule with both products in one tile (PAIRED: the
    weights' rows interleaved, as the TMA kernel's paired tiles). A stage whose row
    reduction the builtin fuses on the tile cannot take it (CannotGenerate: the next
    configuration). Nor where _starved_by_tma (its tiles under a quarter of the SMs, the
    pointer kernel splitting K): H100, 2026-12-07 (benchmarks/results/2026-12-07h-h100-ws-gluon),
    gemm_max_const_long_k (256 x 1024, K = 32768) ran 0.335 ms with it against the split-K
    tiles' 0.099. Opt-in: in place it ran 0.99-1.03x the TMA kernel on four of the six
    workloads timed there and 0.78x on gemm_gelu_erf (2048 x 16384 x 4096, erf epilogue);
    alone it ran 1.01-1.10x cuBLAS at M >= 8192."""
    if os.environ.get(WS_ENV) not in ("1", "pingpong") or precision != "bf16" \
            or scheme not in (None, FP16X1) \
            or target.interpreter or target.name != "cuda" or target.sm < 90 \
            or decode_shaped(stage) \
            or not tma_eligible(spec, target, precision, stage, scheme) \
            or _starved_by_tma(spec, target, precision, stage, scheme):
        return []
    from kforge.providers.builtin.gluon_ws import CONFIG, PINGPONG
    if stage.partner is not None:
        # both products in one kernel (SwiGLU's gate and up, their weights' rows interleaved):
        # the cooperative schedule only, where the paired tile applies (else none)
        from kforge.providers.builtin.kernels import _both_products_in_one_kernel
        paired = dict(CONFIG, num_stages=None, TMA=True, WS=True, PAIRED=True)
        return [paired] if _both_products_in_one_kernel(stage, paired) else []
    both = [dict(CONFIG, num_stages=None, TMA=True, WS=True),
            dict(PINGPONG, num_stages=None, TMA=True, WS=True)]
    return both[::-1] if os.environ.get(WS_ENV) == "pingpong" else both


def _tma_configs(spec: KernelSpec, target, precision: str, stage: RegionShape,
                 scheme: str | None = None) -> list[dict]:
    """The TMA kernel's configurations for `scheme` (bf16 operands or fp16x1), where it is
    wanted (tma_wanted) and the stage qualifies (tma_eligible) and, on a GPU, has more than 128
    rows (a decode step's GEMM reads its weights: the pointer kernel's decode tiles) and, for
    bf16 operands, at least a wave of 128 x 128 tiles and no row reduction (unless
    KFORGE_BUILTIN_TMA=1); else none. The tiles and pipelines tma2 measured best on the H200
    (benchmarks/gemm/NOTES.md runs 5-7): beyond 512 rows 128x256x64, 8 warps, 4 stages,
    GROUP_M 16, the epilogue in 4 column slices, the tile loop flattened with the K loop
    (229408 bytes of shared memory), then the same not flattened (fewer registers where an
    epilogue would spill), then the tile before the slices (3 stages); up to 512 rows
    128x128x64 with 6 stages and 2 slices, flattened, then 4 stages not, then 4 stages with
    the whole-tile epilogue. Not timed in this kernel yet (tma2, the same structure with a
    TMA-store epilogue, ran 1.04-1.13x its predecessor at M >= 8192). A row reduction fused
    over the tile keeps the target's first two tiles (BLOCK_N spans N) of at most 64
    accumulator values a thread, and a whole-tile epilogue; the interpreter too (tested, not
    timed)."""
    if not tma_wanted(target) or not tma_eligible(spec, target, precision, stage, scheme):
        return []
    if decode_shaped(stage) and not target.interpreter:     # (the interpreter: tested, not timed)
        return []
    con = stage.contraction
    if precision != "bf16" and scheme != FP16X1:     # strict / tf32: fp16x3, or tf32's own
        return _gluon_configs(target, stage, scheme) \
            + _opt_in_tma_configs(spec, target, precision, stage, scheme)
    if _starved_by_tma(spec, target, precision, stage, scheme):
        return _split_k_tma_configs(spec, target, precision, stage, scheme)
    # bf16 operands, unless KFORGE_BUILTIN_TMA=1 (the interpreter: tested, not timed)
    gated = scheme is None and not target.interpreter and os.environ.get(TMA_ENV) != "1"
    if gated and bf16_a_source(spec, con) is None \
            and (stage.reductions or _tiles_128(con) < target.compute_units):
        # its cast pass pays only where a wave of 128 x 128 tiles fills the SMs and the stage
        # has no row reduction (measured with a fused one: TMA_DEFAULT)
        return []
    problem = dict(problem_of(spec, stage), precision=precision)
    tiles = [c for c in target.configs("gemm", dict(problem, precision="bf16"))
             if c.get("SPLIT_K", 1) == 1]
    # the target fuses the row reduction into the tile where its tiles span N
    fused = bool(stage.reductions and problem.get("full_rows") and tiles) \
        and tiles[0]["BLOCK_N"] >= con.extent(con.n)
    if gated and fused:
        # a bf16 model's A is read where it lies, with no pass: the TMA kernel comes first
        # under a wave too, and where a rows kernel finishes a reduction over a wide N, but not
        # where the reduction is fused on the tile (not measured without the pass).
        # H100 2026-12-07, the bf16 models: gemm_sigmoid (512 x 8192 x 4096) took the pointer
        # kernel's 128 x 256 tiles, 64 programs, 0.098 ms (the fp32 model's fp16x1 TMA kernel,
        # 128 programs and a split pass, 0.087; cuBLAS 0.058); gemm_row_mean_tall (32768 x
        # 1024 x 1024, then a row mean) 0.67x the matched route
        return []
    keep = 2                # TMA configurations offered: the target's first two, or `own`
    if fused and not target.interpreter:
        # row reductions on the tile hold the row's values beside the accumulator: at most 64
        # accumulator values a thread (sm_90, 128x128 with 4 warps: 72 bytes of spills)
        tiles = [c for c in tiles if c["BLOCK_M"] * c["BLOCK_N"] <= 64 * 32 * c["num_warps"]]
    if not fused and not target.interpreter:
        # (a reduction over a wider N runs in a rows kernel after the GEMM: the GEMM's own
        # tiles; H200 2026-12-04, 4096^3 + GELU + residual + layer norm: 128x128 tiles 0.376 ms
        # against the pointer kernel's 128x256 0.315)
        M = con.extent(con.m)
        # (third: the tile as it was before the slices, measured on the H200 2026-12-04/05,
        # for the tuner to fall back on where the new pipeline times slower)
        if stage.partner is not None and paired_wanted(M):
            # two products a tile (the weights' rows interleaved by 128): 128 columns of each
            # in one 128 x 256 accumulator, one dot a K step, the epilogue in 4 slices (2 of
            # each product), then not flattened; then the products one after the other
            own = [_cfg_tile(128, 256, 64, 8, 4, 16, EPI_SPLIT=4, FLATTEN=True, PAIRED=True),
                   _cfg_tile(128, 256, 64, 8, 4, 16, EPI_SPLIT=4, PAIRED=True),
                   _cfg_tile(128, 256, 64, 8, 4, 16, EPI_SPLIT=4, FLATTEN=True)
                   if M > 512 else _cfg_tile(128, 128, 64, 8, 6, 16, EPI_SPLIT=2, FLATTEN=True)]
        elif M > 512:
            own = [_cfg_tile(128, 256, 64, 8, 4, 16, EPI_SPLIT=4, FLATTEN=True),
                   _cfg_tile(128, 256, 64, 8, 4, 16, EPI_SPLIT=4),
                   _cfg_tile(128, 256, 64, 8, 3, 16)]
        else:
            own = [_cfg_tile(128, 128, 64, 8, 6, 16, EPI_SPLIT=2, FLATTEN=True),
                   _cfg_tile(128, 128, 64, 8, 4, 16, EPI_SPLIT=2),
                   _cfg_tile(128, 128, 64, 8, 4, 16)]
        tiles, keep = own + tiles, len(own)
    if (not fused or target.interpreter) and stage.reductions \
            and partial_wanted(con.extent(con.k),
                               scheme is None and bf16_a_source(spec, con) is not None,
                               target.interpreter) \
            and partial_reductions(spec, stage) is not None:
        # the partials' kernel: a whole-tile epilogue of 64 accumulator values a thread, as a
        # fused reduction's (the interpreter: 32 x 128 tiles, so that a test's N spans several)
        first = _cfg_tile(32, 128, 32, 4, 1, 4) if target.interpreter \
            else _cfg_tile(128, 128, 64, 8, 4, 16, FLATTEN=True)
        if first["BLOCK_N"] < con.extent(con.n):
            tiles, keep = [dict(first, PARTIAL=True)] + tiles, keep + 1
    out, seen = [], set()
    for c in tiles:
        c = dict(c, TMA=True)           # (config_space adds the scheme's input_precision)
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out[:keep]


def _starved_by_tma(spec: KernelSpec, target, precision: str, stage: RegionShape,
                    scheme: str | None) -> bool:
    """A GEMM whose 128 x 128 output tiles fill under a quarter of the GPU's SMs while the
    pointer kernel's first tiles for the scheme split K: the TMA kernel (one program a tile, no
    split-K) would leave most SMs idle. H200, 2026-12-05, gemm_max_const_long_k (256 x 1024,
    K = 32768) under tf32's fp16x1: 16 programs, 0.207 ms, what 16 SMs at the 16-bit rate take
    (0.204 ms), 0.63x the TF32 route; the split-K pointer tiles run 128 programs. Not for the
    interpreter (tested, not timed) or with KFORGE_BUILTIN_TMA=1."""
    if target.interpreter or os.environ.get(TMA_ENV) == "1":
        return False
    if _tiles_128(stage.contraction) * 4 >= target.compute_units:
        return False
    first = stage_configs(spec, target, precision, stage, scheme)[:1]
    return bool(first) and first[0].get("SPLIT_K", 1) > 1


def _split_k_tma_configs(spec: KernelSpec, target, precision: str, stage: RegionShape,
                         scheme: str | None) -> list[dict]:
    """A bf16 model's GEMM that _starved_by_tma keeps off the one-program-a-tile TMA kernel:
    the TMA kernel with split-K instead, 128 x 128 x 64 tiles (8 warps, 4 stages) and enough K
    slices for the SMs, each at least 4 K steps; the epilogue kernel sums the slices. Its A is
    read where it lies (bf16_a_source: no cast pass). Other schemes and policies: none.
    H100 2026-12-07 (07c): gemm_max_const_long_k's bf16 model (256 x 1024, K = 32768) on the
    pointer kernel's split-K tiles ran 0.080 ms, 0.78x max-autotune; cuBLAS 0.052. Not timed
    on a GPU yet."""
    con = stage.contraction
    if scheme is not None or precision != "bf16" or stage.reductions \
            or stage.partner is not None or bf16_a_source(spec, con) is None:
        return []
    tiles = _tiles_128(con)
    steps = -(-con.extent(con.k) // 64)
    split = min(max(1, target.compute_units // tiles), steps // 4)
    if split < 2:
        return []
    return [_cfg_tile(128, 128, 64, 8, 4, 8, SPLIT_K=split, TMA=True)]


def _tiles_128(con: Contraction) -> int:
    """The product's 128 x 128 output tiles (the TMA kernel's programs at its smallest tile)."""
    return -(-con.extent(con.batch) * con.extent(con.m) // 128) * -(-con.extent(con.n) // 128)


def gluon_wanted(target) -> bool:
    """Whether strict's fp16x3 is offered the Gluon kernel first (GLUON_ENV above): on an
    sm_90 CUDA GPU unless KFORGE_BUILTIN_GLUON=0 (its wgmma groups are Hopper's alone; the
    interpreter does not run Gluon)."""
    if target.interpreter or target.name != "cuda" or target.sm != 90:
        return False
    return os.environ.get(GLUON_ENV) != "0"


def _gluon_configs(target, stage: RegionShape, scheme: str) -> list:
    """fp16x3's product by the Gluon kernel first (gluon.py: a K step's three products kept in
    flight while the step before is added; 128 x 128 x 64, 8 warps, 3 stages), where the
    stage has one product (its epilogue fused on the tile, or a rows kernel finishing from the
    stored product), where gluon_wanted. H100, 2026-12-07 (benchmarks/results/
    2026-12-07h-h100-ws-gluon): alone 0.79-0.85 of the 3 x bf16 pace against the Triton
    kernel's 0.73-0.79; eight strict packages 1.06-1.09x faster in place, all verified."""
    if not gluon_wanted(target) or scheme != FP16X3 or stage.partner is not None:
        return []
    from kforge.providers.builtin.gluon import CONFIG
    return [dict(CONFIG, num_stages=None, GLUON=True)]


def _insplit_configs(spec: KernelSpec, target, precision: str, stage: RegionShape,
                     scheme: str) -> list:
    """KFORGE_BUILTIN_INSPLIT=1: fp16x3 on the pointer kernel's first tile, A's planes made in
    the kernel from its fp32 tile (gemm._split_a_in_kernel, config key INSPLIT) instead of by a
    split pass before it: the pass reads A and writes its two planes (8 bytes an element), the
    kernel then reads the planes (4 bytes), where this kernel reads A itself (4 bytes). Where
    the stage has one product. Opt-in (the interpreter too, when asked): on an H100 (2026-12-07)
    eight strict packages ran 0.69-0.85x the split pass's kernel with it."""
    if os.environ.get(INSPLIT_ENV) != "1" or scheme != FP16X3 or stage.partner is not None:
        return []
    tiles = [c for c in stage_configs(spec, target, precision, stage, scheme)
             if c.get("SPLIT_K", 1) == 1]
    return [dict(tiles[0], INSPLIT=True)] if tiles else []


def _opt_in_tma_configs(spec: KernelSpec, target, precision: str, stage: RegionShape,
                        scheme: str) -> list:
    """strict's fp16x3 and tf32 on the TMA kernel: only with KFORGE_BUILTIN_TMA=1 (not timed
    on a GPU yet), and not where a row reduction is fused over the tile (fp16x3's `part`
    accumulator doubles the registers). fp16x3: 128 x 128 x 64 tiles, 8 warps (acc and part:
    128 values a thread), 3 stages of four 16 KiB tiles, then BLOCK_K 32 with 4 stages. tf32:
    kernels/gemm.py's persistent tf32 tiles (NOTES.md run 4), 256 x 128 x 32 with 8 warps and
    3 stages where M >= 1024 and N >= 8192, else 128 x 128 x 32 with 4 stages first (fp32
    tiles: 32-48 KiB a stage). The interpreter: the target's first tile."""
    if os.environ.get(TMA_ENV) != "1":
        return []
    problem = dict(problem_of(spec, stage), precision=precision)
    if stage.reductions and problem.get("full_rows"):
        return []
    con = stage.contraction
    if target.interpreter:
        tiles = [c for c in target.configs("gemm", dict(problem, precision="bf16"))
                 if c.get("SPLIT_K", 1) == 1][:1]
    elif scheme == FP16X3:
        # first the tile in two column parts (N_PARTS: A's planes read once for 256 columns;
        # 48 KiB a stage at BLOCK_K 32), where N spans more than one 128-column tile
        tiles = [_cfg_tile(128, 128, 64, 8, 3, 16), _cfg_tile(128, 128, 32, 8, 4, 16)]
        if con.extent(con.n) > 128:
            tiles.insert(0, _cfg_tile(128, 256, 32, 8, 4, 16, N_PARTS=2))
    else:
        tiles = [_cfg_tile(256, 128, 32, 8, 3, 16), _cfg_tile(128, 128, 32, 8, 4, 16)]
        if not (con.extent(con.m) >= 1024 and con.extent(con.n) >= 8192):
            tiles.reverse()
    return [dict(c, TMA=True) for c in tiles]


def _cfg_tile(bm, bn, bk, warps, stages, group_m, **keys) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m, "SPLIT_K": 1,
            "num_warps": warps, "num_stages": stages, **keys}


def stage_configs(spec, target, precision: str, stage: RegionShape,
                  scheme: str | None = None) -> list[dict]:
    """The target's configurations for a stage; for a GEMM, those that suit `scheme` (fp16x3
    takes the 2-byte-operand tiles, see fp16x3_configs). No split-K with row reductions."""
    problem = dict(problem_of(spec, stage), precision=precision)
    if scheme == FP16X3 and not target.interpreter:
        configs = fp16x3_configs(target.configs("gemm", dict(problem, precision="bf16")))
    elif scheme == FP16X1:          # 16-bit operands, one product: bf16's tiles, two of them
        configs = target.configs(stage.kind, dict(problem, precision="bf16"))[:2]
    elif precision == "bf16" and scheme:     # the fp32-operand fallback: fp32 tiles, two
        configs = target.configs(stage.kind, dict(problem, precision="tf32"))[:2]
    else:
        configs = target.configs(stage.kind, problem)
    return [dict(c) for c in configs if not (stage.reductions and c.get("SPLIT_K", 1) > 1)]
