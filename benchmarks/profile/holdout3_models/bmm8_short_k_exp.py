"""Batched short products of two activations: 8 x (1024 x 64 @ 64 x 1024), scaled by 0.125, then exp.

A third held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout3/):
our own workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the
full size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(B=8, M=1024, K=64, N=1024)
SMOKE = dict(B=2, M=16, K=8, N=16)
TAGS = ('bmm', 'batched', 'short-k', 'exp')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def forward(self, a, b):
        return torch.exp(0.125 * torch.bmm(a, b))


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["B"], s["M"], s["K"]), torch.randn(s["B"], s["K"], s["N"])]


def get_init_inputs(scale="full"):
    return []
