"""RMS norm written out in torch ops: x * rsqrt(mean(x^2) + eps) * weight (no GEMM).

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=16384, N=4096)
SMOKE = dict(M=16, N=64)
TAGS = ("fusion", "row_mean", "scale")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, N, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(N) + 0.5)
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["N"])]


def get_init_inputs(scale="full"):
    return [sizes(scale)["N"]]
