"""Attention masks that only constants reach are folded into the op
(kforge.frontend.constant_masks): a causal mask makes SDPA `is_causal`, an all-true mask goes,
anything else stays; the graph computes the same. Real transformers models (the zoo's Llama
at its small size, prefill and decode) and hand-written masks."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kforge.attention_op  # noqa: F401 - registers torch.ops.kforge.attention
from kforge.frontend.attention_patterns import simplify_kv_cache
from kforge.frontend.constant_masks import fold_constant_masks

REPO = Path(__file__).resolve().parents[2]
aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


def traced(model, inputs):
    from kforge.frontend.importer import _decompositions, _views_to_reshapes
    ep = torch.export.export(model, tuple(inputs), strict=False)
    _views_to_reshapes(ep.graph_module)
    return ep.run_decompositions(_decompositions())


def calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def sdpa_params(node):
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    return {"attn_mask": None, "is_causal": False, **dict(zip(names, node.args)), **node.kwargs}


class Masked(torch.nn.Module):
    """SDPA under a mask built in forward from aranges (as transformers does), or from an
    input (`padding`), additive or boolean."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v, padding):
        s = q.shape[2]
        i = torch.arange(s, device=q.device)
        if self.kind == "causal":
            mask = (i[None, :] <= i[:, None])[None, None].expand(q.shape[0], 1, s, s)
        elif self.kind == "additive_causal":
            mask = torch.zeros(s, s).masked_fill(i[None, :] > i[:, None], float("-inf"))
        elif self.kind == "all":
            mask = torch.ones(q.shape[0], 1, s, s, dtype=torch.bool)
        elif self.kind == "window":
            mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 3)
        elif self.kind == "bias":
            mask = (i[None, :] - i[:, None]).float() * 0.1
        else:                                           # the caller's padding mask
            mask = (i[None, :] <= i[:, None]) & padding[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=g) for _ in range(3))
    padding = torch.ones(2, 8, dtype=torch.bool)
    padding[1, 6:] = False
    return [q, k, v, padding]


@pytest.mark.parametrize("kind,causal,dropped", [
    ("causal", True, 0), ("additive_causal", True, 0), ("all", False, 1),
    ("window", False, 0), ("bias", False, 0), ("padding", False, 0)])
def test_hand_written_masks(kind, causal, dropped):
    model, args = Masked(kind), inputs()
    ep = traced(model, args)
    gm = ep.graph_module
    done = fold_constant_masks(gm)
    assert done == {"masks_dropped": dropped, "masks_causal": int(causal)}
    (att,) = calls(gm, SDPA)
    params = sdpa_params(att)
    assert params["is_causal"] is causal
    assert (params["attn_mask"] is None) == (causal or bool(dropped))
    if causal or dropped:
        # the chain that computed the mask is gone with it
        assert not calls(gm, aten.arange.start_step) and not calls(gm, aten.arange.default)
    torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)


def test_dynamic_batch_mask_stays():
    """A mask whose shape follows a symbolic batch is not evaluated."""
    model, args = Masked("causal"), inputs()
    batch = torch.export.Dim("batch", min=2)
    ep = torch.export.export(model, tuple(args), strict=False,
                             dynamic_shapes=({0: batch}, {0: batch}, {0: batch}, {0: batch}))
    from kforge.frontend.importer import _decompositions
    ep = ep.run_decompositions(_decompositions())
    assert fold_constant_masks(ep.graph_module) == {"masks_dropped": 0, "masks_causal": 0}


def zoo(name, phase, monkeypatch):
    monkeypatch.setenv("KFORGE_LLM_PHASE", phase)
    monkeypatch.setenv("KFORGE_ZOO_SIZE", "small")
    path = REPO / "benchmarks" / "models" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"zoo_{name}_{phase}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    return mod.Model().eval(), mod.get_inputs()


def test_llama_prefill_mask_becomes_causal(monkeypatch):
    model, args = zoo("llama3_8b", "prefill", monkeypatch)
    ep = traced(model, args)
    gm = ep.graph_module
    simplify_kv_cache(gm)
    # transformers' mask: index arithmetic, a cumsum and four gathers per call
    assert calls(gm, aten.cumsum.default) and calls(gm, aten.index.Tensor)
    assert fold_constant_masks(gm) == {"masks_dropped": 0, "masks_causal": 2}    # 2 layers
    assert all(sdpa_params(n)["is_causal"] and sdpa_params(n)["attn_mask"] is None
               for n in calls(gm, SDPA))
    assert not calls(gm, aten.cumsum.default) and not calls(gm, aten.index.Tensor)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)


def test_llama_decode_mask_goes(monkeypatch):
    """One new token against a full cache: every key allowed, so the mask goes."""
    model, args = zoo("llama3_8b", "decode", monkeypatch)
    ep = traced(model, args)
    gm = ep.graph_module
    simplify_kv_cache(gm)
    assert fold_constant_masks(gm) == {"masks_dropped": 2, "masks_causal": 0}
    assert all(n.args[5] is None for n in calls(gm, torch.ops.kforge.attention_kv.default))
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)
