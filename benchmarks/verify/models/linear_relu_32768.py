"""Verification-scale workload (issue 13, item 4): a 32768x32768 fp32 Linear (4 GB of weights)
with ReLU over 2048 rows. KForge benchmark workload (KernelBench file format); only its exported
region is used, by benchmarks/verify/bench_verify.py."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.wide = nn.Linear(features, features, bias=False)

    def forward(self, x):
        return torch.relu(self.wide(x))


def get_inputs():
    return [torch.randn(2048, 32768)]


def get_init_inputs():
    return [32768]
