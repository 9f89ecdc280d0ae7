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

Precision (`dot_precision`): "ieee" multiplies fp32 operands through `fp32_dot` ("tf32x3":
Triton's 3xTF32 split, fp32-accurate; "ieee": plain FMA); "tf32"; "bf16" casts the tiles to bf16
(fp32 accumulation). 16-bit inputs use their own tensor cores. Intermediates (h, y) are fp32.
The Triton interpreter multiplies exactly in fp32 whatever the scheme (`interpret=True`).
"""
from __future__ import annotations

import textwrap

from kforge.kernels.attention import MMA_SOURCE

ACTIVATIONS = {"gpt_oss": 0, "swiglu": 1}
DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
DOT_PRECISIONS = ("ieee", "tf32", "bf16")

_KERNELS = MMA_SOURCE + '''

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
def _tile_rows(SORTED, COUNTS, OFFSETS, E, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """This program's expert (-1: none), its rows' positions in expert order (offset + rows),
    which of them exist, and their (token, k) pair ids."""
    e, row0, count, offset = _tile_of(COUNTS, OFFSETS, tl.program_id(0), E, BLOCK_M, BLOCK_E)
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < count
    pairs = tl.load(SORTED + offset + rows, mask=row_ok, other=0)
    return e, (offset + rows).to(tl.int64), row_ok, pairs.to(tl.int64)


@triton.jit
def _moe_up(X, W1, B1, SORTED, COUNTS, OFFSETS, H1, E, HID, INTER,
            sxt, sxh, swe, swk, swn, sbe, sbn,
            K: tl.constexpr, ACT: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            BLOCK_E: tl.constexpr, PREC: tl.constexpr, LOWP: tl.constexpr,
            INTERP: tl.constexpr):
    pid_n = tl.program_id(1)
    e, h_rows, row_ok, pairs = _tile_rows(SORTED, COUNTS, OFFSETS, E, BLOCK_M, BLOCK_E)
    if e >= 0:
        tok = pairs // K
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < INTER
        if ACT == 0:
            gcols = 2 * cols
            ucols = 2 * cols + 1
        else:
            gcols = cols
            ucols = cols + INTER
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = W1 + e.to(tl.int64) * swe
        for k0 in range(0, HID, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < HID
            a = tl.load(X + tok[:, None] * sxt + ks[None, :] * sxh,
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wmask = k_ok[:, None] & col_ok[None, :]
            wg = tl.load(w_base + ks[:, None] * swk + gcols[None, :] * swn, mask=wmask, other=0.0)
            wu = tl.load(w_base + ks[:, None] * swk + ucols[None, :] * swn, mask=wmask, other=0.0)
            if LOWP:
                a = a.to(tl.bfloat16)
                wg = wg.to(tl.bfloat16)
                wu = wu.to(tl.bfloat16)
            acc_g += _mma(a, wg, PREC, INTERP)
            acc_u += _mma(a, wu, PREC, INTERP)
        bg = tl.load(B1 + e.to(tl.int64) * sbe + gcols * sbn, mask=col_ok, other=0.0)
        bu = tl.load(B1 + e.to(tl.int64) * sbe + ucols * sbn, mask=col_ok, other=0.0)
        g = acc_g + bg.to(tl.float32)[None, :]
        u = acc_u + bu.to(tl.float32)[None, :]
        if ACT == 0:
            g = tl.minimum(g, LIMIT)
            u = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
            h = (u + 1.0) * (g * tl.sigmoid(g * ALPHA))
        else:
            h = g * tl.sigmoid(g) * u
        dst = H1 + h_rows[:, None] * INTER + cols[None, :]
        tl.store(dst, h, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _moe_down(H1, W2, B2, WEIGHT, SORTED, COUNTS, OFFSETS, Y, E, HID, INTER,
              swe, swk, swn, sbe, sbn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_E: tl.constexpr, PREC: tl.constexpr, LOWP: tl.constexpr,
              W16: tl.constexpr, INTERP: tl.constexpr):
    pid_n = tl.program_id(1)
    e, h_rows, row_ok, pairs = _tile_rows(SORTED, COUNTS, OFFSETS, E, BLOCK_M, BLOCK_E)
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
def _moe_combine(Y, OUT, HID, sot, soh, K: tl.constexpr, BLOCK_C: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = cols < HID
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for k in range(K):
        acc += tl.load(Y + (t.to(tl.int64) * K + k) * HID + cols, mask=ok, other=0.0)
    tl.store(OUT + t.to(tl.int64) * sot + cols * soh, acc.to(OUT.dtype.element_ty), mask=ok)
'''

_LAUNCH = '''

def launch(x, index, weight, w1, b1, w2, b2):
    """x [T, H], index [T, K] (expert ids), weight [T, K], w1 [E, H, 2I], b1 [E, 2I],
    w2 [E, I, H], b2 [E, H] -> (out [T, H] in x's dtype,)."""
    if x.dim() != 2 or index.dim() != 2 or weight.shape != index.shape:
        raise ValueError("x must be [T, H]; index and weight [T, K]")
    T, HID = x.shape
    K = index.shape[1]
    E = w1.shape[0]
    INTER = w2.shape[1]
    if index.shape[0] != T or w1.shape[1] != HID or w1.shape[2] != 2 * INTER:
        raise ValueError(f"w1 {{tuple(w1.shape)}} does not match x {{tuple(x.shape)}}")
    if w2.shape[0] != E or w2.shape[2] != HID or b1.shape != (E, 2 * INTER) or \\
            b2.shape != (E, HID):
        raise ValueError("w2, b1, b2 do not match w1")
    if K != TOP_K or E > BLOCK_E:
        raise ValueError(f"this kernel is for top-{{TOP_K}} over at most {{BLOCK_E}} experts")
    if x.dtype != DTYPE:
        raise ValueError(f"x must be {{DTYPE}}")
    index = index.contiguous()
    weight = weight.contiguous()
    npairs = T * K
    dev = x.device
    order = torch.empty(npairs, dtype=torch.int32, device=dev)
    counts = torch.empty(E, dtype=torch.int32, device=dev)
    offsets = torch.empty(E, dtype=torch.int32, device=dev)
    _moe_route[(E,)](index, counts, offsets, order, npairs, BLOCK_P=BLOCK_P)
    tiles = triton.cdiv(npairs, BLOCK_M) + E
    h = torch.empty((npairs, INTER), dtype=torch.float32, device=dev)
    _moe_up[(tiles, triton.cdiv(INTER, BLOCK_N))](
        x, w1, b1, order, counts, offsets, h, E, HID, INTER,
        x.stride(0), x.stride(1), w1.stride(0), w1.stride(1), w1.stride(2),
        b1.stride(0), b1.stride(1),
        K=TOP_K, ACT=ACT, ALPHA=ALPHA, LIMIT=LIMIT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K, BLOCK_E=BLOCK_E, PREC=PREC, LOWP=LOWP, INTERP=INTERPRET,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    y = torch.empty((npairs, HID), dtype=torch.float32, device=dev)
    _moe_down[(tiles, triton.cdiv(HID, BLOCK_N))](
        h, w2, b2, weight, order, counts, offsets, y, E, HID, INTER,
        w2.stride(0), w2.stride(1), w2.stride(2), b2.stride(0), b2.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_E=BLOCK_E, PREC=PREC,
        LOWP=LOWP, W16=W16, INTERP=INTERPRET, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    out = torch.empty((T, HID), dtype=x.dtype, device=dev)
    _moe_combine[(T, triton.cdiv(HID, BLOCK_C))](y, out, HID, out.stride(0), out.stride(1),
                                                 K=TOP_K, BLOCK_C=BLOCK_C)
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
               interpret: bool = False) -> str:
    """The candidate's source (see the module docstring)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: expected one of {sorted(ACTIVATIONS)}")
    if dtype not in DTYPES or dot_precision not in DOT_PRECISIONS:
        raise ValueError(f"dtype {dtype!r} / dot_precision {dot_precision!r}")
    if num_experts < 1 or top_k < 1:
        raise ValueError("num_experts and top_k must be positive")
    if dtype == "fp32":
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
        BLOCK_P = 1024
        BLOCK_C = 256
        PREC = {prec!r}
        LOWP = {bool(lowp)}
        W16 = {dtype != "fp32"}
        INTERPRET = {bool(interpret)}
        NUM_WARPS = {int(num_warps)}
        NUM_STAGES = {int(num_stages)}
        ''')
    return header + _KERNELS + _LAUNCH.format()


def moe_configs(dtype: str, target: str = "cuda", *, rows: int | None = None) -> list[dict]:
    """Tile configurations worth trying (moe_source keywords), the likeliest first. Few rows per
    expert (decoding) want short row tiles."""
    if target == "cpu":
        return [{"block_m": 16, "block_n": 32, "block_k": 32, "num_warps": 4, "num_stages": 1}]
    small = rows is not None and rows <= 64
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
