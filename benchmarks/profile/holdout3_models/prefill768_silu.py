"""Prefill projection: 768 x 2048 -> 5632, bias, then SiLU.

A third held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout3/):
our own workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the
full size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=768, K=2048, N=5632)
SMOKE = dict(M=24, K=32, N=40)
TAGS = ('gemm', 'prefill', 'silu')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        y = self.fc(x)
        return y * torch.sigmoid(y)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
