"""Batched product of two activations: 32 x (512 x 128 @ 128 x 512), scaled by 1/sqrt(128).

A held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout/): our own
workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the full
size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn

FULL = dict(B=32, M=512, K=128, N=512)
SMOKE = dict(B=2, M=16, K=32, N=16)
TAGS = ("bmm", "batched", "scale")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K):
        super().__init__()
        self.scale = K ** -0.5

    def forward(self, q, k):
        return torch.bmm(q, k) * self.scale


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["B"], s["M"], s["K"]), torch.randn(s["B"], s["K"], s["N"])]


def get_init_inputs(scale="full"):
    return [sizes()["K"]]
