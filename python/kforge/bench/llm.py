"""LLM inference workloads: one prefill or one decode step of a decoder stack, with static shapes.

The zoo's LLM files (benchmarks/models/llama3_8b.py, gpt_oss_20b.py) describe their geometry
as size rows; this module turns a row and the environment into the phase and its shapes, builds
the inputs, and runs a decode step against a KV cache that comes in as plain tensors:

* KFORGE_LLM_PHASE=prefill (default): forward(input_ids [B, S]) -> logits [B, S, V].
* KFORGE_LLM_PHASE=decode: forward(input_ids [B, 1], k_0, v_0, ..., k_{L-1}, v_{L-1}) ->
  logits [B, 1, V], where k_i / v_i [B, Hkv, C, D] hold the C previous tokens of layer i (a
  `past_key_values`-style input; the step's own key and value are appended inside, as
  transformers' DynamicCache does, so one call is exactly one generated token per sequence).
* KFORGE_LLM_LAYERS, KFORGE_LLM_BATCH, KFORGE_LLM_SEQ, KFORGE_LLM_CONTEXT override the layer
  count, batch, prefill length and cache length of the row.

`tokens_per_call(shape)` is what tokens/s divides by: B * S for prefill, B for decode. Needs
only torch (and transformers for `decode_step`).

For `kforge bench` (kforge.bench.workloads) a zoo LLM file declares `VARIANTS` (one workload
per phase: `llama3_8b.prefill`, `llama3_8b.decode`) and takes the bench's scale: "smoke" is the
"small" row, "full" the row in $KFORGE_ZOO_SIZE or "real" (`zoo_size`); called without a scale
(kforge compile, the zoo tests) it reads $KFORGE_ZOO_SIZE, default "small".
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

PHASES = ("prefill", "decode")
VARIANTS = {phase: {"KFORGE_LLM_PHASE": phase} for phase in PHASES}


def zoo_size(scale: str | None = None) -> str | None:
    """The size row for a bench scale (None: leave it to llm_shape's default)."""
    if scale is None:
        return None
    if scale == "smoke":
        return "small"
    return os.environ.get("KFORGE_ZOO_SIZE") or "real"


@dataclass(frozen=True)
class LLMShape:
    config: dict            # the model config's fields (layers overridden)
    phase: str
    batch: int
    seq: int                # new tokens per sequence (1 when decoding)
    context: int            # cached tokens per sequence (0 for prefill)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected an integer") from None


def llm_shape(sizes: dict, size: str | None = None) -> LLMShape:
    """The row `size` (default $KFORGE_ZOO_SIZE or "small") of `sizes`, whose rows hold config
    fields plus `prefill=(batch, seq)` and `decode=(batch, context)`, under the environment."""
    size = size or os.environ.get("KFORGE_ZOO_SIZE", "small")
    if size not in sizes:
        raise ValueError(f"KFORGE_ZOO_SIZE={size!r}: expected one of {sorted(sizes)}")
    cfg = dict(sizes[size])
    prefill, decode = cfg.pop("prefill"), cfg.pop("decode")
    cfg["num_hidden_layers"] = _env_int("KFORGE_LLM_LAYERS", cfg["num_hidden_layers"])
    phase = os.environ.get("KFORGE_LLM_PHASE", "prefill")
    if phase == "prefill":
        shape = LLMShape(cfg, phase, _env_int("KFORGE_LLM_BATCH", prefill[0]),
                         _env_int("KFORGE_LLM_SEQ", prefill[1]), 0)
    elif phase == "decode":
        shape = LLMShape(cfg, phase, _env_int("KFORGE_LLM_BATCH", decode[0]), 1,
                         _env_int("KFORGE_LLM_CONTEXT", decode[1]))
    else:
        raise ValueError(f"KFORGE_LLM_PHASE={phase!r}: expected one of {', '.join(PHASES)}")
    if min(shape.batch, shape.seq, cfg["num_hidden_layers"]) < 1 or shape.context < 0:
        raise ValueError(f"{size} {phase}: batch, length and layers must be positive")
    cfg["max_position_embeddings"] = max(cfg.get("max_position_embeddings", 0), 8192,
                                         shape.seq + shape.context)
    return shape


def llm_inputs(shape: LLMShape) -> list[torch.Tensor]:
    cfg = shape.config
    ids = torch.randint(0, cfg["vocab_size"], (shape.batch, shape.seq), dtype=torch.int64)
    if shape.phase == "prefill":
        return [ids]
    heads = cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = (shape.batch, heads, shape.context, head_dim)
    return [ids, *(torch.randn(kv) for _ in range(2 * cfg["num_hidden_layers"]))]


def decode_step(model, config, input_ids: torch.Tensor, past) -> torch.Tensor:
    """Logits of one step of `model` (a transformers causal LM) after the cached tokens `past`
    (k_0, v_0, k_1, v_1, ...)."""
    from transformers import DynamicCache
    if len(past) != 2 * config.num_hidden_layers:
        raise ValueError(f"decode: expected {2 * config.num_hidden_layers} cache tensors "
                         f"(a key and a value per layer), got {len(past)}")
    cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)],
                         config=config)
    return model(input_ids=input_ids, **{_cache_keyword(model): cache}, use_cache=True,
                 return_dict=True).logits


def _cache_keyword(model) -> str:
    """transformers >= 5.25 names the cache `cache` (`past_key_values` is deprecated there and
    goes in 5.40); earlier releases (5.17 on the H200) only know `past_key_values`."""
    import inspect
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


class LLMWorkload(torch.nn.Module):
    """A transformers causal LM as a prefill or decode workload: a subclass sets `self.config`
    and `self.model` after calling __init__ with the phase."""

    # each sequence's logits depend only on its own tokens and cache rows: the bench may run
    # the float64 reference of the strict contract a part of the batch at a time
    BATCH_SEPARABLE = True

    def __init__(self, phase: str):
        super().__init__()
        self.phase = phase

    def forward(self, input_ids: torch.Tensor, *past: torch.Tensor) -> torch.Tensor:
        if self.phase == "prefill":
            return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits
        return decode_step(self.model, self.config, input_ids, past)


def tokens_per_call(shape: LLMShape) -> int:
    return shape.batch * shape.seq


def file_functions(sizes: dict):
    """A zoo LLM file's `get_inputs`, `get_init_inputs` and `tokens_per_call`, each taking the
    bench's optional scale (zoo_size), over the file's size rows."""
    def get_inputs(scale=None):
        return llm_inputs(llm_shape(sizes, zoo_size(scale)))

    def get_init_inputs(scale=None):
        return [zoo_size(scale)]

    def tokens(scale=None):
        return tokens_per_call(llm_shape(sizes, zoo_size(scale)))

    return get_inputs, get_init_inputs, tokens


__all__ = ["LLMShape", "LLMWorkload", "PHASES", "VARIANTS", "llm_shape", "llm_inputs",
           "decode_step", "file_functions", "tokens_per_call", "zoo_size"]
