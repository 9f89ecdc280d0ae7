"""Llama-family decoder LM (GQA, RoPE, RMSNorm, SwiGLU) — KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.LlamaForCausalLM` built from a `LlamaConfig` with random weights (torch default
init under whatever seed is active; nothing is downloaded). forward(input_ids) -> logits.

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 2 layers, hidden 64,
#                       4 query heads sharing 2 KV heads (GQA), seq 32, batch 2.
#   "real"            — GPU-sized: TinyLlama-1.1B geometry (hidden 2048, SwiGLU 5632, 32 query
#                       heads / 4 KV heads, head_dim 64, Llama-2 vocab 32000) cut to 4 layers,
#                       seq 512, batch 4.
# batch/seq are input shapes; every other key is a LlamaConfig field.
SIZES = {
    "small": dict(batch=2, seq=32, vocab_size=256, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64),
    "real": dict(batch=4, seq=512, vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                 num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4,
                 max_position_embeddings=2048),
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
        cfg.pop("batch"), cfg.pop("seq")
        config = LlamaConfig(
            **cfg,
            hidden_act="silu",                     # SwiGLU MLP
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            attention_dropout=0.0,
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
            use_cache=False,
            # transformers 5 picks "sdpa" by default for Llama; set explicitly so the traced graph
            # does not depend on the library's default (aten.scaled_dot_product_attention; under
            # torch.export the causal mask is a materialised [B, 1, S, S] bool tensor).
            attn_implementation="sdpa",
        )
        self.model = LlamaForCausalLM(config).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def get_inputs():
    cfg = _size()
    return [torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq"]), dtype=torch.int64)]


def get_init_inputs():
    return []
