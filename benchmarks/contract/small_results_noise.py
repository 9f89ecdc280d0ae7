"""How noisy the strict contract's E32 is on small results (kforge.verify.contract.factor).

Two fp32 computations of equal accuracy against float64: PyTorch's own fp32 SDPA, and the
textbook formula softmax(q k^T * scale) v in fp32. For each size, 300 checks drawn as the
verifier draws its wide-magnitude inputs (log-uniform magnitudes in [0.05, 2] x 2, mixed
signs): how often the textbook formula's largest error exceeds 2x, 2.5x and 3x SDPA's largest
error (E32). Runs on the CPU (python benchmarks/contract/small_results_noise.py); the counts
depend on the CPU's fp32 kernels. Output of 2026-12-08 (AMD EPYC, torch 2.13.0+cpu) beside it.
"""
import math

import torch


def draw(shape, gen, scale=2.0):
    mag = torch.empty(shape).uniform_(math.log(0.05), math.log(2.0), generator=gen).exp_()
    sign = torch.rand(shape, generator=gen) < 0.5
    return torch.where(sign, -mag, mag) * scale


def main(checks: int = 300) -> None:
    for (b, h, s, d) in ((2, 2, 4, 16), (2, 2, 16, 16), (2, 4, 32, 16), (4, 4, 64, 16)):
        ratios = []
        for seed in range(checks):
            gen = torch.Generator().manual_seed(seed)
            q, k, v = (draw((b, h, s, d), gen) for _ in range(3))
            scale = 1 / math.sqrt(d)
            ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) * scale, -1) \
                @ v.double()
            e32 = (torch.nn.functional.scaled_dot_product_attention(q, k, v).double()
                   - ref).abs().max().item()
            logits = (q @ k.transpose(-1, -2)) * scale
            p = torch.exp(logits - logits.amax(-1, keepdim=True))
            out = (p @ v) / p.sum(-1, keepdim=True)
            ratios.append((out.double() - ref).abs().max().item() / e32)
        over = {f: sum(r > f for r in ratios) for f in (2.0, 2.5, 3.0)}
        print(f"{b * h * s * d:6d} elements: largest ratio {max(ratios):.2f}; over 2x in "
              f"{over[2.0]} of {checks}, over 2.5x in {over[2.5]}, over 3x in {over[3.0]}")


if __name__ == "__main__":
    main()
