"""Group norm (32 groups) then SiLU on an NCHW feature map (no GEMM): a diffusion U-Net step.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(B=16, C=256, H=64, W=64)
SMOKE = dict(B=2, C=64, H=4, W=4)
TAGS = ("fusion", "group_norm", "silu")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.norm = nn.GroupNorm(32, C)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(C) + 0.5)
            self.norm.bias.copy_(torch.randn(C) * 0.1)

    def forward(self, x):
        return F.silu(self.norm(x))


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["B"], s["C"], s["H"], s["W"])]


def get_init_inputs(scale="full"):
    return [sizes(scale)["C"]]
