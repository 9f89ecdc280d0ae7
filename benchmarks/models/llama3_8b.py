"""Llama-3-8B architecture (GQA 32/8, RoPE theta 500000, RMSNorm, SwiGLU 14336), prefill or one
decode step against a KV cache — KForge model zoo, LLM inference workloads (issue 12).

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.LlamaForCausalLM` built from a `LlamaConfig` with random weights (nothing is
downloaded), cut to a few layers.

* KFORGE_LLM_PHASE=prefill (default): forward(input_ids [B, S]) -> logits [B, S, V].
* KFORGE_LLM_PHASE=decode: forward(input_ids [B, 1], k_0, v_0, ..., k_{L-1}, v_{L-1}) ->
  logits [B, 1, V]; the k_i / v_i [B, 8, C, 128] are the layers' cached keys and values of the
  C previous tokens (a `past_key_values`-style input with static shapes; the step's own key and
  value are appended inside, as transformers' DynamicCache does).

Sizes (KFORGE_ZOO_SIZE): "small" (CI, the Triton interpreter) and "real" (the GPU: the 8B
geometry, Llama-3's vocabulary of 128256, 4 layers; prefill batch 8 x 2048 tokens, decode
batch 64 against 2048 cached tokens). KFORGE_LLM_LAYERS, KFORGE_LLM_BATCH, KFORGE_LLM_SEQ and
KFORGE_LLM_CONTEXT override the layer count, batch, prefill length and cache length.
"""
import os

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

SIZES = {
    "small": dict(vocab_size=256, hidden_size=64, intermediate_size=224, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  prefill=(2, 32), decode=(4, 1, 24)),
    "real": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, prefill=(8, 2048), decode=(64, 1, 2048)),
}


def _env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value else default


def shapes(size=None):
    """(config fields, phase, batch, new tokens, cached tokens)."""
    size = size or os.environ.get("KFORGE_ZOO_SIZE", "small")
    if size not in SIZES:
        raise ValueError(f"KFORGE_ZOO_SIZE={size!r}: expected one of {sorted(SIZES)}")
    cfg = dict(SIZES[size])
    prefill, decode = cfg.pop("prefill"), cfg.pop("decode")
    cfg["num_hidden_layers"] = _env_int("KFORGE_LLM_LAYERS", cfg["num_hidden_layers"])
    phase = os.environ.get("KFORGE_LLM_PHASE", "prefill")
    if phase == "prefill":
        batch, seq, context = _env_int("KFORGE_LLM_BATCH", prefill[0]), \
            _env_int("KFORGE_LLM_SEQ", prefill[1]), 0
    elif phase == "decode":
        batch, seq, context = _env_int("KFORGE_LLM_BATCH", decode[0]), decode[1], \
            _env_int("KFORGE_LLM_CONTEXT", decode[2])
    else:
        raise ValueError(f"KFORGE_LLM_PHASE={phase!r}: expected prefill or decode")
    cfg["max_position_embeddings"] = max(8192, seq + context)
    return cfg, phase, batch, seq, context


class Model(nn.Module):
    def __init__(self, size=None):
        super().__init__()
        cfg, self.phase, *_ = shapes(size)
        self.config = LlamaConfig(
            **cfg, hidden_act="silu", rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
            use_cache=self.phase == "decode", attn_implementation="sdpa")
        self.model = LlamaForCausalLM(self.config).eval()

    def forward(self, input_ids: torch.Tensor, *past: torch.Tensor) -> torch.Tensor:
        if self.phase == "prefill":
            return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
        cache = DynamicCache(pairs, config=self.config)
        return self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                          return_dict=True).logits


def get_inputs():
    cfg, phase, batch, seq, context = shapes()
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), dtype=torch.int64)
    if phase == "prefill":
        return [ids]
    kv = (batch, cfg["num_key_value_heads"], context, cfg["head_dim"])
    past = [torch.randn(kv) for _ in range(2 * cfg["num_hidden_layers"])]
    return [ids, *past]


def get_init_inputs():
    return []
