"""Layer norm with affine parameters over the last dimension (no GEMM).

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=8192, N=8192)
SMOKE = dict(M=16, N=64)
TAGS = ("fusion", "layer_norm")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, N):
        super().__init__()
        self.norm = nn.LayerNorm(N)
        with torch.no_grad():   # non-trivial affine parameters
            self.norm.weight.copy_(torch.rand(N) + 0.5)
            self.norm.bias.copy_(torch.randn(N) * 0.1)

    def forward(self, x):
        return self.norm(x)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["N"]) * 2.0 + 0.5]


def get_init_inputs(scale="full"):
    return [sizes(scale)["N"]]
