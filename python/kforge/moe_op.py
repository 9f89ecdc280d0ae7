"""`torch.ops.kforge.moe_experts`: a mixture-of-experts layer's experts over routed tokens, as
one op.

    moe_experts(x [T, H], index [T, K] (int64 expert ids), weight [T, K] (routing weights),
                w1 [E, H, 2I], b1 [E, 2I], w2 [E, I, H], b2 [E, H], activation, alpha, limit)
        -> [T, H]

    out[t] = sum_k weight[t, k] * (act(x[t] @ w1[e] + b1[e]) @ w2[e] + b2[e]),  e = index[t, k]

`activation` names how the 2I columns of the first product become I:
* "gpt_oss": gate = h[..., 0::2], up = h[..., 1::2] (interleaved), gate clamped above at
  `limit`, up to [-limit, limit], act = (up + 1) * gate * sigmoid(alpha * gate) — gpt-oss's
  clamped SwiGLU;
* "swiglu": gate = h[..., :I], up = h[..., I:], act = silu(gate) * up (Mixtral, Qwen-MoE).

Only the routed (token, expert) pairs are computed: tokens are grouped by expert and each group
multiplies its own expert's weights — a grouped (ragged) GEMM, not a loop over every expert on
every token. This module is the op's PyTorch implementation (the region's reference, and what
runs where no kernel is verified); `kforge.kernels.moe` is its Triton kernel. The zoo's MoE
models route through it (benchmarks/models/gpt_oss*.py). Needs only torch.
"""
from __future__ import annotations

import contextlib
import os

import torch

ACTIVATIONS = ("gpt_oss", "swiglu")

_LIB = torch.library.Library("kforge", "FRAGMENT")
_LIB.define("moe_experts(Tensor x, Tensor index, Tensor weight, Tensor w1, Tensor b1, Tensor w2, "
            "Tensor b2, str activation, float alpha, float limit) -> Tensor")


def activate(h: torch.Tensor, activation: str, alpha: float, limit: float) -> torch.Tensor:
    """[N, 2I] first-product rows -> [N, I]."""
    if activation == "gpt_oss":
        gate, up = h[..., 0::2], h[..., 1::2]
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    if activation == "swiglu":
        half = h.shape[-1] // 2
        return torch.nn.functional.silu(h[..., :half]) * h[..., half:]
    raise ValueError(f"moe_experts: unknown activation {activation!r} (expected one of "
                     f"{', '.join(ACTIVATIONS)})")


def route(index: torch.Tensor, num_experts: int):
    """The routed pairs grouped by expert: (pair order [T*K] (flat pair ids sorted by expert,
    stable), per-expert counts [E])."""
    flat = index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts


def moe_experts_reference(x, index, weight, w1, b1, w2, b2, activation: str, alpha: float,
                          limit: float):
    num_tokens, k = index.shape
    num_experts = w1.shape[0]
    order, counts = route(index, num_experts)
    tokens = order // k
    rows = x[tokens]                                          # [T*K, H] grouped by expert
    out_rows = torch.empty(order.numel(), w2.shape[-1], dtype=x.dtype, device=x.device)
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            h = rows[start:start + n] @ w1[e] + b1[e]
            out_rows[start:start + n] = activate(h, activation, alpha, limit) @ w2[e] + b2[e]
        start += n
    scaled = out_rows * weight.reshape(-1)[order].unsqueeze(-1).to(out_rows.dtype)
    out = torch.zeros(num_tokens, w2.shape[-1], dtype=x.dtype, device=x.device)
    return out.index_add_(0, tokens, scaled)


_LIB.impl("moe_experts", moe_experts_reference, "CompositeExplicitAutograd")


@torch.library.register_fake("kforge::moe_experts", lib=_LIB)
def _moe_experts_fake(x, index, weight, w1, b1, w2, b2, activation, alpha, limit):
    return x.new_empty((x.shape[0], w2.shape[-1]))


TRANSFORMERS_EXPERTS = "kforge_grouped"

# transformers' own experts implementations: KForge replaces these at import (a name the user
# registered, such as the zoo's dense forward, is their explicit choice and is kept)
_TRANSFORMERS_OWN = (None, "eager", "grouped_mm", "batched_mm")


def register_transformers_experts(name: str = TRANSFORMERS_EXPERTS) -> str:
    """Makes `experts_implementation=name` in a transformers config run a MoE model's experts as
    this op (so KForge compiles them to its grouped kernel). Returns the name. The experts
    supported are those `unsupported_experts` passes: gpt-oss's (transposed, interleaved
    gate/up, biases, clamped SwiGLU) and the common SwiGLU layout of `use_experts_implementation`
    (Mixtral, Qwen-MoE, OLMoE, DeepSeek, ...: concatenated gate/up, SiLU, either orientation,
    with or without biases)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    ALL_EXPERTS_FUNCTIONS[name] = _transformers_experts_forward
    return name


def _is_gpt_oss(module) -> bool:
    return all(hasattr(module, a) for a in ("gate_up_proj", "gate_up_proj_bias", "down_proj",
                                            "down_proj_bias", "alpha", "limit"))


def unsupported_experts(module) -> str | None:
    """Why a transformers experts module cannot run as `moe_experts`, or None where it can."""
    name = type(module).__name__
    if _is_gpt_oss(module):
        return None
    w1, w2 = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(w1, torch.Tensor) or not isinstance(w2, torch.Tensor) \
            or w1.dim() != 3 or w2.dim() != 3:
        return f"{name}: no [experts, ., .] gate_up_proj and down_proj"
    if getattr(module, "has_gate", None) is not True or not getattr(module, "is_concatenated", 0):
        return f"{name}: not a gated expert with gate and up concatenated"
    if getattr(module, "has_post_expert_norm", False):
        return f"{name}: a norm after each expert"
    if getattr(module, "_is_expert_parallel", False):
        return f"{name}: expert parallel"
    if type(getattr(module, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU"):
        return f"{name}: activation {type(getattr(module, 'act_fn', None)).__name__}, not SiLU"
    from transformers.integrations.moe import _default_apply_gate
    if getattr(type(module), "_apply_gate", None) is not _default_apply_gate:
        return f"{name}: its own gating (_apply_gate)"
    transposed = bool(getattr(module, "is_transposed", False))
    e, hidden = w1.shape[0], w1.shape[1] if transposed else w1.shape[2]
    two_i = w1.shape[2] if transposed else w1.shape[1]
    down = (e, two_i // 2, hidden) if transposed else (e, hidden, two_i // 2)
    if two_i % 2 or tuple(w2.shape) != down:
        return f"{name}: gate_up_proj {tuple(w1.shape)} and down_proj {tuple(w2.shape)} disagree"
    if getattr(module, "has_bias", False) and not all(
            isinstance(getattr(module, b, None), torch.Tensor)
            for b in ("gate_up_proj_bias", "down_proj_bias")):
        return f"{name}: has_bias without gate_up_proj_bias and down_proj_bias"
    return None


def _transformers_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    why = unsupported_experts(self)
    if why is not None:
        raise NotImplementedError(f"kforge's experts implementation does not support {why}")
    weights = top_k_weights.to(hidden_states.dtype)
    if _is_gpt_oss(self):
        return torch.ops.kforge.moe_experts(
            hidden_states, top_k_index, weights, self.gate_up_proj, self.gate_up_proj_bias,
            self.down_proj, self.down_proj_bias, "gpt_oss", float(self.alpha), float(self.limit))
    # moe_experts multiplies x @ w1[e] with w1 [E, H, 2I]: transformers' default orientation
    # stores [E, 2I, H] (nn.Linear's), read through a transposed view (the kernel takes strides)
    w1, w2 = self.gate_up_proj, self.down_proj
    if not getattr(self, "is_transposed", False):
        w1, w2 = w1.transpose(1, 2), w2.transpose(1, 2)
    if getattr(self, "has_bias", False):
        b1, b2 = self.gate_up_proj_bias, self.down_proj_bias
    else:
        b1 = w1.new_zeros(w1.shape[0], w1.shape[2])
        b2 = w2.new_zeros(w2.shape[0], w2.shape[2])
    return torch.ops.kforge.moe_experts(hidden_states, top_k_index, weights, w1, b1, w2, b2,
                                        "swiglu", 1.0, 0.0)


# what transformers' `use_experts_implementation` sets on every experts module it wraps
_EXPERTS_MARKS = ("has_gate", "is_transposed", "is_concatenated", "_is_expert_parallel")


@contextlib.contextmanager
def experts_as_kforge_op(model: torch.nn.Module):
    """While active, the transformers experts modules of `model` that `unsupported_experts`
    passes run as `moe_experts` (their configs name TRANSFORMERS_EXPERTS), where the config
    names one of transformers' own implementations. Yields a list of notes (what was switched,
    what was not and why); every config is restored on exit. KFORGE_TRANSFORMERS_EXPERTS=0
    switches nothing."""
    notes: list[str] = []
    if os.environ.get("KFORGE_TRANSFORMERS_EXPERTS", "1") == "0":
        yield notes
        return
    groups: dict[int, tuple] = {}            # id(config) -> (config, [experts modules])
    for module in model.modules():
        config = getattr(module, "config", None)
        # the instances `use_experts_implementation` made (a dense MLP may have a gate_up_proj
        # too: Phi-3's is an nn.Linear)
        if config is None or not all(hasattr(module, a) for a in _EXPERTS_MARKS) \
                or not hasattr(type(config), "_experts_implementation"):
            continue
        groups.setdefault(id(config), (config, []))[1].append(module)
    saved = []
    try:
        for config, modules in groups.values():
            current = config._experts_implementation
            if current == TRANSFORMERS_EXPERTS:
                continue
            if current not in _TRANSFORMERS_OWN:
                notes.append(f"experts of {len(modules)} layers keep experts_implementation="
                             f"{current!r} (the model's own choice)")
                continue
            why = next((w for w in map(unsupported_experts, modules) if w), None)
            if why is not None:
                notes.append(f"experts of {len(modules)} layers run as PyTorch fallback ops "
                             f"({current!r}): {why}")
                continue
            register_transformers_experts()
            # the attribute behind the property: the setter would also rewrite sub-configs
            saved.append((config, config.__dict__.get("_experts_implementation_internal"),
                          "_experts_implementation_internal" in config.__dict__))
            config.__dict__["_experts_implementation_internal"] = TRANSFORMERS_EXPERTS
            notes.append(f"experts of {len(modules)} layers ({type(modules[0]).__name__}) "
                         f"run as kforge.moe_experts (a grouped GEMM over the routed tokens) "
                         f"instead of {current!r}")
        yield notes
    finally:
        for config, value, had in reversed(saved):
            if had:
                config.__dict__["_experts_implementation_internal"] = value
            else:
                config.__dict__.pop("_experts_implementation_internal", None)


__all__ = ["ACTIVATIONS", "activate", "moe_experts_reference", "route",
           "register_transformers_experts", "TRANSFORMERS_EXPERTS",
           "unsupported_experts", "experts_as_kforge_op"]
