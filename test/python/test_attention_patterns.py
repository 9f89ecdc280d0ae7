"""Attention spelled out in PyTorch ops (gpt-oss's eager attention with sinks) is found in the
traced graph and becomes one torch.ops.kforge.attention op; near misses are left alone."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import kforge.attention_op  # noqa: F401 - registers torch.ops.kforge.attention
from kforge.frontend.attention_patterns import fuse_written_attention


class SinkAttention(nn.Module):
    """The eager attention of gpt-oss, written here: GQA by repeat, additive mask, sinks."""

    def __init__(self, heads=4, kv_heads=2, dim=16, subtract_max=True):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim
        self.sinks = nn.Parameter(torch.randn(heads))
        self.subtract_max = subtract_max

    def forward(self, q, k, v, mask):
        group = self.heads // self.kv_heads
        k = k[:, :, None].expand(-1, -1, group, -1, -1).reshape(k.shape[0], self.heads,
                                                                 k.shape[2], self.dim)
        v = v[:, :, None].expand(-1, -1, group, -1, -1).reshape(v.shape[0], self.heads,
                                                                 v.shape[2], self.dim)
        w = torch.matmul(q, k.transpose(2, 3)) * self.dim ** -0.5 + mask
        sinks = self.sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)
        logits = torch.cat([w, sinks], dim=-1)
        if self.subtract_max:
            logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = torch.softmax(logits, dim=-1)[..., :-1]
        return torch.matmul(probs, v)


def traced(model, inputs):
    from kforge.frontend.importer import _decompositions, _views_to_reshapes
    ep = torch.export.export(model, inputs, strict=False)
    _views_to_reshapes(ep.graph_module)
    return ep.run_decompositions(_decompositions())


def inputs():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 8, 16)
    k, v = torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    mask = torch.where(torch.rand(2, 1, 8, 8) > 0.2, 0.0, torch.finfo(torch.float32).min)
    return q, k, v, mask


def ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_sink_attention_becomes_one_op_and_computes_the_same():
    for subtract_max in (True, False):
        model = SinkAttention(subtract_max=subtract_max).eval()
        args = inputs()
        ep = traced(model, args)
        assert fuse_written_attention(ep.graph_module) == 1
        found = ops(ep.graph_module)
        assert torch.ops.kforge.attention.default in found
        assert torch.ops.aten._softmax.default not in found and \
            torch.ops.aten.bmm.default not in found
        with torch.no_grad():
            torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)


def test_softmax_over_another_concatenation_is_left_alone():
    class NotAttention(nn.Module):
        def forward(self, x, y):
            return torch.softmax(torch.cat([x, y], dim=-1), dim=-1)[..., :-1] @ x.transpose(-1, -2)

    ep = traced(NotAttention(), (torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 1)))
    assert fuse_written_attention(ep.graph_module) == 0


def test_op_reference_matches_the_kernel_reference():
    from kforge.kernels.attention import reference_attention
    q, k, v, mask = (t.double() for t in inputs())
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    sinks = torch.randn(4, dtype=torch.float64)
    got = torch.ops.kforge.attention(q, k, v, mask, sinks, 0.25)
    want = reference_attention(q, k, v, mask=mask, scale=0.25, sinks=sinks)
    torch.testing.assert_close(got, want)


class PlainAttention(nn.Module):
    """Attention written with matmuls (a transformer block's or BERT's eager form): heads cut
    from one fused projection, so the matmuls' operands are non-contiguous views that their
    decomposition copies (view(clone(expand(x))))."""

    def __init__(self, heads=2, dim=8, divide=False, masked=False):
        super().__init__()
        self.heads, self.dim, self.divide, self.masked = heads, dim, divide, masked
        self.qkv = nn.Linear(heads * dim, 3 * heads * dim)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.dim).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1))
        scores = scores / self.dim ** 0.5 if self.divide else scores * self.dim ** -0.5
        if self.masked:
            scores = scores + mask
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def _plain_inputs():
    torch.manual_seed(1)
    mask = torch.where(torch.rand(2, 1, 1, 6) > 0.3, 0.0, -1e4)
    return torch.randn(2, 6, 16), mask


@pytest.mark.parametrize("divide,masked", [(False, False), (True, False), (False, True)])
def test_plain_attention_becomes_one_op_and_computes_the_same(divide, masked):
    model = PlainAttention(divide=divide, masked=masked).eval()
    args = _plain_inputs()
    ep = traced(model, args)
    assert fuse_written_attention(ep.graph_module) == 1
    found = ops(ep.graph_module)
    assert torch.ops.kforge.attention.default in found
    assert torch.ops.aten._softmax.default not in found and torch.ops.aten.bmm.default not in found
    fused = next(n for n in ep.graph_module.graph.nodes
                 if n.target == torch.ops.kforge.attention.default)
    assert fused.args[4] is None and fused.args[5] == pytest.approx(8 ** -0.5)
    assert (fused.args[3] is None) is (not masked)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*args), model(*args), atol=1e-5, rtol=1e-5)


def test_plain_attention_whose_probabilities_are_also_returned_is_left_alone():
    class ReturnsProbabilities(PlainAttention):
        def forward(self, x, mask):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.dim).permute(2, 0, 3, 1, 4)
            p = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.5, dim=-1)
            return torch.matmul(p, v), p

    ep = traced(ReturnsProbabilities().eval(), _plain_inputs())
    assert fuse_written_attention(ep.graph_module) == 0


def test_a_softmax_over_keys_that_are_not_transposed_is_left_alone():
    class NoTranspose(nn.Module):
        def forward(self, q, k, v):
            return torch.matmul(torch.softmax(torch.matmul(q, k) * 0.5, dim=-1), v)

    x = torch.randn(2, 2, 6, 6)
    ep = traced(NoTranspose(), (x, torch.randn(2, 2, 6, 6), torch.randn(2, 2, 6, 8)))
    assert fuse_written_attention(ep.graph_module) == 0
