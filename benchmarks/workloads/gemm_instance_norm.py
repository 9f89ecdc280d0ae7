"""Linear, output seen as 64 channels of N/64 features, instance norm per channel.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=4096, K=4096, N=4096)
SMOKE = dict(M=16, K=32, N=256)
TAGS = ('gemm', 'bias', 'instance_norm')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N)
        self.norm = nn.InstanceNorm1d(64, affine=True)

    def forward(self, x):
        y = self.fc(x)
        return self.norm(y.view(y.shape[0], 64, -1)).view(y.shape[0], -1)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
