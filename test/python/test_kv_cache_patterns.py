"""KV-cache decoding as transformers traces it copies the cache several times per layer and
step (a cat onto an empty tensor, repeat_kv's expanded copy); kforge.frontend.attention_patterns
.simplify_kv_cache removes those copies and the graph computes the same. Real transformers
models (the zoo's LLM files at their small size) and a hand-written sink attention."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import kforge.attention_op  # noqa: F401 - registers torch.ops.kforge.attention
from kforge.frontend.attention_patterns import fuse_written_attention, simplify_kv_cache

REPO = Path(__file__).resolve().parents[2]
aten = torch.ops.aten


def traced(model, inputs):
    from kforge.frontend.importer import _decompositions, _views_to_reshapes
    ep = torch.export.export(model, tuple(inputs), strict=False)
    _views_to_reshapes(ep.graph_module)
    return ep.run_decompositions(_decompositions())


def calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def zoo(name, monkeypatch):
    monkeypatch.setenv("KFORGE_LLM_PHASE", "decode")
    monkeypatch.delenv("KFORGE_ZOO_SIZE", raising=False)
    spec = importlib.util.spec_from_file_location(f"zoo_{name}", REPO / "benchmarks" / "models" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    return mod.Model().eval(), mod.get_inputs()


def test_llama_decode_reads_its_cache_once(monkeypatch):
    model, inputs = zoo("llama3_8b", monkeypatch)
    ep = traced(model, inputs)
    gm = ep.graph_module
    before = len(calls(gm, aten.cat.default))
    done = simplify_kv_cache(gm)
    # per layer (2): the key and the value cache appended to an empty tensor, repeat_kv, and
    # the step's key and value appended to the cache for the attention
    assert done == {"empty_cat_operands": 4, "repeat_kv_folded": 2, "kv_append_fused": 2}
    assert len(calls(gm, aten.cat.default)) == before - 8    # 2 layers x (2 + 2)
    assert not calls(gm, aten.scaled_dot_product_attention.default)
    for att in calls(gm, torch.ops.kforge.attention_kv.default):
        q, k, k_new = (a.meta["val"] for a in att.args[:3])
        assert att.args[1].op == "placeholder"              # the cache input itself
        assert tuple(q.shape) == (4, 4, 1, 16) and tuple(k.shape) == (4, 2, 24, 16)
        assert tuple(k_new.shape) == (4, 2, 1, 16) and att.args[5] is not None   # the mask
    assert not calls(gm, aten.expand.default) or all(
        len(n.meta["val"].shape) != 5 for n in calls(gm, aten.expand.default))
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)


def test_gpt_oss_sink_attention_takes_the_kv_heads(monkeypatch):
    model, inputs = zoo("gpt_oss_20b", monkeypatch)
    ep = traced(model, inputs)
    gm = ep.graph_module
    assert fuse_written_attention(gm) == 2
    done = simplify_kv_cache(gm)
    assert done == {"empty_cat_operands": 4, "repeat_kv_folded": 2, "kv_append_fused": 2}
    assert not calls(gm, torch.ops.kforge.attention.default)
    for att in calls(gm, torch.ops.kforge.attention_kv.default):
        q, k = att.args[0].meta["val"], att.args[1].meta["val"]
        assert q.shape[1] == 4 and k.shape[1] == 2        # 4 query heads read 2 kv heads
        assert att.args[6] is not None                    # the sinks
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)


def test_a_cache_read_by_more_than_the_attention_stays_appended():
    """The updated cache is also returned (as a generation loop would keep it): the cat stays,
    the attention reads it."""
    class Step(torch.nn.Module):
        def forward(self, q, k, k_new, v, v_new):
            keys, values = torch.cat([k, k_new], -2), torch.cat([v, v_new], -2)
            out = torch.nn.functional.scaled_dot_product_attention(q, keys, values)
            return out, keys

    torch.manual_seed(2)
    args = (torch.randn(2, 4, 1, 16), torch.randn(2, 4, 7, 16), torch.randn(2, 4, 1, 16),
            torch.randn(2, 4, 7, 16), torch.randn(2, 4, 1, 16))
    ep = traced(Step(), args)
    assert simplify_kv_cache(ep.graph_module)["kv_append_fused"] == 0


def test_kv_append_reference_is_attention_over_the_concatenation():
    torch.manual_seed(4)
    q = torch.randn(2, 4, 3, 16, dtype=torch.float64)
    k, kn = torch.randn(2, 2, 9, 16, dtype=torch.float64), torch.randn(2, 2, 3, 16, dtype=torch.float64)
    v, vn = torch.randn(2, 2, 9, 16, dtype=torch.float64), torch.randn(2, 2, 3, 16, dtype=torch.float64)
    mask = torch.rand(2, 1, 3, 12) > 0.3
    got = torch.ops.kforge.attention_kv(q, k, kn, v, vn, mask, None, 0.3)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, torch.cat([k, kn], -2), torch.cat([v, vn], -2), attn_mask=mask, scale=0.3,
        enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    add = torch.randn(2, 1, 3, 12, dtype=torch.float64)
    sinks = torch.randn(4, dtype=torch.float64)
    got = torch.ops.kforge.attention_kv(q, k, kn, v, vn, add, sinks, 0.3)
    want = torch.ops.kforge.attention(q, torch.cat([k, kn], -2), torch.cat([v, vn], -2), add,
                                      sinks, 0.3)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_grouped_query_reference_is_the_repeated_one():
    torch.manual_seed(1)
    q = torch.randn(2, 6, 5, 16, dtype=torch.float64)
    k, v = torch.randn(2, 3, 7, 16, dtype=torch.float64), torch.randn(2, 3, 7, 16, dtype=torch.float64)
    mask = torch.randn(2, 1, 5, 7, dtype=torch.float64)
    sinks = torch.randn(6, dtype=torch.float64)
    got = torch.ops.kforge.attention(q, k, v, mask, sinks, 0.25)
    want = torch.ops.kforge.attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                      mask, sinks, 0.25)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_what_is_not_a_cache_copy_is_left_alone():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("empty", torch.zeros(0))

        def forward(self, x, y):
            a = torch.cat([self.empty, x], dim=0)          # a graph output: a tensor of its own
            b = torch.cat([x, y], dim=-1)                  # nothing empty
            # a repeat that feeds a matmul, not attention
            r = y[:, :, None].expand(-1, -1, 2, -1, -1).reshape(2, 4, 3, 5)
            return a, b, r @ r.transpose(-1, -2)

    x, y = torch.randn(2, 2, 3, 5), torch.randn(2, 2, 3, 5)
    model = Model()
    ep = traced(model, (x, y))
    assert simplify_kv_cache(ep.graph_module) == {"empty_cat_operands": 0, "repeat_kv_folded": 0,
                                                  "kv_append_fused": 0}
    for got, want in zip(ep.module()(x, y), model(x, y)):
        torch.testing.assert_close(got, want)
