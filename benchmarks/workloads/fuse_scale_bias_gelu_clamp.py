"""Elementwise chain: clamp(gelu(x * gain + bias), -2, 2) with per-feature gain and bias (no GEMM).

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=8192, N=8192)
SMOKE = dict(M=16, N=64)
TAGS = ("fusion", "scale", "bias", "gelu_erf", "clamp")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, N):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(N) + 0.5)
        self.bias = nn.Parameter(torch.randn(N) * 0.1)

    def forward(self, x):
        return torch.clamp(F.gelu(x * self.gain + self.bias), -2.0, 2.0)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["N"]) * 2.0]


def get_init_inputs(scale="full"):
    return [sizes(scale)["N"]]
