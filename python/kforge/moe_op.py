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


def register_transformers_experts(name: str = TRANSFORMERS_EXPERTS) -> str:
    """Makes `experts_implementation=name` in a transformers config run a MoE model's experts as
    this op (so KForge compiles them to its grouped kernel). gpt-oss's experts (transposed,
    interleaved gate/up, biases, clamped SwiGLU) are supported. Returns the name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    ALL_EXPERTS_FUNCTIONS[name] = _transformers_experts_forward
    return name


def _transformers_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    if not all(hasattr(self, a) for a in ("gate_up_proj", "gate_up_proj_bias", "down_proj",
                                           "down_proj_bias", "alpha", "limit")):
        raise NotImplementedError(f"kforge's experts implementation supports gpt-oss's experts, "
                                  f"not {type(self).__name__}")
    return torch.ops.kforge.moe_experts(
        hidden_states, top_k_index, top_k_weights.to(hidden_states.dtype), self.gate_up_proj,
        self.gate_up_proj_bias, self.down_proj, self.down_proj_bias, "gpt_oss",
        float(self.alpha), float(self.limit))


__all__ = ["ACTIVATIONS", "activate", "moe_experts_reference", "route",
           "register_transformers_experts", "TRANSFORMERS_EXPERTS"]
