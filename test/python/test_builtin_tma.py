"""The builtin's persistent TMA GEMM (KFORGE_BUILTIN_TMA; kernels.tma_eligible): the bf16
policy's Linear + epilogue regions, with bf16 operands (A cast to bf16 by a pass) or fp16x1 (A's
fp16 plane and row scales from the split pass, the weight's fp16 plane and column exponents from
prepare_weights), A and the weight read through in-kernel tensor descriptors. It runs under the
Triton interpreter against the float64 reference and compiles for sm_90 to wgmma; with the
variable at 0 nothing of it is offered."""
from __future__ import annotations

from pathlib import Path

import pytest

from kforge.providers.builtin import candidates, config_space
from kforge.targets import get_target
from kforge.verify.static import static_check
from test_builtin import _big_spec, check, load_candidate, run_candidate, spec

TMA_SPECS = ["matmul_bias_relu", "linear_gelu_layer_norm_softmax"]


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")


def _tma(s, target, scheme=None):
    return [c for c in candidates(s, target, "bf16") if c.config.get("TMA")
            and c.config.get("input_precision") == scheme]


@pytest.mark.parametrize("scheme", [None, "fp16x1"])
@pytest.mark.parametrize("name", TMA_SPECS)
def test_tma_candidate_matches_the_reference(name, scheme, monkeypatch, tmp_path):
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = spec(name)
    space = config_space(s, "cpu", "bf16")
    assert space[0].get("TMA")                      # first, where it is offered
    assert any(c.get("TMA") and c.get("input_precision") == "fp16x1" for c in space)
    cands = _tma(s, "cpu", scheme)
    assert cands
    for cand in cands:
        assert "tl.make_tensor_descriptor" in cand.source
        assert "for tile in tl.range(pid, " in cand.source
        if scheme:      # the split pass's plane, no bf16 cast pass; the scales undone
            assert "_split_a(" in cand.source and "_cast_a(" not in cand.source
            assert "acc = acc * s_a * " in cand.source
        else:
            assert "_cast_a(" in cand.source and "_split_a(" not in cand.source
        assert not static_check(cand.source), static_check(cand.source)
        check(cand, s, "bf16", tmp_path)


def test_fp16x1_tma_undoes_the_scales_of_badly_scaled_operands(monkeypatch, tmp_path):
    """Rows of A and columns of the weight far outside fp16's range (1e6, 1e-6): the scales
    keep the fp16 planes finite and exact to 11 bits, and the epilogue undoes them (a
    wrong or missing scale is off by powers of two: the check fails)."""
    import torch
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=40, K=24, N=44)
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 1, "TMA": True, "input_precision": "fp16x1"}
    cand = candidates(s, "cpu", "bf16", [config])[0]
    g = torch.Generator().manual_seed(3)
    x = torch.rand(40, 24, generator=g) * 2 - 1
    x[:20] *= 1e6
    x[20:] *= 1e-6
    w = torch.rand(44, 24, generator=g) * 2 - 1
    w[::2] *= 1e5
    w[1::2] *= 1e-5
    bias = torch.zeros(44)
    module = load_candidate(cand.source, tmp_path / "fp16x1_tma.py")
    out = run_candidate(module, s, [x, w, bias])[0]
    ref = torch.relu(x.double() @ w.double().T)
    err = (out.double() - ref).abs() / (ref.abs().amax(1, keepdim=True) + 1e-300)
    assert torch.isfinite(out).all()
    assert err.max() < 2e-3, err.max()


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


@pytest.mark.parametrize("policy,scheme,slices,flatten", [
    ("bf16", None, 2, False), ("bf16", "fp16x1", 4, True), ("strict", "fp16x3", 4, False),
    ("tf32", "fp16x1", 2, True)])
def test_tma_epilogue_in_column_slices(policy, scheme, slices, flatten, monkeypatch, tmp_path):
    """EPI_SPLIT: the epilogue (the fp16 schemes' column scales, the bias, the ReLU, the masked
    store) on each of 2 or 4 column slices of the accumulator, split by reshape/permute/split
    (halves of halves: a slice out of order lands in the wrong columns and the check fails),
    over ragged M and N edges; FLATTEN pipelines the tile loop with the K loop (the
    interpreter runs it as written)."""
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=40, K=24, N=100)
    config = {"BLOCK_M": 16, "BLOCK_N": 16 * slices, "BLOCK_K": 16, "GROUP_M": 2,
              "SPLIT_K": 1, "num_warps": 4, "num_stages": 1, "TMA": True,
              "input_precision": scheme, "EPI_SPLIT": slices, "FLATTEN": flatten}
    cand = candidates(s, "cpu", policy, [config])[0]
    assert "EPI_N" in cand.source
    assert cand.source.count("tl.store(") >= slices
    assert ("flatten=True" in cand.source) == flatten
    assert not static_check(cand.source), static_check(cand.source)
    check(cand, s, policy, tmp_path)


@pytest.mark.parametrize("scheme", [None, "fp16x1"])
def test_tma_epilogue_slices_match_the_whole_tile_bit_for_bit(scheme, monkeypatch, tmp_path):
    """A real region with several outputs in a head layout (a tiny Llama's Q projection with
    RoPE: [32, 64] x [64, 64] -> [1, 2, 32, 16]-shaped results through reshapes and a
    transpose, fixtures/regions/tiny_llama_q_rope.json from `kforge compile
    benchmarks/models/llama.py`): the sliced epilogue computes every element as the whole-tile
    one does, so the outputs are identical, not merely close."""
    import torch
    from test_builtin import make_args
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    from pathlib import Path
    from kforge.spec import load_spec
    s = load_spec(Path(__file__).parent / "fixtures" / "regions" / "tiny_llama_q_rope.json")
    first = next(c for c in config_space(s, "cpu", "bf16")
                 if c.get("TMA") and c.get("input_precision") == scheme)
    whole = dict(first, BLOCK_N=64, EPI_SPLIT=1)
    outs = {}
    for slices in (1, 2, 4):
        cand = candidates(s, "cpu", "bf16", [dict(whole, EPI_SPLIT=slices,
                                                  FLATTEN=slices > 1)])[0]
        assert ("EPI_N" in cand.source) == (slices > 1)
        module = load_candidate(cand.source, tmp_path / f"q_rope_{slices}.py")
        outs[slices] = run_candidate(module, s, make_args(s, 0))
    assert len(outs[1]) >= 2
    for slices in (2, 4):
        for a, b in zip(outs[1], outs[slices]):
            assert torch.equal(a, b), (slices, (a - b).abs().max())
    if scheme:
        check(candidates(s, "cpu", "bf16", [dict(whole, EPI_SPLIT=4)])[0], s, "bf16", tmp_path)


def test_fp16x3_tma_tile_in_two_column_parts(monkeypatch, tmp_path):
    """N_PARTS (strict's fp16x3, opt-in with the TMA kernel): two accumulators over the tile's
    column halves, each with its own three products a K step on the shared A planes, and the
    epilogue on each: within strict's tolerance over ragged M, N and K edges; first among the
    opt-in fp16x3 tiles where N spans more than 128 columns; not for other schemes."""
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=40, K=24, N=100)
    config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 1, "TMA": True, "input_precision": "fp16x3",
              "N_PARTS": 2}
    cand = candidates(s, "cpu", "strict", [config])[0]
    assert "acc_1 += part" in cand.source and "block_shape=[EPI_N, BLOCK_K]" in cand.source
    assert not static_check(cand.source), static_check(cand.source)
    check(cand, s, "strict", tmp_path)
    assert candidates(s, "cpu", "bf16", [dict(config, input_precision="fp16x1")]) == []
    big = _big_spec(tmp_path / "big", "matmul_bias_relu", M=1024, K=512, N=2048)
    first = next(c for c in config_space(big, "cuda", "strict") if c.get("TMA"))
    assert first.get("N_PARTS") == 2 and first["BLOCK_N"] == 256


def _linear_residual_spec(tmp_path, M, K, N):
    """relu-free Linear + bias + residual (`fc(x) + r`): an epilogue that loads a whole
    [M, N] tensor beside the accumulator."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "specs"))
    import make_fixtures as mf
    tmp_path.mkdir(parents=True, exist_ok=True)
    old, mf.HERE = mf.HERE, tmp_path
    try:
        s = mf.Spec("linear_residual", ["transpose", "matmul", "bias", "residual"])
        x, w = s.arg([M, K]), s.arg([N, K], weight="fc.weight")
        b, r = s.arg([N], weight="fc.bias"), s.arg([M, N])
        wt, = s.generic("linalg.transpose", [w], [s.empty([K, N])], ["parallel", "parallel"],
                        ["(d0, d1) -> (d1, d0)", mf.ID2], "y = a0", [[K, N]])
        mm, = s.generic("linalg.matmul", [x, wt], [s.fill(0.0, [M, N])],
                        ["parallel", "parallel", "reduction"],
                        ["(d0, d1, d2) -> (d0, d2)", "(d0, d1, d2) -> (d2, d1)",
                         "(d0, d1, d2) -> (d0, d1)"],
                        "t0 = arith.mulf a0 a1; t1 = arith.addf a2 t0; y = t1", [[M, N]])
        out, = s.generic("linalg.generic", [mm, b, r], [s.empty([M, N])],
                         ["parallel", "parallel"],
                         [mf.ID2, "(d0, d1) -> (d1)", mf.ID2, mf.ID2],
                         "t0 = arith.addf a0 a1; t1 = arith.addf t0 a2; y = t1", [[M, N]])
        s.write([out], "contraction", 2 * M * N * K)
    finally:
        mf.HERE = old
    from kforge.spec import load_spec
    return load_spec(tmp_path / "linear_residual.json")


def test_tma_first_tile_with_a_full_tile_epilogue_operand_does_not_spill(monkeypatch, tmp_path):
    """gemm_residual_add's region (2048 x 4096 x 4096 + bias + residual): the residual tile
    beside a 128 x 256 accumulator spilled 312 bytes with the whole-tile epilogue (sm_90
    cross-compile, Triton 3.9), which made the spill screen pass over the first tile. In
    column slices the first configuration compiles without spills, within the shared memory,
    and passes the bf16 check in the interpreter at a small size."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    xc = pytest.importorskip("kforge.crosscompile")
    s = _linear_residual_spec(tmp_path / "big", 2048, 4096, 4096)
    first = config_space(s, "cuda", "bf16")[0]
    assert first.get("TMA") and first.get("EPI_SPLIT") == 4 and first["BLOCK_N"] == 256, first
    cand = candidates(s, "cuda", "bf16", [first])[0]
    gemm = [r for r in xc.compile_candidate(cand.source, s, 90, name="t")
            if r.name.endswith("_gemm")]
    assert gemm and all(r.ok and r.mma == "wgmma" and r.spill_stores == 0 for r in gemm), \
        [(r.error, r.spill_stores) for r in gemm]
    limit = get_target("cuda").arch_info.shared_bytes
    assert all(r.shared_bytes <= limit for r in gemm), [r.shared_bytes for r in gemm]
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    small = _linear_residual_spec(tmp_path / "small", 40, 24, 100)
    config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 1, "TMA": True, "input_precision": "fp16x1",
              "EPI_SPLIT": 4, "FLATTEN": True}
    check(candidates(small, "cpu", "bf16", [config])[0], small, "bf16", tmp_path)


def test_tma_epilogue_slices_need_whole_slices_of_16(monkeypatch, tmp_path):
    """4 slices of a 32-column tile would be 8 wide: no candidate, the others unaffected."""
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=40, K=24, N=44)
    config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 1, "TMA": True, "EPI_SPLIT": 4}
    assert candidates(s, "cpu", "bf16", [config]) == []
    assert candidates(s, "cpu", "bf16", [dict(config, EPI_SPLIT=2)])


def test_tma_is_offered_only_where_it_fits_and_not_when_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "0")
    big = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=1024, K=512, N=2048)
    for s in [spec(name) for name in TMA_SPECS] + [big]:
        for target in ("cpu", "cuda"):
            assert not any("TMA" in c for c in config_space(s, target, "bf16"))
    monkeypatch.delenv("KFORGE_BUILTIN_TMA")
    # the default on a GPU: first for fp16x1 past 128 rows; bf16 operands only with a wave of
    # 128 x 128 tiles (1024 x 2048: 128 tiles, fewer than the 132 SMs)
    space = config_space(big, "cuda", "bf16")
    assert space[0].get("TMA") and space[0]["input_precision"] == "fp16x1"
    assert not any(c.get("TMA") and not c.get("input_precision") for c in space)
    wide = _big_spec(tmp_path / "wide", "matmul_bias_relu", M=4096, K=512, N=4096)
    assert any(c.get("TMA") and not c.get("input_precision")
               for c in config_space(wide, "cuda", "bf16"))
    assert not any(c.get("TMA") for c in config_space(spec("matmul_bias_relu"), "cuda", "bf16"))
    # a norm over N = 4096 runs in a rows kernel after the GEMM: the GEMM's own 128 x 256 tiles
    # (with the fused-row register cap it took 128 x 128 and ran 0.84x the pointer kernel)
    rows = _big_spec(tmp_path / "rows", "linear_gelu_layer_norm_softmax", M=4096, K=512, N=4096)
    first = config_space(rows, "cuda", "bf16")[0]
    assert first.get("TMA") and (first["BLOCK_M"], first["BLOCK_N"]) == (128, 256), first
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    # batched, an activation B, K % 8 != 0 (a conv's im2col K = 18), other policies
    for name in ("bmm_scale_softmax", "gemm_rope_split_outputs", "conv2d_bias"):
        assert not any("TMA" in c for c in config_space(spec(name), "cuda", "bf16")), name
    # no TMA before Hopper
    assert not any("TMA" in c for c in config_space(spec("matmul_bias_relu"), "cuda:sm_80",
                                                     "bf16"))
    for policy in ("strict", "tf32"):       # 8 rows: decode-shaped, the pointer kernel's tiles
        assert not any("TMA" in c for c in config_space(spec("matmul_bias_relu"), "cuda", policy))
    assert all(c.config.get("input_precision") is None for c in _tma(spec("matmul_bias_relu"),
                                                                     "cuda"))


@pytest.mark.parametrize("scheme", [None, "fp16x1"])
@pytest.mark.parametrize("name", TMA_SPECS)
def test_tma_kernel_compiles_to_wgmma_for_sm90(name, scheme, monkeypatch, tmp_path):
    """On a GPU the kernel is offered past 128 rows (a decode step's GEMM keeps the pointer
    kernel's decode tiles): 1024 rows here, the tiles it takes there."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    xc = pytest.importorskip("kforge.crosscompile")
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    assert not _tma(spec(name), "cuda", scheme)          # 8 rows: decode-shaped
    s = _big_spec(tmp_path / name, name, M=1024, K=512, N=512 if name == "matmul_bias_relu"
                  else 12)     # (GELU, norm and softmax over 64+ columns spill, pointer kernels too)
    cands = _tma(s, "cuda", scheme)
    # the two sliced pipelines and the whole-tile tile before them; a row reduction fused over
    # the tile: the target's two tiles
    assert len(cands) == (3 if name == "matmul_bias_relu" else 2)
    for cand in cands:
        assert not static_check(cand.source), static_check(cand.source)
        reports = xc.compile_candidate(cand.source, s, 90, name="t")
        assert reports and all(r.ok for r in reports), [r.error for r in reports]
        gemm = [r for r in reports if r.name.endswith("_gemm")]
        assert gemm and all(r.mma == "wgmma" for r in gemm), [(r.name, r.mma) for r in reports]
        assert all(r.spill_stores == 0 for r in gemm), [(r.name, r.spill_stores) for r in gemm]
        # the descriptors became TMA copies in the GEMM; its operand pass reads by pointer
        assert all(r.tma for r in gemm) and not any(r.tma for r in reports if r not in gemm)
        # within the H200's shared memory (the target's limit)
        limit = get_target("cuda").arch_info.shared_bytes
        assert all(r.shared_bytes <= limit for r in gemm), [r.shared_bytes for r in gemm]


# strict and tf32 on the TMA kernel (fp16x3 planes; tf32: fp32 operands read where they lie),
# not timed on a GPU yet: offered only with KFORGE_BUILTIN_TMA=1
POLICY_SCHEMES = [("strict", "fp16x3"), ("tf32", "tf32")]


@pytest.mark.parametrize("policy,scheme", POLICY_SCHEMES)
def test_strict_and_tf32_tma_are_offered_only_when_asked(policy, scheme, monkeypatch, tmp_path):
    """By default strict and tf32 keep the pointer kernel; KFORGE_BUILTIN_TMA=1 puts the TMA
    tiles first for the policy's scheme, not where a row reduction is fused over the tile (a
    second accumulator under fp16x3)."""
    big = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=1024, K=512, N=2048)
    monkeypatch.delenv("KFORGE_BUILTIN_TMA", raising=False)
    # (fp16x3's Gluon kernel, first by default on sm_90, is test_gemm_gluon.py's)
    monkeypatch.setenv("KFORGE_BUILTIN_GLUON", "0")

    def own(space):         # (tf32's fp16x1 tiles come first and take the TMA kernel anyway)
        return [c for c in space if c.get("input_precision") == scheme]
    assert not any(c.get("TMA") for c in own(config_space(big, "cuda", policy)))
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    first = own(config_space(big, "cuda", policy))[0]
    assert first.get("TMA"), first
    # fp16x3: the tile in two column parts (N_PARTS) first; tf32: its 128 x 128 fp32 tile
    expect = (128, 256, 8, 2) if scheme == "fp16x3" else (128, 128, 8, None)
    assert (first["BLOCK_M"], first["BLOCK_N"], first["num_warps"],
            first.get("N_PARTS")) == expect, first
    fused = _big_spec(tmp_path / "rows", "linear_gelu_layer_norm_softmax", M=1024, K=512, N=12)
    assert not any(c.get("TMA") for c in own(config_space(fused, "cuda", policy)))


def test_tf32_tma_reads_only_an_argument_as_it_lies(monkeypatch):
    """tf32 on the TMA kernel has no pass: an A computed in the region (a batched product's,
    an im2col's) keeps the pointer kernel."""
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    for name in ("bmm_scale_softmax", "conv2d_bias"):
        assert not any(c.get("TMA") for c in config_space(spec(name), "cpu", "tf32")), name
    assert config_space(spec("matmul_bias_relu"), "cpu", "tf32")[0].get("TMA")


@pytest.mark.parametrize("policy,scheme", POLICY_SCHEMES)
def test_strict_and_tf32_tma_candidates_match_the_reference(policy, scheme, monkeypatch,
                                                           tmp_path):
    """Under the policy's tolerance; fp16x3 reads both planes of A (rows M..2M-1 of its
    descriptor) and of the weight, tf32 A and the weight as they are (no pass, no prepared
    weight); ragged M, N and K edges over 3 x 3 tiles of 16."""
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = spec("matmul_bias_relu")
    cands = [c for c in candidates(s, "cpu", policy) if c.config.get("TMA")]
    assert cands
    for cand in cands:
        if cand.config["input_precision"] == "fp16x3":
            assert "a_lo = a_desc.load(" in cand.source and "w_lo = w_desc.load(" in cand.source
            assert "_split_a(" in cand.source and "_cast_a(" not in cand.source
        elif cand.config["input_precision"] == "fp16x1":    # tf32's 16-bit-rate scheme
            assert "_split_a(" in cand.source and "a_lo" not in cand.source
        else:       # the interpreter's tf32 scheme is "ieee"
            assert "_split_a(" not in cand.source and "_cast_a(" not in cand.source
            assert "def prepare_weights" not in cand.source
        assert not static_check(cand.source), static_check(cand.source)
        check(cand, s, policy, tmp_path)
    edge = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=40, K=24, N=44)
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 1, "TMA": True,
              "input_precision": scheme if policy == "strict" else "ieee"}
    check(candidates(edge, "cpu", policy, [config])[0], edge, policy, tmp_path)


@pytest.mark.parametrize("policy,scheme", POLICY_SCHEMES)
def test_strict_and_tf32_tma_kernels_compile_to_wgmma_for_sm90(policy, scheme, monkeypatch,
                                                              tmp_path):
    """Their tiles for sm_90: wgmma, no spills, within the H200's shared memory (fp16x3:
    four 16 KiB tiles a stage, and 128 x 256 x 32 in two column parts; tf32: fp32 tiles of 32
    or 48 KiB a stage)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    xc = pytest.importorskip("kforge.crosscompile")
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=1024, K=512, N=512)
    cands = [c for c in candidates(s, "cuda", policy)
             if c.config.get("TMA") and c.config["input_precision"] == scheme]
    assert len(cands) == (3 if scheme == "fp16x3" else 2)
    limit = get_target("cuda").arch_info.shared_bytes
    for cand in cands:
        reports = xc.compile_candidate(cand.source, s, 90, name="t")
        assert reports and all(r.ok for r in reports), [r.error for r in reports]
        gemm = [r for r in reports if r.name.endswith("_gemm")]
        assert gemm and all(r.mma == "wgmma" and r.spill_stores == 0 for r in gemm)
        assert all(r.shared_bytes <= limit for r in gemm), [r.shared_bytes for r in gemm]


def test_tf32_policy_puts_fp16x1_first_on_gpus(tmp_path):
    """Under tf32, an fp32 GEMM on the GPU starts with fp16x1 (11-bit significands, as TF32, at
    the 16-bit rate: the persistent TMA tiles first, then the pointer kernel's), then TF32's own
    products, fp16x3 last; in the interpreter the tf32 kernel stays first, fp16x1 second. A
    convolution-like GEMM whose pass costs more than its product keeps tf32 first."""
    from kforge.providers.builtin import region_shape
    from kforge.providers.builtin.schemes import gemm_input_precisions
    big = _big_spec(tmp_path / "big", "matmul_bias_relu", M=4096, K=4096, N=4096)
    space = config_space(big, "cuda", "tf32")
    assert space[0].get("TMA") and space[0]["input_precision"] == "fp16x1"
    schemes = [c.get("input_precision") for c in space]
    assert schemes.index("tf32") > schemes.index("fp16x1")
    assert schemes[-1] == "fp16x3"
    stage = region_shape(big, get_target("cuda"), "tf32")
    assert gemm_input_precisions(big, get_target("cuda"), "tf32", stage) == \
        ("fp16x1", "tf32", "fp16x3")
    cpu = get_target("cpu")
    assert gemm_input_precisions(big, cpu, "tf32", stage) == \
        cpu.dot_input_precisions("tf32") + ("fp16x1",)
    narrow = _big_spec(tmp_path / "narrow", "matmul_bias_relu", M=65536, K=512, N=16)
    stage = region_shape(narrow, get_target("cuda"), "tf32")
    assert gemm_input_precisions(narrow, get_target("cuda"), "tf32", stage)[0] == "tf32"


@pytest.mark.parametrize("tma", [True, False])
def test_tf32_fp16x1_candidate_passes_the_tf32_verifier(tma, monkeypatch, tmp_path):
    """The fp16x1 kernel offered under tf32 (TMA and pointer forms) passes the real verifier at
    the tf32 policy: its unit-scale inputs at half the tolerance and its wide-magnitude ones."""
    from kforge.verify.verifier import verify_candidate
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1" if tma else "0")
    s = spec("linear_gelu_layer_norm_softmax")
    cands = [c for c in candidates(s, "cpu", "tf32")
             if c.config.get("input_precision") == "fp16x1" and bool(c.config.get("TMA")) == tma]
    assert cands
    record = verify_candidate(s, cands[0], "cpu", "tf32")
    assert record.status == "verified", (record.reason, record.message)


@pytest.mark.parametrize("policy", ["tf32", "bf16"])
def test_tma_tiles_that_would_starve_the_sms_give_way_to_split_k(policy, monkeypatch, tmp_path):
    """256 x 1024 output tiles of 128 x 128 are 16 programs for the H200's 132 SMs, and the
    TMA kernel has no split-K: the pointer kernel's split-K tiles go first. 256 x 4096 (64
    tiles, where the TMA kernel measured 1.54x the pointer kernel) keeps the TMA tiles, and
    KFORGE_BUILTIN_TMA=1 offers them everywhere."""
    monkeypatch.delenv("KFORGE_BUILTIN_TMA", raising=False)
    long_k = _big_spec(tmp_path / "long_k", "matmul_bias_relu", M=256, K=32768, N=1024)
    space = config_space(long_k, "cuda", policy)
    assert not any(c.get("TMA") for c in space)
    assert space[0]["SPLIT_K"] > 1 and space[0]["input_precision"] == "fp16x1"
    wide = _big_spec(tmp_path / "wide", "matmul_bias_relu", M=256, K=4096, N=4096)
    assert config_space(wide, "cuda", policy)[0].get("TMA")
    if policy == "bf16":
        # nor the warp-specialized kernel (one program a tile too): 0.29x the split-K tiles on
        # an H100 (2026-12-07h); the wide one takes it first when asked
        monkeypatch.setenv("KFORGE_BUILTIN_WS", "1")
        assert not any(c.get("WS") for c in config_space(long_k, "cuda", policy))
        assert config_space(wide, "cuda", policy)[0].get("WS")
        monkeypatch.delenv("KFORGE_BUILTIN_WS")
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    assert any(c.get("TMA") for c in config_space(long_k, "cuda", policy))


@pytest.mark.parametrize("policy,scheme,slices", [
    ("bf16", None, 1), ("bf16", "fp16x1", 4), ("strict", "fp16x3", 2)])
def test_tma_store_of_the_output_matches_tl_store_bit_for_bit(policy, scheme, slices,
                                                              monkeypatch, tmp_path):
    """TMA_STORE: the output slices go out through a descriptor made at the top of the kernel
    (clipped at the ragged M and N edges by the copy itself, not by a mask) and land exactly
    where tl.store puts them: same elements, same bits, and nothing past the edges (the
    output is poisoned before the run by the checker)."""
    import torch
    from test_builtin import make_args
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=40, K=24, N=100)
    config = {"BLOCK_M": 16, "BLOCK_N": 16 * max(slices, 2), "BLOCK_K": 16, "GROUP_M": 2,
              "SPLIT_K": 1, "num_warps": 4, "num_stages": 1, "TMA": True,
              "input_precision": scheme, "EPI_SPLIT": slices}
    outs = {}
    for tma_store in (False, True):
        cand = candidates(s, "cpu", policy, [dict(config, TMA_STORE=tma_store)])[0]
        assert ("_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N" in cand.source) == tma_store
        gemm = cand.source.split("_gemm(")[1].split("\ndef ")[0]
        assert ("tl.store(" in gemm) != tma_store, gemm
        assert not static_check(cand.source), static_check(cand.source)
        check(cand, s, policy, tmp_path)
        module = load_candidate(cand.source, tmp_path / f"store_{tma_store}.py")
        outs[tma_store] = run_candidate(module, s, make_args(s, 0))
    for a, b in zip(outs[False], outs[True]):
        assert torch.equal(a, b), (a - b).abs().max()


def test_tma_store_keeps_tl_store_where_rows_are_not_16_byte_aligned(monkeypatch, tmp_path):
    """N % 4 != 0 (fp32 rows of 102 columns: a descriptor needs 16-byte strides): TMA_STORE
    leaves the output to tl.store, and the candidate still matches the reference."""
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=40, K=24, N=102)
    config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 1, "TMA": True, "input_precision": "fp16x1",
              "EPI_SPLIT": 2, "TMA_STORE": True}
    cand = candidates(s, "cpu", "bf16", [config])[0]
    gemm = cand.source.split("_gemm(")[1].split("\ndef ")[0]
    assert "tl.store(" in gemm and "_desc.store(" not in gemm
    check(cand, s, "bf16", tmp_path)


def test_tma_store_in_a_region_with_an_elementwise_stage_after_the_product(monkeypatch,
                                                                           tmp_path):
    """The tiny Llama's Q projection + RoPE: the GEMM stores the product by TMA, and the RoPE
    stage reads it back in its head-major layout; the candidate matches the reference."""
    from kforge.spec import load_spec
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = load_spec(Path(__file__).parent / "fixtures" / "regions" / "tiny_llama_q_rope.json")
    first = next(c for c in config_space(s, "cpu", "bf16")
                 if c.get("TMA") and c.get("input_precision") == "fp16x1")
    cand = candidates(s, "cpu", "bf16", [dict(first, BLOCK_N=64, EPI_SPLIT=2,
                                              TMA_STORE=True)])[0]
    gemm = cand.source.split("_gemm(")[1].split("\ndef ")[0]
    assert "_desc.store(" in gemm and "tl.store(" not in gemm
    check(cand, s, "bf16", tmp_path)


def test_tma_store_compiles_to_a_bulk_store_for_sm90(monkeypatch, tmp_path):
    """On sm_90 the descriptor store is a TMA bulk copy from shared memory (cp.async.bulk
    .tensor ... global.shared), no spills, within the H200's shared memory at the first tile."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    xc = pytest.importorskip("kforge.crosscompile")
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=1024, K=512, N=512)
    first = next(c for c in config_space(s, "cuda", "bf16")
                 if c.get("TMA") and c.get("input_precision") == "fp16x1")
    cand = candidates(s, "cuda", "bf16", [dict(first, TMA_STORE=True)])[0]
    assert "_desc.store(" in cand.source
    reports = xc.compile_candidate(cand.source, s, 90, name="t")
    assert reports and all(r.ok for r in reports), [r.error for r in reports]
    gemm = next(r for r in reports if r.name.endswith("_gemm"))
    assert gemm.mma == "wgmma" and gemm.spill_stores == 0
    assert gemm.shared_bytes <= get_target("cuda").arch_info.shared_bytes
    assert gemm.ptx_ops["tma_store"] > 0, gemm.ptx_ops
