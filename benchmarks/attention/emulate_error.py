"""Where fp16x1 attention's error comes from, emulated on the CPU in float64: causal attention
over N(0, 1.28^2) q, k, v (about the scale of Llama-3-8B's projections of a normed hidden
state at HF's initialisation), with one part of the kernel's rounding at a time against the
exact result: the scores' operands (q per row, k per key, scaled by powers of two and rounded
to fp16), v (per column over all keys), p (fp16), all of them, and bf16 q and k.

    python benchmarks/attention/emulate_error.py [--heads 8] [--seq 1024] [--dim 128]
"""
import argparse
import math

import torch


def fp16x1(x, dim):
    """x scaled by the power of two that puts max |x| along `dim` below 2**15, rounded to fp16,
    scaled back (the kernel's operand rounding)."""
    amax = x.abs().amax(dim=dim, keepdim=True)
    scale = torch.ldexp(torch.ones_like(amax), 15 - torch.frexp(amax)[1])
    return (x * scale).to(torch.float16).to(x.dtype) / scale


def attention(q, k, v, p_fp16=False):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    l_sum = p.sum(-1, keepdim=True)
    if p_fp16:
        p = p.to(torch.float16).to(p.dtype)
    return p @ v / l_sum


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--scale", type=float, default=1.28)
    args = ap.parse_args()
    torch.manual_seed(0)
    shape = (1, args.heads, args.seq, args.dim)
    q, k, v = (torch.randn(shape, dtype=torch.float64) * args.scale for _ in range(3))
    ref = attention(q, k, v)
    print(f"output RMS {ref.pow(2).mean().sqrt():.3f}")
    cases = {
        "scores: q, k fp16x1": attention(fp16x1(q, -1), fp16x1(k, -1), v),
        "q fp16x1 alone": attention(fp16x1(q, -1), k, v),
        "v fp16x1 (columns over keys)": attention(q, k, fp16x1(v, -2)),
        "p fp16": attention(q, k, v, p_fp16=True),
        "all of fp16x1": attention(fp16x1(q, -1), fp16x1(k, -1), fp16x1(v, -2), p_fp16=True),
        "fp16x3 scores (v, p fp16)": attention(q, k, fp16x1(v, -2), p_fp16=True),
        "bf16 q, k": attention(q.to(torch.bfloat16).double(), k.to(torch.bfloat16).double(), v),
    }
    for name, out in cases.items():
        d = (out - ref).abs()
        print(f"{name:30s} max {d.max():.2e}  RMS {d.pow(2).mean().sqrt():.2e}")


if __name__ == "__main__":
    main()
