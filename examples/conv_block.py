"""Convolution block: Conv2d → BatchNorm2d (inference) → ReLU.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`; small default shapes.
The batch norm runs with its running statistics (the importer puts models in eval mode); they
are set to non-trivial values so that the normalization is not an identity.
"""
import torch
from torch import nn

batch_size = 2
in_channels = 3
out_channels = 8
height = width = 16
kernel_size = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.bn = nn.BatchNorm2d(out_channels)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
