"""Row softmax over a wide activation (no GEMM): one read, one write, two reductions.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=16384, N=8192)
SMOKE = dict(M=16, N=64)
TAGS = ("fusion", "softmax")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["N"]) * 3.0]


def get_init_inputs(scale="full"):
    return []
