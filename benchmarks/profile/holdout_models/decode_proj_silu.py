"""Decode-step projection: 64 tokens, 4096 -> 4096, then SiLU.

A held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout/): our own
workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the full
size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=64, K=4096, N=4096)
SMOKE = dict(M=16, K=32, N=48)
TAGS = ('gemm', 'decode', 'silu')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=False)

    def forward(self, x):
        return F.silu(self.fc(x))


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
