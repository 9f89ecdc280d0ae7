"""Linear, per-feature scale plus residual, average pool (window 2), log-softmax.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=2048, K=4096, N=8192)
SMOKE = dict(M=16, K=32, N=64)
TAGS = ('gemm', 'bias', 'scale', 'residual', 'avg_pool', 'log_softmax')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N)
        self.gain = nn.Parameter(torch.rand(N) + 0.5)

    def forward(self, x, r):
        return F.log_softmax(F.avg_pool1d((self.fc(x) * self.gain + r).unsqueeze(1), 2).squeeze(1), dim=1)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"]), torch.randn(s["M"], s["N"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
