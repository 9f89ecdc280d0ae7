"""kforge.kernels.gemm: every GEMM template under the Triton interpreter (TRITON_INTERPRET=1), on
interpreter-sized shapes, against an fp64 reference; plus the renderer's argument checks.

The H200 measurements behind the defaults are in benchmarks/gemm/NOTES.md (this file only checks
that what is rendered computes the right function)."""
import math

import pytest
import torch

from kforge.kernels.gemm import (DEFAULT_IMPL, IMPLS, PRECISIONS, TMA2_KEYS, config_space,
                                 default_config, default_options, load_source, render_gemm)

SMALL = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
         "num_warps": 4, "num_stages": 2}
# tolerance on max|out - ref| / max|ref|: the interpreter computes low-precision dots in fp32, so
# bf16/fp16 splits show only their representation error
TOL = {"fp16x3": 1e-6, "3xtf32": 1e-6, "tf32x3": 1e-6, "ieee": 1e-6, "tri-bf16x3": 1e-6,
       "tri-bf16x6": 1e-6, "bf16x3": 1e-4, "tf32": 1e-6, "bf16": 2e-2}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _module(**kw):
    kw.setdefault("config", SMALL)
    return load_source(render_gemm("g", **kw), "kf_test_gemm")


def _ref(a, w_nk, bias=None):
    r = a.double() @ w_nk.double().t()
    return r + bias.double() if bias is not None else r


def _relerr(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


CASES = [  # (precision, impl, a_prep, tma, split_k, b_layout)
    ("strict", "fp16x3", "pass", False, 1, "nk"),
    ("strict", "fp16x3", "pass", False, 2, "kn"),
    ("strict", "fp16x3", "pass", True, 1, "nk"),
    ("strict", "3xtf32", "kernel", True, 1, "nk"),
    ("strict", "3xtf32", "kernel", False, 2, "kn"),
    ("strict", "3xtf32", "pass", False, 1, "nk"),
    ("strict", "bf16x3", "pass", False, 1, "nk"),
    ("strict", "bf16x3", "kernel", True, 1, "kn"),
    ("strict", "tf32x3", "kernel", False, 1, "nk"),
    ("strict", "tri-bf16x6", "kernel", False, 1, "nk"),
    ("tf32", "tf32", "kernel", True, 1, "nk"),
    ("tf32", "tf32", "kernel", False, 2, "kn"),
    ("bf16", "bf16", "pass", True, 1, "nk"),
    ("bf16", "bf16", "kernel", False, 2, "nk"),
]


@pytest.mark.parametrize("precision,impl,a_prep,tma,split_k,b_layout", CASES)
def test_gemm_bias_epilogue(precision, impl, a_prep, tma, split_k, b_layout):
    """A 3-d activation, a bias, and every epilogue operand kind, on ragged sizes."""
    mod = _module(precision=precision, impl=impl, a_prep=a_prep, tma=tma, b_layout=b_layout,
                  has_bias=True, epilogue="acc = tl.maximum(acc, 0.0) * s + r[:, None] + t",
                  epilogue_args=[("s", "scalar"), ("r", "row"), ("t", "tile")],
                  config=dict(SMALL, SPLIT_K=split_k))
    g = torch.Generator().manual_seed(7)
    B, S, N, K = 2, 21, 45, 80
    a = torch.rand(B, S, K, generator=g) * 2 - 1
    w = (torch.rand(N, K, generator=g) * 2 - 1) / math.sqrt(K)
    bias = torch.rand(N, generator=g) - 0.5
    r = torch.rand(B * S, generator=g)
    t = torch.rand(B, S, N, generator=g)
    w_in = w if b_layout == "nk" else w.t().contiguous()
    a0, w0 = a.clone(), w_in.clone()
    pw = mod.prepare_weights({1: w_in})[1]
    out, = mod.launch(a, pw, bias, 1.5, r, t)
    assert out.shape == (B, S, N) and out.dtype == torch.float32
    assert torch.equal(a, a0) and torch.equal(w_in, w0)          # inputs untouched
    ref = torch.relu(_ref(a, w, bias)) * 1.5 + r.double().reshape(B, S, 1) + t.double()
    assert torch.isfinite(out).all()
    assert _relerr(out, ref) < TOL[impl]


@pytest.mark.parametrize("impl", ["fp16x3", "3xtf32", "bf16x3"])
def test_strict_odd_k_and_default_config(impl):
    """K not a multiple of BLOCK_K (masked tail, TMA falls back to the pointer kernel)."""
    mod = _module(precision="strict", impl=impl, tma=True)
    g = torch.Generator().manual_seed(3)
    a = torch.rand(33, 37, generator=g) * 2 - 1
    w = torch.rand(19, 37, generator=g) * 2 - 1
    out, = mod.launch(a, mod.prepare_weights({1: w})[1])
    assert _relerr(out, _ref(a, w)) < TOL[impl]


@pytest.mark.parametrize("scale_a,scale_w", [(1e-20, 1e-15), (1e15, 1e18), (None, None)])
def test_fp16x3_scaling_keeps_range(scale_a, scale_w):
    """fp16x3 scales rows/columns by powers of two: tiny, huge and mixed magnitudes stay exact."""
    mod = _module(precision="strict", impl="fp16x3")
    g = torch.Generator().manual_seed(11)
    a = torch.rand(40, 64, generator=g) * 2 - 1
    w = torch.rand(24, 64, generator=g) * 2 - 1
    if scale_a is None:                     # element-wise magnitudes over 6 decades, a zero row
        a = a * 10 ** (torch.rand(40, 64, generator=g) * 6 - 3)
        w = w * 10 ** (torch.rand(24, 64, generator=g) * 6 - 3)
        a[5] = 0
    else:
        a, w = a * scale_a, w * scale_w
    out, = mod.launch(a, mod.prepare_weights({1: w})[1])
    assert torch.isfinite(out).all()
    assert _relerr(out, _ref(a, w)) < 1e-6


def test_arg_order_and_weight_index():
    mod = _module(precision="tf32", has_bias=True, arg_order=["bias", "a", "b"])
    assert mod.B_INDEX == 2
    g = torch.Generator().manual_seed(1)
    a, w, b = torch.rand(20, 32, generator=g), torch.rand(16, 32, generator=g), torch.rand(16, generator=g)
    pw = mod.prepare_weights({2: w})[2]
    out, = mod.launch(b, a, pw)
    assert _relerr(out, _ref(a, w, b)) < 1e-6


def test_render_rejects_bad_input():
    with pytest.raises(ValueError):
        render_gemm("g", precision="fp8")
    with pytest.raises(ValueError):
        render_gemm("g", precision="tf32", impl="3xtf32")
    with pytest.raises(ValueError):
        render_gemm("g", epilogue_args=[("acc", "col")])
    with pytest.raises(ValueError):
        render_gemm("g", epilogue_args=[("x", "matrix")])
    with pytest.raises(ValueError):
        render_gemm("not an identifier")


def test_config_spaces_and_defaults():
    keys = {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages"}
    for precision in PRECISIONS:
        assert default_options(precision)["impl"] == DEFAULT_IMPL[precision]
        for impl in IMPLS[precision]:
            for tma in (False, True):
                for M in (None, 256, 4096):
                    # only the bf16 persistent configs may carry the tma2 kernel's keys
                    allowed = ({frozenset(keys), frozenset(keys | set(TMA2_KEYS))}
                               if (impl, tma) == ("bf16", True) else {frozenset(keys)})
                    space = config_space(precision, impl, M, tma=tma)
                    assert space and all(frozenset(c) in allowed for c in space)
                    assert frozenset(default_config(precision, impl, M, 8192, 8192, tma=tma)) in allowed
    assert any(c["SPLIT_K"] > 1 for c in config_space("strict", M=256))
    src = render_gemm("g")
    assert "autotune" not in src and "def launch(" in src and "def prepare_weights(" in src


TMA2 = {"EPI_SPLIT": 2, "A_FP32": False, "WS": False}


@pytest.mark.parametrize("epi_split,a_fp32,split_k,ws", [
    (1, False, 1, False), (2, True, 1, False), (4, False, 1, True), (2, True, 3, False),
    (1, True, 2, True), (4, False, 2, False)])
def test_bf16_tma2_kernel(epi_split, a_fp32, split_k, ws):
    """The bf16 scheme's second persistent kernel (in-kernel descriptors, A cast by the pass or in
    registers, split-K work items, epilogue column slices stored by TMA): ragged M, every epilogue
    operand kind, against float64. K, N multiples of 8 and 4 (the descriptors' 16-byte rule)."""
    mod = _module(precision="bf16", impl="bf16", tma=True, has_bias=True,
                  epilogue="acc = tl.maximum(acc, 0.0) * s + r[:, None] + t",
                  epilogue_args=[("s", "scalar"), ("r", "row"), ("t", "tile")])
    cfg = dict(SMALL, BLOCK_N=64 if epi_split == 4 else 32, SPLIT_K=split_k, EPI_SPLIT=epi_split,
               A_FP32=a_fp32, WS=ws)
    g = torch.Generator().manual_seed(5)
    B, S, N, K = 3, 15, 92, 112
    a = torch.rand(B, S, K, generator=g) * 2 - 1
    w = (torch.rand(N, K, generator=g) * 2 - 1) / math.sqrt(K)
    bias = torch.rand(N, generator=g) - 0.5
    r = torch.rand(B * S, generator=g)
    t = torch.rand(B, S, N, generator=g)
    pw = mod.prepare_weights({1: w})[1]
    assert pw.dtype == torch.bfloat16
    out, kernels = mod._run((a, pw, bias, 1.5, r, t), cfg)
    # the pass runs only when A is not cast in the kernel; split-K adds the reduce kernel
    assert len(kernels) == 1 + (not a_fp32) + (split_k > 1)
    ref = torch.relu(_ref(a, w, bias)) * 1.5 + r.double().reshape(B, S, 1) + t.double()
    assert out.shape == (B, S, N) and torch.isfinite(out).all()
    assert _relerr(out, ref) < TOL["bf16"]


def test_bf16_tma2_falls_back_when_rows_unaligned():
    """N % 4 != 0 (fp32 output rows not 16-byte multiples): the tma2 config runs the pointer path."""
    mod = _module(precision="bf16", impl="bf16", tma=True)
    g = torch.Generator().manual_seed(9)
    a = torch.rand(20, 48, generator=g) * 2 - 1
    w = torch.rand(30, 48, generator=g) * 2 - 1
    out, kernels = mod._run((a, mod.prepare_weights({1: w})[1]), dict(SMALL, **TMA2))
    assert _relerr(out, _ref(a, w)) < TOL["bf16"]


@pytest.mark.parametrize("M", [None, 64, 300])
def test_bf16_default_configs_run(M):
    """The bf16 policy's defaults (tma2 configs for every shape class) under the interpreter."""
    cfg = default_config("bf16", M=M, N=64, K=96)
    assert "EPI_SPLIT" in cfg and not cfg["WS"]
    mod = _module(precision="bf16", has_bias=True, epilogue="acc = tl.maximum(acc, 0.0)", config=cfg)
    g = torch.Generator().manual_seed(13)
    a = torch.rand(M or 40, 96, generator=g) * 2 - 1
    w = (torch.rand(64, 96, generator=g) * 2 - 1) / math.sqrt(96)
    bias = torch.rand(64, generator=g) - 0.5
    out, = mod.launch(a, mod.prepare_weights({1: w})[1], bias)
    assert _relerr(out, torch.relu(_ref(a, w, bias))) < TOL["bf16"]
