"""Batched product of two activations: 16 x (256 x 512 @ 512 x 1024), then a sigmoid.

A second held-out shape for the builtin tuner's cost model (benchmarks/profile/specs_holdout2/):
our own workload, in the KernelBench file format. `get_inputs()` / `get_init_inputs()` give the
full size; pass `scale="smoke"` for a tiny CPU variant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(B=16, M=256, K=512, N=1024)
SMOKE = dict(B=2, M=16, K=32, N=16)
TAGS = ('bmm', 'batched', 'sigmoid')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def forward(self, a, b):
        return torch.sigmoid(torch.bmm(a, b))


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["B"], s["M"], s["K"]), torch.randn(s["B"], s["K"], s["N"])]


def get_init_inputs(scale="full"):
    return []
