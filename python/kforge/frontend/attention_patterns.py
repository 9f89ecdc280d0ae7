"""Attention written out in PyTorch ops, found in the traced graph and made one op.

SDPA reaches the frontend whole (it is kept out of the decomposition). Attention that a model
spells out itself does not — gpt-oss's eager attention with sinks, after decomposition:

    s  = view(bmm(view(expand(q)), view(expand(permute(k, [0, 1, 3, 2])))), [B, H, Sq, Skv])
    l  = cat([add(mul(s, scale), mask), expand(view(sinks, [1, H, 1, 1]))], -1)
    p  = slice(_softmax(sub(l, max.dim(l, -1, True)[0]), -1), -1, 0, Skv)
    o  = view(bmm(view(expand(p)), view(expand(v))), [B, H, Sq, D])

`fuse_sink_attention` replaces each `o` by `torch.ops.kforge.attention(q, k, v, mask, sinks,
scale)` (kforge.attention_op), which becomes a fallback op with a fused kernel. The scale, the
mask and the max subtraction are optional; anything else unexpected leaves the graph as it was.
"""
from __future__ import annotations

import operator

import torch

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
    """What a 4-d matmul's decomposition fed to bmm: view(expand(x)) -> x (nothing further, so a
    repeat_kv's own expand and clone stay part of the operand)."""
    if isinstance(node, torch.fx.Node) and node.target in _RESHAPES:
        node = node.args[0]
    if isinstance(node, torch.fx.Node) and node.target == aten.expand.default:
        node = node.args[0]
    return node


def _shape(node):
    v = _val(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _match(softmax: torch.fx.Node):
    """The pieces of one sink attention ending at `softmax`, or None."""
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
    if logits.target != aten.cat.default or logits.args[1] not in (-1, 3) or \
            len(logits.args[0]) != 2:
        return None
    scores, sink = logits.args[0]
    sinks = _through(sink)
    if _shape(sinks) is None or len(_shape(sinks)) != 1:
        return None
    mask = None
    if scores.target == aten.add.Tensor:
        scores, mask = scores.args
        if not isinstance(mask, torch.fx.Node):
            return None
    scale = 1.0
    if scores.target == aten.mul.Tensor and isinstance(scores.args[1], (int, float)):
        scores, scale = scores.args[0], float(scores.args[1])
    qk = _through(scores, _RESHAPES)
    if qk.target != aten.bmm.default:
        return None
    q = _bmm_operand(qk.args[0])
    kt = _bmm_operand(qk.args[1])
    if kt.target != aten.permute.default or list(kt.args[1]) != [0, 1, 3, 2]:
        return None
    k = kt.args[0]
    users = list(softmax.users)
    if len(users) != 1 or users[0].target != aten.slice.Tensor:
        return None
    sliced = users[0]
    qs, ks = _shape(q), _shape(k)
    if qs is None or ks is None or len(qs) != 4 or len(ks) != 4:
        return None
    b, h, sq, d = qs
    skv = ks[2]
    if tuple(sliced.args[1:4]) not in ((-1, 0, skv), (3, 0, skv), (-1, 0, -1), (3, 0, -1)):
        return None
    if _shape(sinks) != (h,) or ks != (b, h, skv, d):
        return None
    # the product with v, through the views of the probabilities
    node = sliced
    chain = [sliced]
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


def fuse_sink_attention(graph_module) -> int:
    """Replaces each sink attention of the graph by one kforge.attention op; returns how many."""
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


__all__ = ["fuse_sink_attention"]
