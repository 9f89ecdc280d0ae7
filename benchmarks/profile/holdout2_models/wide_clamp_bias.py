"""Wide projection 768 -> 6144 over 1536 rows, bias, clamped to [-2, 2].

A second held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout2/):
our own workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the
full size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=1536, K=768, N=6144)
SMOKE = dict(M=16, K=32, N=48)
TAGS = ('gemm', 'wide', 'clamp')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        y = self.fc(x)
        return torch.clamp(y, -2.0, 2.0)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
