"""Tall and skinny: 65536 x 256 -> 256, then leaky ReLU.

A held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout/): our own
workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the full
size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=65536, K=256, N=256)
SMOKE = dict(M=16, K=32, N=48)
TAGS = ('gemm', 'tall-skinny', 'leaky_relu')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        return F.leaky_relu(self.fc(x), 0.1)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
