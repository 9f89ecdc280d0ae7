"""Deep reduction onto few tiles: 1024 x 20480 -> 512, plus a residual.

A third held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout3/):
our own workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the
full size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=1024, K=20480, N=512)
SMOKE = dict(M=16, K=64, N=24)
TAGS = ('gemm', 'deep-k', 'residual')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=False)

    def forward(self, x, r):
        y = self.fc(x)
        return y + r


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"]), torch.randn(s["M"], s["N"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
