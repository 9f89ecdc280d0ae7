"""ResNet (bottleneck blocks, BatchNorm in eval, ReLU, max-pool stem) — KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.ResNetModel` built from a `ResNetConfig` with random weights (torch default init
under whatever seed is active; nothing is downloaded; BatchNorm running stats are the init
values, mean 0 / var 1). forward(pixel_values) -> last_hidden_state [batch, C, H/32, W/32]
(before the global average pool). No attention.

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import ResNetConfig, ResNetModel

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 32x32 images, stem 16,
#                       4 stages of one bottleneck block (out channels 32/64/128/256), batch 2;
#                       output [2, 256, 1, 1].
#   "real"            — GPU-sized: ResNet-50 (stem 64, depths 3/4/6/3, out channels
#                       256/512/1024/2048) at 224x224, batch 8; output [8, 2048, 7, 7].
# batch/image_size are input shapes; every other key is a ResNetConfig field.
SIZES = {
    "small": dict(batch=2, image_size=32, embedding_size=16, hidden_sizes=[32, 64, 128, 256],
                  depths=[1, 1, 1, 1]),
    "real": dict(batch=8, image_size=224, embedding_size=64, hidden_sizes=[256, 512, 1024, 2048],
                 depths=[3, 4, 6, 3]),
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
        cfg.pop("batch"), cfg.pop("image_size")
        config = ResNetConfig(
            **cfg,
            num_channels=3,
            layer_type="bottleneck",
            hidden_act="relu",
            downsample_in_first_stage=False,
            downsample_in_bottleneck=False,        # stride on the 3x3 conv (torchvision v1.5)
            # no attention_implementation: ResNet has no attention.
        )
        self.model = ResNetModel(config).eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).last_hidden_state


def get_inputs():
    cfg = _size()
    return [torch.randn(cfg["batch"], 3, cfg["image_size"], cfg["image_size"])]


def get_init_inputs():
    return []
