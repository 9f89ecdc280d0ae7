"""Norms without a GEMM are one region and one rows kernel.

torch-mlir computes a layer norm's (and a group norm's) variance from an f64 mean and, beside
it, the f32 mean that is subtracted: two chains that share only the input. The region analysis
merges them (passes/FusionAnalysis.cpp), so the builtin generates a single rows kernel.
"""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kforge.providers.builtin import analyze_region, candidates
from kforge.reference import run_host_plan
from kforge.spec import load_spec
from test_builtin import load_candidate, run_candidate
from test_reference import export_regions, real_export


class _LayerNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.norm(x)


class _GroupNormSilu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(4, 16)

    def forward(self, x):
        return F.silu(self.norm(x))


NORMS = {
    "layer_norm": (_LayerNorm, lambda: [torch.randn(8, 32) * 2.0 + 0.5]),
    "group_norm_silu": (_GroupNormSilu, lambda: [torch.randn(2, 16, 4, 4)]),
}


@real_export
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_is_one_rows_kernel(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    cls, make_inputs = NORMS[name]
    model = cls().eval()
    with torch.no_grad():   # non-trivial affine parameters
        model.norm.weight.copy_(torch.rand_like(model.norm.weight) + 0.5)
        model.norm.bias.copy_(torch.randn_like(model.norm.bias) * 0.1)
    inputs = make_inputs()
    plan, weights = export_regions(model, inputs, tmp_path)

    calls = [s.call for s in plan.steps if hasattr(s, "call")]
    assert len(calls) == 1, f"{name}: {len(calls)} regions"
    spec = load_spec(Path(plan.directory) / f"{calls[0]}.json")
    stages = analyze_region(spec).stages
    assert [s.kind for s in stages] == ["rows"]
    assert len(stages[0].reductions) == 3      # f64 mean, f64 variance, f32 mean

    module = load_candidate(candidates(spec, "cpu", "strict")[0].source, tmp_path / "k.py")
    kernels = {calls[0]: lambda *args: run_candidate(module, spec, args)}
    got, = run_host_plan(plan, {calls[0]: spec}, inputs, weights, kernels=kernels)
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
