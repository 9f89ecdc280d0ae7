"""Fused flash-attention forward as a KForge kernel source generator.

    out[b, h, i] = sum_j softmax_j(l[b, h, i, :] (+ sink)) v[b, h // G, j]
    l[b, h, i, j] = scale * q[b, h, i] . k[b, h // G, j]  (+ additive mask)   or -inf if masked

`attention_source(...)` returns the Python source of a self-contained KForge candidate (imports
only torch, triton, triton.language, math; passes kforge.verify.static.static_check): one
@triton.jit kernel plus helpers, and `launch(q, k, v[, mask][, sinks]) -> (out,)` that only checks
shapes, allocates the output (torch.empty_like(q), or q.new_empty([B, Hq, Sq, Dv]) where v's
head dim is not q's), takes a broadcasting view of the mask (`mask.expand`, stride 0 on broadcast
dims, never materialized) and launches the kernel. Every shape-independent choice is baked into
the source as a module-level constant; B, H, Sq, Skv and all strides are read from the tensors at
run time, so one source serves every batch/sequence size.

Semantics (the reference is `reference_attention` below; it equals
torch.nn.functional.scaled_dot_product_attention wherever that one is defined):
  * q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], out [B, Hq, Sq, Dv], any strides;
    Hq == gqa_group * Hkv (query head h reads kv head h // gqa_group); D from 1 to 256 (the
    configuration lists were cross-compiled at 16, 32, 64, 80, 96, 128, 192 and 256); Dv = D by
    default (`value_head_dim`), or another width up to 256: values narrower than queries and
    keys are multi-head latent attention (DeepSeek-V3: D = 192, 128 without and 64 with rotary
    embedding, Dv = 128). Both are padded to a power of two of at least 16 (the smallest dot)
    inside the kernel, with masked loads.
  * scale defaults to 1/sqrt(D) (q's head dim), applied to q.k before the additive mask (as
    SDPA).
  * mask: None, "bool" (True = keep) or "additive" (float, added to the scaled logits; -inf or
    finfo.min entries as transformers builds them), broadcastable to [B, Hq, Sq, Skv].
  * causal, bottom-right aligned (KV caches): query i attends key j iff j <= i + (Skv - Sq).
    NB torch's `is_causal=True` is top-left aligned; the two agree only when Sq == Skv.
  * window W: additionally j > i + (Skv - Sq) - W (the last W keys up to and including the
    diagonal; transformers' sliding_window_overlay). Without `causal` it is only this lower
    bound (keys after the diagonal stay visible).
  * sinks (gpt-oss): a per-query-head logit s[h] (not scaled, no mask) in the denominator only.
  * rows where every key is masked: masked_rows="zero" (default) writes 0, which is what
    torch >= 2.5 SDPA returns (math backend `_safe_softmax`; checked with torch 2.13) and what
    transformers relies on (checked 5.24: masking_utils no longer unmasks such rows, its
    `allow_torch_fix` is deprecated and does nothing); masked_rows="nan" writes NaN (0/0, as
    older torch did).
    With sinks such a row is 0 either way (the sink takes all the weight). An additive mask of
    finite finfo.min values is *not* "masked": like eager torch, such a row averages v.
  * dtypes fp32, bf16, fp16 (baked: `dtype`); out has q's dtype, and q's layout where Dv = D
    (else contiguous); fp32 softmax statistics and accumulator.

Precision (`dot_precision`):
  * "ieee": fp32-accurate products. For fp32 operands the dots use
    input_precision=`fp32_dot` — "tf32x3" (default: Triton's 3xTF32 split on tensor cores, ~2^-22
    relative per product; on the H200 its worst error was 0.007 of the 1e-4 tolerance,
    benchmarks/attention/NOTES.md) or "ieee" (plain fp32 FMA, exact but without tensor cores,
    small tiles only). The interpreter multiplies fp32 exactly either way. P@V is always taken
    into a fresh accumulator and added in fp32 (chaining wgmma accumulation is not
    round-to-nearest). bf16/fp16 q, k: q@k^T runs on 16-bit tensor cores (products are exact in
    fp32), P stays fp32 and V is widened to fp32 for P@V.
  * "tf32": the same with input_precision="tf32".
  * "bf16": q/k/v tiles cast to bf16 (fp16 when the inputs are fp16), P cast likewise, fp32
    accumulation (P@V chained in the accumulator, as FlashAttention does).
  * "fp16x3" (fp32 q, k, v only): q@k^T as three fp16 products of hi/lo splits of q and k
    (fp32-grade scores: the softmax amplifies their errors), P and V rounded to fp16 for one
    fp16 p@v into a fresh fp32 accumulator (P is in [0, 1]; V overflowing fp16 fails the
    verification's wide-magnitude check). The bf16 policy's second scheme, for prefill, where
    bf16-rounded scores missed the tolerance (Llama-3-8B, H200) and 3xTF32 on both products
    took 40 % of the step.
  * "fp16x1" (fp32 q, k, v only): one fp16 product each for q@k^T and p@v, on operands scaled
    by powers of two so that fp16 neither overflows nor loses them to subnormals: each row of q
    and each key of k by its own (max |x| over the head dim below 2**15), each column of v
    likewise over all the keys; the scales are undone exactly on the fp32 scores and on the
    output. k and v are scaled once, by two small kernels before the attention kernel, into fp16
    copies (half the bytes the kernel reads; every query tile reads them as a bf16 kernel reads
    its 16-bit operands, p@v accumulated in the dot). With `kv_append` (a cache and the step's
    new keys, read where they lie) each k tile is scaled per key and each v tile per column
    over the tile's keys, in the kernel, and each tile's p@v is unscaled before it is added.
    Operands keep 11 significant bits, as TF32 does (and 8x finer than bf16), at the 16-bit
    rate: tf32's second scheme and bf16's second, before fp16x3. P is in [0, 1] and rounded to
    fp16 as fp16x3 does.
  * interpret=True (the Triton interpreter, TRITON_INTERPRET=1): numpy has no bf16 matmul, so
    every dot widens its (already rounded) operands to fp32 and multiplies exactly; the rounding of
    the "bf16" policy is still applied first, so the numerics match the GPU's up to accumulation
    order. The interpreter's "tf32" is exact fp32.

Other API: `attention_configs(head_dim, dtype, target, *, seq_q=None, dot_precision=None,
fp32_dot="tf32x3", value_head_dim=None)` (block sizes/warps/stages worth trying, as
attention_source keyword dicts: pass the precision scheme, its register/shared-memory needs
differ), `reference_attention(...)` (pure torch, any float dtype, float64 for tests),
`load_source(src)` (import a rendered source; Triton's JIT needs a real file). H200 timing
script and results: benchmarks/attention/ (run 1, 2026-12-01: bf16 causal prefill D=128 387
TFLOP/s = 0.75x torch SDPA's flash kernel; decoding with pack_gqa at the memory roofline, 1.0x
SDPA; fp32 "ieee" 0.88x SDPA's fp32 kernel).

pack_gqa=True puts the gqa_group query heads that share a kv head into one program's rows
(rows = (head in group, query)), so each K/V tile is loaded once per group: for decoding
(Sq = 1) it turns a 1-row tile into a gqa_group-row tile.
"""
from __future__ import annotations

import math
import textwrap

from kforge.kernels import BF16_RNE_SOURCE, POW2_SOURCE

# Any head dim from 1 to MAX_HEAD_DIM is taken, padded to a power of two of at least 16 (a dot's
# side) with masked loads; HEAD_DIMS are the widths the configuration lists were cross-compiled
# at for sm_90 (a width between two of them compiles like the next one up: its padded tile).
# Models bring others: MobileViT-S 36 / 48 / 60, small configs 4 to 8, DeepSeek-V3 192 / 128.
MAX_HEAD_DIM = 256
HEAD_DIMS = (16, 32, 64, 80, 96, 128, 192, 256)
VALUE_HEAD_DIMS = (8,) + HEAD_DIMS      # DeepSeek-V3's multi-head latent attention in small: 8


def head_dim_ok(d) -> bool:
    """Whether the kernel takes `d` as a head dim (of queries and keys, or of values)."""
    return isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_HEAD_DIM
DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
DOT_PRECISIONS = ("ieee", "tf32", "bf16", "fp16x3", "fp16x1")
FP16_SPLITS = ("fp16x3", "fp16x1")     # fp32 q, k, v split (fp16x3) or scaled (fp16x1)
FP32_DOTS = ("tf32x3", "ieee")
MASK_KINDS = {None: 0, "bool": 1, "additive": 2}
MASKED_ROWS = ("zero", "nan")
LOG2E = 1.4426950408889634

# a @ b for every precision scheme, and the interpreter's bf16 rounding (BF16_RNE_SOURCE); the
# MoE kernels use them too (kforge.kernels.moe)
MMA_SOURCE = '''
@triton.jit
def _mma(a, b, PREC: tl.constexpr, INTERP: tl.constexpr):
    """a @ b with fp32 accumulation; PREC "" = 16-bit operands (tensor cores)."""
    if INTERP:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif PREC == "":
        c = tl.dot(a, b)
    else:
        c = tl.dot(a, b, input_precision=PREC)
    return c


''' + BF16_RNE_SOURCE

_KERNEL = MMA_SOURCE + POW2_SOURCE + '''

@triton.jit
def _dot_fp16x3(a, b, INTERP: tl.constexpr):
    """a @ b of fp32 tiles as three fp16 products: each operand split into an fp16 high part
    and the fp16 rounding of what it leaves, a_hi@b_lo + a_lo@b_hi + a_hi@b_hi (the small
    terms first), fp32 accumulation: about 2^-22 relative per product, at 3x the fp16 rate."""
    a_hi = a.to(tl.float16)
    a_lo = (a - a_hi.to(tl.float32)).to(tl.float16)
    b_hi = b.to(tl.float16)
    b_lo = (b - b_hi.to(tl.float32)).to(tl.float16)
    c = _mma(a_hi, b_lo, "", INTERP) + _mma(a_lo, b_hi, "", INTERP)
    return c + _mma(a_hi, b_hi, "", INTERP)

@triton.jit
def _pow2_scales(amax):
    """(2**(15 - e), 2**(e - 15)) with amax < 2**e: the power of two that brings a slice whose
    largest |x| is amax under 2**15 (fp16's top binade; 1 for a zero slice), and its inverse."""
    e = _pow2_exp(amax)
    return _pow2(15 - e), _pow2(e - 15)

@triton.jit
def _prep_k16(K, K16, KS, Skv, H, stride_kb, stride_kh, stride_kn, stride_kd,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """fp16x1's keys, once for every query tile that reads them: each key (row of k) scaled by
    its own power of two (max |k| over the head dim below 2**15) into K16 [B, H, Skv, HEAD_DIM]
    fp16, the factor that undoes it into KS [B, H, Skv]."""
    pid = tl.program_id(0)
    n_r = tl.cdiv(Skv, BLOCK_R)
    bh = pid // n_r
    rows = (pid % n_r) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok = rows < Skv
    ok = r_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    b64 = (bh // H).to(tl.int64)
    h64 = (bh % H).to(tl.int64)
    x = tl.load(K + b64 * stride_kb + h64 * stride_kh + rows[:, None].to(tl.int64) * stride_kn
                + offs_d[None, :] * stride_kd, mask=ok, other=0.0)
    y, down = _fp16_scaled(x, 1)
    out_rows = bh.to(tl.int64) * Skv + rows
    tl.store(K16 + out_rows[:, None] * HEAD_DIM + offs_d[None, :], y, mask=ok)
    tl.store(KS + out_rows, down, mask=r_ok)

@triton.jit
def _v_block(base, r0, Skv, cols, c_ok, stride_vn, stride_vd, BLOCK_R: tl.constexpr):
    """Rows r0 .. r0 + BLOCK_R of one head's v at `cols` (0 outside), the rows, their mask."""
    rows = r0 + tl.arange(0, BLOCK_R)
    ok = (rows < Skv)[:, None] & c_ok[None, :]
    x = tl.load(base + rows[:, None].to(tl.int64) * stride_vn + cols[None, :] * stride_vd,
                mask=ok, other=0.0)
    return x, rows, ok

@triton.jit
def _prep_v16(V, V16, VS, Skv, H, stride_vb, stride_vh, stride_vn, stride_vd,
              HEAD_DIM_V: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr):
    """fp16x1's values: each column (b, head, d) scaled by one power of two over all its keys
    (max |v| below 2**15) into V16 [B, H, Skv, HEAD_DIM_V] fp16, the factor into VS [B, H,
    HEAD_DIM_V]: p@v then accumulates in the dot and the factor is applied once, at the end."""
    bh = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < HEAD_DIM_V
    base = V + (bh // H).to(tl.int64) * stride_vb + (bh % H).to(tl.int64) * stride_vh
    amax = tl.zeros([BLOCK_C], dtype=tl.float32)
    for r0 in range(0, Skv, BLOCK_R):
        x, rows, ok = _v_block(base, r0, Skv, cols, c_ok, stride_vn, stride_vd, BLOCK_R)
        amax = tl.maximum(amax, tl.max(tl.abs(x), 0))
    up, down = _pow2_scales(amax)
    tl.store(VS + bh.to(tl.int64) * HEAD_DIM_V + cols, down, mask=c_ok)
    for r0 in range(0, Skv, BLOCK_R):       # again, scaled by the factors found above
        x, rows, ok = _v_block(base, r0, Skv, cols, c_ok, stride_vn, stride_vd, BLOCK_R)
        out_rows = bh.to(tl.int64) * Skv + rows
        tl.store(V16 + out_rows[:, None] * HEAD_DIM_V + cols[None, :],
                 (x * up[None, :]).to(tl.float16), mask=ok)

@triton.jit
def _fp16_scaled(x, AXIS: tl.constexpr):
    """x as fp16 scaled by a power of two per row (AXIS 1) or per column (AXIS 0), max |x| over
    AXIS below 2**15 after scaling (a zero slice: scale 1), and the factors that undo it
    (exact: powers of two); NaN and inf stay NaN and inf."""
    up, down = _pow2_scales(tl.max(tl.abs(x), AXIS))
    if AXIS == 1:
        y = (x * up[:, None]).to(tl.float16)
    else:
        y = (x * up[None, :]).to(tl.float16)
    return y, down

@triton.jit
def _attn_tile(acc, l_i, m_i, q, qs, k_base, v_base, ks_base, mask_rows, row_i, row_ok, start_n,
               Skv, off, stride_kn, stride_kd, stride_vn, stride_vd, stride_mn,
               BOUNDS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_DV: tl.constexpr, HEAD_DIM_V: tl.constexpr,
               QK_SCALE: tl.constexpr, USE_EXP2: tl.constexpr,
               CAUSAL: tl.constexpr, WINDOW: tl.constexpr, MASK_KIND: tl.constexpr,
               QK_PREC: tl.constexpr, PV_PREC: tl.constexpr, LOWP: tl.constexpr,
               CAST_KV: tl.constexpr, CHAIN_PV: tl.constexpr, INTERP: tl.constexpr,
               PREP: tl.constexpr):
    """One BLOCK_N block of keys: the online-softmax update of (acc, l_i, m_i).
    PREP (fp16x1): k and v are the prepared fp16 copies (_prep_k16 / _prep_v16), each key's
    factor at ks_base; v's factors are applied after the last block.
    BOUNDS: the block may hold keys >= Skv or keys the causal/window band excludes for some
    row; without it every key of the block is < Skv and in the band of every row."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    n_ok = offs_n < Skv
    d_ok = offs_d < HEAD_DIM
    dv_ok = offs_dv < HEAD_DIM_V
    kt_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
    if BOUNDS:
        kt = tl.load(kt_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
    else:
        if BLOCK_D != HEAD_DIM:
            kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
        if BLOCK_DV != HEAD_DIM_V:
            v = tl.load(v_ptrs, mask=dv_ok[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
    if CAST_KV:
        kt = kt.to(LOWP)
    if QK_PREC == "fp16x3":
        s = _dot_fp16x3(q, kt, INTERP) * QK_SCALE
    elif QK_PREC == "fp16x1":       # q scaled per row (qs), each key of the tile per column
        if PREP:
            if BOUNDS:
                ks = tl.load(ks_base + offs_n, mask=n_ok, other=1.0)
            else:
                ks = tl.load(ks_base + offs_n)
        else:
            kt, ks = _fp16_scaled(kt, 0)
        s = _mma(q, kt, "", INTERP) * (qs[:, None] * (ks * QK_SCALE)[None, :])
    else:
        s = _mma(q, kt, QK_PREC, INTERP) * QK_SCALE
    if MASK_KIND != 0:
        m_ptrs = mask_rows[:, None] + offs_n[None, :] * stride_mn
        if BOUNDS:
            m_ok = row_ok[:, None] & n_ok[None, :]
        else:
            m_ok = row_ok[:, None] & (offs_n[None, :] >= 0)
        if MASK_KIND == 1:
            mv = tl.load(m_ptrs, mask=m_ok, other=0)
            keep = mv != 0
        else:
            s = s + tl.load(m_ptrs, mask=m_ok, other=0.0).to(tl.float32)
    if BOUNDS:
        band = n_ok[None, :] & (row_i[:, None] >= 0)
        if CAUSAL:
            band = band & (offs_n[None, :] <= row_i[:, None] + off)
        if WINDOW > 0:
            band = band & (offs_n[None, :] > row_i[:, None] + (off - WINDOW))
        if MASK_KIND == 1:
            keep = keep & band
        else:
            keep = band
        s = tl.where(keep, s, float("-inf"))
    elif MASK_KIND == 1:
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)    # a row with nothing kept yet
    if USE_EXP2:
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
    else:
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if PV_PREC == "fp16x1" and PREP:     # v scaled per column over all keys: undone at the end
        if INTERP:
            acc = acc + _mma(p.to(tl.float16), v, "", INTERP)
        else:
            acc = tl.dot(p.to(tl.float16), v, acc)
    elif PV_PREC == "fp16x1":       # v scaled per column over the tile's keys, undone after
        v16, vs = _fp16_scaled(v, 0)
        acc = acc + _mma(p.to(tl.float16), v16, "", INTERP) * vs[None, :]
    else:
        if PV_PREC == "":
            pv_a = p.to(LOWP)
            pv_b = v.to(LOWP)
        else:
            pv_a = p
            pv_b = v.to(tl.float32)
        if CHAIN_PV and not INTERP:
            acc = tl.dot(pv_a, pv_b, acc)
        else:
            acc = acc + _mma(pv_a, pv_b, PV_PREC, INTERP)
    return acc, l_i, m_new


@triton.jit
def _attn_fwd(Q, K, V, O, M, S, K2, V2, KS, VS,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_om, stride_od,
              stride_mb, stride_mh, stride_mm, stride_mn,
              stride_k2b, stride_k2h, stride_k2n, stride_k2d,
              stride_v2b, stride_v2h, stride_v2n, stride_v2d,
              stride_ksb, stride_ksh, stride_vsb, stride_vsh,
              Sq, Skv, C, n_head_prog,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr,
              BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              GQA: tl.constexpr, PACK: tl.constexpr, QK_SCALE: tl.constexpr,
              USE_EXP2: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
              MASK_KIND: tl.constexpr, HAS_SINKS: tl.constexpr, SINK_SCALE: tl.constexpr,
              QK_PREC: tl.constexpr, PV_PREC: tl.constexpr,
              LOWP: tl.constexpr, CAST_Q: tl.constexpr, CAST_KV: tl.constexpr,
              CHAIN_PV: tl.constexpr, ZERO_EMPTY: tl.constexpr, INTERP: tl.constexpr,
              TWO: tl.constexpr, PREP: tl.constexpr):
    # TWO: keys [0, C) are K/V, keys [C, Skv) are K2/V2 at index j - C (a KV cache and the
    # step's new keys, never concatenated); without it C == Skv and K2/V2 are unused
    # program -> (row tile, batch, head group); row tiles of one (b, head) are adjacent so that
    # they share K/V in L2; with CAUSAL the heaviest tile of each (b, head) goes first
    G: tl.constexpr = GQA if PACK else 1          # query heads per program
    R = Sq * G                                    # rows of one program space
    n_m = tl.cdiv(R, BLOCK_M)
    pid = tl.program_id(0)
    start_m = pid % n_m
    if CAUSAL:
        start_m = n_m - 1 - start_m
    bh = pid // n_m
    b = bh // n_head_prog
    h0 = (bh % n_head_prog) * G                   # first query head of this program
    hkv = h0 // GQA
    r0 = start_m * BLOCK_M
    offs_m = r0 + tl.arange(0, BLOCK_M)
    row_ok = offs_m < R
    r1 = tl.minimum(r0 + BLOCK_M, R) - 1          # last real row
    if PACK:
        g = offs_m // Sq
        row_i = offs_m - g * Sq                    # query index of each row
        head = h0 + g                              # query head of each row
        g0 = r0 // Sq
        g1 = r1 // Sq
        i_min = tl.where(g0 == g1, r0 - g0 * Sq, 0)
        i_max = tl.where(g0 == g1, r1 - g0 * Sq, Sq - 1)
    else:
        row_i = offs_m
        head = h0 + offs_m * 0
        i_min = r0
        i_max = r1
    b64 = b.to(tl.int64)
    head64 = head.to(tl.int64)
    row64 = row_i.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    q_ptrs = Q + (b64 * stride_qb + head64 * stride_qh + row64 * stride_qm)[:, None] \\
        + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if CAST_Q:
        q = q.to(LOWP)
    if QK_PREC == "fp16x1":
        q, qs = _fp16_scaled(q, 1)                 # each row by its own power of two
    else:
        qs = tl.full([BLOCK_M], 1.0, tl.float32)
    k_base = K + b64 * stride_kb + hkv.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hkv.to(tl.int64) * stride_vh
    ks_base = KS + b64 * stride_ksb + hkv.to(tl.int64) * stride_ksh   # (PREP: keys' factors)
    # the new keys, addressed by absolute key index j (their row j - C)
    # (C * stride: a cache's length times a row's stride; C may be a specialized constant)
    k2_base = K2 + b64 * stride_k2b + hkv.to(tl.int64) * stride_k2h - C * stride_k2n
    v2_base = V2 + b64 * stride_v2b + hkv.to(tl.int64) * stride_v2h - C * stride_v2n
    mask_rows = M + b64 * stride_mb + head64 * stride_mh + row64 * stride_mm

    if HAS_SINKS:
        m_i = tl.load(S + head, mask=row_ok, other=0.0).to(tl.float32) * SINK_SCALE
        l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # key range [lo, hi) that some row of the tile may see, and the sub-range [full_lo,
    # full_hi) that every row sees (no causal/window/Skv masks there)
    off = Skv - Sq
    lo = 0
    hi = Skv
    full_lo = 0
    full_hi = Skv
    if CAUSAL:
        hi = tl.minimum(Skv, i_max + off + 1)
        full_hi = tl.minimum(hi, i_min + off + 1)
    if WINDOW > 0:
        lo = tl.maximum(0, i_min + off - WINDOW + 1)
        full_lo = tl.maximum(lo, i_max + off - WINDOW + 1)
    lo = (lo // BLOCK_N) * BLOCK_N                 # blocks start at multiples of BLOCK_N
    hi = tl.maximum(hi, lo)                        # (no key at all: causal with Sq > Skv)
    hi_all = hi
    if TWO:                                        # the loops below cover the cache only
        hi = tl.maximum(tl.minimum(hi, C), lo)
        full_hi = tl.minimum(full_hi, C)
    # masked [lo, mid_lo), unmasked [mid_lo, mid_hi), masked [mid_hi, hi)
    mid_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, lo), hi)
    mid_hi = tl.maximum(tl.minimum((full_hi // BLOCK_N) * BLOCK_N, hi), mid_lo)

    for start_n in range(lo, mid_lo, BLOCK_N):
        acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, qs, k_base, v_base, ks_base, mask_rows,
                                   row_i, row_ok, start_n, C, off,
                                   stride_kn, stride_kd, stride_vn, stride_vd,
                                   stride_mn, True, BLOCK_N, BLOCK_D, HEAD_DIM, BLOCK_DV,
                                   HEAD_DIM_V, QK_SCALE, USE_EXP2, CAUSAL, WINDOW, MASK_KIND,
                                   QK_PREC, PV_PREC, LOWP, CAST_KV, CHAIN_PV, INTERP, PREP)
    for start_n in range(mid_lo, mid_hi, BLOCK_N):
        acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, qs, k_base, v_base, ks_base, mask_rows,
                                   row_i, row_ok, start_n, C, off,
                                   stride_kn, stride_kd, stride_vn, stride_vd,
                                   stride_mn, False, BLOCK_N, BLOCK_D, HEAD_DIM, BLOCK_DV,
                                   HEAD_DIM_V, QK_SCALE, USE_EXP2, CAUSAL, WINDOW, MASK_KIND,
                                   QK_PREC, PV_PREC, LOWP, CAST_KV, CHAIN_PV, INTERP, PREP)
    for start_n in range(mid_hi, hi, BLOCK_N):
        acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, qs, k_base, v_base, ks_base, mask_rows,
                                   row_i, row_ok, start_n, C, off,
                                   stride_kn, stride_kd, stride_vn, stride_vd,
                                   stride_mn, True, BLOCK_N, BLOCK_D, HEAD_DIM, BLOCK_DV,
                                   HEAD_DIM_V, QK_SCALE, USE_EXP2, CAUSAL, WINDOW, MASK_KIND,
                                   QK_PREC, PV_PREC, LOWP, CAST_KV, CHAIN_PV, INTERP, PREP)

    if TWO:                                        # the new keys, every block bounded
        for start_n in range(C, hi_all, BLOCK_N):
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, qs, k2_base, v2_base, ks_base, mask_rows,
                                       row_i, row_ok, start_n, Skv, off,
                                       stride_k2n, stride_k2d, stride_v2n, stride_v2d,
                                       stride_mn, True, BLOCK_N, BLOCK_D, HEAD_DIM, BLOCK_DV,
                                       HEAD_DIM_V, QK_SCALE, USE_EXP2, CAUSAL, WINDOW, MASK_KIND,
                                       QK_PREC, PV_PREC, LOWP, CAST_KV, CHAIN_PV, INTERP, PREP)

    if ZERO_EMPTY:
        l_i = tl.where(l_i == 0.0, 1.0, l_i)       # no key kept: acc is 0, the row is 0
    out = acc / l_i[:, None]
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < HEAD_DIM_V
    if PREP:                                       # v's column factors (fp16x1, _prep_v16)
        vs = tl.load(VS + b64 * stride_vsb + hkv.to(tl.int64) * stride_vsh + offs_dv,
                     mask=dv_ok, other=1.0)
        out = out * vs[None, :]
    o_ptrs = O + (b64 * stride_ob + head64 * stride_oh + row64 * stride_om)[:, None] \\
        + offs_dv[None, :] * stride_od
    if INTERP and O.dtype.element_ty == tl.bfloat16:
        out = _bf16_rne(out)          # the interpreter truncates to bf16; a GPU rounds
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
'''

_LAUNCH = '''

def launch({params}):
    """{doc} -> (out,): out [B, Hq, Sq, {dv}] in q's dtype."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-d [B, H, S, D]")
    B, HQ, SQ, D = q.shape
    HKV = k.shape[1]
    SKV = k.shape[2]
    if D != HEAD_DIM or k.shape[3] != HEAD_DIM or v.shape[3] != HEAD_DIM_V:
        raise ValueError(f"head dims must be {{HEAD_DIM}} (q, k) and {{HEAD_DIM_V}} (v), got q "
                         f"{{tuple(q.shape)}}, k {{tuple(k.shape)}}, v {{tuple(v.shape)}}")
    if k.shape[0] != B or v.shape[0] != B or v.shape[1] != HKV or v.shape[2] != SKV:
        raise ValueError(f"k {{tuple(k.shape)}} and v {{tuple(v.shape)}} do not match q "
                         f"{{tuple(q.shape)}}")
    if HQ != HKV * GQA_GROUP:
        raise ValueError(f"{{HQ}} query heads != {{GQA_GROUP}} x {{HKV}} kv heads")
    if q.dtype != DTYPE or k.dtype != DTYPE or v.dtype != DTYPE:
        raise ValueError(f"q, k, v must be {{DTYPE}}")
{alloc_code}{kv_code}{mask_code}{sink_code}{prep_code}    grid = (triton.cdiv(SQ * HEAD_GROUP, BLOCK_M) * B * (HQ // HEAD_GROUP),)
    _attn_fwd[grid](
        q, k, v, o, m, s, k2, v2, ks, vs,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        o.stride(0), o.stride(1), o.stride(2), o.stride(3),
        msb, msh, msm, msn,
        k2.stride(0), k2.stride(1), k2.stride(2), k2.stride(3),
        v2.stride(0), v2.stride(1), v2.stride(2), v2.stride(3),
        ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
        SQ, SKV, C, HQ // HEAD_GROUP,
        HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, HEAD_DIM_V=HEAD_DIM_V, BLOCK_DV=BLOCK_DV,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, GQA=GQA_GROUP, PACK=PACK_GQA, QK_SCALE=QK_SCALE,
        USE_EXP2=USE_EXP2, CAUSAL=CAUSAL, WINDOW=WINDOW, MASK_KIND=MASK_KIND,
        HAS_SINKS=HAS_SINKS, SINK_SCALE=SINK_SCALE, QK_PREC=QK_PREC, PV_PREC=PV_PREC,
        LOWP=LOWP, CAST_Q=CAST_Q, CAST_KV=CAST_KV, CHAIN_PV=CHAIN_PV, ZERO_EMPTY=ZERO_EMPTY,
        INTERP=INTERPRET, TWO=KV_APPEND, PREP=PREP_KV,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return (o,)
'''

_ALLOC_CODE = '''    o = torch.empty_like(q)
'''
_ALLOC_V_CODE = '''    o = q.new_empty((B, HQ, SQ, HEAD_DIM_V))   # Dv != D: contiguous
'''

_KV_CODE = '''    # the step's new keys and values, appended to the cache without a copy
    if k_new.dim() != 4 or v_new.dim() != 4 or k_new.shape[:3] != v_new.shape[:3] or \\
            k_new.shape[:2] != k.shape[:2] or k_new.shape[3] != HEAD_DIM or \\
            v_new.shape[3] != HEAD_DIM_V:
        raise ValueError(f"k_new {tuple(k_new.shape)} / v_new {tuple(v_new.shape)} do not "
                         f"match the cache {tuple(k.shape)}")
    if k_new.dtype != DTYPE or v_new.dtype != DTYPE:
        raise ValueError(f"k_new, v_new must be {DTYPE}")
    C = SKV
    SKV = C + k_new.shape[2]
    k2, v2 = k_new, v_new
'''
_NO_KV_CODE = '''    C = SKV
    k2, v2 = k, v                        # unused
'''

_MASK_CODE = '''    if mask.dim() > 4:
        raise ValueError("mask must be broadcastable to [B, Hq, Sq, Skv]")
    if MASK_KIND == 1 and mask.dtype != torch.bool:
        raise ValueError("this kernel takes a boolean mask (True = keep)")
    if MASK_KIND == 2 and not mask.is_floating_point():
        raise ValueError("this kernel takes an additive float mask")
    m = mask.expand(B, HQ, SQ, SKV)      # a view: broadcast dims get stride 0
    msb, msh, msm, msn = m.stride()
'''
_NO_MASK_CODE = '''    m = q                                # unused pointer
    msb, msh, msm, msn = 0, 0, 0, 0
'''
_SINK_CODE = '''    if sinks.dim() != 1 or sinks.shape[0] != HQ:
        raise ValueError(f"sinks must be [{HQ}], got {tuple(sinks.shape)}")
    s = sinks
'''
_NO_SINK_CODE = '''    s = q                                # unused pointer
'''
_PREP_CODE = '''    # fp16x1: k and v scaled to fp16 once (per key; per column over all keys), not
    # in every query tile that reads them; the kernel reads the copies
    k16 = torch.empty((B, HKV, SKV, HEAD_DIM), dtype=torch.float16, device=k.device)
    ks = torch.empty((B, HKV, SKV), dtype=torch.float32, device=k.device)
    v16 = torch.empty((B, HKV, SKV, HEAD_DIM_V), dtype=torch.float16, device=v.device)
    vs = torch.empty((B, HKV, HEAD_DIM_V), dtype=torch.float32, device=v.device)
    _prep_k16[(B * HKV * triton.cdiv(SKV, PREP_ROWS),)](
        k, k16, ks, SKV, HKV, k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_R=PREP_ROWS, num_warps=4)
    _prep_v16[(B * HKV, triton.cdiv(HEAD_DIM_V, PREP_COLS))](
        v, v16, vs, SKV, HKV, v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        HEAD_DIM_V=HEAD_DIM_V, BLOCK_C=PREP_COLS, BLOCK_R=PREP_ROWS, num_warps=4)
    k, v = k16, v16
'''
_NO_PREP_CODE = '''    ks, vs = q, q                        # unused pointers
'''


def _check(cond: bool, msg: str):
    if not cond:
        raise ValueError(msg)


def _padded(head_dim: int) -> int:
    """A head dim's tile width: the next power of two, at least 16 (tl.dot's smallest)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def attention_source(*, head_dim: int, causal: bool = False, window: int | None = None,
                     scale: float | None = None, mask: str | None = None, sinks: bool = False,
                     gqa_group: int = 1, dtype: str = "fp32", dot_precision: str = "ieee",
                     block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                     num_stages: int = 2, interpret: bool = False, fp32_dot: str = "tf32x3",
                     pack_gqa: bool = False, masked_rows: str = "zero",
                     kv_append: bool = False, value_head_dim: int | None = None) -> str:
    """The source of a KForge candidate computing attention with these baked options.

    `launch(q, k, v[, mask][, sinks])` (mask when `mask` is set, sinks when `sinks`) returns
    (out,). With `kv_append`, `launch(q, k, k_new, v, v_new[, mask][, sinks])`: the keys are
    k's followed by k_new's along the sequence (a KV cache and the step's own keys), read where
    they lie, never concatenated; masks and causality index the whole sequence. v (and v_new)
    are `value_head_dim` wide (default: head_dim), and so is out. See the module docstring for
    the semantics and precision policies."""
    _check(head_dim_ok(head_dim), f"head_dim must be 1..{MAX_HEAD_DIM}, got {head_dim}")
    if value_head_dim is None:
        value_head_dim = head_dim
    _check(head_dim_ok(value_head_dim),
           f"value_head_dim must be 1..{MAX_HEAD_DIM}, got {value_head_dim}")
    _check(dtype in DTYPES, f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    _check(dot_precision in DOT_PRECISIONS,
           f"dot_precision must be one of {DOT_PRECISIONS}, got {dot_precision!r}")
    _check(fp32_dot in FP32_DOTS, f"fp32_dot must be one of {FP32_DOTS}, got {fp32_dot!r}")
    _check(mask in MASK_KINDS, f"mask must be None, 'bool' or 'additive', got {mask!r}")
    _check(masked_rows in MASKED_ROWS, f"masked_rows must be one of {MASKED_ROWS}")
    _check(window is None or (isinstance(window, int) and window >= 1),
           f"window must be None or an int >= 1, got {window!r}")
    _check(isinstance(gqa_group, int) and gqa_group >= 1, "gqa_group must be an int >= 1")
    for name, val in (("block_m", block_m), ("block_n", block_n)):
        _check(val >= 16 and val & (val - 1) == 0, f"{name} must be a power of two >= 16")
    _check(num_warps in (1, 2, 4, 8, 16), "num_warps must be 1, 2, 4, 8 or 16")
    _check(num_stages >= 1, "num_stages must be >= 1")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    _check(math.isfinite(scale), "scale must be finite")

    f32 = dtype == "fp32"
    split = dot_precision in FP16_SPLITS
    _check(not split or f32, f"dot_precision {dot_precision!r} takes fp32 q, k, v")
    lowp = "tl.float16" if dtype == "fp16" or split else "tl.bfloat16"
    bf16 = dot_precision == "bf16"
    fp32_prec = {"ieee": fp32_dot, "tf32": "tf32", "bf16": "", "fp16x3": "",
                 "fp16x1": "fp16x1"}[dot_precision]
    qk_prec = dot_precision if split else fp32_prec if f32 else ""
    pv_prec = fp32_prec
    # additive masks stay in natural-log units: finfo.min * log2(e) would overflow to -inf and
    # turn an eager-style "all finfo.min" row (uniform weights in torch) into an empty one
    use_exp2 = mask != "additive"
    # fp16x1 over a sequence of keys (not a cache and the step's new keys: those stay where they
    # lie and are scaled a tile at a time)
    prep = dot_precision == "fp16x1" and not kv_append
    qk_scale = scale * LOG2E if use_exp2 else scale
    sink_scale = LOG2E if use_exp2 else 1.0

    consts = [  # (assignment, comment)
        (f"HEAD_DIM = {head_dim}", ""),
        (f"BLOCK_D = {_padded(head_dim)}", "head_dim padded to a power of two"),
        (f"HEAD_DIM_V = {value_head_dim}", "v's and out's head dim"),
        (f"BLOCK_DV = {_padded(value_head_dim)}", "likewise padded (at least 16: a dot's side)"),
        (f"BLOCK_M = {block_m}", ""),
        (f"BLOCK_N = {block_n}", ""),
        (f"NUM_WARPS = {num_warps}", ""),
        (f"NUM_STAGES = {num_stages}", ""),
        (f"GQA_GROUP = {gqa_group}", "query heads per kv head"),
        (f"PACK_GQA = {bool(pack_gqa and gqa_group > 1)}", "a program takes a kv head's group"),
        (f"HEAD_GROUP = {gqa_group if pack_gqa else 1}", "query heads per program"),
        (f"CAUSAL = {bool(causal)}", "bottom-right: key j <= query i + Skv - Sq"),
        (f"WINDOW = {window or 0}", "> 0: also key j > i + Skv - Sq - WINDOW"),
        (f"SCALE = {scale!r}", ""),
        (f"USE_EXP2 = {use_exp2}", "logits in log2 units (not with additive masks)"),
        (f"QK_SCALE = {qk_scale!r}", "SCALE (* log2(e) when USE_EXP2)"),
        (f"SINK_SCALE = {sink_scale!r}", ""),
        (f"MASK_KIND = {MASK_KINDS[mask]}", "0 none, 1 bool (True = keep), 2 additive"),
        (f"HAS_SINKS = {bool(sinks)}", ""),
        (f"DTYPE = {DTYPES[dtype]}", ""),
        (f"DOT_PRECISION = {dot_precision!r}", ""),
        (f"QK_PREC = {qk_prec!r}", "q@k^T input_precision ('' = 16-bit operands)"),
        (f"PV_PREC = {pv_prec!r}", "p@v input_precision ('' = 16-bit operands)"),
        (f"LOWP = {lowp}", "16-bit operand type of the bf16 policy"),
        (f"CAST_Q = {bf16 and f32}", ""),
        (f"CAST_KV = {bf16 and f32}", ""),
        (f"CHAIN_PV = {bf16}", "p@v accumulated inside the dot (bf16 policy)"),
        (f"ZERO_EMPTY = {masked_rows == 'zero'}", "rows with no key kept: 0 (else NaN)"),
        (f"INTERPRET = {bool(interpret)}", "Triton interpreter: dots widened to fp32"),
        (f"KV_APPEND = {bool(kv_append)}", "keys: k then k_new (a cache and the new ones)"),
        (f"PREP_KV = {prep}", "fp16x1: k, v scaled to fp16 once, before the kernel"),
        ("PREP_ROWS = 64", "the prepass's rows a program"),
        ("PREP_COLS = 32", "_prep_v16's columns a program"),
    ]
    params = (["q", "k", "k_new", "v", "v_new"] if kv_append else ["q", "k", "v"]) + \
        (["mask"] if mask else []) + (["sinks"] if sinks else [])
    feats = [f"D={head_dim}"] + ([f"Dv={value_head_dim}"] if value_head_dim != head_dim
                                 else []) + [dtype, f"dot={dot_precision}"]
    if causal:
        feats.append("causal")
    if window:
        feats.append(f"window={window}")
    if mask:
        feats.append(f"{mask} mask")
    if sinks:
        feats.append("sinks")
    if gqa_group > 1:
        feats.append(f"gqa={gqa_group}")
    if kv_append:
        feats.append("kv append")
    dv = "D" if value_head_dim == head_dim else "Dv"
    shapes = "q [B, Hq, Sq, D], " + ("k/v [B, Hkv, Skv, D]" if dv == "D" else
                                     "k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]")
    header = textwrap.dedent(f'''\
        """Flash-attention forward, generated by kforge.kernels.attention.

        {", ".join(feats)}

        launch({", ".join(params)}) -> (out,); {shapes}.
        """
        import math

        import torch
        import triton
        import triton.language as tl

        ''')
    launch = _LAUNCH.format(
        params=", ".join(params), doc=f"launch({', '.join(params)})", dv=dv,
        alloc_code=_ALLOC_CODE if value_head_dim == head_dim else _ALLOC_V_CODE,
        kv_code=_KV_CODE if kv_append else _NO_KV_CODE,
        mask_code=_MASK_CODE if mask else _NO_MASK_CODE,
        sink_code=_SINK_CODE if sinks else _NO_SINK_CODE,
        prep_code=_PREP_CODE if prep else _NO_PREP_CODE)
    lines = [f"{a.ljust(26)}  # {c}" if c else a for a, c in consts]
    return header + "\n".join(lines) + "\n\n" + _KERNEL + launch


def attention_configs(head_dim: int, dtype: str, target: str = "cuda", *,
                      seq_q: int | None = None, dot_precision: str | None = None,
                      fp32_dot: str = "tf32x3", value_head_dim: int | None = None,
                      kv_append: bool = False) -> list[dict]:
    """Launch configurations worth timing, best guess first, as attention_source keywords.

    target "cuda" (H200, sm_90) or "cpu" / "interpreter" (small tiles: the interpreter's cost
    grows with tile area). dot_precision defaults to "bf16" for 16-bit dtypes and "ieee" for fp32.
    seq_q <= 16 (decoding) gives small-BLOCK_M configs with pack_gqa (the group's heads fill the
    rows). The cuda lists were chosen from cross-compiles for sm_90 (kforge.crosscompile, Triton
    3.9, D=64/128 causal): every entry lowers to wgmma (BLOCK_M 64/128, 4/8 warps; decoding's
    BLOCK_M=16 uses mma.sync), fits the 227 KB of shared memory and spills nothing or a few dozen
    bytes. Order: measured best first where benchmarks/attention/NOTES.md has a measurement
    (H200, D=128 bf16/fp32 prefill, decoding, D=64 sliding window), else a guess. Tiles are
    sized for the wider of the q/k and v head dims (`value_head_dim`, default head_dim); head
    dims over 128 have lists of their own (_wide_head_configs)."""
    _check(head_dim_ok(head_dim), f"head_dim must be 1..{MAX_HEAD_DIM}, got {head_dim}")
    value_head_dim = head_dim if value_head_dim is None else value_head_dim
    _check(head_dim_ok(value_head_dim),
           f"value_head_dim must be 1..{MAX_HEAD_DIM}, got {value_head_dim}")
    _check(dtype in DTYPES, f"dtype must be one of {tuple(DTYPES)}")
    if dot_precision is None:
        dot_precision = "ieee" if dtype == "fp32" else "bf16"
    _check(dot_precision in DOT_PRECISIONS, f"dot_precision must be one of {DOT_PRECISIONS}")

    def c(bm, bn, w, s, **kw):
        return dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s, **kw)

    if target in ("cpu", "interpreter", "interpret"):
        return [c(16, 16, 4, 1), c(32, 32, 4, 1)]
    _check(target == "cuda", f"target must be 'cuda' or 'cpu', got {target!r}")
    if max(head_dim, value_head_dim) > 128:         # BLOCK_D or BLOCK_DV 256
        d192 = head_dim <= 192 and value_head_dim <= 128
        return _wide_head_configs(dtype, seq_q, dot_precision, fp32_dot, d192, c)
    big = max(head_dim, value_head_dim) > 64        # BLOCK_D or BLOCK_DV 128
    if seq_q is not None and seq_q <= 16:
        if dot_precision == "ieee":
            return [c(16, 64, 4, 3, pack_gqa=True), c(16, 32, 4, 3, pack_gqa=True),
                    c(64, 32, 4, 3, pack_gqa=True)]
        return [c(64, 64, 4, 3, pack_gqa=True), c(16, 128, 4, 3, pack_gqa=True),
                c(16, 64, 4, 3, pack_gqa=True), c(16, 64, 4, 3)]
    if dot_precision == "ieee" and fp32_dot == "ieee":
        # plain fp32 FMA dots (no tensor cores): only small tiles stay out of local memory
        return [c(64, 16, 8, 2), c(32, 16, 4, 2)]
    if dot_precision == "fp16x1" and not kv_append:
        # k and v scaled to fp16 before the kernel: its tiles are a 16-bit kernel's (sm_90
        # cross-compile, Triton 3.9, causal, D = 128 GQA 4 and D = 64 with sinks and a window:
        # none spills; 128x64 w8 s3 233 / 206 registers, 128 / 65 KB shared); not yet timed
        return [c(128, 64, 8, 3), c(128, 64, 8, 2), c(128, 32, 8, 3), c(64, 64, 4, 3)]
    if dot_precision == "fp16x1" and big:
        # (with kv_append: every tile scaled in the kernel) one fp16 dot each on scaled
        # operands; the scales and the fp32 v tile beside its fp16 copy take registers: at
        # D = 128 (Llama-3-8B prefill, causal, sm_90 cross-compile, Triton 3.9) 128x64 w8 s2
        # spilled 40 bytes (255 registers), 128x32 233-237 and 64x32 244 none; at D = 64
        # (gpt-oss, sinks and a window) fp16x3's tiles 212-254, none.
        # Not yet timed on a GPU
        return [c(128, 32, 8, 3), c(128, 32, 8, 2), c(64, 32, 4, 3), c(128, 64, 8, 2)]
    if dot_precision in FP16_SPLITS:
        # q@k^T's three fp16 dots, p@v one: fewer registers than tf32x3's six (sm_90 cross-
        # compile, Triton 3.9, Llama-3-8B prefill D=128 causal: 128x64 w8 s2 238 registers, no
        # spills, 160 KB shared; D=64 with sinks and a window: 196); not yet timed on a GPU
        return ([c(128, 64, 8, 2), c(128, 32, 8, 2), c(128, 32, 8, 3), c(64, 32, 4, 3)] if big
                else [c(128, 64, 8, 3), c(128, 64, 8, 2), c(64, 64, 4, 3), c(128, 32, 8, 3)])
    if dot_precision == "ieee":
        # tf32x3 splits both operands of p@v (and of q@k^T for fp32): three dots' registers
        if dtype == "fp32":
            return ([c(128, 32, 8, 2), c(128, 16, 8, 2), c(64, 32, 4, 3), c(64, 16, 4, 3)] if big
                    else [c(128, 64, 8, 2), c(64, 64, 4, 3), c(128, 32, 8, 3), c(128, 64, 8, 3)])
        return ([c(128, 64, 8, 2), c(128, 32, 8, 3), c(64, 32, 4, 3), c(128, 64, 8, 3)] if big
                else [c(128, 64, 8, 3), c(64, 64, 4, 3), c(128, 32, 8, 3), c(128, 64, 8, 2)])
    if dtype == "fp32":                  # fp32 tiles in shared memory: twice the bytes
        if dot_precision == "tf32":
            return ([c(128, 32, 8, 3), c(128, 64, 8, 2), c(64, 32, 4, 3), c(64, 64, 4, 3)] if big
                    else [c(128, 64, 8, 3), c(128, 128, 8, 2), c(64, 64, 4, 3), c(128, 32, 8, 3)])
        return ([c(128, 64, 8, 2), c(128, 64, 8, 3), c(64, 64, 4, 3), c(128, 32, 8, 3)] if big
                else [c(128, 64, 8, 3), c(128, 128, 8, 2), c(64, 64, 4, 3), c(128, 32, 8, 3)])
    # 16-bit inputs: 16-bit q@k^T (and p@v with "bf16"; "tf32" widens p@v to fp32)
    if dot_precision == "tf32":
        return ([c(128, 64, 8, 3), c(128, 64, 8, 2), c(64, 64, 4, 3), c(128, 32, 8, 3)] if big
                else [c(128, 64, 8, 3), c(128, 128, 8, 2), c(64, 64, 4, 3)])
    return ([c(128, 64, 8, 3), c(128, 128, 8, 3), c(128, 128, 8, 2), c(64, 64, 4, 4)] if big
            else [c(128, 64, 8, 3), c(128, 128, 8, 3), c(64, 64, 4, 4), c(128, 64, 4, 3)])


def _wide_head_configs(dtype: str, seq_q: int | None, dot_precision: str, fp32_dot: str,
                       d192: bool, c) -> list[dict]:
    """attention_configs for head dims over 128 (BLOCK_D or BLOCK_DV 256), chosen from
    cross-compiles for sm_90 (kforge.crosscompile, Triton 3.9, ptxas; causal prefill and
    decoding over a cache, fp32 and bf16, every scheme of the builtin's policies). `d192`:
    D = 192 with Dv <= 128 (DeepSeek-V3's 192 / 128), where larger tiles fit; else the lists
    checked at D = Dv = 256. Every entry compiles, fits the 227 KB of shared memory and spills
    nothing, except: fp32 3xTF32 spills at every tile tried (the q tile and its split take the
    registers), and at D = Dv = 256 so do fp16x3, 16-bit q@k^T with 3xTF32 or FMA p@v, and
    16-bit decoding's 16x32 (4 bytes); there the entries spilled least. Not yet timed on a GPU:
    the order is a guess, larger tiles first."""
    f32 = dtype == "fp32"
    pack = dict(pack_gqa=True)
    if seq_q is not None and seq_q <= 16:
        if dot_precision == "ieee" and fp32_dot == "ieee":      # plain fp32 FMA
            return [c(16, 16, 4, 2, **pack), c(16, 32, 4, 1, **pack)]
        if f32 and dot_precision == "ieee":
            # 3xTF32: 56 / 64 bytes of spills at 192 / 128, 136 / 96 at 256 / 256; wider
            # tiles over 1 KB
            return [c(16, 32, 4, 2, **pack), c(16, 32, 4, 3, **pack)]
        if f32 and dot_precision == "tf32":
            return [c(16, 64, 4, 2, **pack), c(16, 32, 4, 3, **pack), c(64, 32, 4, 2, **pack),
                    c(16, 32, 4, 2, **pack)]
        if f32 or dot_precision == "ieee":   # bf16 / fp16x3 tiles of fp32, or 3xTF32 p@v
            return ([c(16, 64, 4, 3, **pack), c(16, 32, 4, 3, **pack), c(16, 32, 4, 2, **pack)]
                    if d192 else [c(16, 32, 4, 3, **pack), c(16, 32, 4, 2, **pack)])
        return ([c(64, 64, 4, 3, **pack), c(16, 128, 4, 3, **pack), c(16, 64, 4, 3, **pack),
                 c(16, 64, 4, 3)] if d192 else
                [c(64, 32, 4, 2, **pack), c(16, 64, 4, 3, **pack), c(16, 32, 4, 3, **pack),
                 c(16, 64, 4, 3)])
    if dot_precision == "ieee" and fp32_dot == "ieee":          # plain fp32 FMA
        # (16-bit q@k^T with an FMA p@v at 256 / 256: 1-1.3 KB of spills)
        return [c(64, 16, 8, 2), c(64, 16, 8, 1), c(32, 16, 4, 1)]
    if f32 and dot_precision == "ieee":
        # 3xTF32 on fp32 q, k, v: 840 / 900 / 1112 bytes of spills at 192 / 128 (1.8-2.4 KB at
        # 256); 128-row tiles spill less but need 288 KB of shared memory or more. 64x16 with 8
        # warps (1112 bytes) compiled but faulted on the H200 (illegal address at 192 / 128,
        # 2026-12-05; the 4-warp tiles ran and passed): not offered
        return [c(64, 16, 4, 1), c(64, 16, 4, 2)]
    if f32 and dot_precision == "tf32":
        return ([c(128, 32, 8, 2), c(128, 64, 8, 1), c(128, 16, 8, 2), c(64, 32, 4, 2)] if d192
                else [c(128, 32, 8, 1), c(128, 16, 8, 2), c(128, 16, 8, 1), c(64, 16, 4, 2)])
    if f32 and dot_precision == "bf16":
        return ([c(128, 64, 8, 2), c(128, 32, 8, 3), c(64, 64, 8, 2), c(64, 32, 4, 3)] if d192
                else [c(64, 32, 8, 1), c(64, 16, 8, 1)])
    if f32:                                      # fp16x3; at 256 / 256 148-248 bytes of spills
        return ([c(128, 64, 8, 1), c(128, 32, 8, 2), c(128, 16, 8, 2), c(64, 32, 4, 1)] if d192
                else [c(64, 16, 8, 1), c(64, 32, 8, 1), c(128, 16, 8, 1)])
    if dot_precision == "ieee":          # 16-bit q@k^T, 3xTF32 p@v; at 256 / 256 100 / 444 bytes
        return ([c(128, 64, 8, 2), c(128, 32, 8, 3), c(64, 32, 4, 3), c(64, 64, 4, 2)] if d192
                else [c(64, 16, 8, 1), c(64, 32, 8, 1)])
    return ([c(128, 64, 8, 3), c(128, 64, 8, 2), c(128, 32, 8, 3), c(64, 64, 4, 3)] if d192
            else [c(128, 64, 8, 2), c(128, 32, 8, 3), c(64, 32, 4, 3), c(128, 32, 8, 2)])


def reference_attention(q, k, v, mask=None, causal: bool = False, window: int | None = None,
                        scale: float | None = None, sinks=None, masked_rows: str = "zero"):
    """Attention in plain torch, in q's dtype (pass float64 tensors for an exact reference).

    Same semantics as the generated kernel (module docstring): GQA by repeating kv heads,
    bottom-right causal, sliding window, bool/additive mask broadcast to [B, Hq, Sq, Skv],
    gpt-oss sinks, fully masked rows 0 (masked_rows="zero") or NaN ("nan"); v may have another
    head dim than q and k (out is [B, Hq, Sq, v's]), the default scale is q's 1/sqrt(D)."""
    import torch

    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads is not a multiple of {Hkv} kv heads")
    dt = q.dtype
    k = k.to(dt).repeat_interleave(Hq // Hkv, dim=1)
    v = v.to(dt).repeat_interleave(Hq // Hkv, dim=1)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    from kforge.attention_op import band_mask
    keep = band_mask(Sq, Skv, causal, window or 0, q.device)
    if keep is None:
        keep = torch.ones(Sq, Skv, dtype=torch.bool, device=q.device)
    keep = keep.expand(B, Hq, Sq, Skv)
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            s = s + mask.to(dt)
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sk = sinks.to(dt).reshape(1, Hq, 1, 1).expand(B, Hq, Sq, 1)
        s = torch.cat([s, sk], dim=-1)
    mx = s.amax(dim=-1, keepdim=True)
    mx = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
    p = torch.exp(s - mx)
    den = p.sum(dim=-1, keepdim=True)
    if sinks is not None:
        p = p[..., :-1]
    out = torch.matmul(p, v) / den
    if masked_rows == "zero":
        out = torch.where(den == 0, torch.zeros_like(out), out)
    return out


def load_source(src: str, module_name: str = "kforge_attention_candidate"):
    """Import rendered source as a module (Triton's JIT needs a real file for inspect)."""
    from kforge.kernels.gemm import load_source as _load

    return _load(src, module_name)
