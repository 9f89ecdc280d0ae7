"""Pre-norm transformer block: multi-head self-attention (explicit matmul + softmax) and a GELU MLP.

h = x + Wo(attention(LN1(x))); out = h + W2(gelu_tanh(W1(LN2(h)))).
Attention is written with matmuls and softmax (not scaled_dot_product_attention) so that every
GEMM and its epilogue is visible to region formation.

KForge benchmark workload (KernelBench file format). `get_inputs()` / `get_init_inputs()` give
the full size; pass `scale="smoke"` for the tiny CPU variant used in CI.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FULL = dict(B=8, S=1024, D=1024, H=16, F=4096)
SMOKE = dict(B=2, S=16, D=32, H=2, F=64)
TAGS = ("transformer", "gemm", "bias", "layer_norm", "softmax", "gelu_tanh", "residual")


def sizes(scale="full"):
    return SMOKE if scale == "smoke" else FULL


class Model(nn.Module):
    def __init__(self, D, H, F_):
        super().__init__()
        self.heads = H
        self.ln1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D)
        self.up = nn.Linear(D, F_)
        self.down = nn.Linear(F_, D)

    def forward(self, x):
        B, S, D = x.shape
        H = self.heads
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / (D // H) ** 0.5)
        attn = torch.matmul(torch.softmax(scores, dim=-1), v)
        h = x + self.proj(attn.transpose(1, 2).reshape(B, S, D))
        return h + self.down(F.gelu(self.up(self.ln2(h)), approximate="tanh"))


def get_inputs(scale="full"):
    s = sizes(scale)
    return [torch.randn(s["B"], s["S"], s["D"])]


def get_init_inputs(scale="full"):
    s = sizes(scale)
    return [s["D"], s["H"], s["F"]]
