"""Deep reduction: 512 x 12288 -> 768, scaled by 0.5 plus a residual.

A second held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout2/):
our own workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the
full size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=512, K=12288, N=768)
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
        return 0.5 * y + r


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"]), torch.randn(s["M"], s["N"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
