"""T5 encoder-decoder (relative position bias, RMS-style T5 LayerNorm, ReLU FFN, cross-attention)
— KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.T5Model` (no LM head) built from a `T5Config` with random weights (torch default
init under whatever seed is active; nothing is downloaded).
forward(input_ids, decoder_input_ids) -> decoder last_hidden_state.

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import T5Config, T5Model

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 2 encoder + 2 decoder
#                       layers, d_model 64, 4 heads of 16, FFN 128, encoder seq 32, decoder
#                       seq 16, batch 2.
#   "real"            — GPU-sized: t5-base (12 + 12 layers, d_model 768, 12 heads of 64, FFN
#                       3072, vocab 32128), encoder seq 512, decoder seq 128, batch 4.
# batch/enc_seq/dec_seq are input shapes; every other key is a T5Config field.
SIZES = {
    "small": dict(batch=2, enc_seq=32, dec_seq=16, vocab_size=256, d_model=64, d_kv=16, d_ff=128,
                  num_layers=2, num_decoder_layers=2, num_heads=4),
    "real": dict(batch=4, enc_seq=512, dec_seq=128, vocab_size=32128, d_model=768, d_kv=64,
                 d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12),
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
        for k in ("batch", "enc_seq", "dec_seq"):
            cfg.pop(k)
        config = T5Config(
            **cfg,
            relative_attention_num_buckets=32,
            relative_attention_max_distance=128,
            feed_forward_proj="relu",              # original T5 (t5-small/base/large)
            layer_norm_epsilon=1e-6,
            dropout_rate=0.0,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
            use_cache=False,
            # transformers 5 picks "sdpa" by default for T5; set explicitly (the relative
            # position bias, plus the causal mask in decoder self-attention, is passed to
            # aten.scaled_dot_product_attention as an additive float attn_mask).
            attn_implementation="sdpa",
        )
        self.model = T5Model(config).eval()

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids,
                         use_cache=False, return_dict=True)
        return out.last_hidden_state


def get_inputs():
    cfg = _size()
    v, b = cfg["vocab_size"], cfg["batch"]
    return [torch.randint(2, v, (b, cfg["enc_seq"]), dtype=torch.int64),
            torch.randint(2, v, (b, cfg["dec_seq"]), dtype=torch.int64)]


def get_init_inputs():
    return []
