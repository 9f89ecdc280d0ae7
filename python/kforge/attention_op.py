"""`torch.ops.kforge.attention`: attention with optional sinks, as one op.

    attention(q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, D], mask (additive,
              broadcastable to [B, H, Sq, Skv]) or None, sinks [H] or None, scale,
              causal=False, window=0) -> [B, H, Sq, D]

    out = softmax([scale * q @ k^T + mask, sink_h]) without its sink column, @ v

`causal` and `window` say the same as a mask in fewer bytes (kforge.frontend.constant_masks
puts them where the model's mask is a constant of that shape): with `causal`, query i sees key
j only if j <= i + (Skv - Sq) (bottom-right aligned); with `window` W > 0, only if
j > i + (Skv - Sq) - W as well (transformers' sliding window). The kernel then skips the blocks
outside that band (kforge.kernels.attention's `causal` and `window`).

H is a multiple of Hkv: query head h reads kv head h // (H / Hkv) (grouped-query attention, as
transformers' repeat_kv lays the heads out; kforge.frontend.attention_patterns folds that copy
away).

It is what the frontend puts in place of an attention written out in PyTorch ops — gpt-oss's
eager attention (`cat` of the sink logits, `softmax`, slice, `matmul`), which SDPA cannot express
— so that it becomes a fallback op with a kernel (kforge.kernel_fallbacks) instead of three
regions around a softmax over a concatenation. Its implementation here is those same PyTorch
ops: the region's reference, and what runs when no kernel is verified. Needs only torch.
"""
from __future__ import annotations

import torch

_LIB = torch.library.Library("kforge", "FRAGMENT")
_LIB.define("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor? sinks, float scale, "
            "bool causal=False, int window=0) -> Tensor")


# aten.scaled_dot_product_attention's arguments, in order, with their defaults
SDPA_ARGS = {"query": None, "key": None, "value": None, "attn_mask": None, "dropout_p": 0.0,
             "is_causal": False, "scale": None, "enable_gqa": False}


def sdpa_arguments(args, kwargs=None) -> dict:
    """SDPA's arguments by name, defaults filled in, from a call's positional and keyword
    arguments (an FX node's, or a fallback op's argument list)."""
    return {**SDPA_ARGS, **dict(zip(SDPA_ARGS, args)), **(kwargs or {})}


def band_mask(sq: int, skv: int, causal: bool, window: int, device=None) -> torch.Tensor | None:
    """[Sq, Skv] bool (True = keep) of `causal` and `window` as the op defines them; None when
    neither is set."""
    if not causal and not window:
        return None
    i = torch.arange(sq, device=device)[:, None] + (skv - sq)
    j = torch.arange(skv, device=device)[None, :]
    keep = j <= i if causal else torch.ones(sq, skv, dtype=torch.bool, device=device)
    return keep & (j > i - window) if window else keep


def _with_band(mask, q, skv: int, causal: bool, window: int):
    """The additive mask with the band's excluded keys at -inf."""
    band = band_mask(q.shape[2], skv, causal, window, q.device)
    if band is None:
        return mask
    blocked = torch.zeros(band.shape, dtype=q.dtype, device=q.device).masked_fill(
        ~band, float("-inf"))
    return blocked if mask is None else mask + blocked


# the score matrices one slice of attention_reference materializes (its scores, logits and
# probabilities: a prefill's [8, 64, 2048, 2048] float64 scores alone are 17 GB)
SLICE_BYTES = 1 << 31


def score_bytes(q: torch.Tensor, keys: int, batch: int = 1, heads: int = 1) -> int:
    """What attention over `keys` keys holds for `batch` x `heads` of q's [B, H, Sq, D] at
    once: its scores, logits and probabilities, in q's element type."""
    return 3 * batch * heads * q.shape[2] * keys * q.element_size()


def attention_reference(q, k, v, mask, sinks, scale: float, causal: bool = False,
                        window: int = 0):
    """The op's definition, computed a slice of (batch, query heads) at a time where the whole
    score matrix would take more than SLICE_BYTES (each slice is exact: heads and sequences are
    independent)."""
    mask = _with_band(mask, q, k.shape[2], causal, window)
    b, h, sq, _ = q.shape
    per_head = score_bytes(q, k.shape[2])
    if score_bytes(q, k.shape[2], b, h) <= SLICE_BYTES:
        return _attention_dense(q, k, v, mask, sinks, scale)
    group = h // k.shape[1]
    heads = max(1, min(h, SLICE_BYTES // per_head))
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    for i in range(b):
        kk = k[i:i + 1].repeat_interleave(group, dim=1) if group > 1 else k[i:i + 1]
        vv = v[i:i + 1].repeat_interleave(group, dim=1) if group > 1 else v[i:i + 1]
        for h0 in range(0, h, heads):
            h1 = min(h, h0 + heads)
            m = mask
            if m is not None:
                m = m[i:i + 1] if m.dim() == 4 and m.shape[0] > 1 else m
                m = m[:, h0:h1] if m.dim() == 4 and m.shape[1] > 1 else m
            out[i:i + 1, h0:h1] = _attention_dense(
                q[i:i + 1, h0:h1], kk[:, h0:h1], vv[:, h0:h1], m,
                None if sinks is None else sinks[h0:h1], scale)
    return out


def _attention_dense(q, k, v, mask, sinks, scale: float):
    if k.shape[1] != q.shape[1]:         # grouped-query attention
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    if sinks is None:
        return torch.matmul(torch.softmax(scores, dim=-1), v)
    b, h, sq, _ = scores.shape
    sink = sinks.to(scores.dtype).reshape(1, h, 1, 1).expand(b, h, sq, 1)
    logits = torch.cat([scores, sink], dim=-1)
    logits = logits - logits.amax(dim=-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1)[..., :-1]
    return torch.matmul(probs, v)


_LIB.impl("attention", attention_reference, "CompositeExplicitAutograd")


@torch.library.register_fake("kforge::attention", lib=_LIB)
def _attention_fake(q, k, v, mask, sinks, scale, causal=False, window=0):
    return q.new_empty(q.shape[:-1] + (v.shape[-1],))


# Attention over a KV cache plus the step's new keys and values, without their concatenation:
#   attention_kv(q, k, k_new, v, v_new, mask, sinks, scale)
#     = attention(q, cat([k, k_new], -2), cat([v, v_new], -2), mask, sinks, scale)
# where `attention` is SDPA (mask boolean or additive; a row with every key masked gives 0) when
# sinks is None, else kforge.attention above. kforge.frontend.attention_patterns puts it where a
# decoding step appends to its cache only to attend over it (transformers' DynamicCache), so the
# kernel reads the cache where it lies instead of a copy of it.
_LIB.define("attention_kv(Tensor q, Tensor k, Tensor k_new, Tensor v, Tensor v_new, Tensor? mask, "
            "Tensor? sinks, float scale) -> Tensor")


def attention_kv_reference(q, k, k_new, v, v_new, mask, sinks, scale: float):
    keys, values = torch.cat([k, k_new], dim=-2), torch.cat([v, v_new], dim=-2)
    if sinks is not None:
        return attention_reference(q, keys, values, mask, sinks, scale)
    return torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=scale, enable_gqa=keys.shape[1] != q.shape[1])


_LIB.impl("attention_kv", attention_kv_reference, "CompositeExplicitAutograd")


@torch.library.register_fake("kforge::attention_kv", lib=_LIB)
def _attention_kv_fake(q, k, k_new, v, v_new, mask, sinks, scale):
    return q.new_empty(q.shape[:-1] + (v.shape[-1],))


__all__ = ["SDPA_ARGS", "attention_kv_reference", "attention_reference", "band_mask",
           "sdpa_arguments"]
