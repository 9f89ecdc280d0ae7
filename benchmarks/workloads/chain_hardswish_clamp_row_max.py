"""Tall Linear, hardswish, clamp to [0, 1], max over each row.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=16384, K=1024, N=2048)
SMOKE = dict(M=16, K=32, N=64)
TAGS = ('gemm', 'bias', 'hardswish', 'clamp', 'row_max')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N)

    def forward(self, x):
        return torch.clamp(F.hardswish(self.fc(x)), 0.0, 1.0).amax(dim=1, keepdim=True)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
