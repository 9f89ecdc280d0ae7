"""ConvNeXt (patchify stem, 7x7 depthwise conv, channels-last LayerNorm, GELU MLP, layer scale)
— KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.ConvNextModel` built from a `ConvNextConfig` with random weights (torch default
init under whatever seed is active; nothing is downloaded).
forward(pixel_values) -> last_hidden_state [batch, C, H/32, W/32] (before pooling). No attention.

layer_scale_init_value is 1.0 instead of the config default 1e-6: with 1e-6 every block's
residual branch is scaled to ~nothing, so a wrong kernel inside a block would not show in the
output when KForge checks it against eager. (Trained ConvNeXt layer scales are O(0.1-1).)

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import ConvNextConfig, ConvNextModel

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 32x32 images, 4 stages
#                       of one block (channels 16/32/64/128), batch 2; output [2, 128, 1, 1].
#   "real"            — GPU-sized: ConvNeXt-T (depths 3/3/9/3, channels 96/192/384/768) at
#                       224x224, batch 8; output [8, 768, 7, 7].
# batch/image_size are input shapes; every other key is a ConvNextConfig field.
SIZES = {
    "small": dict(batch=2, image_size=32, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    "real": dict(batch=8, image_size=224, hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3]),
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
        config = ConvNextConfig(
            **cfg,
            num_channels=3,
            patch_size=4,
            num_stages=4,
            hidden_act="gelu",
            layer_norm_eps=1e-12,
            layer_scale_init_value=1.0,            # see the module docstring
            drop_path_rate=0.0,
            # no attention_implementation: ConvNeXt has no attention.
        )
        self.model = ConvNextModel(config).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).last_hidden_state


def get_inputs():
    cfg = _size()
    return [torch.randn(cfg["batch"], 3, cfg["image_size"], cfg["image_size"])]


def get_init_inputs():
    return []
