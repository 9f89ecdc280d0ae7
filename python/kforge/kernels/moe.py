"""Grouped (ragged) GEMMs for a mixture-of-experts layer, as a KForge kernel source generator.

Computes `torch.ops.kforge.moe_experts` (kforge.moe_op) over the routed (token, expert) pairs
only — E experts, top-K routing, T tokens: T*K rows, never T*E:

1. `_moe_route` (one program per expert): the pairs routed to expert e, in pair order, at
   `sorted[offset_e : offset_e + count_e]` (offset_e = pairs routed to experts < e), and
   `counts`, `offsets`. Every program scans the [T, K] index itself, so no program waits on
   another and nothing goes back to the host.
2. `_moe_up` (grid: an upper bound of row tiles x tiles of I): a program finds its expert from
   the counts (tile -> expert by a prefix sum), gathers its tokens' rows of x, multiplies them by
   that expert's w1 for the gate and the up columns at once (gpt-oss interleaves them; "swiglu"
   keeps them in halves), adds the bias and applies the gating in registers: h [T*K, I], in
   expert order.
3. `_moe_down`: h's rows of one expert times its w2, plus bias, times the routing weight, written
   to the pair's own row of y [T*K, H] (no atomics: the result does not depend on scheduling).
4. `_moe_combine`: out[t] = sum_k y[t*K + k].

The tile grid is sized for the worst case (ceil(T*K / BLOCK_M) + E row tiles; programs past the
last expert's tiles return at once), so a launch never needs the counts on the host and can be
captured in a CUDA graph.

`moe_source(...)` returns the Python source of a self-contained candidate (imports torch,
triton, triton.language only; passes kforge.verify.static): the kernels and
`launch(x, index, weight, w1, b1, w2, b2) -> (out,)`. Shapes are read from the tensors at run
time; the activation, its constants, the tiles and the precision are baked in.

Precision (`dot_precision`): "ieee" multiplies fp32 operands through `fp32_dot`:
* "fp16x3" (fp32-accurate, on fp16 tensor cores at twice the TF32 rate; kforge.kernels.gemm's
  strict scheme): `prepare_weights` stores each expert's w1 and w2 as fp16 hi + lo planes of
  w * 2**(15 - e_n), e_n the exponent of column n's largest magnitude, with e_n - 15 in a last
  row ([E, 2K + 1, N] fp16); kforge.kernels.gemm's fp16x3 row pass does the same for x and
  for h per row.
  Each K step takes a_lo@b_hi + a_hi@b_lo + a_hi@b_hi into a fresh accumulator that is added to
  the running fp32 sum; the power-of-two scales are undone exactly in the epilogue. The up
  projection loads gate and up columns as one contiguous [BLOCK_K, 2 * BLOCK_N] tile and splits
  the accumulator in registers.
* "fp16x1" (the bf16 policy's: 11 significant bits where bf16 keeps 8): the same planes, the
  hi ones alone, one fp16 product a K step (the lo planes are written and not read).
* "tf32x3": Triton's 3xTF32 split, fp32-accurate; "ieee": plain FMA.
"tf32": one TF32 product, whose tensor-core instruction reads both operands K-major, so
`prepare_weights` stores w1 and w2 with K of unit stride (same shape; an N-major fp32 tile was
copied into shared memory 4 bytes at a time). "bf16" casts the tiles to bf16 (fp32
accumulation). 16-bit inputs use their own tensor cores. Intermediates (h, y) are fp32. The
Triton interpreter multiplies exactly in fp32 whatever the scheme (`interpret=True`).
"""
from __future__ import annotations

import textwrap

from kforge.kernels.attention import MMA_SOURCE
from kforge.kernels.gemm import _PREP_ROWS_FP16

ACTIVATIONS = {"gpt_oss": 0, "swiglu": 1}
DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
DOT_PRECISIONS = ("ieee", "tf32", "bf16")
FP32_DOTS = ("fp16x3", "tf32x3", "ieee", "fp16x1")

_KERNELS = MMA_SOURCE + _PREP_ROWS_FP16.format(name="_moe") + '''

@triton.jit
def _moe_route(INDEX, COUNTS, OFFSETS, SORTED, NPAIRS, BLOCK_P: tl.constexpr):
    e = tl.program_id(0)
    before = 0
    mine = 0
    for p0 in range(0, NPAIRS, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        idx = tl.load(INDEX + p, mask=p < NPAIRS, other=-1).to(tl.int32)
        before += tl.sum(((idx < e) & (idx >= 0)).to(tl.int32), axis=0)
        mine += tl.sum((idx == e).to(tl.int32), axis=0)
    tl.store(COUNTS + e, mine)
    tl.store(OFFSETS + e, before)
    running = before
    for p0 in range(0, NPAIRS, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        idx = tl.load(INDEX + p, mask=p < NPAIRS, other=-1).to(tl.int32)
        hit = (idx == e).to(tl.int32)
        pos = running + tl.cumsum(hit, axis=0) - 1
        tl.store(SORTED + pos, p.to(tl.int32), mask=hit != 0)
        running += tl.sum(hit, axis=0)


@triton.jit
def _tile_of(COUNTS, OFFSETS, pid_m, E, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """(expert, first row of this tile within the expert, its row count, its offset), or
    expert -1 for a program past the last tile."""
    ar = tl.arange(0, BLOCK_E)
    counts = tl.load(COUNTS + ar, mask=ar < E, other=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(tiles, axis=0)
    total = tl.sum(tiles, axis=0)
    e = tl.sum((ends <= pid_m).to(tl.int32), axis=0)
    first = tl.sum(tl.where(ar == e, ends - tiles, 0), axis=0)
    count = tl.sum(tl.where(ar == e, counts, 0), axis=0)
    offset = tl.load(OFFSETS + e, mask=pid_m < total, other=0)
    e = tl.where(pid_m < total, e, -1)
    return e, (pid_m - first) * BLOCK_M, count, offset


@triton.jit
def _grid_ids(NUM_M, NUM_N, GROUP_M: tl.constexpr):
    """(row tile, column tile) of this program of a 1-D grid of NUM_M x NUM_N: GROUP_M row tiles
    at a time, each sweeping every column tile with the row tiles adjacent, so that their
    gathered rows stay in L2 while the weights' columns stream past (rows first over the whole
    grid re-read all of x, or of h, from memory once per column tile)."""
    pid = tl.program_id(0)
    per_group = GROUP_M * NUM_N
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(NUM_M - first_m, GROUP_M)
    within = pid % per_group
    return first_m + within % size_m, within // size_m


@triton.jit
def _tile_rows(SORTED, COUNTS, OFFSETS, E, pid_m, BLOCK_M: tl.constexpr,
               BLOCK_E: tl.constexpr):
    """Row tile pid_m's expert (-1: none), its rows' positions in expert order (offset + rows),
    which of them exist, and their (token, k) pair ids."""
    e, row0, count, offset = _tile_of(COUNTS, OFFSETS, pid_m, E, BLOCK_M, BLOCK_E)
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < count
    pairs = tl.load(SORTED + offset + rows, mask=row_ok, other=0)
    return e, (offset + rows).to(tl.int64), row_ok, pairs.to(tl.int64)


@triton.jit
def _up_columns(n0, INTER, ACT: tl.constexpr, BLOCK_N: tl.constexpr):
    """w1's gate and up columns of outputs [n0, n0 + BLOCK_N) as one run of 2 * BLOCK_N, and
    which exist. gpt-oss interleaves them (one contiguous run); "swiglu" keeps gate in [0, I)
    and up in [I, 2I) (two runs of BLOCK_N)."""
    j = tl.arange(0, 2 * BLOCK_N)
    if ACT == 0:
        cols = 2 * n0 + j
        # (n0 + j // 2 < INTER, written so that the mask is constant over runs of the columns:
        # `j // 2` made it alternate at every other column, and the weight tiles' copies went 4
        # bytes at a time (sm_90 PTX: 96 cp.async.ca beside 24 16-byte .cg; H100, 2026-12-06:
        # _moe_up3 4.71 ms where a dense fp16x3 GEMM of its products took 2.99)
        col_ok = cols < 2 * INTER
    else:
        within = j % BLOCK_N
        cols = tl.where(j < BLOCK_N, n0 + within, INTER + n0 + within)
        col_ok = (n0 + within) < INTER
    return cols, col_ok


@triton.jit
def _gated(acc, ACT: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The activation of [BLOCK_M, 2 * BLOCK_N] gate and up pre-activations in _up_columns'
    order: [BLOCK_M, BLOCK_N]."""
    if ACT == 0:
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        g = tl.minimum(g, LIMIT)
        u = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
        h = (u + 1.0) * (g * tl.sigmoid(g * ALPHA))
    else:
        g, u = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
        h = g * tl.sigmoid(g) * u
    return h


@triton.jit
def _moe_up(X, W1, B1, SORTED, COUNTS, OFFSETS, H1, E, HID, INTER, NUM_M, NUM_N,
            sxt, sxh, swe, swk, swn, sbe, sbn,
            K: tl.constexpr, ACT: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            BLOCK_E: tl.constexpr, PREC: tl.constexpr, LOWP: tl.constexpr,
            GROUP_M: tl.constexpr, INTERP: tl.constexpr):
    pid_m, pid_n = _grid_ids(NUM_M, NUM_N, GROUP_M)
    e, h_rows, row_ok, pairs = _tile_rows(SORTED, COUNTS, OFFSETS, E, pid_m, BLOCK_M, BLOCK_E)
    if e >= 0:
        tok = pairs // K
        n0 = pid_n * BLOCK_N
        # gate and up columns as one run of 2 * BLOCK_N, one product, split in registers (two
        # loads of every other column were 2-byte gathers under gpt-oss's interleaving: a bf16
        # model at its prefill shape, H100 2026-12-06, this kernel 21.8 -> 1.44 ms)
        wcols, wc_ok = _up_columns(n0, INTER, ACT, BLOCK_N)
        w_base = W1 + e.to(tl.int64) * swe
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k0 in range(0, HID, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < HID
            a = tl.load(X + tok[:, None] * sxt + ks[None, :] * sxh,
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_base + ks[:, None] * swk + wcols[None, :] * swn,
                        mask=k_ok[:, None] & wc_ok[None, :], other=0.0)
            if LOWP:
                a = a.to(tl.bfloat16)
                w = w.to(tl.bfloat16)
            acc += _mma(a, w, PREC, INTERP)
        bw = tl.load(B1 + e.to(tl.int64) * sbe + wcols * sbn, mask=wc_ok, other=0.0)
        h = _gated(acc + bw.to(tl.float32)[None, :], ACT, ALPHA, LIMIT, BLOCK_M, BLOCK_N)
        cols = n0 + tl.arange(0, BLOCK_N)
        tl.store(H1 + h_rows[:, None] * INTER + cols[None, :], h,
                 mask=row_ok[:, None] & (cols < INTER)[None, :])


@triton.jit
def _moe_down(H1, W2, B2, WEIGHT, SORTED, COUNTS, OFFSETS, Y, E, HID, INTER, NUM_M, NUM_N,
              swe, swk, swn, sbe, sbn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_E: tl.constexpr, PREC: tl.constexpr, LOWP: tl.constexpr,
              W16: tl.constexpr, GROUP_M: tl.constexpr, INTERP: tl.constexpr):
    pid_m, pid_n = _grid_ids(NUM_M, NUM_N, GROUP_M)
    e, h_rows, row_ok, pairs = _tile_rows(SORTED, COUNTS, OFFSETS, E, pid_m, BLOCK_M, BLOCK_E)
    if e >= 0:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < HID
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = W2 + e.to(tl.int64) * swe
        for k0 in range(0, INTER, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < INTER
            a = tl.load(H1 + h_rows[:, None] * INTER + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_base + ks[:, None] * swk + cols[None, :] * swn,
                        mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            if LOWP:
                a = a.to(tl.bfloat16)
                w = w.to(tl.bfloat16)
            elif W16:
                a = a.to(w.dtype)
            acc += _mma(a, w, PREC, INTERP)
        b = tl.load(B2 + e.to(tl.int64) * sbe + cols * sbn, mask=col_ok, other=0.0)
        r = tl.load(WEIGHT + pairs, mask=row_ok, other=0.0).to(tl.float32)
        y = (acc + b.to(tl.float32)[None, :]) * r[:, None]
        tl.store(Y + pairs[:, None] * HID + cols[None, :], y,
                 mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _moe_split_w(W, OUT, KR, N, swe, swk, swn, BLOCK: tl.constexpr):
    """Expert e's weight [K, N] -> OUT[e] [2K + 1, N] fp16: rows 0..K-1 hi, K..2K-1 lo of
    w * 2**(15 - e_n) (max |w[:, n]| < 2**e_n), row 2K e_n - 15 (a small integer, exact)."""
    e = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    src = W + e * swe + cols * swn
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(0, KR):
        amax = tl.maximum(amax, tl.abs(tl.load(src + k * swk, mask=ok, other=0.0).to(tl.float32)))
    ex = _pow2_exp(amax)
    scale = _pow2(15 - ex)
    dst = OUT + e * (2 * KR + 1) * N + cols
    for k in range(0, KR):
        x = tl.load(src + k * swk, mask=ok, other=0.0).to(tl.float32) * scale
        hi = x.to(tl.float16)
        tl.store(dst + k * N, hi, mask=ok)
        tl.store(dst + (KR + k) * N, (x - hi.to(tl.float32)).to(tl.float16), mask=ok)
    tl.store(dst + 2 * KR * N, (ex - 15).to(tl.float16), mask=ok)


@triton.jit
def _mma3(a_hi, a_lo, b_hi, b_lo, INTERP: tl.constexpr):
    """a_lo@b_hi + a_hi@b_lo + a_hi@b_hi in a fresh fp32 accumulator."""
    if INTERP:
        ah = a_hi.to(tl.float32)
        bh = b_hi.to(tl.float32)
        part = tl.dot(a_lo.to(tl.float32), bh, input_precision="ieee")
        part += tl.dot(ah, b_lo.to(tl.float32), input_precision="ieee")
        part += tl.dot(ah, bh, input_precision="ieee")
    else:
        part = tl.dot(a_lo, b_hi)
        part = tl.dot(a_hi, b_lo, part)
        part = tl.dot(a_hi, b_hi, part)
    return part


@triton.jit
def _planes_dot(A, LO_A, a_rows, row_ok, B, LO_B, LDB, cols, col_ok, KDIM, acc,
                BLOCK_K: tl.constexpr, INTERP: tl.constexpr, ONE: tl.constexpr):
    """acc + A[a_rows, :] @ B[:, cols] over K = KDIM, both operands as fp16 hi/lo planes (the
    lo plane LO_A / LO_B elements after the hi one; A's rows KDIM long, B's LDB); ONE
    (fp16x1): the hi planes alone, one fp16 product."""
    for k0 in range(0, KDIM, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < KDIM
        am = row_ok[:, None] & k_ok[None, :]
        ao = a_rows[:, None] * KDIM + ks[None, :]
        a_hi = tl.load(A + ao, mask=am, other=0.0)
        bm = k_ok[:, None] & col_ok[None, :]
        bo = ks[:, None] * LDB + cols[None, :]
        b_hi = tl.load(B + bo, mask=bm, other=0.0)
        if ONE:
            acc += _mma(a_hi, b_hi, "", INTERP)
        else:
            a_lo = tl.load(A + LO_A + ao, mask=am, other=0.0)
            b_lo = tl.load(B + LO_B + bo, mask=bm, other=0.0)
            acc += _mma3(a_hi, a_lo, b_hi, b_lo, INTERP)
    return acc


@triton.jit
def _col_scale(W, ROW, cols, col_ok):
    """2**(e_n - 15) of each column, from the exponent row of a prepared weight."""
    return _pow2(tl.load(W + ROW + cols, mask=col_ok, other=0.0).to(tl.int32))


@triton.jit
def _moe_up3(XP, SX, W1P, B1, SORTED, COUNTS, OFFSETS, H1, E, T, HID, INTER, NUM_M, NUM_N,
             sbe, sbn,
             K: tl.constexpr, ACT: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             BLOCK_E: tl.constexpr, GROUP_M: tl.constexpr, INTERP: tl.constexpr,
             ONE: tl.constexpr):
    pid_m, pid_n = _grid_ids(NUM_M, NUM_N, GROUP_M)
    e, h_rows, row_ok, pairs = _tile_rows(SORTED, COUNTS, OFFSETS, E, pid_m, BLOCK_M, BLOCK_E)
    if e >= 0:
        tok = pairs // K
        W = 2 * INTER
        n0 = pid_n * BLOCK_N
        cols, col_ok = _up_columns(n0, INTER, ACT, BLOCK_N)
        wb = W1P + e.to(tl.int64) * (2 * HID + 1) * W
        lo_w = HID.to(tl.int64) * W
        lo_x = T.to(tl.int64) * HID
        acc = _planes_dot(XP, lo_x, tok, row_ok, wb, lo_w, W, cols, col_ok, HID,
                          tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32), BLOCK_K, INTERP,
                          ONE)
        sx = tl.load(SX + tok, mask=row_ok, other=0.0)
        sw = _col_scale(wb, 2 * lo_w, cols, col_ok)
        b = tl.load(B1 + e.to(tl.int64) * sbe + cols * sbn, mask=col_ok, other=0.0)
        h = _gated(acc * sx[:, None] * sw[None, :] + b.to(tl.float32)[None, :], ACT, ALPHA,
                   LIMIT, BLOCK_M, BLOCK_N)
        ncols = n0 + tl.arange(0, BLOCK_N)
        tl.store(H1 + h_rows[:, None] * INTER + ncols[None, :], h,
                 mask=row_ok[:, None] & (ncols < INTER)[None, :])


@triton.jit
def _moe_down3(HP, SH, W2P, B2, WEIGHT, SORTED, COUNTS, OFFSETS, Y, E, NPAIRS, HID, INTER,
               NUM_M, NUM_N, sbe, sbn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, GROUP_M: tl.constexpr,
               INTERP: tl.constexpr, ONE: tl.constexpr):
    pid_m, pid_n = _grid_ids(NUM_M, NUM_N, GROUP_M)
    e, h_rows, row_ok, pairs = _tile_rows(SORTED, COUNTS, OFFSETS, E, pid_m, BLOCK_M, BLOCK_E)
    if e >= 0:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < HID
        wb = W2P + e.to(tl.int64) * (2 * INTER + 1) * HID
        lo_w = INTER.to(tl.int64) * HID
        lo_h = NPAIRS.to(tl.int64) * INTER
        acc = _planes_dot(HP, lo_h, h_rows, row_ok, wb, lo_w, HID, cols, col_ok, INTER,
                          tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), BLOCK_K, INTERP,
                          ONE)
        sh = tl.load(SH + h_rows, mask=row_ok, other=0.0)
        sw = _col_scale(wb, 2 * lo_w, cols, col_ok)
        b = tl.load(B2 + e.to(tl.int64) * sbe + cols * sbn, mask=col_ok, other=0.0)
        r = tl.load(WEIGHT + pairs, mask=row_ok, other=0.0).to(tl.float32)
        y = (acc * sh[:, None] * sw[None, :] + b.to(tl.float32)[None, :]) * r[:, None]
        tl.store(Y + pairs[:, None] * HID + cols[None, :], y,
                 mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _moe_combine(Y, OUT, HID, sot, soh, K: tl.constexpr, BLOCK_C: tl.constexpr,
                 INTERP: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = cols < HID
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for k in range(K):
        acc += tl.load(Y + (t.to(tl.int64) * K + k) * HID + cols, mask=ok, other=0.0)
    if INTERP and OUT.dtype.element_ty == tl.bfloat16:
        acc = _bf16_rne(acc)          # the interpreter truncates to bf16; a GPU rounds
    tl.store(OUT + t.to(tl.int64) * sot + cols * soh, acc.to(OUT.dtype.element_ty), mask=ok)
'''

_LAUNCH = '''

def _split16(w):
    """[E, K, N] fp32 -> [E, 2K + 1, N] fp16 (`_moe_split_w`)."""
    E_, K_, N_ = w.shape
    out = torch.empty((E_, 2 * K_ + 1, N_), dtype=torch.float16, device=w.device)
    _moe_split_w[(E_, triton.cdiv(N_, BLOCK_S))](w, out, K_, N_, w.stride(0), w.stride(1),
                                                 w.stride(2), BLOCK=BLOCK_S)
    return out


def _prepared(w):
    return w.dtype == torch.float16 and DTYPE == torch.float32


def _rows_of(w):
    """K of a [E, K, N] weight, raw or prepared ([E, 2K + 1, N])."""
    return (w.shape[1] - 1) // 2 if _prepared(w) else w.shape[1]


def _k_major(w):
    """[E, K, N] -> the same values and shape with K of unit stride. TF32 tensor-core products
    read both operands K-major from shared memory; an N-major fp32 weight tile was copied there 4
    bytes at a time (sm_90 PTX: 96 of _moe_up's 102 async copies)."""
    return w.transpose(1, 2).contiguous().transpose(1, 2)


def prepare_weights(weights):
    """w1 (argument 3) and w2 (argument 5) re-stored for the scheme: fp16 hi/lo planes with their
    column exponents (fp16x3, fp16x1), K-major copies (TF32 products); the biases and the rest
    unchanged. Other schemes take the weights as they are."""
    out = dict(weights)
    for i in (3, 5):
        w = out.get(i)
        if w is None:
            continue
        if SPLIT and not _prepared(w):
            out[i] = _split16(w)
        elif KMAJOR and w.dim() == 3 and w.stride(1) != 1:
            out[i] = _k_major(w)
    return out


def launch(x, index, weight, w1, b1, w2, b2):
    """x [T, H], index [T, K] (expert ids), weight [T, K], w1 [E, H, 2I], b1 [E, 2I],
    w2 [E, I, H], b2 [E, H] -> (out [T, H] in x's dtype,)."""
    if x.dim() != 2 or index.dim() != 2 or weight.shape != index.shape:
        raise ValueError("x must be [T, H]; index and weight [T, K]")
    T, HID = x.shape
    K = index.shape[1]
    E = w1.shape[0]
    INTER = _rows_of(w2)
    if index.shape[0] != T or _rows_of(w1) != HID or w1.shape[2] != 2 * INTER:
        raise ValueError(f"w1 {{tuple(w1.shape)}} does not match x {{tuple(x.shape)}}")
    if w2.shape[0] != E or w2.shape[2] != HID or b1.shape != (E, 2 * INTER) or \\
            b2.shape != (E, HID):
        raise ValueError("w2, b1, b2 do not match w1")
    if K != TOP_K or E > BLOCK_E:
        raise ValueError(f"this kernel is for top-{{TOP_K}} over at most {{BLOCK_E}} experts")
    if x.dtype != DTYPE or any(w.dtype != DTYPE and not (SPLIT and _prepared(w))
                               for w in (w1, w2)):
        raise ValueError(f"x and the weights must be {{DTYPE}}")
    index = index.contiguous()
    weight = weight.contiguous()
    npairs = T * K
    dev = x.device
    order = torch.empty(npairs, dtype=torch.int32, device=dev)
    counts = torch.empty(E, dtype=torch.int32, device=dev)
    offsets = torch.empty(E, dtype=torch.int32, device=dev)
    _moe_route[(E,)](index, counts, offsets, order, npairs, BLOCK_P=BLOCK_P)
    tiles = triton.cdiv(npairs, BLOCK_M) + E

    if SPLIT:
        # weights not re-stored by prepare_weights (a caller that does not call it) are split
        # here, at every call
        w1p = w1 if _prepared(w1) else _split16(w1)
        w2p = w2 if _prepared(w2) else _split16(w2)
        x = x.contiguous()               # the row pass reads rows of unit stride
        xp = torch.empty((2, T, HID), dtype=torch.float16, device=dev)
        sx = torch.empty(T, dtype=torch.float32, device=dev)
        _moe_prep_a_fp16[(T,)](x, xp, sx, T, HID, x.stride(0), BLOCK=BLOCK_R)
        h = torch.empty((npairs, INTER), dtype=torch.float32, device=dev)
        n_up = triton.cdiv(INTER, BLOCK_N)
        _moe_up3[(tiles * n_up,)](
            xp, sx, w1p, b1, order, counts, offsets, h, E, T, HID, INTER, tiles, n_up,
            b1.stride(0), b1.stride(1), K=TOP_K, ACT=ACT, ALPHA=ALPHA, LIMIT=LIMIT,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_E=BLOCK_E, GROUP_M=GROUP_M,
            INTERP=INTERPRET, ONE=ONE, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
        hp = torch.empty((2, npairs, INTER), dtype=torch.float16, device=dev)
        sh = torch.empty(npairs, dtype=torch.float32, device=dev)
        _moe_prep_a_fp16[(npairs,)](h, hp, sh, npairs, INTER, h.stride(0), BLOCK=BLOCK_R)
        del h
        y = torch.empty((npairs, HID), dtype=torch.float32, device=dev)
        n_down = triton.cdiv(HID, 2 * BLOCK_N)
        _moe_down3[(tiles * n_down,)](
            hp, sh, w2p, b2, weight, order, counts, offsets, y, E, npairs, HID, INTER, tiles,
            n_down, b2.stride(0), b2.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=2 * BLOCK_N,
            BLOCK_K=BLOCK_K, BLOCK_E=BLOCK_E, GROUP_M=GROUP_M, INTERP=INTERPRET, ONE=ONE,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    else:
        h = torch.empty((npairs, INTER), dtype=torch.float32, device=dev)
        n_up = triton.cdiv(INTER, BLOCK_N)
        _moe_up[(tiles * n_up,)](
            x, w1, b1, order, counts, offsets, h, E, HID, INTER, tiles, n_up,
            x.stride(0), x.stride(1), w1.stride(0), w1.stride(1), w1.stride(2),
            b1.stride(0), b1.stride(1),
            K=TOP_K, ACT=ACT, ALPHA=ALPHA, LIMIT=LIMIT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K, BLOCK_E=BLOCK_E, PREC=PREC, LOWP=LOWP, GROUP_M=GROUP_M,
            INTERP=INTERPRET, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
        y = torch.empty((npairs, HID), dtype=torch.float32, device=dev)
        n_down = triton.cdiv(HID, BLOCK_N)
        _moe_down[(tiles * n_down,)](
            h, w2, b2, weight, order, counts, offsets, y, E, HID, INTER, tiles, n_down,
            w2.stride(0), w2.stride(1), w2.stride(2), b2.stride(0), b2.stride(1),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_E=BLOCK_E, PREC=PREC,
            LOWP=LOWP, W16=W16, GROUP_M=GROUP_M, INTERP=INTERPRET, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES)
    out = torch.empty((T, HID), dtype=x.dtype, device=dev)
    _moe_combine[(T, triton.cdiv(HID, BLOCK_C))](y, out, HID, out.stride(0), out.stride(1),
                                                 K=TOP_K, BLOCK_C=BLOCK_C, INTERP=INTERPRET)
    return (out,)
'''


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def moe_source(*, num_experts: int, top_k: int, activation: str = "gpt_oss",
               alpha: float = 1.702, limit: float = 7.0, dtype: str = "fp32",
               dot_precision: str = "ieee", fp32_dot: str = "tf32x3", block_m: int = 64,
               block_n: int = 64, block_k: int = 32, num_warps: int = 4, num_stages: int = 2,
               group_m: int = 8, interpret: bool = False) -> str:
    """The candidate's source (see the module docstring)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: expected one of {sorted(ACTIVATIONS)}")
    if dtype not in DTYPES or dot_precision not in DOT_PRECISIONS:
        raise ValueError(f"dtype {dtype!r} / dot_precision {dot_precision!r}")
    if num_experts < 1 or top_k < 1:
        raise ValueError("num_experts and top_k must be positive")
    if group_m < 1:
        raise ValueError(f"group_m must be positive, got {group_m}")
    if fp32_dot not in FP32_DOTS:
        raise ValueError(f"fp32_dot {fp32_dot!r}: expected one of {FP32_DOTS}")
    split = dtype == "fp32" and dot_precision == "ieee" and fp32_dot in ("fp16x3", "fp16x1")
    if split:
        prec = ""
    elif dtype == "fp32":
        prec = {"ieee": fp32_dot, "tf32": "tf32", "bf16": ""}[dot_precision]
    else:
        prec = ""
    lowp = dtype == "fp32" and dot_precision == "bf16"
    header = textwrap.dedent(f'''\
        import torch
        import triton
        import triton.language as tl

        DTYPE = {DTYPES[dtype]}
        TOP_K = {int(top_k)}
        BLOCK_E = {_pow2(max(num_experts, 2))}
        ACT = {ACTIVATIONS[activation]}
        ALPHA = {float(alpha)!r}
        LIMIT = {float(limit)!r}
        BLOCK_M = {int(block_m)}
        BLOCK_N = {int(block_n)}
        BLOCK_K = {int(block_k)}
        GROUP_M = {int(group_m)}
        BLOCK_P = 1024
        BLOCK_C = 256
        BLOCK_R = 1024
        BLOCK_S = 256
        SPLIT = {bool(split)}
        ONE = {bool(split and fp32_dot == "fp16x1")}
        KMAJOR = {prec == "tf32"}
        PREC = {prec!r}
        LOWP = {bool(lowp)}
        W16 = {dtype != "fp32"}
        INTERPRET = {bool(interpret)}
        NUM_WARPS = {int(num_warps)}
        NUM_STAGES = {int(num_stages)}
        ''')
    return header + _KERNELS + _LAUNCH.format()


def moe_configs(dtype: str, target: str = "cuda", *, rows: int | None = None,
                split: bool = False) -> list[dict]:
    """Tile configurations worth trying (moe_source keywords), the likeliest first. Few rows per
    expert (decoding) want short row tiles. `split`: the fp16x3 scheme (fp16 hi/lo tiles, a
    [BLOCK_M, 2 * BLOCK_N] accumulator in both projections)."""
    if target == "cpu":
        return [{"block_m": 16, "block_n": 32, "block_k": 32, "num_warps": 4, "num_stages": 1}]
    small = rows is not None and rows <= 64
    if split:
        configs = [
            {"block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 8, "num_stages": 3},
            {"block_m": 128, "block_n": 64, "block_k": 32, "num_warps": 8, "num_stages": 4},
            {"block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3},
            {"block_m": 64, "block_n": 128, "block_k": 32, "num_warps": 8, "num_stages": 3},
        ]
        if small:
            configs.insert(0, {"block_m": 16, "block_n": 64, "block_k": 64, "num_warps": 4,
                               "num_stages": 3})
        return configs
    bk = 64 if dtype != "fp32" else 32
    configs = [
        {"block_m": 64, "block_n": 128, "block_k": bk, "num_warps": 8, "num_stages": 3},
        {"block_m": 128, "block_n": 64, "block_k": bk, "num_warps": 8, "num_stages": 3},
        {"block_m": 64, "block_n": 64, "block_k": bk, "num_warps": 4, "num_stages": 3},
    ]
    if small:
        configs.insert(0, {"block_m": 16, "block_n": 128, "block_k": bk, "num_warps": 4,
                           "num_stages": 3})
    return configs


def load_source(src: str, module_name: str = "kforge_moe_candidate"):
    """Import rendered source as a module (Triton's JIT needs a real file)."""
    from kforge.kernels.gemm import load_source as _load

    return _load(src, module_name)


__all__ = ["moe_source", "moe_configs", "load_source", "ACTIVATIONS"]
