"""Row logsumexp of a shifted, scaled input (no GEMM): logsumexp((x - 1) * 0.5) per row.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=8192, N=16384)
SMOKE = dict(M=16, N=64)
TAGS = ("fusion", "scale", "logsumexp")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def forward(self, x):
        return torch.logsumexp((x - 1.0) * 0.5, dim=-1)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["N"]) * 4.0]


def get_init_inputs(scale="full"):
    return []
