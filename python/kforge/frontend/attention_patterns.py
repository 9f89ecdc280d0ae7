"""Attention written out in PyTorch ops, found in the traced graph and made one op.

SDPA reaches the frontend whole (it is kept out of the decomposition). Attention that a model
spells out itself does not — gpt-oss's eager attention with sinks, after decomposition:

    s  = view(bmm(view(expand(q)), view(expand(permute(k, [0, 1, 3, 2])))), [B, H, Sq, Skv])
    l  = cat([add(mul(s, scale), mask), expand(view(sinks, [1, H, 1, 1]))], -1)
    p  = slice(_softmax(sub(l, max.dim(l, -1, True)[0]), -1), -1, 0, Skv)
    o  = view(bmm(view(expand(p)), view(expand(v))), [B, H, Sq, D])

Plain attention spelled out the same way (a transformer block's `softmax(q @ k^T * scale) @ v`,
BERT's or GPT-2's eager attention with an additive mask) is that chain without the `cat` and
the `slice`; the matmuls' decomposition may copy an operand to make it contiguous
(`view(clone(expand(x)))`), and the scale may be a division.

`fuse_written_attention` replaces each `o` by `torch.ops.kforge.attention(q, k, v, mask, sinks,
scale)` (kforge.attention_op; sinks None for plain attention), which becomes a fallback op with
a fused kernel instead of two batched GEMM regions around a softmax region, whose score matrix
([B, H, Sq, Skv]) went through memory three times. The scale, the mask and the max subtraction
are optional; anything else unexpected leaves the graph as it was.
"""
from __future__ import annotations

import math
import operator

import torch

from kforge.attention_op import sdpa_arguments

aten = torch.ops.aten
_RESHAPES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_PASS = _RESHAPES + (aten.expand.default, aten.clone.default)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _through(node, ops=_PASS):
    """Follow views, expands and clones back to the tensor they show."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in ops:
        node = node.args[0]
    return node


def _bmm_operand(node):
    """What a 4-d matmul's decomposition fed to bmm: view(clone(expand(x))) -> x, the clone
    (a contiguous copy) and the expand only where they keep the shape, so that a repeat_kv's
    own expand and clone stay part of the operand."""
    if isinstance(node, torch.fx.Node) and node.target in _RESHAPES:
        node = node.args[0]
    while isinstance(node, torch.fx.Node) and \
            node.target in (aten.expand.default, aten.clone.default) and \
            _shape(node) is not None and _shape(node) == _shape(node.args[0]):
        node = node.args[0]
    return node


def _shape(node):
    v = _val(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _match(softmax: torch.fx.Node):
    """The pieces of one attention ending at `softmax` (with sinks, or plain), or None."""
    if softmax.args[1] not in (-1, 3) or (len(softmax.args) > 2 and softmax.args[2]):
        return None
    logits = softmax.args[0]
    if logits.target == aten.sub.Tensor:          # the explicit max subtraction
        centre = logits.args[1]
        if not (isinstance(centre, torch.fx.Node) and centre.target is operator.getitem and
                centre.args[0].target == aten.max.dim):
            return None
        logits = logits.args[0]
        if centre.args[0].args[0] is not logits:
            return None
    if logits.target == aten.cat.default:          # sinks: one more logit column per head
        if logits.args[1] not in (-1, 3) or len(logits.args[0]) != 2:
            return None
        scores, sink = logits.args[0]
        sinks = _through(sink)
        if _shape(sinks) is None or len(_shape(sinks)) != 1:
            return None
    else:
        scores, sinks = logits, None
    mask = None
    if scores.target == aten.add.Tensor:
        scores, mask = scores.args
        if not isinstance(mask, torch.fx.Node):
            return None
    scale = 1.0
    if scores.target == aten.mul.Tensor and isinstance(scores.args[1], (int, float)):
        scores, scale = scores.args[0], float(scores.args[1])
    elif scores.target == aten.div.Tensor and isinstance(scores.args[1], (int, float)) and \
            scores.args[1] != 0:
        scores, scale = scores.args[0], 1.0 / float(scores.args[1])
    qk = _through(scores, _RESHAPES)
    if qk.target != aten.bmm.default:
        return None
    q = _bmm_operand(qk.args[0])
    kt = _bmm_operand(qk.args[1])
    if kt.target != aten.permute.default or list(kt.args[1]) != [0, 1, 3, 2]:
        return None
    k = kt.args[0]
    qs, ks = _shape(q), _shape(k)
    if qs is None or ks is None or len(qs) != 4 or len(ks) != 4:
        return None
    b, h, sq, d = qs
    skv = ks[2]
    if ks != (b, h, skv, d):
        return None
    node = softmax
    if sinks is not None:          # the sink column sliced off the probabilities
        users = list(softmax.users)
        if len(users) != 1 or users[0].target != aten.slice.Tensor:
            return None
        node = users[0]
        if tuple(node.args[1:4]) not in ((-1, 0, skv), (3, 0, skv), (-1, 0, -1), (3, 0, -1)):
            return None
        if _shape(sinks) != (h,):
            return None
    elif _shape(softmax) != (b, h, sq, skv):
        return None
    # the product with v, through the views of the probabilities
    chain = [node]
    while True:
        nxt = list(node.users)
        if len(nxt) != 1:
            nxt = [u for u in nxt if u.target != aten._assert_tensor_metadata.default]
            if len(nxt) != 1:
                return None
        node = nxt[0]
        chain.append(node)
        if node.target == aten.bmm.default:
            break
        if node.target not in _PASS:
            return None
    pv = node
    v = _bmm_operand(pv.args[1])
    vs = _shape(v)
    if vs is None or vs[:3] != (b, h, skv):
        return None
    outs = [u for u in pv.users if u.target in _RESHAPES]
    if len(outs) != 1 or len(pv.users) != 1 or _shape(outs[0]) != (b, h, sq, vs[3]):
        return None
    if mask is not None:
        ms = _shape(mask)
        if ms is None or len(ms) != 4 or any(m not in (1, full) for m, full in
                                             zip(ms, (b, h, sq, skv))):
            return None
    return {"q": q, "k": k, "v": v, "mask": mask, "sinks": sinks, "scale": scale,
            "out": outs[0], "chain": chain}


def fuse_written_attention(graph_module) -> int:
    """Replaces each attention spelled out in the graph (with sinks, or plain) by one
    kforge.attention op; returns how many."""
    import kforge.attention_op  # noqa: F401 - registers torch.ops.kforge.attention
    graph = graph_module.graph
    found = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten._softmax.default:
            continue
        m = _match(node)
        if m is None:
            continue
        out = m["out"]
        with graph.inserting_before(out):
            fused = graph.call_function(torch.ops.kforge.attention.default,
                                        (m["q"], m["k"], m["v"], m["mask"], m["sinks"],
                                         m["scale"]))
        fused.meta.update(out.meta)
        out.replace_all_uses_with(fused)
        for dead in m["chain"]:        # metadata asserts would keep the replaced ops alive
            for user in list(dead.users):
                if user.target == aten._assert_tensor_metadata.default:
                    graph.erase_node(user)
        found += 1
    if found:
        graph.eliminate_dead_code()
        graph_module.recompile()
    return found


# -- KV caches --------------------------------------------------------------------------------
# transformers' decoding path, traced, copies the whole cache several times per layer and step:
#   k = cat([cat([clone(empty), k_past], -2), k_new], -2)        # DynamicCache: lazy init, update
#   k = view(clone(expand(unsqueeze(k, 2), [B, Hkv, R, S, D])), [B, Hkv * R, S, D])  # repeat_kv
#   o = sdpa(q, k, v, ...)
# The first cat copies k_past to append it to nothing; repeat_kv writes R copies of the cache for
# an attention that can read each kv head for its R query heads (enable_gqa; the kernel's
# gqa_group, pack_gqa). `simplify_kv_cache` removes both: cat operands without elements are
# dropped (a cat left with one operand is that operand), and a repeat_kv feeding attention is
# undone (SDPA gets enable_gqa=True; kforge.attention reads kv head h // R for query head h).
# Then an attention whose keys and values are cat([cache, new], -2), read by nothing else,
# becomes kforge.attention_kv(q, k_cache, k_new, v_cache, v_new, ...): the kernel reads the
# cache in place rather than a copy with the new token appended.

_ATTENTION = (aten.scaled_dot_product_attention.default,)


def _numel(node) -> int | None:
    shape = _shape(node)
    return None if shape is None else math.prod(int(d) for d in shape)


def _drop_empty_cat_operands(graph) -> int:
    changed = 0
    outputs: set = set()       # a graph output stays a tensor of its own
    for n in graph.nodes:
        if n.op == "output":
            torch.fx.node.map_arg(n.args, outputs.add)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.cat.default or node in outputs:
            continue
        parts = list(node.args[0])
        kept = [x for x in parts if _numel(x) != 0]
        if len(kept) == len(parts) or not kept:
            continue
        if len(kept) == 1 and _shape(kept[0]) == _shape(node) and \
                getattr(_val(kept[0]), "dtype", None) == getattr(_val(node), "dtype", None):
            node.replace_all_uses_with(kept[0])
        else:
            node.args = (kept,) + tuple(node.args[1:])
        changed += 1
    return changed


def _repeat_kv_source(node):
    """x and R where `node` is view(clone(expand(unsqueeze(x, 2), [B, Hkv, R, S, D])),
    [B, Hkv * R, S, D]) (repeat_kv after decomposition), else None."""
    if not (isinstance(node, torch.fx.Node) and node.target in _RESHAPES):
        return None
    inner = node.args[0]
    if isinstance(inner, torch.fx.Node) and inner.target == aten.clone.default:
        inner = inner.args[0]
    if not (isinstance(inner, torch.fx.Node) and inner.target == aten.expand.default):
        return None
    unsq = inner.args[0]
    if not (isinstance(unsq, torch.fx.Node) and unsq.target == aten.unsqueeze.default and
            unsq.args[1] in (2, -3)):
        return None
    x = unsq.args[0]
    xs, es, out = _shape(x), _shape(inner), _shape(node)
    if xs is None or es is None or out is None or len(xs) != 4 or len(es) != 5:
        return None
    b, hkv, s, d = xs
    r = es[2]
    if es != (b, hkv, r, s, d) or out != (b, hkv * r, s, d) or r < 2:
        return None
    return x, r


def _fold_repeat_kv(graph) -> int:
    folded = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _ATTENTION:
            kind = "sdpa"
        elif node.target == torch.ops.kforge.attention.default:
            kind = "kforge"
        else:
            continue
        if len(node.args) < 3:
            continue
        rk, rv = _repeat_kv_source(node.args[1]), _repeat_kv_source(node.args[2])
        if rk is None or rv is None or rk[1] != rv[1]:
            continue
        if kind == "sdpa" and (node.kwargs.get("enable_gqa") or len(node.args) > 7):
            continue
        node.args = (node.args[0], rk[0], rv[0]) + tuple(node.args[3:])
        if kind == "sdpa":
            node.kwargs = {**node.kwargs, "enable_gqa": True}
        folded += 1
    return folded


def _appended(node):
    """(cache, new) where `node` is cat([cache, new], -2) of 4-d tensors, else None (whether
    anything but the attention reads it is the caller's question)."""
    if not (isinstance(node, torch.fx.Node) and node.target == aten.cat.default):
        return None
    parts = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    shape = _shape(node)
    if len(parts) != 2 or shape is None or len(shape) != 4 or dim not in (2, -2):
        return None
    if any(_shape(x) is None or len(_shape(x)) != 4 for x in parts):
        return None
    return tuple(parts)


def _fuse_kv_append(graph) -> int:
    """attention(q, cat([k, k_new]), cat([v, v_new]), ...) -> kforge.attention_kv when the cats
    feed nothing else: SDPA without dropout or is_causal, and kforge.attention."""
    fused = 0
    kforge_attention = torch.ops.kforge.attention.default
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _ATTENTION + (kforge_attention,):
            continue
        k, v = node.args[1], node.args[2]
        ka, va = _appended(k), _appended(v)
        if ka is None or va is None or len(k.users) != 1 or len(v.users) != 1 or k is v:
            continue
        if node.target == kforge_attention:
            q, _, _, mask, sinks, scale = node.args
        else:
            params = sdpa_arguments(node.args, node.kwargs)
            if params["dropout_p"] or params["is_causal"]:
                continue
            q, mask, sinks = node.args[0], params["attn_mask"], None
            scale = params["scale"]
            if scale is None:
                scale = _shape(q)[-1] ** -0.5
            qs, ks = _shape(q), _shape(k)
            if ks[1] != qs[1] and not params["enable_gqa"]:
                continue
        with graph.inserting_before(node):
            new = graph.call_function(torch.ops.kforge.attention_kv.default,
                                      (q, ka[0], ka[1], va[0], va[1], mask, sinks, float(scale)))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        fused += 1
    return fused


def simplify_kv_cache(graph_module) -> dict:
    """The rewrites above on a decomposed graph; returns how many of each were made."""
    import kforge.attention_op  # noqa: F401 - registers torch.ops.kforge.attention
    graph = graph_module.graph
    done = {"empty_cat_operands": _drop_empty_cat_operands(graph),
            "repeat_kv_folded": _fold_repeat_kv(graph)}
    _drop_orphan_asserts(graph)         # the undone copies go: their cats have one user left
    done["kv_append_fused"] = _fuse_kv_append(graph)
    _drop_orphan_asserts(graph)
    graph_module.recompile()
    return done


def _drop_orphan_asserts(graph) -> None:
    """Dead code goes, and with it the metadata asserts on tensors nothing else uses any more,
    which would keep their computation alive (dead-code elimination keeps side effects):
    repeatedly, up the chains. Dead code first, so that an assert whose tensor's last other
    user was itself dead goes too."""
    while True:
        graph.eliminate_dead_code()
        dead = [n for n in graph.nodes
                if n.op == "call_function" and n.target == aten._assert_tensor_metadata.default
                and isinstance(n.args[0], torch.fx.Node)
                and all(u.target == aten._assert_tensor_metadata.default
                        for u in n.args[0].users)]
        if not dead:
            return
        for n in dead:
            graph.erase_node(n)


__all__ = ["fuse_written_attention", "simplify_kv_cache"]
