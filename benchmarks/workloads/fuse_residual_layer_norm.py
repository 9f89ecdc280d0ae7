"""Residual add followed by layer norm (no GEMM): the post-attention step of a transformer.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=8192, N=4096)
SMOKE = dict(M=16, N=64)
TAGS = ("fusion", "residual", "layer_norm")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, N):
        super().__init__()
        self.norm = nn.LayerNorm(N, eps=1e-6)

    def forward(self, x, r):
        return self.norm(x + r)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["N"]), torch.randn(s["M"], s["N"])]


def get_init_inputs(scale="full"):
    return [sizes(scale)["N"]]
