"""The builtin's opt-in persistent TMA GEMM (KFORGE_BUILTIN_TMA=1; kernels.tma_eligible): the
bf16 scheme's Linear + epilogue regions, A cast to bf16 by a pass, A and the bf16 weight read
through in-kernel tensor descriptors. It runs under the Triton interpreter against the float64
reference and compiles for sm_90 to wgmma; without the variable nothing of it is offered."""
from __future__ import annotations

import pytest

from kforge.providers.builtin import candidates, config_space
from kforge.targets import get_target
from kforge.verify.static import static_check
from test_builtin import _big_spec, check, spec

TMA_SPECS = ["matmul_bias_relu", "linear_gelu_layer_norm_softmax"]


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")


def _tma(s, target):
    return [c for c in candidates(s, target, "bf16") if c.config.get("TMA")]


@pytest.mark.parametrize("name", TMA_SPECS)
def test_tma_candidate_matches_the_reference(name, monkeypatch, tmp_path):
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = spec(name)
    space = config_space(s, "cpu", "bf16")
    assert space[0].get("TMA")                      # first, where it is offered
    cands = _tma(s, "cpu")
    assert cands
    for cand in cands:
        assert "tl.make_tensor_descriptor" in cand.source
        assert "for tile in tl.range(pid, " in cand.source
        assert not static_check(cand.source), static_check(cand.source)
        check(cand, s, "bf16", tmp_path)


def test_tma_persistent_loop_covers_edge_tiles(monkeypatch, tmp_path):
    """One program (the interpreter's one compute unit) walks 3 x 3 tiles of 16 with ragged M,
    N and K edges (K = 24: the descriptor zero-fills the second K step's tail)."""
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=40, K=24, N=44)
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 1, "TMA": True}
    cand = candidates(s, "cpu", "bf16", [config])[0]
    assert "NUM_SMS=1" in cand.source
    check(cand, s, "bf16", tmp_path)


def test_tma_is_offered_only_where_it_fits_and_only_when_asked(monkeypatch):
    for name in TMA_SPECS:
        for target in ("cpu", "cuda"):
            assert not any("TMA" in c for c in config_space(spec(name), target, "bf16"))
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    # batched, an activation B, K % 8 != 0 (a conv's im2col K = 18), other policies
    for name in ("bmm_scale_softmax", "gemm_rope_split_outputs", "conv2d_bias"):
        assert not any("TMA" in c for c in config_space(spec(name), "cuda", "bf16")), name
    # no TMA before Hopper
    assert not any("TMA" in c for c in config_space(spec("matmul_bias_relu"), "cuda:sm_80",
                                                     "bf16"))
    for policy in ("strict", "tf32"):
        assert not any("TMA" in c for c in config_space(spec("matmul_bias_relu"), "cuda", policy))
    assert all(c.config.get("input_precision") is None for c in _tma(spec("matmul_bias_relu"),
                                                                     "cuda"))


@pytest.mark.parametrize("name", TMA_SPECS)
def test_tma_kernel_compiles_to_wgmma_for_sm90(name, monkeypatch):
    pytest.importorskip("triton.backends.nvidia.compiler")
    xc = pytest.importorskip("kforge.crosscompile")
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = spec(name)
    cands = _tma(s, "cuda")
    assert len(cands) == 2
    for cand in cands:
        assert not static_check(cand.source), static_check(cand.source)
        reports = xc.compile_candidate(cand.source, s, 90, name="t")
        assert reports and all(r.ok for r in reports), [r.error for r in reports]
        gemm = [r for r in reports if r.name.endswith("_gemm")]
        assert gemm and all(r.mma == "wgmma" for r in gemm), [(r.name, r.mma) for r in reports]
        assert all(r.spill_stores == 0 for r in gemm), [(r.name, r.spill_stores) for r in gemm]
        # within the H200's shared memory (the target's limit)
        limit = get_target("cuda").arch_info.shared_bytes
        assert all(r.shared_bytes <= limit for r in gemm), [r.shared_bytes for r in gemm]
