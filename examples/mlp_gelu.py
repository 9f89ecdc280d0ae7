"""Two-layer MLP: Linear (GEMM + bias) → GELU, twice.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. Shapes are small so that the
Triton interpreter can run the compiled model in tests; pass bigger sizes to `Model` for real
measurements.
"""
import torch
from torch import nn

batch_size = 16
in_features = 64
hidden_features = 128
out_features = 32


class Model(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc2(self.act(self.fc1(x))))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden_features, out_features]
