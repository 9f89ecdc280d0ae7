"""BERT encoder (post-LayerNorm, GELU MLP, padding mask) — KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.BertModel` (no pooler) built from a `BertConfig` with random weights (torch
default init under whatever seed is active; nothing is downloaded).
forward(input_ids, attention_mask) -> last_hidden_state. The last row of the batch is padded:
its attention_mask ends in zeros.

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import BertConfig, BertModel

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 2 layers, hidden 64,
#                       4 heads, FFN 128, seq 32, batch 2, last row padded by 8.
#   "real"            — GPU-sized: BERT-base (12 layers, hidden 768, 12 heads, FFN 3072, vocab
#                       30522), seq 512, batch 8, last row padded by 128.
# batch/seq/pad are input shapes; every other key is a BertConfig field.
SIZES = {
    "small": dict(batch=2, seq=32, pad=8, vocab_size=256, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=128, max_position_embeddings=64),
    "real": dict(batch=8, seq=512, pad=128, vocab_size=30522, hidden_size=768,
                 num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512),
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
        for k in ("batch", "seq", "pad"):
            cfg.pop(k)
        config = BertConfig(
            **cfg,
            type_vocab_size=2,
            hidden_act="gelu",                     # exact (erf) GELU
            layer_norm_eps=1e-12,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            pad_token_id=0,
            use_cache=False,
            # transformers 5 picks "sdpa" by default for BERT; set explicitly
            # (aten.scaled_dot_product_attention with the padding mask expanded to a
            # [B, 1, S, S] bool tensor).
            attn_implementation="sdpa",
        )
        self.model = BertModel(config, add_pooling_layer=False).eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state


def get_inputs():
    cfg = _size()
    b, s = cfg["batch"], cfg["seq"]
    input_ids = torch.randint(1, cfg["vocab_size"], (b, s), dtype=torch.int64)
    attention_mask = torch.ones(b, s, dtype=torch.int64)
    attention_mask[-1, s - cfg["pad"]:] = 0        # padding at the end of the last row
    input_ids[-1, s - cfg["pad"]:] = 0             # pad_token_id
    return [input_ids, attention_mask]


def get_init_inputs():
    return []
