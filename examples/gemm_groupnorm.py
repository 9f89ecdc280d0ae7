"""GEMM (Linear with bias) followed by GroupNorm and a SiLU.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`; small default shapes.
"""
import torch
from torch import nn

batch_size = 16
in_features = 64
out_features = 128
num_groups = 8


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, num_groups: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.norm(self.fc(x)))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
