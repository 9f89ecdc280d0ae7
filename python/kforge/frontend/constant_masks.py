"""Attention masks that are constants of the traced shapes, folded into the attention op.

transformers builds its attention mask inside `forward` (`create_causal_mask`): with no padding
mask among the inputs and static shapes, it depends on nothing the caller passes, only on
`arange`s of the traced sequence lengths. Traced, it is a chain of index arithmetic, `cumsum`
and gathers (fallback ops) that computes, on every call, a [B, 1, Sq, Skv] boolean tensor that
the attention kernel then reads tile by tile. Its value is known at compile time, and in the
common cases it says something the kernel can do without reading it:

* every key allowed: the mask goes; under `kforge.attention_kv` (a decoding step) it becomes
  one `full` of its shape and value instead, because without a mask PyTorch's reference takes
  another, more accurate path, and the strict contract, judged against PyTorch's own error,
  then rejected every fp32 kernel on one element of Qwen2's decode (the mask, [B, 1, 1, Skv],
  is a read of no consequence; what it cost was the chain that computed it);
* SDPA over a square score matrix with exactly the causal pattern (key j allowed for query i
  iff j <= i, for every batch row and head): the mask goes and the op gets `is_causal=True`,
  so the kernel skips the blocks above the diagonal instead of computing and masking them;
* `kforge.attention` (attention written out, gpt-oss's with sinks) under a causal mask, with or
  without a sliding window (key j allowed iff i + Skv - Sq - W < j <= i + Skv - Sq): the mask
  goes and the op gets `causal=True` and `window=W`, so the kernel visits only the band's
  blocks (a 128-key window over 2048 tokens: about a tenth of them).

`fold_constant_masks` evaluates each attention mask that no user input, parameter or buffer
reaches (its ancestors are constants of the graph: `arange`, `full`, literals; nothing
random), on the CPU, with static shapes of at most MAX_ELEMENTS elements per value, and
rewrites the op when the value is one of the cases above. Anything else (a padding mask among
the inputs, a dynamic batch, a window under SDPA, an additive bias that is not 0/-inf) leaves
the graph as it was. The chain that computed the mask is then dead and goes with it.
"""
from __future__ import annotations

import torch

from kforge.attention_op import SDPA_ARGS, band_mask, sdpa_arguments

aten = torch.ops.aten

# largest value (in elements) evaluated while folding a mask: Llama-3-8B's prefill mask at
# batch 8 x 2048 tokens is 33.5M booleans
MAX_ELEMENTS = 1 << 27


def _attention_mask(node) -> tuple[str, object] | None:
    """(kind, mask node) of an attention op: kind "sdpa", "kforge" or "kforge_kv"."""
    if node.op != "call_function":
        return None
    if node.target == aten.scaled_dot_product_attention.default:
        if len(node.args) > 3:
            return "sdpa", node.args[3]
        return "sdpa", node.kwargs.get("attn_mask")
    kforge = getattr(torch.ops, "kforge", None)
    if kforge is None:
        return None
    if node.target == kforge.attention.default and len(node.args) == 6 and not node.kwargs:
        return "kforge", node.args[3]
    if node.target == kforge.attention_kv.default and len(node.args) == 8:
        return "kforge_kv", node.args[5]
    return None


def _static_numel(node) -> int | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 1 if isinstance(val, (int, float, bool)) or val is None else None
    try:
        return int(torch.Size(val.shape).numel())
    except (TypeError, ValueError):     # symbolic sizes
        return None


def _constant_value(mask) -> torch.Tensor | None:
    """The mask's value when only constants reach it, else None."""
    needed: set = set()
    stack = [mask]
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            return None                  # placeholders (inputs, weights, buffers), get_attr, ...
        if torch.Tag.nondeterministic_seeded in node.target.tags:
            return None
        numel = _static_numel(node)
        if numel is None or numel > MAX_ELEMENTS:
            return None
        needed.add(node)
        stack.extend(node.all_input_nodes)
    env: dict = {}
    try:
        for node in mask.graph.nodes:
            if node not in needed:
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
            if "device" in kwargs:
                kwargs = {**kwargs, "device": torch.device("cpu")}
            env[node] = node.target(*args, **kwargs)
    except Exception:                    # noqa: BLE001 - not evaluable here: leave the mask be
        return None
    value = env[mask]
    return value if isinstance(value, torch.Tensor) else None


def _allowed(value: torch.Tensor) -> torch.Tensor | None:
    """Which keys the mask lets through (bool), or None for an additive bias other than 0/-inf
    (a value the op adds to the scores rather than a choice of keys)."""
    if value.dtype == torch.bool:
        return value
    if not value.is_floating_point():
        return None
    blocked = value <= torch.finfo(value.dtype).min / 2       # -inf and finfo.min alike
    if not bool(((value == 0) | blocked).all()):
        return None
    return ~blocked


def fold_constant_masks(graph_module) -> dict:
    """Rewrites the attention ops of a decomposed graph whose masks are constants (above);
    returns how many masks were dropped, filled, became `is_causal`, or a causal band."""
    graph = graph_module.graph
    done = {"masks_dropped": 0, "masks_filled": 0, "masks_causal": 0, "masks_banded": 0}
    cache: dict = {}
    fills: dict = {}
    for node in list(graph.nodes):
        found = _attention_mask(node)
        if found is None or not isinstance(found[1], torch.fx.Node):
            continue
        kind, mask = found
        if mask not in cache:
            value = _constant_value(mask)
            cache[mask] = None if value is None else _allowed(value)
        allowed = cache[mask]
        if allowed is None or allowed.dim() > 4:
            continue
        if bool(allowed.all()):
            if kind == "kforge_kv":
                if mask not in fills:
                    fills[mask] = _full_like(graph, mask)
                _set_mask(node, kind, fills[mask], causal=False)
                done["masks_filled"] += 1
            else:
                _set_mask(node, kind, None, causal=False)
                done["masks_dropped"] += 1
            continue
        if kind == "kforge_kv":
            continue
        q, k = (node.args[0].meta.get("val"), node.args[1].meta.get("val"))
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
            continue
        sq, skv = q.shape[-2], k.shape[-2]
        if allowed.shape[-2:] != (sq, skv):
            continue
        if kind == "sdpa":
            # torch's is_causal is top-left aligned: the same band only when Sq == Skv
            if sq == skv and _sdpa_plain(node) and \
                    bool((allowed == band_mask(sq, skv, True, 0)).all()):
                _set_mask(node, kind, None, causal=True)
                done["masks_causal"] += 1
            continue
        window = _band_window(allowed, sq, skv)
        if window is not None:
            node.args = node.args[:3] + (None,) + node.args[4:6] + (True, window)
            done["masks_banded"] += 1
    if any(done.values()):
        from kforge.frontend.attention_patterns import _drop_orphan_asserts
        _drop_orphan_asserts(graph)     # the chains that computed the masks, with their asserts
        graph_module.recompile()
    return done


def _full_like(graph, mask):
    """A `full` node of the mask's shape and dtype holding "every key allowed": True, or 0.0
    for an additive mask."""
    val = mask.meta["val"]
    fill = True if val.dtype == torch.bool else 0.0
    with graph.inserting_before(mask):
        node = graph.call_function(aten.full.default, (list(val.shape), fill),
                                   {"dtype": val.dtype, "device": torch.device("cpu"),
                                    "pin_memory": False})
    node.meta.update(mask.meta)
    return node


def _band_window(allowed: torch.Tensor, sq: int, skv: int) -> int | None:
    """W when `allowed` is kforge.attention's causal band with window W (0: no window) for every
    batch row and head, else None."""
    causal = band_mask(sq, skv, True, 0)
    if bool((allowed == causal).all()):
        return 0
    # the window is how many keys the last query sees; the band must then match exactly
    window = int(allowed.reshape(-1, sq, skv)[0, -1].sum())
    if window < 1 or window >= skv:
        return None
    return window if bool((allowed == band_mask(sq, skv, True, window)).all()) else None


def _sdpa_plain(node) -> bool:
    """SDPA without dropout and not already causal (the mask would then come on top)."""
    params = sdpa_arguments(node.args, node.kwargs)
    return not params["dropout_p"] and not params["is_causal"]


def _set_mask(node, kind: str, mask, causal: bool) -> None:
    if kind == "kforge":
        node.args = node.args[:3] + (mask,) + node.args[4:]
    elif kind == "kforge_kv":
        node.args = node.args[:5] + (mask,) + node.args[6:]
    else:
        params = {**dict(zip(SDPA_ARGS, node.args)), **node.kwargs}   # as given, no defaults
        params["attn_mask"] = mask
        if causal:
            params["is_causal"] = True
        node.args = tuple(params.pop(name) for name in list(SDPA_ARGS)[:3])
        node.kwargs = params


__all__ = ["fold_constant_masks", "MAX_ELEMENTS"]
