"""fp16x3 GEMM main loops on the GPU, one process: where the three-product step loses time.

    OUT=$OUT python3 benchmarks/gemm/fp16x3_ab.py            (on the device machine)

The builtin's strict scheme (kernels.gemm / providers.builtin.gemm, and kernels.moe's
_planes_dot) takes each K step as three fp16 products chained into a fresh fp32 `part`
(a_lo @ b_hi + a_hi @ b_lo + a_hi @ b_hi), then `acc += part` in exact fp32: chaining the whole
of K in the tensor core's accumulator truncates. The add waits for the step's three products,
so no product of the next step is in flight while it waits. Variants of that loop, same tiles
and operand planes (fp16 hi / lo of power-of-two scaled rows and columns, as the builtin's):

  base     one part a 64-deep step (the builtin's pointer kernel today: 128x128x64, 8 warps,
           3 stages)
  sub2     each loop iteration two 32-deep steps, each with its own part, both parts' products
           issued before either is added: the first part's wait overlaps the second's products
           (the same 64-deep stage in shared memory; parts half as deep: no less accurate)
  base_k32_s4  base with 32-deep steps and 4 stages
  gluon_pp base's tiles and accumulation in Gluon (fp16x3_gluon.py): each step's three
           products issued as wgmma groups with no wait between them, into one of two parts
           that alternate, and only the step before waited for and added
  cat4_*   all four products of a step (lo x lo too) as one dot over 4 x BLOCK_K, F steps
           chained into a part before its fp32 add (_fp16x4_cat). Triton waits after each of
           chained dots in one iteration (sm_90 PTX of base: wgmma.wait_group 0 after every
           dot, even with `part` loop-carried); one dot an iteration on a loop-carried
           accumulator it keeps in flight (wait_group 1). A third more tensor-core work and
           twice the operand tiles in shared memory. cat4_k32_chain: all of K chained (the
           error the flush avoids; a bound on the speed)

Each is checked against a float64 product of the same planes' values (relative Frobenius
error, and the ratio of its worst element to PyTorch's own fp32 GEMM's worst element against
the same float64 product), and timed with triton.testing.do_bench (L2 flushed, median) beside
cuBLAS fp32 (TF32 off: the strict policy's PyTorch route) and cuBLAS bf16 (the 16-bit rate).
Writes $OUT/fp16x3_ab.json and prints a table.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output rows and columns, in grouped order (GROUP_M row tiles share their
    B tiles in L2), as the builtin's pointer kernel takes them."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return rm, rn


@triton.jit
def _fp16x3(AH, AL, BH, BL, SA, SB, C, M, N, K,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr, SUB: tl.constexpr):
    rm, rn = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K * SUB):
        ka = k0 + tl.arange(0, BLOCK_K)[None, :]
        kb = k0 + tl.arange(0, BLOCK_K)[:, None]
        a_hi = tl.load(AH + rm * K + ka)
        a_lo = tl.load(AL + rm * K + ka)
        b_hi = tl.load(BH + rn * K + kb)
        b_lo = tl.load(BL + rn * K + kb)
        if SUB == 2:
            a_hi2 = tl.load(AH + rm * K + ka + BLOCK_K)
            a_lo2 = tl.load(AL + rm * K + ka + BLOCK_K)
            b_hi2 = tl.load(BH + rn * K + kb + BLOCK_K)
            b_lo2 = tl.load(BL + rn * K + kb + BLOCK_K)
            p0 = tl.dot(a_lo, b_hi)
            p0 = tl.dot(a_hi, b_lo, p0)
            p0 = tl.dot(a_hi, b_hi, p0)
            p1 = tl.dot(a_lo2, b_hi2)
            p1 = tl.dot(a_hi2, b_lo2, p1)
            p1 = tl.dot(a_hi2, b_hi2, p1)
            acc += p0
            acc += p1
        else:
            part = tl.dot(a_lo, b_hi)
            part = tl.dot(a_hi, b_lo, part)
            part = tl.dot(a_hi, b_hi, part)
            acc += part
    acc = acc * tl.load(SA + rm) * tl.load(SB + rn)
    tl.store(C + rm * N + rn, acc)


@triton.jit
def _fp16x4_cat(A2, B2, SA, SB, C, M, N, K,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, F: tl.constexpr):
    """All four products of a K step (lo x lo too: the split's exact product) as one dot over
    4 * BLOCK_K: A's tile read as (hi, hi, lo, lo) and B's as (hi, lo, hi, lo) blocks of
    BLOCK_K columns of the same step, straight from the [2, R, K] planes by the pointers'
    plane offsets. F steps chain into one `part` in the tensor core (a loop-carried
    accumulator, which Triton keeps in flight: wait_group 1), then `acc += part` in fp32; the
    two loops flattened into one pipeline. F = 0: no flush, all of K chained (a bound)."""
    rm, rn = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    c4 = tl.arange(0, 4 * BLOCK_K)
    a_cols = (c4 // (2 * BLOCK_K)).to(tl.int64) * M * K + c4 % BLOCK_K        # hi hi lo lo
    b_cols = ((c4 // BLOCK_K) % 2).to(tl.int64) * N * K + c4 % BLOCK_K        # hi lo hi lo
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if F == 0:
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(A2 + rm * K + k0 + a_cols[None, :])
            b = tl.load(B2 + rn * K + k0 + b_cols[:, None])
            acc = tl.dot(a, b, acc)
    else:
        for c0 in tl.range(0, K, BLOCK_K * F, flatten=True):
            part = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for kk in range(0, BLOCK_K * F, BLOCK_K):
                a = tl.load(A2 + rm * K + c0 + kk + a_cols[None, :])
                b = tl.load(B2 + rn * K + c0 + kk + b_cols[:, None])
                part = tl.dot(a, b, part)
            acc += part
    acc = acc * tl.load(SA + rm) * tl.load(SB + rn)
    tl.store(C + rm * N + rn, acc)


VARIANTS = {
    "base": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SUB=1, num_stages=3),
    "sub2": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, SUB=2, num_stages=3),
    "base_k32_s4": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, SUB=1, num_stages=4),
    "cat4_k32_f1": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, F=1, LOOP=1, num_stages=3),
    "cat4_k32_f2": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, F=2, LOOP=1, num_stages=3),
    "cat4_k32_f4": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, F=4, LOOP=1, num_stages=3),
    "cat4_k16_f4": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=16, F=4, LOOP=1, num_stages=6),
    "cat4_k32_chain": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, F=0, LOOP=1, num_stages=3),
    # the same accumulation as base, its wgmma groups issued by hand in Gluon so that a step's
    # three products are in flight while the step before is added (fp16x3_gluon.py)
    "gluon_pp": dict(GLUON=1),
}
SHAPES = [(4096, 4096, 2880), (16384, 4096, 4096), (8192, 8192, 8192)]


def planes(x: torch.Tensor):
    """Rows of x scaled by 2**(15 - e) (max |row| < 2**e) into fp16 hi + lo planes ([2, R, K],
    hi first), and the scales undone after the product."""
    amax = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    e = torch.floor(torch.log2(amax)) + 1
    s = torch.exp2(15 - e)
    y = x * s
    hi = y.half()
    lo = (y - hi.float()).half()
    return torch.stack([hi, lo]).contiguous(), (1.0 / s).reshape(-1).contiguous()


def launch(cfg, ah, al, bh, bl, sa, sb, c, a2=None, b2=None):
    """ah / al (bh / bl): views of the [2, M, K] buffer a2 (b2), hi first."""
    if cfg.get("GLUON"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import fp16x3_gluon
        return fp16x3_gluon.launch(a2, b2, sa, sb, c)
    M, K = ah.shape
    N = bh.shape[0]
    meta = {k: v for k, v in cfg.items() if k not in ("num_stages", "LOOP", "SUB")}
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    if cfg.get("LOOP"):
        _fp16x4_cat[grid](a2, b2, sa, sb, c, M, N, K, GROUP_M=8, num_warps=8,
                            num_stages=cfg["num_stages"], **meta)
        return c
    _fp16x3[grid](ah, al, bh, bl, sa, sb, c, M, N, K, GROUP_M=8, num_warps=8,
                  num_stages=cfg["num_stages"], SUB=cfg["SUB"], **meta)
    return c


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    names = os.environ.get("FP16X3_VARIANTS", ",".join(VARIANTS)).split(",")
    rows = []
    for M, N, K in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(M, K, device="cuda", generator=g)
        b = torch.randn(N, K, device="cuda", generator=g) / K ** 0.5
        a2, sa = planes(a)
        b2, sb = planes(b)
        ah, al, bh, bl = a2[0], a2[1], b2[0], b2[1]
        ref = (a.double() @ b.double().T)
        fp32 = a @ b.T
        err32 = (fp32.double() - ref).abs().max().item()
        row = {"shape": [M, N, K], "flop": 2 * M * N * K,
               "fp32_worst_err": err32,
               "cublas_fp32_ms": triton.testing.do_bench(lambda: a @ b.T, warmup=25, rep=200)}
        a16, b16 = a.bfloat16(), b.bfloat16()
        row["cublas_bf16_ms"] = triton.testing.do_bench(lambda: a16 @ b16.T, warmup=25, rep=200)
        del fp32, a16, b16
        c = torch.empty(M, N, device="cuda")
        for name in names:
            cfg = VARIANTS[name]
            try:
                c.fill_(float("nan"))
                launch(cfg, ah, al, bh, bl, sa, sb, c, a2, b2)
                torch.cuda.synchronize()
                d = c.double() - ref
                row[f"{name}_rel"] = (d.norm() / ref.norm()).item()
                row[f"{name}_worst_vs_fp32"] = d.abs().max().item() / err32
                row[f"{name}_ms"] = triton.testing.do_bench(
                    lambda: launch(cfg, ah, al, bh, bl, sa, sb, c, a2, b2), warmup=25, rep=200)
                # the 16-bit rate over three products: what the step would take at cuBLAS's pace
                row[f"{name}_of_3x_bf16"] = 3 * row["cublas_bf16_ms"] / row[f"{name}_ms"]
            except Exception as e:                  # noqa: BLE001 - a variant that fails
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps({k: v for k, v in row.items() if k.startswith(name)}), flush=True)
        rows.append(row)
        del a, b, a2, b2, ah, al, bh, bl, ref, c
        torch.cuda.empty_cache()
    (out / "fp16x3_ab.json").write_text(json.dumps(rows, indent=1))
    print(f"| M,N,K | cuBLAS fp32 | cuBLAS bf16 | " + " | ".join(names) + " |")
    for r in rows:
        cells = [f"{r.get(n + '_ms', float('nan')):.3f} ({r.get(n + '_of_3x_bf16', 0):.2f}, "
                 f"{r.get(n + '_worst_vs_fp32', float('nan')):.2f})" for n in names]
        print(f"| {r['shape']} | {r['cublas_fp32_ms']:.3f} | {r['cublas_bf16_ms']:.3f} | "
              + " | ".join(cells) + " |")
    print("cells: ms (of the 3 x bf16 pace, worst error over fp32 cuBLAS's worst error)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
