"""Verification-scale workload (issue 13, item 4): an 8192x8192 Linear with bias and GELU over
8192 rows. KForge benchmark workload (KernelBench file format); only its exported region is
used, by benchmarks/verify/bench_verify.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.proj = nn.Linear(features, features)

    def forward(self, x):
        return nn.functional.gelu(self.proj(x))


def get_inputs():
    return [torch.randn(8192, 8192)]


def get_init_inputs():
    return [8192]
