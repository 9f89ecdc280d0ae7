"""Transformer-style feed-forward block: LayerNorm(x + W2·GELU_tanh(W1·x + b1) + b2).

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`; small default shapes. The GELU
uses the tanh approximation, the other form the fusion passes recognise.
"""
import torch
from torch import nn

batch_size = 16
features = 64
hidden = 128


class Model(nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(features, hidden)
        self.down = nn.Linear(hidden, features)
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.up(x), approximate="tanh")
        return self.norm(x + self.down(h))


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, hidden]
