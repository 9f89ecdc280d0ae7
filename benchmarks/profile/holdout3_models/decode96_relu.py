"""Small odd batch of decode rows: 96 x 3072 -> 8192, then ReLU.

A third held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout3/):
our own workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the
full size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=96, K=3072, N=8192)
SMOKE = dict(M=6, K=32, N=48)
TAGS = ('gemm', 'decode', 'relu')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=False)

    def forward(self, x):
        y = self.fc(x)
        return torch.relu(y)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
