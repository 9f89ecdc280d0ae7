"""SwiGLU gate on a fused up-projection output: silu(a) * b, where [a, b] = x split in halves (no GEMM).

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=8192, N=8192)
SMOKE = dict(M=16, N=64)
TAGS = ("fusion", "silu", "mul")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["N"])]


def get_init_inputs(scale="full"):
    return []
