"""GPT-2 decoder LM (learned positions, pre-LayerNorm, GELU-tanh MLP, tied LM head) — KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.GPT2LMHeadModel` built from a `GPT2Config` with random weights (torch default init
under whatever seed is active; nothing is downloaded). forward(input_ids) -> logits.

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 2 layers, hidden 64,
#                       4 heads, seq 32, batch 2.
#   "real"            — GPU-sized: GPT-2 small (124M: 12 layers, hidden 768, 12 heads, vocab
#                       50257, 1024 positions), seq 512, batch 4.
# batch/seq are input shapes; every other key is a GPT2Config field.
SIZES = {
    "small": dict(batch=2, seq=32, vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64),
    "real": dict(batch=4, seq=512, vocab_size=50257, n_embd=768, n_layer=12, n_head=12,
                 n_positions=1024),
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
        config = GPT2Config(
            **cfg,
            activation_function="gelu_new",        # GPT-2's tanh-approximated GELU
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=cfg["vocab_size"] - 1, eos_token_id=cfg["vocab_size"] - 1,
            use_cache=False,
            # transformers 5 picks "sdpa" by default for GPT-2; set explicitly
            # (aten.scaled_dot_product_attention; under torch.export the causal mask is a
            # materialised [B, 1, S, S] bool tensor).
            attn_implementation="sdpa",
        )
        self.model = GPT2LMHeadModel(config).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def get_inputs():
    cfg = _size()
    return [torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq"]), dtype=torch.int64)]


def get_init_inputs():
    return []
