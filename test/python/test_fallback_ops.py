"""Fallback ops: ops torch-mlir cannot lower to linalg run through PyTorch (docs/fallback-ops.md).

Real torch-mlir imports, real kforge-opt host plans, real compiles (builtin, cpu) and runs that
match eager; the spec reader and the executor on their own."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from kforge.errors import UserError
from kforge.fallbacks import run_fallback
from kforge.spec import FallbackOp, load_host_plan, to_json

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.fc = nn.Linear(8, 8)

        def forward(self, ids, x):
            h = torch.relu(self.fc(self.emb(ids)))            # gather, then a GEMM region
            c = torch.cumsum(x, dim=-1)                        # tm_tensor.scan in torch-mlir
            top, idx = torch.topk(c, 2, dim=-1)                # two results, one of them i64
            s, _ = torch.sort(x, dim=-1, descending=True)
            return h.sum(-1) + top.sum(-1, keepdim=True) + idx[..., :1].float() \\
                + torch.lgamma(x.abs() + 1) + s              # lgamma: no linalg lowering

    def get_inputs():
        return [torch.randint(0, 16, (2, 5)), torch.randn(2, 5)]

    def get_init_inputs():
        return []
    """)

EXPECTED = {"aten.embedding", "aten.cumsum", "aten.topk", "aten.sort", "aten.lgamma"}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fallback") / "model.py"
    path.write_text(MODEL)
    return path


def test_import_outlines_fallback_ops(model_file, tmp_path, kforge_opt):
    from kforge.frontend import form_regions, import_model
    result = import_model(model_file, tmp_path / "model.mlir")
    text = result.mlir_path.read_text()
    assert "tm_tensor" not in text and "torch." not in text.replace("torch-mlir", "")
    for name in EXPECTED:
        assert f"call @kforge.fallback.{name}." in text, name
        assert f'kforge.fallback = "{name}"' in text, name
    form_regions(result.mlir_path, tmp_path / "regions")
    plan = load_host_plan(tmp_path / "regions" / "host_plan.json")
    steps = [s for s in plan.steps if isinstance(s, FallbackOp)]
    assert {s.name for s in steps} == EXPECTED
    topk = next(s for s in steps if s.name == "aten.topk")
    assert len(topk.results) == 2 and plan.tensor(topk.results[1]).dtype == "i64"
    # the plan round-trips through its JSON writer
    again = load_host_plan(json.loads(to_json(plan)))
    assert [s for s in again.steps if isinstance(s, FallbackOp)] == steps


def test_compile_and_run_match_eager(model_file, tmp_path, kforge_opt, monkeypatch):
    from kforge.build import compile_model
    from kforge.runtime import eager_outputs, load_package, load_model_file, max_error
    from kforge.synth import SynthOptions
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    pkg = tmp_path / "pkg"
    doc = compile_model(model_file, pkg, SynthOptions(target="cpu", rounds=0))
    cov = doc["coverage"]
    assert {r["name"] for r in cov["fallback_ops"]} == EXPECTED
    assert all(r["count"] == 1 for r in cov["fallback_ops"])
    assert cov["time_measured"] and 0 <= cov["time_share"]["fallback"] <= 1
    assert "Fallback ops (run by PyTorch)" in (pkg / "report.md").read_text()
    compiled = load_package(pkg)
    for seed in (1, 2):               # fresh inputs, not the ones it was compiled with
        torch.manual_seed(seed)
        _, inputs = load_model_file(model_file, with_model=False, seed=seed)
        got = compiled(*inputs)
        want = eager_outputs(compiled.package, inputs)
        abs_err, _ = max_error(got, want)
        assert abs_err <= 1e-4, abs_err


def test_keyword_only_arguments_and_devices():
    x = torch.randn(3, 4)
    # torch-mlir lists cumsum's keyword-only dtype positionally
    (out,) = run_fallback("aten.cumsum", ({"tensor": 0}, 1, None), [x], torch.device("cpu"))
    torch.testing.assert_close(out, torch.cumsum(x, 1))
    (out,) = run_fallback("aten.index_select", ({"tensor": 0}, 0, {"tensor": 1}),
                          [x, torch.tensor([2, 0])], torch.device("cpu"))
    torch.testing.assert_close(out, x[[2, 0]])


def test_executor_errors_are_clear():
    with pytest.raises(UserError, match="no operator aten::no_such_op"):
        run_fallback("aten.no_such_op", ({"tensor": 0},), [torch.zeros(1)], torch.device("cpu"))
    with pytest.raises(UserError, match="fallback op aten.cumsum failed on operands"):
        run_fallback("aten.cumsum", ({"tensor": 0}, 5, None), [torch.zeros(2)],
                     torch.device("cpu"))


def test_plan_reader_checks_fallback_arguments():
    plan = {"schema": "kforge.host-plan", "version": 1, "function": "main",
            "inputs": [{"name": "arg0", "shape": [4], "dtype": "f32", "weight": None}],
            "values": [{"name": "v0", "shape": [4], "dtype": "f32"}],
            "steps": [{"op": "fallback", "name": "aten.cumsum", "args": [{"tensor": 3}, 0],
                       "operands": ["arg0"], "results": ["v0"]}],
            "outputs": ["v0"]}
    with pytest.raises(UserError, match="tensor index 3 is not one of the 1 operands"):
        load_host_plan(plan)


class _KeysAssembledBySlices(torch.nn.Module):
    """DeepSeek-style attention in small: keys written into slices of a new tensor
    (aten.slice_scatter after export: tensor.insert_slice, which the host plan does not
    describe), and values narrower than queries and keys (multi-head latent attention)."""

    def __init__(self):
        super().__init__()
        self.rope = torch.nn.Linear(8, 8)

    def forward(self, q, k_pass, k_rot, v):
        k = q.new_zeros(q.shape)
        k[..., :8] = k_pass
        k[..., 8:] = self.rope(k_rot)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_slice_writes_fall_back_and_unequal_head_dims_get_the_attention_kernel(tmp_path,
                                                                              kforge_opt):
    from kforge.build import compile_model
    from kforge.runtime import load_package
    from kforge.synth import SynthOptions

    torch.manual_seed(0)
    model = _KeysAssembledBySlices().eval()
    q = torch.randn(1, 2, 8, 16)
    inputs = (q, torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8))
    doc = compile_model(model, tmp_path / "pkg", SynthOptions(target="cpu", rounds=0),
                        example_inputs=inputs)
    plan = json.loads((tmp_path / "pkg" / "regions" / "host_plan.json").read_text())
    assert [s["name"] for s in plan["steps"] if s.get("op") == "fallback"].count(
        "aten.slice_scatter") == 2
    attention = [r for r in doc["regions"] if r.get("root_kind") == "attention"]
    # values narrower than queries and keys (multi-head latent attention): the builtin's
    # flash-attention kernel takes a value head dim of its own
    assert len(attention) == 1 and attention[0]["status"] == "verified", attention
    with torch.no_grad():
        torch.testing.assert_close(load_package(tmp_path / "pkg")(*inputs), model(*inputs),
                                   atol=1e-5, rtol=1e-5)


CAT_MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(32, 64, bias=False)

        def forward(self, x, cos, sin):
            q = self.q(x)
            rot = torch.cat((-q[..., 32:], q[..., :32]), dim=-1)   # rotate_half: a select
            rope = q * cos + rot * sin
            five = torch.cat([x[..., :4]] * 5, dim=-1)              # 5 inputs: falls back
            return rope, five * 2

    def get_inputs():
        return [torch.randn(2, 8, 32), torch.randn(8, 64), torch.randn(8, 64)]

    def get_init_inputs():
        return []
    """)


def test_concatenation_is_elementwise_where_it_can_be(tmp_path, kforge_opt, monkeypatch):
    """A cat of 2-4 tensors of static sizes is a select (`--kforge-concat-to-generics`): RoPE's
    rotate_half fuses into its GEMM region, where it was a fallback op between the GEMM's
    three outputs and the elementwise region that read them; a cat of more inputs still
    falls back. The kernels verify (interpreter) and the package matches eager."""
    from kforge.build import compile_model
    from kforge.runtime import eager_outputs, load_package, load_model_file, max_error
    from kforge.synth import SynthOptions
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.py"
    path.write_text(CAT_MODEL)
    doc = compile_model(path, tmp_path / "pkg", SynthOptions(target="cpu", rounds=0))
    assert {r["name"]: r["count"] for r in doc["coverage"]["fallback_ops"]} == {"aten.cat": 1}
    assert all(r["status"] == "verified" for r in doc["regions"]), doc["regions"]
    gemm = [r for r in doc["regions"] if r["root_kind"] == "contraction"]
    assert len(gemm) == 1 and "cmpi_select" in gemm[0]["fused"], gemm
    compiled = load_package(tmp_path / "pkg")
    _, inputs = load_model_file(path, with_model=False, seed=3)
    got, want = compiled(*inputs), eager_outputs(compiled.package, inputs)
    for g, w in zip(got, want):
        assert max_error(g, w)[0] <= 1e-4
