"""Square output, deeper K: 2048 x 4096 -> 2048, then 0.5 * tanh(y) + 0.5.

A third held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout3/):
our own workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the
full size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=2048, K=4096, N=2048)
SMOKE = dict(M=16, K=32, N=16)
TAGS = ('gemm', 'square', 'tanh')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=False)

    def forward(self, x):
        y = self.fc(x)
        return 0.5 * torch.tanh(y) + 0.5


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
