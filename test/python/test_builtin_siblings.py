"""Sibling contractions (SwiGLU's gate and up projections, one region since
--kforge-form-regions merges them): the builtin pairs the two products as one GEMM stage with a
partner. The persistent TMA kernel computes both from one pass over A, through one descriptor
over the two weights' rows interleaved by prepare_weights (PAIRED configurations, first by
default beyond 512 rows; KFORGE_BUILTIN_PAIRED=0 turns them off); every other configuration runs
the partner's GEMM first, both reading one pass over A. Runs under the Triton interpreter against the float64 reference and compiles for
sm_90."""
from __future__ import annotations

import pytest

from kforge.providers.builtin import candidates, config_space
from kforge.providers.builtin.analysis import analyze_region
from kforge.verify.static import static_check
from test_builtin import _big_spec, check, load_candidate, make_args, run_candidate, spec


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")


def _config(scheme, slices, block_n, **extra):
    return {"BLOCK_M": 16, "BLOCK_N": block_n, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
            "num_warps": 4, "num_stages": 1, "TMA": True, "input_precision": scheme,
            "EPI_SPLIT": slices, "PAIRED": True, **extra}


def test_sibling_products_are_one_stage_with_a_partner():
    """The gate's GEMM stage only materialized its product for the up projection's stage,
    whose contraction reads the same A by the same map: one stage, the gate its partner."""
    s = spec("swiglu")
    shape = analyze_region(s)
    assert len(shape.stages) == 1 and shape.kind == "gemm"
    assert shape.partner is not None
    assert shape.partner.op.results[0] != shape.contraction.op.results[0]
    assert shape.partner.op.operands[shape.partner.a] == \
        shape.contraction.op.operands[shape.contraction.a]
    assert shape.stores == list(s.results)


@pytest.mark.parametrize("scheme,slices,block_n", [("fp16x1", 2, 32), ("fp16x1", 4, 64),
                                                   (None, 2, 64)])
def test_paired_kernel_computes_both_products_from_one_pass(scheme, slices, block_n,
                                                            monkeypatch, tmp_path):
    """One split (or cast) pass over A and one GEMM launch for both products, ragged M; the
    weights interleaved in blocks of BLOCK_N / 2 rows. fp16x1 matches the float64 reference
    within the policy; under either scheme the paired kernel gives what the two products
    computed one after the other give (the same roundings, up to the epilogue's fp32 order)."""
    import torch
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "sw", "swiglu", M=40, K=24, N=96)
    cand = candidates(s, "cpu", "bf16", [_config(scheme, slices, block_n)])[0]
    src = cand.source
    assert src.count("_gemm[") == 1
    assert src.count("_split_a[") + src.count("_cast_a[") == 1
    assert "interleaved by BLOCK_N / 2" in src and "    def _prepare_each(" in src
    assert not static_check(src), static_check(src)
    if scheme:
        check(cand, s, "bf16", tmp_path)
    # the same products one at a time (not PAIRED)
    alone = candidates(s, "cpu", "bf16", [_config(scheme, slices, block_n, PAIRED=False)])[0]
    assert alone.source.count("_gemm[") == 2
    args = make_args(s, 0)
    got = run_candidate(load_candidate(src, tmp_path / "paired.py"), s, args)[0]
    ref = run_candidate(load_candidate(alone.source, tmp_path / "alone.py"), s, args)[0]
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6), (got - ref).abs().max()


def test_paired_weights_interleave_rows_and_drop_the_partners_copy(monkeypatch, tmp_path):
    """prepare_weights stores the two fp16x1 weights as one: rows in blocks of BLOCK_N / 2,
    first the up projection's then the gate's, then their column exponents the same way; the
    gate's own argument becomes an empty tensor (the kernel reads it through the pair)."""
    import torch
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    s = _big_spec(tmp_path / "sw", "swiglu", M=40, K=24, N=96)
    cand = candidates(s, "cpu", "bf16", [_config("fp16x1", 2, 32)])[0]
    module = load_candidate(cand.source, tmp_path / "paired.py")
    names = [a.name for a in s.args]
    wg, wu = names.index("arg0"), names.index("arg2")
    g = torch.Generator().manual_seed(0)
    weights = {wg: torch.randn(96, 24, generator=g), wu: torch.randn(96, 24, generator=g)}
    out = module.prepare_weights(dict(weights))
    # each weight prepared alone: the same candidate's source without the pairing
    monkeypatch.setenv("KFORGE_BUILTIN_TMA", "1")
    alone = load_candidate(candidates(s, "cpu", "bf16",
                                      [_config("fp16x1", 2, 32, PAIRED=False)])[0].source,
                           tmp_path / "alone.py")
    each = alone.prepare_weights(dict(weights))
    assert out[wg].numel() == 0
    n, k, half = 96, 24, 16
    plane = out[wu][:2 * n * k].view(n // half, 2, half, k)
    assert torch.equal(plane[:, 0].reshape(n, k), each[wu][:n * k].view(n, k))
    assert torch.equal(plane[:, 1].reshape(n, k), each[wg][:n * k].view(n, k))
    exps = out[wu][2 * n * k:].view(n // half, 2, half)
    assert torch.equal(exps[:, 0].reshape(n), each[wu][n * k:])
    assert torch.equal(exps[:, 1].reshape(n), each[wg][n * k:])


def test_other_kernels_run_the_partners_gemm_first(tmp_path):
    """Without the TMA kernel (the interpreter's default, strict's schemes, a pointer tile)
    the partner's GEMM stores its product first and the stage reads it: two GEMM launches,
    each verified against the reference."""
    s = _big_spec(tmp_path / "sw", "swiglu", M=40, K=24, N=96)
    for precision in ("strict", "tf32"):
        cand = candidates(s, "cpu", precision)[0]
        assert not cand.config.get("TMA")
        assert cand.source.count("_gemm[") == 2 and "_p_gemm" in cand.source
        check(cand, s, precision, tmp_path)


@pytest.mark.parametrize("rows,env", [(1024, "0"), (256, None)])
def test_unpaired_products_run_the_stages_tma_tile_one_after_the_other(rows, env, monkeypatch,
                                                                        tmp_path):
    """With KFORGE_BUILTIN_PAIRED=0, or by default at up to 512 rows, the first configuration
    is the single-product TMA tile, and the partner's GEMM runs first with that same tile:
    two persistent GEMMs reading one split pass over A."""
    if env is None:
        monkeypatch.delenv("KFORGE_BUILTIN_PAIRED", raising=False)
    else:
        monkeypatch.setenv("KFORGE_BUILTIN_PAIRED", env)
    s = _big_spec(tmp_path / "sw", "swiglu", M=rows, K=512, N=1024)
    space = config_space(s, "cuda", "bf16")
    first = space[0]
    assert first.get("TMA") and not any(c.get("PAIRED") for c in space)
    src = candidates(s, "cuda", "bf16", [first])[0].source
    assert src.count("_gemm[") == 2 and src.count("for tile in tl.range(pid, ") == 2
    # one split pass over the common A: the stage's GEMM reads the partner's planes
    assert src.count("_split_a[") == 1 and "interleaved" not in src
    assert sum(line.strip().endswith("the partner's planes of this A")
               for line in src.splitlines()) == 1


@pytest.mark.parametrize("precision,scheme", [("bf16", "fp16x1"), ("strict", "fp16x3"),
                                              ("tf32", "fp16x1")])
def test_partners_split_pass_serves_both_products(precision, scheme, tmp_path):
    """Two products of one A under an fp16 scheme, one after the other: one split pass writes
    A's planes and row scales, both GEMMs read them (the second's are the first's tensors),
    and the region still matches the float64 reference (ragged M, N, K)."""
    s = _big_spec(tmp_path / "sw", "swiglu", M=40, K=24, N=96)
    config = next(c for c in config_space(s, "cpu", precision)
                  if c.get("input_precision") == scheme and c.get("SPLIT_K", 1) == 1)
    cand = candidates(s, "cpu", precision, [config])[0]
    src = cand.source
    assert src.count("_gemm[") == 2 and src.count("_split_a[") == 1
    shared = [line.split("=")[0].strip() for line in src.splitlines()
              if line.strip().endswith("the partner's planes of this A")]
    assert len(shared) == 1 and shared[0].endswith("_a16")
    check(cand, s, precision, tmp_path)


def test_paired_tiles_first_on_hopper_and_compile_without_spills(monkeypatch, tmp_path):
    """By default, on sm_90 the paired 128 x 256 tile (128 columns of each product) comes
    first under bf16 at a prefill shape, the single-product tile third (the two products one
    after the other), and it compiles to wgmma with TMA copies, no spills, within the H200's
    shared memory."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    xc = pytest.importorskip("kforge.crosscompile")
    from kforge.targets import get_target
    monkeypatch.delenv("KFORGE_BUILTIN_PAIRED", raising=False)
    s = _big_spec(tmp_path / "sw", "swiglu", M=1024, K=512, N=1024)
    space = config_space(s, "cuda", "bf16")
    first = space[0]
    assert first.get("TMA") and first.get("PAIRED") and first["BLOCK_N"] == 256
    tma = [c for c in space if c.get("TMA")]
    assert [bool(c.get("PAIRED")) for c in tma[:3]] == [True, True, False]
    assert first["EPI_SPLIT"] == 4
    cand = candidates(s, "cuda", "bf16", [first])[0]
    assert cand.source.count("_gemm[") == 1
    reports = xc.compile_candidate(cand.source, s, 90, name="t")
    assert reports and all(r.ok for r in reports), [r.error for r in reports]
    gemm = next(r for r in reports if r.name.endswith("_gemm"))
    assert gemm.mma == "wgmma" and gemm.tma and gemm.spill_stores == 0
    assert gemm.shared_bytes <= get_target("cuda").arch_info.shared_bytes


@pytest.mark.parametrize("scheme", [None, "fp16x1"])
def test_the_warp_specialized_kernel_takes_both_products_of_a_pair(scheme, monkeypatch,
                                                                   tmp_path):
    """KFORGE_BUILTIN_WS=1: SwiGLU's gate and up products by the warp-specialized Gluon kernel
    in one tile (PAIRED: the interleaved weights through one descriptor of 2N rows, 128 columns
    of each product a 128 x 256 tile, N / 128 tiles across), the partner's slice beside the
    product's in the epilogue, fp16x1's column exponents read where the interleaved weight
    keeps them. One kernel, no partner GEMM before it; it compiles for sm_90 to wgmma with
    TMA, without spills. Not run: the interpreter does not run Gluon (the GPU's tune verifies
    it, and ws_ab.py's protocol is test_gluon_ws_protocol's, paired too)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)     # (Gluon has no interpreter)
    pytest.importorskip("triton.backends.nvidia.compiler")
    xc = pytest.importorskip("kforge.crosscompile")
    from kforge.targets import get_target
    monkeypatch.setenv("KFORGE_BUILTIN_WS", "1")
    s = _big_spec(tmp_path / "sw", "swiglu", M=1024, K=512, N=1024)
    space = [c for c in config_space(s, "cuda", "bf16")
             if c.get("input_precision") == scheme]
    first = space[0]
    assert first.get("WS") and first.get("PAIRED") and first["BLOCK_N"] == 256, first
    cand = candidates(s, "cuda", "bf16", [first])[0]
    src = cand.source
    assert "gl.warp_specialize(" in src and "_gemm_p" not in src      # one product kernel
    assert "num_pid_n = 1024 // (BLOCK_N // 2)" in src
    assert "[2048, 512], [512, 1], [BLOCK_N, BLOCK_K]" in src          # both weights' rows
    consumer = src.split("_gemm_consumer(")[1].split("@gluon.jit")[0]
    # slices 0 and 1 are the product's columns, 2 and 3 the partner's same columns
    assert "acc_1_0 = gl.convert_layout(acc_1_0, blk)" in consumer.split("# columns [1")[0]
    assert "rn = pid_n * (BLOCK_N // 2) + 1 * EPI_N" in consumer
    if scheme == "fp16x1":
        assert f"+ {2 * 1024 * 512} + pid_n * BLOCK_N + 3 * EPI_N" in consumer
    reports = xc.compile_candidate(src, s, 90, name="t")
    assert reports and all(r.ok for r in reports), [r.error for r in reports]
    gemm = next(r for r in reports if r.name.endswith("_gemm"))
    assert gemm.mma == "wgmma" and gemm.tma and gemm.spill_stores == 0, gemm
    assert gemm.shared_bytes <= get_target("cuda").arch_info.shared_bytes
    # without the variable: the TMA kernel's paired tiles, as before
    monkeypatch.delenv("KFORGE_BUILTIN_WS")
    assert not any(c.get("WS") for c in config_space(s, "cuda", "bf16"))
