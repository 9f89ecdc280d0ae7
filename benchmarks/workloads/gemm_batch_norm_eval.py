"""Linear, then batch norm with running statistics (inference form).

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(M=8192, K=1024, N=4096)
SMOKE = dict(M=16, K=32, N=64)
TAGS = ('gemm', 'bias', 'batch_norm_eval')


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.fc = nn.Linear(K, N)
        # Non-trivial statistics, so that the normalization is not the identity.
        self.register_buffer("running_mean", torch.randn(N) * 0.1)
        self.register_buffer("running_var", torch.rand(N) + 0.5)
        self.weight = nn.Parameter(torch.rand(N) + 0.5)
        self.bias = nn.Parameter(torch.randn(N) * 0.1)

    def forward(self, x):
        return F.batch_norm(self.fc(x), self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, eps=1e-5)


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["M"], s["K"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["K"], s["N"]]
