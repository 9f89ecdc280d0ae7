"""Very tall Linear (32768 rows), min with a constant, tanh twice.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=32768, K=1024, N=1024)
SMOKE = dict(M=16, K=32, N=64)
TAGS = ('gemm', 'bias', 'min_const', 'tanh', 'tall_m')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N)

    def forward(self, x):
        return torch.tanh(torch.tanh(torch.minimum(self.fc(x), torch.tensor(0.5))))


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
