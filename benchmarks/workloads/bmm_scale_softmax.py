"""Batched GEMM of two activations, scaled, then softmax over the last dimension (attention scores).

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(B=16, M=2048, K=1024, N=2048)
SMOKE = dict(B=2, M=16, K=32, N=64)
TAGS = ("gemm", "batched", "scale", "softmax")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K):
        super().__init__()
        self.scale = 1.0 / K ** 0.5

    def forward(self, a, b):
        return torch.softmax(torch.bmm(a, b) * self.scale, dim=-1)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["B"], s["M"], s["K"]), torch.randn(s["B"], s["K"], s["N"])]


def get_init_inputs(scale="full"):
    return [sizes(scale)["K"]]
