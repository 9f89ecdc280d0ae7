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

from kforge.attention_op import sdpa_arguments   # (and registers torch.ops.kforge.attention)
from kforge.frontend.attention_patterns import simplify_kv_cache
from kforge.frontend.constant_masks import fold_constant_masks
from test_kv_cache_patterns import calls, traced

REPO = Path(__file__).resolve().parents[2]
aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


def sdpa_params(node):
    return sdpa_arguments(node.args, node.kwargs)


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
    assert done == {"masks_dropped": dropped, "masks_filled": 0,
                    "masks_causal": int(causal), "masks_banded": 0}
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
    assert not any(fold_constant_masks(ep.graph_module).values())


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
    assert fold_constant_masks(gm) == {"masks_dropped": 0, "masks_filled": 0,
                                       "masks_causal": 2, "masks_banded": 0}   # 2 layers
    assert all(sdpa_params(n)["is_causal"] and sdpa_params(n)["attn_mask"] is None
               for n in calls(gm, SDPA))
    assert not calls(gm, aten.cumsum.default) and not calls(gm, aten.index.Tensor)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)


def test_llama_decode_mask_is_one_fill(monkeypatch):
    """One new token against a full cache: every key is allowed. A decoding step keeps a mask
    (without one the strict contract's PyTorch reference changes path and tightens, and
    Qwen2's decode attention then verified no fp32 kernel), but as one `full`, not the
    aranges and comparisons that computed it."""
    model, args = zoo("llama3_8b", "decode", monkeypatch)
    ep = traced(model, args)
    gm = ep.graph_module
    simplify_kv_cache(gm)
    assert calls(gm, aten.le.Tensor)
    assert fold_constant_masks(gm) == {"masks_dropped": 0, "masks_filled": 2, "masks_causal": 0,
                                       "masks_banded": 0}
    for n in calls(gm, torch.ops.kforge.attention_kv.default):
        assert n.args[5].target == aten.full.default and n.args[5].args[1] is True
    assert not calls(gm, aten.le.Tensor)          # (an arange stays: RoPE's positions)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)


def test_gpt_oss_prefill_masks_become_bands(monkeypatch):
    """gpt-oss's eager attention with sinks (kforge.attention): the full layer's mask becomes
    `causal`, the sliding layer's `causal` with its window; the graph computes the same."""
    model, args = zoo("gpt_oss_20b", "prefill", monkeypatch)
    ep = traced(model, args)
    gm = ep.graph_module
    from kforge.frontend.attention_patterns import fuse_written_attention
    fuse_written_attention(gm)
    simplify_kv_cache(gm)
    assert fold_constant_masks(gm) == {"masks_dropped": 0, "masks_filled": 0, "masks_causal": 0,
                                       "masks_banded": 2}
    att = calls(gm, torch.ops.kforge.attention.default)
    window = model.config.sliding_window
    assert sorted(n.args[3:4] + n.args[6:] for n in att) == [(None, True, 0),
                                                             (None, True, window)]
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sq,skv,causal,window", [
    (8, 8, True, 0), (8, 8, True, 3), (3, 8, True, 2), (8, 8, False, 3)])
def test_band_reference_is_the_mask(sq, skv, causal, window):
    """kforge.attention's causal/window give what the same band as a mask gives."""
    from kforge.attention_op import attention_reference, band_mask
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, sq, 16, generator=g)
    k, v = (torch.randn(1, 2, skv, 16, generator=g) for _ in range(2))
    sinks = torch.randn(4, generator=g)
    keep = band_mask(sq, skv, causal, window)
    mask = torch.zeros(sq, skv).masked_fill(~keep, float("-inf"))
    want = attention_reference(q, k, v, mask, sinks, 0.25)
    got = torch.ops.kforge.attention(q, k, v, None, sinks, 0.25, causal, window)
    torch.testing.assert_close(got, want)
    assert not torch.equal(got, attention_reference(q, k, v, None, sinks, 0.25))


def test_band_flops_count_the_band():
    """The floor of a banded region counts only the pairs its kernel computes."""
    from kforge.kernel_fallbacks import attention_flops
    full = attention_flops((1, 2, 4, 8), (1, 2, 4, 8))
    assert full == 2 * 2 * 16 * 16
    assert attention_flops((1, 2, 4, 8), (1, 2, 4, 8), causal=True) == full * 10 // 16
    assert attention_flops((1, 2, 4, 8), (1, 2, 4, 8), causal=True, window=2) == full * 7 // 16
    # bottom-right: 2 queries over 5 keys see 4 and 5 keys
    assert attention_flops((1, 1, 2, 8), (1, 1, 5, 8), causal=True) == 2 * 9 * 16
