"""GEMM (Linear with bias) followed by a scaled row softmax.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`; small default shapes.
"""
import torch
from torch import nn

batch_size = 16
in_features = 64
out_features = 96


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x) * self.scale, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, 0.125]
