"""Mixtral decoder LM (sparse MoE: 8 SwiGLU experts top-2, GQA, RoPE, RMSNorm) — KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.MixtralForCausalLM` built from a `MixtralConfig` with random weights (nothing is
downloaded). forward(input_ids) -> logits.

The config keeps transformers' default experts implementation: KForge's import switches the
experts to its grouped-GEMM op by itself (kforge.moe_op.experts_as_kforge_op), which is what a
user's own Mixtral gets. Eager PyTorch (the bench's baselines) runs transformers' `grouped_mm`.

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import MixtralConfig, MixtralForCausalLM

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 2 layers, hidden 64,
#                       4 query heads / 2 KV heads of 16, 4 experts top-2 of FFN 128, seq 32,
#                       batch 2.
#   "real"            — GPU-sized: Mixtral-8x7B layer geometry (hidden 4096, expert FFN 14336,
#                       32 query heads / 8 KV heads of 128, 8 experts top-2) cut to 2 layers,
#                       the Llama-2 vocab 32000, seq 512, batch 4.
# batch/seq are input shapes; every other key is a MixtralConfig field.
SIZES = {
    "small": dict(batch=2, seq=32, vocab_size=256, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64),
    "real": dict(batch=4, seq=512, vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                 num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096),
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
        config = MixtralConfig(
            **cfg,
            hidden_act="silu",
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            attention_dropout=0.0,
            router_jitter_noise=0.0,
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
            use_cache=False,
            attn_implementation="sdpa",      # explicit, as in llama.py
        )
        self.model = MixtralForCausalLM(config).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def get_inputs():
    cfg = _size()
    return [torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq"]), dtype=torch.int64)]


def get_init_inputs():
    return []
