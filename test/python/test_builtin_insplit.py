"""strict's fp16x3 GEMM with A's planes made in the kernel (KFORGE_BUILTIN_INSPLIT=1, config key
INSPLIT; gemm._split_a_in_kernel): no split pass over A; each K step's fp32 tile of A is scaled
per row by a power of two, split into fp16 hi and lo, and the step's part multiplied back. It
runs under the Triton interpreter against the float64 reference, is at least as accurate as the
split pass on operands whose magnitudes differ along K, and compiles for sm_90 to wgmma without
spills. Without the variable it is not offered."""
from __future__ import annotations

import pytest

from kforge.providers.builtin import candidates, config_space
from kforge.verify.static import static_check
from test_builtin import _big_spec, check, load_candidate, run_candidate, spec


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")


def _insplit(s, target, precision="strict"):
    return [c for c in candidates(s, target, precision) if c.config.get("INSPLIT")]


@pytest.mark.parametrize("name", ["matmul_bias_relu", "linear_gelu_layer_norm_softmax"])
def test_insplit_candidate_matches_the_reference(name, monkeypatch, tmp_path):
    monkeypatch.setenv("KFORGE_BUILTIN_INSPLIT", "1")
    s = spec(name)
    space = config_space(s, "cpu", "strict")
    fp16x3 = [c for c in space if c.get("input_precision") == "fp16x3"]
    assert fp16x3[0].get("INSPLIT")             # the scheme's first, where asked
    cand = _insplit(s, "cpu")[0]
    # no pass over A: its planes come from the kernel's own fp32 tile, the scale per K step
    assert "_split_a(" not in cand.source
    assert "acc += part * a_unscale" in cand.source
    assert not static_check(cand.source), static_check(cand.source)
    check(cand, s, "strict", tmp_path)


def test_insplit_is_offered_only_when_asked(monkeypatch):
    s = spec("matmul_bias_relu")
    monkeypatch.delenv("KFORGE_BUILTIN_INSPLIT", raising=False)
    assert not any(c.get("INSPLIT") for c in config_space(s, "cpu", "strict"))
    monkeypatch.setenv("KFORGE_BUILTIN_INSPLIT", "1")
    assert not any(c.get("INSPLIT") for c in config_space(s, "cpu", "bf16"))


def test_insplit_scales_each_step_of_badly_scaled_rows(monkeypatch, tmp_path):
    """Rows of A at 1e6 and 1e-6, and along K one block 1e4 times the next: each step's scale
    keeps the fp16 planes finite and their lo plane normal, and the part is scaled back. The
    error against float64 is within fp16x3's 2^-21 of each row's largest term, and no worse than
    the split pass's with one scale a row (a wrong or missing scale is off by powers of two)."""
    import torch
    monkeypatch.setenv("KFORGE_BUILTIN_INSPLIT", "1")
    M, K, N = 40, 64, 44
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=M, K=K, N=N)
    base = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
            "num_warps": 4, "num_stages": 1, "input_precision": "fp16x3"}
    g = torch.Generator().manual_seed(5)
    x = torch.rand(M, K, generator=g) * 2 - 1
    x[:20] *= 1e6
    x[20:] *= 1e-6
    x[:, 16:32] *= 1e-4             # one BLOCK_K step far smaller than the rest of its row
    w = torch.rand(N, K, generator=g) * 2 - 1
    bias = torch.zeros(N)
    terms = (x.double().abs() @ w.double().abs().T)        # the row's scale of the products
    ref = torch.relu(x.double() @ w.double().T)
    errs = {}
    for key in ("INSPLIT", None):
        config = dict(base, **({key: True} if key else {}))
        cand = candidates(s, "cpu", "strict", [config])[0]
        assert ("_split_a(" in cand.source) == (key is None)
        module = load_candidate(cand.source, tmp_path / f"k_{key}.py")
        out = run_candidate(module, s, [x, w, bias])[0]
        assert torch.isfinite(out).all()
        errs[key] = ((out.double() - ref).abs() / terms).max().item()
    assert errs["INSPLIT"] < 2 ** -21, errs
    assert errs["INSPLIT"] <= errs[None] * 1.01, errs


def test_insplit_compiles_to_wgmma_for_sm90(monkeypatch, tmp_path):
    """Its tile for sm_90: wgmma, no spills, within the H200's shared memory, and no split
    pass among the region's kernels."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    xc = pytest.importorskip("kforge.crosscompile")
    from kforge.targets import get_target
    monkeypatch.setenv("KFORGE_BUILTIN_INSPLIT", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=1024, K=512, N=512)
    cands = _insplit(s, "cuda")
    assert len(cands) == 1 and candidates(s, "cuda", "strict")[0].config.get("INSPLIT")
    reports = xc.compile_candidate(cands[0].source, s, 90, name="t")
    assert reports and all(r.ok for r in reports), [r.error for r in reports]
    assert not any("split_a" in r.name for r in reports), [r.name for r in reports]
    gemm = [r for r in reports if r.name.endswith("_gemm")]
    assert gemm and all(r.mma == "wgmma" and r.spill_stores == 0 for r in gemm), gemm
    limit = get_target("cuda").arch_info.shared_bytes
    assert all(r.shared_bytes <= limit for r in gemm), [r.shared_bytes for r in gemm]
