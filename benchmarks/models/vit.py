"""Vision Transformer encoder (patch conv, CLS token, pre-LayerNorm, GELU MLP) — KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.ViTModel` (no pooler) built from a `ViTConfig` with random weights (torch default
init under whatever seed is active; nothing is downloaded).
forward(pixel_values) -> last_hidden_state [batch, 1 + (image/patch)^2, hidden].

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import ViTConfig, ViTModel

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 32x32 images, patch 8
#                       (16 patches + CLS = 17 tokens), 2 layers, hidden 64, 4 heads, batch 2.
#   "real"            — GPU-sized: ViT-B/16 at 224x224 (197 tokens, 12 layers, hidden 768,
#                       12 heads, MLP 3072), batch 8.
# batch is the input batch; every other key is a ViTConfig field.
SIZES = {
    "small": dict(batch=2, image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=128),
    "real": dict(batch=8, image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12,
                 num_attention_heads=12, intermediate_size=3072),
}


def _size(size=None):
    size = size or os.environ.get("KFORGE_ZOO_SIZE", "small")
    if size not in SIZES:
        raise ValueError(f"KFORGE_ZOO_SIZE={size!r}: expected one of {sorted(SIZES)}")
    return dict(SIZES[size])


class Model(nn.Module):
    def __init__(self, size=None):
        super().__init__()
        cfg = _size(size)
        cfg.pop("batch")
        config = ViTConfig(
            **cfg,
            num_channels=3,
            hidden_act="gelu",
            layer_norm_eps=1e-12,
            qkv_bias=True,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            # transformers 5 picks "sdpa" by default for ViT; set explicitly
            # (aten.scaled_dot_product_attention; eager passes no mask, but under torch.export
            # create_bidirectional_mask materialises an all-true [B, 1, T, T] bool mask).
            attn_implementation="sdpa",
        )
        self.model = ViTModel(config, add_pooling_layer=False).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).last_hidden_state


def get_inputs():
    cfg = _size()
    return [torch.randn(cfg["batch"], 3, cfg["image_size"], cfg["image_size"])]


def get_init_inputs():
    return []
