"""kforge.kernels.attention: the generated flash-attention kernel under the Triton interpreter
(TRITON_INTERPRET=1) against a float64 reference, every feature alone and combined; values of
another head dim than queries and keys (multi-head latent attention), down to the builtin
provider's verified kernel; the pure-torch reference against torch's SDPA; and the KForge rules
(static checks, launch computes nothing with torch, every output element written).

Sizes are interpreter-sized and deliberately odd (not multiples of the 16x16 test tiles)."""
from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():                 # before triton is imported (conftest does too)
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch.nn.functional as F  # noqa: E402

from kforge.kernels.attention import (HEAD_DIMS, VALUE_HEAD_DIMS,  # noqa: E402
                                      attention_configs, attention_source, load_source,
                                      reference_attention)
from kforge.verify.static import static_check  # noqa: E402

TORCH_DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SMALL = dict(block_m=16, block_n=16, num_warps=4, num_stages=1)
TOL = {"fp32": 1e-4, "bf16": 1e-2, "fp16": 1e-2}


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _poisoned_empty(monkeypatch):
    """torch.empty_like and Tensor.new_empty (the output of values of another head dim) return
    NaN-filled memory (as in KForge's sandbox): unwritten output shows."""
    def poison(original):
        def poisoned(*a, **kw):
            t = original(*a, **kw)
            if t.is_floating_point():
                t.fill_(float("nan"))
            return t
        return poisoned
    monkeypatch.setattr(torch, "empty_like", poison(torch.empty_like))
    monkeypatch.setattr(torch.Tensor, "new_empty", poison(torch.Tensor.new_empty))


def _module(**kw):
    opts = dict(SMALL, interpret=True)
    opts.update(kw)
    return load_source(attention_source(**opts), "kf_test_attention")


def _inputs(B, Hq, Hkv, Sq, Skv, D, dtype="fp32", seed=0, Dv=None):
    g = torch.Generator().manual_seed(seed)
    dt = TORCH_DT[dtype]
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dt)
    k = torch.randn(B, Hkv, Skv, D, generator=g).to(dt)
    v = torch.randn(B, Hkv, Skv, D if Dv is None else Dv, generator=g).to(dt)
    return q, k, v


def _assert_close(out, ref, tol):
    """|out - ref| <= tol * max(1, RMS(ref)) + tol * |ref| (KForge's comparison), NaN exactly
    where ref has NaN."""
    out = out.double()
    assert out.shape == ref.shape
    nan_ref = torch.isnan(ref)
    assert torch.equal(torch.isnan(out), nan_ref), "NaN pattern differs from the reference"
    o, r = out[~nan_ref], ref[~nan_ref]
    if r.numel() == 0:
        return
    scale = max(1.0, r.pow(2).mean().sqrt().item())
    err = (o - r).abs()
    bound = tol * scale + tol * r.abs()
    bad = err > bound
    assert not bad.any(), (f"{int(bad.sum())} of {r.numel()} elements off; max err "
                           f"{err.max().item():.3g} (tol {tol})")


def _run(q, k, v, *, mask=None, sinks=None, causal=False, window=None, scale=None,
         dtype="fp32", dot_precision="ieee", tol=None, masked_rows="zero", **src_kw):
    mod = _module(head_dim=q.shape[-1], value_head_dim=v.shape[-1], causal=causal,
                  window=window, scale=scale,
                  mask=None if mask is None else ("bool" if mask.dtype == torch.bool
                                                  else "additive"),
                  sinks=sinks is not None, gqa_group=q.shape[1] // k.shape[1], dtype=dtype,
                  dot_precision=dot_precision, masked_rows=masked_rows, **src_kw)
    args = [q, k, v] + ([mask] if mask is not None else []) + ([sinks] if sinks is not None else [])
    (out,) = mod.launch(*args)
    assert out.dtype == q.dtype and out.shape == q.shape[:3] + v.shape[3:]
    ref = reference_attention(q.double(), k.double(), v.double(),
                              mask=None if mask is None else
                              (mask if mask.dtype == torch.bool else mask.double()),
                              causal=causal, window=window, scale=scale,
                              sinks=None if sinks is None else sinks.double(),
                              masked_rows=masked_rows)
    _assert_close(out, ref, TOL[dtype] if tol is None else tol)
    return out, ref


# ------------------------------------------------------------------------------------------------
# every feature alone, fp32 "ieee" at 1e-4 against float64
# (B, Hq, Hkv, Sq, Skv, D, options)
FEATURES = {
    "plain": ((2, 2, 2, 37, 45, 32), {}),
    "causal_square": ((2, 2, 2, 37, 37, 32), dict(causal=True)),
    "causal_kv_cache": ((1, 2, 2, 13, 50, 32), dict(causal=True)),           # Sq < Skv
    "causal_sq_gt_skv": ((1, 2, 2, 40, 21, 32), dict(causal=True)),   # first rows see nothing
    "window_only": ((1, 2, 2, 33, 47, 32), dict(window=9)),
    "causal_window": ((1, 2, 2, 41, 41, 32), dict(causal=True, window=7)),
    "causal_window_wide": ((1, 2, 2, 19, 60, 32), dict(causal=True, window=35)),
    "sinks": ((2, 3, 3, 21, 29, 32), dict(sinks=True)),
    "gqa": ((2, 8, 2, 19, 33, 32), {}),
    "gqa_packed": ((2, 8, 2, 19, 33, 32), dict(pack_gqa=True)),
    "gqa_packed_causal": ((1, 6, 2, 11, 23, 32), dict(pack_gqa=True, causal=True)),
    "scale": ((1, 2, 2, 17, 23, 32), dict(scale=0.37)),
    "d16": ((1, 2, 2, 17, 23, 16), {}),
    "d80_padded": ((1, 2, 2, 17, 23, 80), dict(causal=True)),
    "d96_padded": ((1, 2, 2, 17, 23, 96), {}),
    "d128": ((1, 1, 1, 17, 23, 128), {}),
    "tiles_32x16": ((1, 2, 2, 37, 45, 32), dict(block_m=32, block_n=16, causal=True)),
    "tiles_16x32": ((1, 2, 2, 37, 45, 32), dict(block_m=16, block_n=32, causal=True, window=20)),
    "fp32_dot_fma": ((1, 2, 2, 17, 23, 32), dict(fp32_dot="ieee", causal=True)),
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_feature_fp32(name):
    shape, opts = FEATURES[name]
    opts = dict(opts)
    B, Hq, Hkv, Sq, Skv, D = shape
    q, k, v = _inputs(B, Hq, Hkv, Sq, Skv, D)
    sinks = None
    if opts.pop("sinks", False):
        sinks = torch.randn(Hq, generator=torch.Generator().manual_seed(5))
    _run(q, k, v, sinks=sinks, **opts)


# ------------------------------------------------------------------------------------------------
# masks: bool and additive, broadcast over batch / head / query dims (stride 0, not materialized)
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("mshape", ["B1QK", "1HQK", "QK", "B11K", "BHQK"])
def test_masks_broadcast(kind, mshape):
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 19, 27, 32
    q, k, v = _inputs(B, Hq, Hkv, Sq, Skv, D, seed=1)
    dims = {"B1QK": (B, 1, Sq, Skv), "1HQK": (1, Hq, Sq, Skv), "QK": (Sq, Skv),
            "B11K": (B, 1, 1, Skv), "BHQK": (B, Hq, Sq, Skv)}[mshape]
    g = torch.Generator().manual_seed(2)
    keep = torch.rand(dims, generator=g) > 0.3
    if mshape == "B11K":
        keep[1] = False                       # a fully padded batch element: every row empty
    else:
        keep[..., 3, :] = False               # a query row with no key
    if kind == "bool":
        mask = keep
    else:
        mask = torch.where(keep, torch.randn(dims, generator=g), torch.tensor(float("-inf")))
    out, ref = _run(q, k, v, mask=mask, causal=(mshape == "BHQK"))
    empty = ~(reference_attention(q.double(), k.double(), v.double(), mask=keep,
                                  causal=(mshape == "BHQK")).ne(0).any(-1))
    assert empty.any() and out[empty].eq(0).all()      # empty rows are exactly 0


def test_additive_mask_low_precision_and_finfo_min():
    """transformers' eager masks: finfo.min (finite) — a row of only finfo.min averages v like
    torch does; a bf16 additive mask on fp32 inputs is widened in the kernel."""
    B, Hq, Sq, Skv, D = 1, 2, 13, 21, 32
    q, k, v = _inputs(B, Hq, Hq, Sq, Skv, D, seed=3)
    keep = torch.rand(Sq, Skv, generator=torch.Generator().manual_seed(4)) > 0.4
    keep[5] = False
    mn = torch.finfo(torch.float32).min
    mask = torch.where(keep, torch.tensor(0.0), torch.tensor(mn))[None, None]
    out, _ = _run(q, k, v, mask=mask)
    torch.testing.assert_close(out[:, :, 5], v.mean(dim=2), atol=1e-5, rtol=1e-5)
    sd = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double())
    _assert_close(out, sd, 1e-4)
    _run(q, k, v, mask=torch.where(keep, 0.0, float("-inf")).to(torch.bfloat16))


def test_masked_rows_nan():
    q, k, v = _inputs(1, 2, 2, 30, 17, 32, seed=6)
    out, _ = _run(q, k, v, causal=True, masked_rows="nan")
    assert torch.isnan(out[:, :, :13]).all() and not torch.isnan(out[:, :, 13:]).any()
    # with sinks an empty row is 0 either way
    s = torch.randn(2)
    out, _ = _run(q, k, v, causal=True, sinks=s, masked_rows="nan")
    assert out[:, :, :13].eq(0).all()


# ------------------------------------------------------------------------------------------------
# decode (Sq = 1), combinations, layouts
@pytest.mark.parametrize("pack", [False, True])
def test_decode(pack):
    B, Hq, Hkv, Skv, D = 3, 8, 2, 53, 64
    q, k, v = _inputs(B, Hq, Hkv, 1, Skv, D, seed=7)
    sinks = torch.randn(Hq)
    _run(q, k, v, causal=True, sinks=sinks, pack_gqa=pack)
    _run(q, k, v, causal=True, window=20, pack_gqa=pack)
    pad = torch.ones(B, 1, 1, Skv, dtype=torch.bool)
    pad[0, ..., :10] = False                     # left padding of batch 0
    _run(q, k, v, mask=pad, pack_gqa=pack)


@pytest.mark.parametrize("window", [None, 1, 15, 16, 17, 33])
@pytest.mark.parametrize("pack", [False, True])
def test_band_boundaries_sweep(window, pack):
    """Causal/window band edges falling on, before and after 16-key block boundaries, for
    Sq == Skv, Sq < Skv, Sq > Skv and decoding: the split into masked and unmasked key blocks
    must never drop or add a key."""
    mod = _module(head_dim=16, causal=True, window=window, gqa_group=2, pack_gqa=pack)
    for Sq, Skv in [(33, 33), (16, 48), (17, 49), (15, 47), (40, 17), (1, 35), (32, 32), (5, 64),
                    (3, 17), (18, 48)]:
        q, k, v = _inputs(1, 2, 1, Sq, Skv, 16, seed=Sq * 100 + Skv)
        (out,) = mod.launch(q, k, v)
        ref = reference_attention(q.double(), k.double(), v.double(), causal=True, window=window)
        _assert_close(out, ref, 1e-4)


COMBOS = [  # (B, Hq, Hkv, Sq, Skv, D), causal, window, mask, sinks, pack, dtype, dot
    ((2, 4, 2, 23, 37, 32), True, 11, None, True, False, "fp32", "ieee"),
    ((2, 4, 2, 23, 37, 32), True, 11, "bool", True, True, "fp32", "ieee"),
    ((1, 6, 2, 17, 29, 80), True, 9, "additive", True, False, "fp32", "ieee"),
    ((2, 4, 1, 5, 31, 64), True, 16, "bool", True, True, "fp32", "tf32"),
    ((1, 4, 2, 23, 37, 32), True, 11, None, True, False, "bf16", "bf16"),
    ((1, 4, 2, 23, 37, 80), True, 11, "bool", True, True, "bf16", "bf16"),
    ((1, 4, 2, 23, 37, 32), True, 11, "additive", True, False, "bf16", "ieee"),
    ((1, 4, 2, 23, 37, 32), True, None, None, True, False, "fp16", "bf16"),
    ((1, 4, 2, 23, 37, 64), False, None, "bool", False, False, "fp16", "tf32"),
    ((1, 4, 4, 23, 37, 32), True, 11, None, True, False, "fp32", "bf16"),
]


@pytest.mark.parametrize("case", COMBOS, ids=lambda c: "-".join(str(x) for x in c[1:]))
def test_combined(case):
    shape, causal, window, mkind, has_sinks, pack, dtype, dot = case
    B, Hq, Hkv, Sq, Skv, D = shape
    q, k, v = _inputs(B, Hq, Hkv, Sq, Skv, D, dtype=dtype, seed=8)
    g = torch.Generator().manual_seed(9)
    mask = None
    if mkind:
        keep = torch.rand(B, 1, Sq, Skv, generator=g) > 0.25
        mask = keep if mkind == "bool" else torch.where(
            keep, torch.randn(B, 1, Sq, Skv, generator=g), float("-inf")).to(TORCH_DT[dtype])
    sinks = torch.randn(Hq, generator=g).to(TORCH_DT[dtype]) if has_sinks else None
    tol = 1e-2 if (dtype != "fp32" or dot == "bf16") else (1e-4 if dot == "ieee" else 1e-3)
    _run(q, k, v, mask=mask, sinks=sinks, causal=causal, window=window, dtype=dtype,
         dot_precision=dot, pack_gqa=pack, tol=tol)


def test_bf16_policy_rounds_operands():
    """dot_precision="bf16" on fp32 inputs really rounds q/k/v/p to bf16 (interpreter emulation):
    within 1e-2 of exact but measurably off, while "ieee" is within 1e-6."""
    q, k, v = _inputs(1, 2, 2, 33, 41, 64, seed=10)
    out_bf, ref = _run(q, k, v, causal=True, dot_precision="bf16", tol=1e-2)
    out_ie, _ = _run(q, k, v, causal=True, dot_precision="ieee", tol=1e-6)
    assert (out_bf.double() - ref).abs().max() > 1e-4


def test_bf16_outputs_round_to_nearest_in_the_interpreter():
    """bf16 q, k, v with fp32 ("ieee") dots: every output element is the exact result rounded
    to the nearest bf16, up to the fp32 arithmetic before it. The interpreter's own fp32 to bf16
    conversion truncates (a bf16 Mixtral's attention, strict before the router, was a bf16 ulp
    off on one element and fell back to the reference); a GPU's rounds to nearest even."""
    q, k, v = _inputs(1, 2, 2, 33, 41, 64, dtype="bf16", seed=11)
    out, ref = _run(q, k, v, causal=True, dtype="bf16", dot_precision="ieee", tol=1e-2)
    half_ulp = ref.abs() * 2.0 ** -8          # bf16's spacing is at most 2^-7 |x|
    err = (out.double() - ref).abs()
    nearest = (out.double() - ref.bfloat16().double()).abs()
    assert (nearest == 0).float().mean() > 0.99, float((nearest == 0).float().mean())
    assert bool((err <= half_ulp * 1.01 + 1e-6).all()), float((err / half_ulp).max())


def test_fp16x3_scheme_keeps_the_scores_fp32_grade():
    """dot_precision="fp16x3": q@k^T as three fp16 products of hi/lo splits, one fp16 p@v.
    bf16-rounded scores miss 1e-2 already at unit scale and grow with the scores' spread; with
    fp16x3 only P's and V's fp16 rounding is left: about 1e-3 at every scale, and more than the
    fp32 "ieee" scheme's (the rounding is really applied)."""
    for mult in (1, 6):
        q, k, v = _inputs(1, 4, 2, 33, 41, 64, seed=11)
        q, k = q * mult, k * mult
        out, ref = _run(q, k, v, causal=True, dot_precision="fp16x3", tol=2e-3)
        err = (out.double() - ref).abs().max().item()
        assert 1e-4 < err < 2e-3
        out_bf, _ = _run(q, k, v, causal=True, dot_precision="bf16", tol=1.0)
        assert (out_bf.double() - ref).abs().max().item() > 10 * err
    with pytest.raises(ValueError, match="fp32"):
        attention_source(head_dim=64, dtype="bf16", dot_precision="fp16x3")


@pytest.mark.parametrize("name", ["causal_square", "sinks", "gqa_packed_causal",
                                  "causal_window", "d80_padded", "tiles_16x32",
                                  "causal_sq_gt_skv"])
def test_fp16x1_scheme_on_every_feature(name):
    """dot_precision="fp16x1": one fp16 product each for q@k^T and p@v on power-of-two-scaled
    operands (q per row, k per key, v per column over all keys; k and v scaled by two kernels
    before the attention kernel), the scales undone on the fp32 scores and on the output:
    tf32-grade (11 significant bits) wherever the features put
    their masks, sinks, GQA packing and padding."""
    shape, opts = FEATURES[name]
    q, k, v = _inputs(*shape, seed=12)
    sinks = torch.randn(q.shape[1]) if opts.get("sinks") else None
    out, ref = _run(q, k, v, sinks=sinks, dot_precision="fp16x1", tol=2e-3,
                    **{k_: v_ for k_, v_ in opts.items() if k_ != "sinks"})
    assert (out.double() - ref).abs().max().item() > 1e-6      # the rounding is applied
    # k and v are scaled once before the kernel (prepared fp16 copies), not in every tile
    src = attention_source(head_dim=shape[5], dtype="fp32", dot_precision="fp16x1")
    assert "PREP_KV = True" in src and "_prep_v16[" in src
    assert "PREP_KV = False" in attention_source(head_dim=shape[5], dtype="fp32",
                                                 dot_precision="fp16x1", kv_append=True)


def test_fp16x1_values_narrower_than_keys():
    """Values of their own head dim (DeepSeek's latent attention: 48 against keys' 32, padded to
    64): the prepared v copy, its column factors and the output are Dv wide."""
    q, k, v = _inputs(1, 4, 2, 19, 27, 32, seed=14, Dv=48)
    out, _ = _run(q, k, v, causal=True, dot_precision="fp16x1", tol=2e-3)
    assert out.shape == (1, 4, 19, 48)


def test_fp16x1_scales_keep_operands_fp16_cannot_hold():
    """Rows of q, keys and value columns far outside fp16's range (1e6, 1e-6: unscaled they
    would overflow to inf or vanish into subnormals): the power-of-two scales keep each within
    fp16 at 11 significant bits and the result at the tf32 grade; a missing or wrong scale is
    off by powers of two."""
    q, k, v = _inputs(1, 2, 2, 33, 40, 32, seed=13)
    q[:, :, ::2] *= 1e-5           # rows of q (fp16 subnormals unscaled)
    q[:, :, 1::2] *= 1e-3
    k[:, :, ::3] *= 1e3            # keys: the scores stay near 1 (11-bit operands give scores
    #                                of 1e4 an absolute error of about 2, as TF32 would)
    v[..., ::2] *= 1e6             # value columns (over fp16's 65504 unscaled)
    v[..., 1::2] *= 1e-6
    out, ref = _run(q, k, v, causal=True, dot_precision="fp16x1", tol=2e-3)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="fp32"):
        attention_source(head_dim=64, dtype="bf16", dot_precision="fp16x1")


def test_strided_layouts():
    """q/k/v as transformers hands them ([B, S, H, D] transposed to [B, H, S, D]); out follows q's
    layout; k/v as a slice of a larger KV cache."""
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 9, 30, 32
    g = torch.Generator().manual_seed(11)
    q = torch.randn(B, Sq, Hq, D, generator=g).transpose(1, 2)
    cache_k = torch.randn(B, Hkv, 64, D, generator=g)
    cache_v = torch.randn(B, Hkv, 64, D, generator=g)
    k, v = cache_k[:, :, :Skv], cache_v[:, :, :Skv]
    out, _ = _run(q, k, v, causal=True)
    assert out.stride() == q.stride()


def test_one_source_many_shapes():
    """Shapes are read at run time: one loaded module serves several B/Sq/Skv."""
    mod = _module(head_dim=32, causal=True, sinks=True, gqa_group=2)
    for B, Sq, Skv in [(1, 1, 7), (2, 16, 16), (3, 19, 40), (1, 33, 17)]:
        q, k, v = _inputs(B, 4, 2, Sq, Skv, 32, seed=B + Sq)
        s = torch.randn(4)
        (out,) = mod.launch(q, k, v, s)
        ref = reference_attention(q.double(), k.double(), v.double(), causal=True,
                                  sinks=s.double())
        _assert_close(out, ref, 1e-4)


def test_launch_argument_checks():
    mod = _module(head_dim=32, gqa_group=2)
    q, k, v = _inputs(1, 4, 2, 5, 7, 32)
    with pytest.raises(ValueError, match="query heads"):
        mod.launch(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="head dim"):
        mod.launch(q[..., :16], k[..., :16], v[..., :16])
    with pytest.raises(ValueError, match="head dims must be 32 .q, k. and 32 .v."):
        mod.launch(q, k, v[..., :16])
    with pytest.raises(ValueError, match="must be"):
        mod.launch(q.double(), k.double(), v.double())
    latent = _module(head_dim=32, value_head_dim=16, gqa_group=2)
    with pytest.raises(ValueError, match="and 16 .v."):
        latent.launch(q, k, v)


# ------------------------------------------------------------------------------------------------
# values of another head dim than queries and keys: multi-head latent attention (DeepSeek-V3's
# queries and keys are 192 wide, 128 without and 64 with rotary embedding; its values 128)
# (B, Hq, Hkv, Sq, Skv, D, Dv, options)
LATENT = {
    "d16_v8_causal": ((2, 2, 2, 19, 19, 16, 8), dict(causal=True)),
    "d16_v8_gqa_bool": ((1, 4, 2, 17, 23, 16, 8), dict(mask="bool")),
    "d16_v8_gqa_packed_additive": ((1, 4, 2, 17, 23, 16, 8),
                                   dict(mask="additive", pack_gqa=True, causal=True)),
    "d64_v32_causal_gqa": ((1, 4, 1, 21, 30, 64, 32), dict(causal=True)),
    "d64_v32_bool_causal": ((2, 2, 2, 13, 13, 64, 32), dict(mask="bool", causal=True)),
    "d64_v32_additive_window_sinks": ((1, 4, 2, 13, 29, 64, 32),
                                      dict(mask="additive", window=9, sinks=True)),
    "d32_v64_wider_values": ((1, 2, 2, 9, 21, 32, 64), dict(mask="bool")),
    "d192_v128_causal_gqa": ((1, 2, 1, 9, 21, 192, 128), dict(causal=True)),
    "d192_v128_bf16": ((1, 2, 2, 9, 21, 192, 128),
                       dict(causal=True, dtype="bf16", dot_precision="bf16")),
    "d256": ((1, 1, 1, 9, 21, 256, 256), dict(causal=True)),
    # widths off the cross-compiled list, padded in the kernel: MobileViT-S's 36, a tiny
    # config's 6 and 4
    "d36_causal": ((1, 4, 4, 11, 11, 36, 36), dict(causal=True)),
    "d6_bool": ((2, 2, 1, 9, 13, 6, 6), dict(mask="bool")),
    "d4_v6_additive": ((1, 2, 2, 7, 10, 4, 6), dict(mask="additive")),
}


@pytest.mark.parametrize("name", list(LATENT))
def test_values_of_another_head_dim(name):
    """out is [B, Hq, Sq, Dv] (every element written: the allocation is poisoned), v's tiles
    padded to a power of two of their own; a query row with no key kept is 0."""
    (B, Hq, Hkv, Sq, Skv, D, Dv), opts = LATENT[name]
    opts = dict(opts)
    dtype, mkind = opts.pop("dtype", "fp32"), opts.pop("mask", None)
    q, k, v = _inputs(B, Hq, Hkv, Sq, Skv, D, dtype, seed=14, Dv=Dv)
    g = torch.Generator().manual_seed(15)
    mask = None
    if mkind:
        keep = torch.rand(B, 1, Sq, Skv, generator=g) > 0.3
        keep[..., 3, :] = False
        mask = keep if mkind == "bool" else torch.where(
            keep, torch.randn(B, 1, Sq, Skv, generator=g), float("-inf")).to(TORCH_DT[dtype])
    sinks = torch.randn(Hq, generator=g) if opts.pop("sinks", False) else None
    out, ref = _run(q, k, v, mask=mask, sinks=sinks, dtype=dtype, **opts)
    assert out.shape == (B, Hq, Sq, Dv)
    if mkind and sinks is None:
        assert out[:, :, 3].eq(0).all()
    assert static_check(attention_source(head_dim=D, value_head_dim=Dv)) == []


def test_values_of_another_head_dim_in_the_source():
    """The launch allocates out [B, Hq, Sq, Dv] itself (empty_like(q) where Dv = D), the header
    names both head dims, and an unsupported one is refused."""
    src = attention_source(head_dim=192, value_head_dim=128)
    assert "HEAD_DIM_V = 128" in src and "BLOCK_DV = 128" in src and "BLOCK_D = 256" in src
    assert "D=192, Dv=128" in src and "v [B, Hkv, Skv, Dv]" in src
    assert "q.new_empty((B, HQ, SQ, HEAD_DIM_V))" in src and "empty_like" not in src
    same = attention_source(head_dim=64)
    assert "torch.empty_like(q)" in same and "new_empty" not in same and "Dv=" not in same
    assert "BLOCK_DV = 16" in attention_source(head_dim=16, value_head_dim=8)
    assert "BLOCK_D = 64" in attention_source(head_dim=48, value_head_dim=8)     # padded
    for bad in (dict(head_dim=64, value_head_dim=0), dict(head_dim=0), dict(head_dim=320)):
        with pytest.raises(ValueError, match="head_dim"):
            attention_source(**bad)


def _attention_region(q, k, v, is_causal=True, dtype="f32"):
    """The one-op region the import makes of an SDPA call (kforge.kernel_fallbacks.promote)."""
    from kforge.kernel_fallbacks import promote
    from kforge.spec import load_host_plan

    names = ["q", "k", "v"]
    plan = load_host_plan({
        "schema": "kforge.host-plan", "version": 1, "function": "main",
        "inputs": [{"name": n, "shape": list(s), "dtype": dtype, "weight": None}
                   for n, s in zip(names, (q, k, v))],
        "values": [{"name": "out", "shape": list(q[:3]) + [v[3]], "dtype": dtype}],
        "steps": [{"op": "fallback", "name": "aten.scaled_dot_product_attention",
                   "args": [{"tensor": 0}, {"tensor": 1}, {"tensor": 2}, None, 0.0, is_causal],
                   "operands": names, "results": ["out"]}],
        "outputs": ["out"]})
    _, (spec,) = promote(plan)
    return spec


def test_builtin_provider_verifies_latent_attention():
    """The builtin writes a kernel for an SDPA region whose values are narrower than its queries
    and keys, and the real verifier accepts it; a value head dim the kernel has no tile for is
    refused with the reason."""
    from kforge.providers.base import GenerationRequest
    from kforge.providers.builtin import BuiltinProvider, candidates
    from kforge.verify.verifier import verify_candidate

    spec = _attention_region((2, 4, 8, 16), (2, 4, 8, 16), (2, 4, 8, 8))
    cand = candidates(spec, "cpu", "strict")[0]
    assert "HEAD_DIM = 16" in cand.source and "HEAD_DIM_V = 8" in cand.source
    record = verify_candidate(spec, cand, "cpu", "strict")
    assert record.status == "verified", (record.reason, record.message)
    # DeepSeek-V3's geometry on the GPU: every configuration renders
    big = _attention_region((1, 16, 256, 192), (1, 16, 256, 192), (1, 16, 256, 128))
    for policy in ("strict", "tf32", "bf16"):
        cands = candidates(big, "cuda", policy)
        assert cands and all(static_check(c.source) == [] for c in cands)
    # any width up to 256 is taken (padded); wider ones are refused with the reason
    assert candidates(_attention_region((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 12)),
                      "cpu", "strict")
    wide = _attention_region((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 320))
    req = GenerationRequest(wide, "", "", "strict", "cpu", "functional", 0)
    assert "value head dim 320" in BuiltinProvider().unsupported(req)


def test_deepseek_v3_attention_compiles_for_sm90(tmp_path, repo_root):
    """The builtin's first kernel for DeepSeek-V3's attention (bf16, queries and keys 192 wide,
    values 128, causal prefill) compiled for the H200 with the real Triton compiler and ptxas:
    wgmma, no spills, within the 227 KB of shared memory (the other configurations of
    attention_configs for wide heads were checked the same way). In a process of its own: in
    one that imported triton for the interpreter, the real compile of this kernel fails at
    tl.cdiv (Triton 3.9), a jit helper bound to the interpreter at import."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from kforge.providers.builtin import candidates
    from kforge.spec import to_json

    spec = _attention_region((1, 16, 512, 192), (1, 16, 512, 192), (1, 16, 512, 128),
                             dtype="bf16")
    to_json(spec, tmp_path / "spec.json")
    (tmp_path / "kernel.py").write_text(candidates(spec, "cuda", "bf16")[0].source)
    code = (f"import json, pathlib; from kforge.crosscompile import compile_candidate; "
            f"from kforge.spec import load_spec; d = pathlib.Path({str(tmp_path)!r}); "
            f"r = compile_candidate((d / 'kernel.py').read_text(), load_spec(d / 'spec.json'), "
            f"90, name='deepseek_v3_attention'); print(json.dumps([x.to_json() for x in r]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root / "python")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (report,) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["mma"] == "wgmma", report["error"]
    assert report["spill_stores"] == 0 and report["shared_bytes"] <= 227 * 1024, report


# ------------------------------------------------------------------------------------------------
# the reference itself against torch's SDPA where SDPA is defined
def test_reference_matches_sdpa():
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = (t.double() for t in _inputs(2, 8, 2, 11, 19, 16, seed=12))
    sd = lambda **kw: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)  # noqa: E731
    torch.testing.assert_close(reference_attention(q, k, v), sd())
    torch.testing.assert_close(reference_attention(q, k, v, causal=True),
                               sd(attn_mask=causal_lower_right(11, 19)))
    qs = q[:, :, :, :]
    torch.testing.assert_close(reference_attention(qs, k[:, :, :11], v[:, :, :11], causal=True),
                               F.scaled_dot_product_attention(qs, k[:, :, :11], v[:, :, :11],
                                                              is_causal=True, enable_gqa=True))
    keep = torch.rand(2, 1, 11, 19) > 0.5
    keep[:, :, 4] = False                                           # fully masked rows: 0 in both
    torch.testing.assert_close(reference_attention(q, k, v, mask=keep), sd(attn_mask=keep))
    add = torch.where(keep, torch.randn(2, 1, 11, 19).double(), float("-inf"))
    torch.testing.assert_close(reference_attention(q, k, v, mask=add, scale=0.3),
                               sd(attn_mask=add, scale=0.3))


def test_reference_sinks_match_gpt_oss_eager():
    """transformers' gpt-oss eager_attention_forward: sinks concatenated as an extra logit."""
    q, k, v = (t.double() for t in _inputs(2, 4, 4, 7, 9, 16, seed=13))
    sinks = torch.randn(4).double()
    scale = 0.25
    add = torch.zeros(7, 9).double()
    add[:, 5:] = float("-inf")
    w = torch.matmul(q, k.transpose(2, 3)) * scale + add
    combined = torch.cat([w, sinks.reshape(1, -1, 1, 1).expand(2, -1, 7, -1)], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined, dim=-1)[..., :-1]
    expect = torch.matmul(probs, v)
    torch.testing.assert_close(reference_attention(q, k, v, mask=add, scale=scale, sinks=sinks),
                               expect)


# ------------------------------------------------------------------------------------------------
# KForge's rules for a candidate
# a KV cache and the step's new keys as two operands (kv_append), never concatenated:
# (B, Hq, Hkv, Sq, cached, new, D, options)
KV_APPEND = {
    "decode_bool_mask_gqa_packed": ((2, 4, 2, 1, 37, 1, 16), dict(mask="bool", pack_gqa=True)),
    "decode_cache_a_block_multiple": ((1, 2, 2, 1, 32, 1, 16), dict(mask="additive")),
    "several_new_causal": ((1, 2, 2, 5, 20, 5, 16), dict(causal=True)),
    "sinks_window": ((2, 4, 2, 3, 40, 3, 32), dict(sinks=True, causal=True, window=9)),
    "empty_cache": ((1, 2, 2, 4, 0, 4, 16), dict(causal=True)),
    "one_cached_one_new": ((1, 2, 1, 1, 1, 1, 16), dict(mask="bool")),
    "bf16": ((2, 4, 2, 1, 45, 1, 32), dict(dtype="bf16", dot_precision="bf16", mask="bool")),
    "latent_decode_gqa_packed": ((2, 4, 2, 1, 37, 1, 16),
                                 dict(value_head_dim=8, mask="bool", pack_gqa=True)),
    "latent_d192_v128_several_new": ((1, 2, 1, 3, 20, 3, 192),
                                     dict(value_head_dim=128, causal=True)),
    # fp16x1 over a cache: each tile scaled in the kernel (no prepared copies of k and v)
    "fp16x1_several_new_gqa": ((1, 4, 2, 5, 37, 5, 32),
                               dict(causal=True, dot_precision="fp16x1", tol=2e-3)),
}


@pytest.mark.parametrize("name", list(KV_APPEND))
def test_kv_append_reads_the_cache_and_the_new_keys_in_place(name):
    (B, Hq, Hkv, Sq, C, N, D), opts = KV_APPEND[name]
    opts = dict(opts)
    dtype, mask_kind = opts.pop("dtype", "fp32"), opts.pop("mask", None)
    sinks = opts.pop("sinks", False)
    Dv = opts.pop("value_head_dim", D)
    tol = opts.pop("tol", None)
    q, k, v = _inputs(B, Hq, Hkv, Sq, C, D, dtype, seed=7, Dv=Dv)
    _, kn, vn = _inputs(B, Hq, Hkv, Sq, N, D, dtype, seed=8, Dv=Dv)
    g = torch.Generator().manual_seed(9)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(B, 1, Sq, C + N, generator=g) > 0.3
    elif mask_kind == "additive":
        mask = torch.randn(B, 1, Sq, C + N, generator=g)
    s = torch.randn(Hq, generator=g) if sinks else None
    mod = _module(head_dim=D, value_head_dim=Dv, mask=mask_kind, sinks=sinks,
                  gqa_group=Hq // Hkv, dtype=dtype, kv_append=True, **opts)
    args = [q, k, kn, v, vn] + ([mask] if mask is not None else []) + ([s] if sinks else [])
    (out,) = mod.launch(*args)
    assert out.shape == (B, Hq, Sq, Dv)
    ref = reference_attention(q.double(), torch.cat([k, kn], 2).double(),
                              torch.cat([v, vn], 2).double(),
                              mask=None if mask is None else
                              (mask if mask.dtype == torch.bool else mask.double()),
                              causal=opts.get("causal", False), window=opts.get("window"),
                              sinks=None if s is None else s.double())
    _assert_close(out, ref, tol or TOL[dtype])
    with pytest.raises(ValueError, match="do not match the cache"):
        mod.launch(q, k, kn[..., : D // 2], v, vn[..., : D // 2], *args[5:])
    with pytest.raises(ValueError, match="do not match the cache"):
        mod.launch(q, k, kn, v, vn[..., : Dv // 2], *args[5:])


def test_sources_pass_static_checks():
    combos = itertools.product([False, True], [None, 8], [None, "bool", "additive"],
                               [False, True], [1, 4], ["fp32", "bf16", "fp16"],
                               ["ieee", "tf32", "bf16"], [False, True])
    n = 0
    for causal, window, mask, sinks, gqa, dtype, dot, interp in combos:
        src = attention_source(head_dim=80 if gqa == 4 else 64, causal=causal, window=window,
                               mask=mask, sinks=sinks, gqa_group=gqa, dtype=dtype,
                               dot_precision=dot, interpret=interp, pack_gqa=gqa > 1,
                               kv_append=interp)
        assert static_check(src) == [], src
        compile(src, "<attention>", "exec")
        n += 1
    assert n == 2 * 2 * 3 * 2 * 2 * 3 * 3 * 2


def test_launch_does_no_torch_compute(monkeypatch):
    """As KForge's sandbox watches: torch calls `launch` makes outside the kernel are only
    allocation, views and metadata (the list is the worker's own)."""
    from torch.overrides import TorchFunctionMode
    from triton.runtime.interpreter import InterpretedFunction

    from kforge.verify._worker import ALLOWED_TORCH

    state = {"in_kernel": 0, "ops": []}
    run = InterpretedFunction.run

    def counted(self, *a, **kw):
        state["in_kernel"] += 1
        try:
            return run(self, *a, **kw)
        finally:
            state["in_kernel"] -= 1
    monkeypatch.setattr(InterpretedFunction, "run", counted)

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not state["in_kernel"]:
                state["ops"].append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    mod = _module(head_dim=32, causal=True, mask="bool", sinks=True, gqa_group=2)
    q, k, v = _inputs(1, 4, 2, 5, 9, 32)
    mask = torch.ones(1, 1, 5, 9, dtype=torch.bool)
    sinks = torch.zeros(4)
    with Watch():
        mod.launch(q, k, v, mask, sinks)
    assert state["ops"] and set(state["ops"]) <= ALLOWED_TORCH, state["ops"]


def test_configs_and_argument_errors():
    for d in HEAD_DIMS:
        dv = 128 if d == 192 else d             # DeepSeek-V3's values under its 192-wide keys
        for dt in ("fp32", "bf16", "fp16"):
            for dot, fp32_dot in (("ieee", "tf32x3"), ("ieee", "ieee"), ("tf32", "tf32x3"),
                                  ("bf16", "tf32x3")):
                for target, seq_q in (("cuda", None), ("cuda", 1), ("cpu", None)):
                    cfgs = attention_configs(d, dt, target, seq_q=seq_q, dot_precision=dot,
                                             fp32_dot=fp32_dot, value_head_dim=dv)
                    assert cfgs
                    for cfg in cfgs:        # every config renders a valid source
                        src = attention_source(head_dim=d, value_head_dim=dv, dtype=dt,
                                               dot_precision=dot, fp32_dot=fp32_dot,
                                               gqa_group=4, **cfg)
                        assert static_check(src) == []
                    if seq_q == 1:
                        assert all(c["block_m"] <= 64 for c in cfgs)
                        assert any(c.get("pack_gqa") for c in cfgs)
    assert 8 in VALUE_HEAD_DIMS and set(HEAD_DIMS) <= set(VALUE_HEAD_DIMS)
    for bad in (dict(head_dim=0), dict(head_dim=300), dict(head_dim=64, value_head_dim=257),
                dict(head_dim=64, dtype="fp8"), dict(head_dim=64, window=0),
                dict(head_dim=64, mask="float"), dict(head_dim=64, dot_precision="fp16"),
                dict(head_dim=64, block_m=24)):
        with pytest.raises(ValueError):
            attention_source(**bad)
    assert math.isclose(float(attention_source(head_dim=64).split("SCALE = ")[1].split()[0]),
                        0.125)


# ------------------------------------------------------------------------------------------------
# compiled kernels on a CUDA GPU (skipped without one): the same semantics at sizes that fill
# several tiles, with the launch configurations attention_configs() proposes for the H200
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GPU_CASES = {  # name: (B, Hq, Hkv, Sq, Skv, D), dtype, dot, options
    "fp32_ieee_causal_d128": ((2, 4, 4, 300, 300, 128), "fp32", "ieee", dict(causal=True)),
    "fp32_ieee_fma": ((1, 4, 2, 200, 333, 64), "fp32", "ieee", dict(causal=True, fp32_dot="ieee")),
    "fp32_ieee_gqa_window_sinks_d80": ((2, 8, 2, 257, 513, 80), "fp32", "ieee",
                                       dict(causal=True, window=100, sinks=True)),
    "fp32_tf32_bool_mask": ((2, 4, 2, 190, 300, 64), "fp32", "tf32", dict(mask="bool")),
    "fp32_bf16_additive": ((2, 4, 2, 190, 300, 64), "fp32", "bf16", dict(mask="additive")),
    "bf16_causal_d128": ((2, 8, 8, 384, 384, 128), "bf16", "bf16", dict(causal=True)),
    "bf16_gqa_sq_gt_skv": ((2, 8, 2, 300, 200, 128), "bf16", "bf16", dict(causal=True)),
    "bf16_swa_sinks_bool_d64": ((2, 8, 1, 333, 333, 64), "bf16", "bf16",
                                dict(causal=True, window=64, sinks=True, mask="bool")),
    "bf16_ieee_additive_d96": ((1, 4, 2, 200, 250, 96), "bf16", "ieee",
                               dict(causal=True, mask="additive")),
    "fp16_bf16_d32": ((2, 4, 4, 200, 260, 32), "fp16", "bf16", dict(causal=True)),
    "fp16_tf32_d16": ((2, 4, 4, 200, 260, 16), "fp16", "tf32", {}),
    "decode_bf16_pack": ((8, 32, 8, 1, 1000, 128), "bf16", "bf16", dict(causal=True, sinks=True)),
    "decode_fp32_pack": ((4, 8, 2, 1, 777, 64), "fp32", "ieee", dict(causal=True, window=300)),
    "chunked_prefill_bf16": ((2, 8, 2, 17, 700, 128), "bf16", "bf16", dict(causal=True)),
    # DeepSeek-V3's multi-head latent attention: keys 192 wide, values 128
    "latent_bf16_d192_v128": ((2, 8, 8, 300, 300, 192), "bf16", "bf16",
                              dict(causal=True, value_head_dim=128)),
    "latent_fp32_ieee_d192_v128": ((1, 4, 4, 200, 200, 192), "fp32", "ieee",
                                   dict(causal=True, value_head_dim=128)),
    "latent_decode_bf16_d192_v128": ((4, 16, 16, 1, 700, 192), "bf16", "bf16",
                                     dict(causal=True, value_head_dim=128)),
    "fp32_tf32_d256": ((1, 4, 2, 200, 260, 256), "fp32", "tf32", dict(mask="bool")),
    # the other wide-head lists (_wide_head_configs), every configuration on the GPU
    "latent_fp32_tf32_d192_v128": ((1, 4, 4, 200, 200, 192), "fp32", "tf32",
                                   dict(causal=True, value_head_dim=128)),
    "latent_fp32_bf16_d192_v128": ((1, 4, 4, 200, 200, 192), "fp32", "bf16",
                                   dict(causal=True, value_head_dim=128)),
    "latent_fp32_fma_d192_v128": ((1, 4, 4, 130, 130, 192), "fp32", "ieee",
                                  dict(causal=True, value_head_dim=128, fp32_dot="ieee")),
    "latent_bf16_ieee_d192_v128": ((1, 4, 4, 200, 200, 192), "bf16", "ieee",
                                   dict(causal=True, value_head_dim=128)),
    "latent_decode_fp32_ieee_d192_v128": ((4, 16, 16, 1, 700, 192), "fp32", "ieee",
                                          dict(causal=True, value_head_dim=128)),
    "bf16_d256": ((1, 4, 2, 200, 260, 256), "bf16", "bf16", dict(causal=True)),
    "fp32_ieee_d256": ((1, 4, 2, 150, 150, 256), "fp32", "ieee", dict(causal=True)),
    "fp32_bf16_d256": ((1, 4, 2, 150, 150, 256), "fp32", "bf16", dict(causal=True)),
    "latent_fp32_fp16x3_d192_v128": ((1, 4, 4, 200, 200, 192), "fp32", "fp16x3",
                                     dict(causal=True, value_head_dim=128)),
    "fp32_fp16x3_d256": ((1, 4, 2, 150, 150, 256), "fp32", "fp16x3", dict(causal=True)),
}


def _gpu_case(name, cfg_index=0, all_configs=False):
    shape, dtype, dot, opts = GPU_CASES[name]
    opts = dict(opts)
    B, Hq, Hkv, Sq, Skv, D = shape
    Dv = opts.pop("value_head_dim", D)
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = TORCH_DT[dtype]
    q = torch.randn(B, Hq, Sq, D, device="cuda", generator=g).to(dt)
    k = torch.randn(B, Hkv, Skv, D, device="cuda", generator=g).to(dt)
    v = torch.randn(B, Hkv, Skv, Dv, device="cuda", generator=g).to(dt)
    mask = None
    mkind = opts.pop("mask", None)
    if mkind:
        keep = torch.rand(B, 1, Sq, Skv, device="cuda", generator=g) > 0.2
        keep[:, :, 7] = False
        mask = keep if mkind == "bool" else torch.where(
            keep, torch.randn(B, 1, Sq, Skv, device="cuda", generator=g), float("-inf")).to(dt)
    sinks = torch.randn(Hq, device="cuda", generator=g) if opts.pop("sinks", False) else None
    fp32_dot = opts.pop("fp32_dot", "tf32x3")
    cfgs = attention_configs(D, dtype, "cuda", seq_q=Sq, dot_precision=dot, fp32_dot=fp32_dot,
                             value_head_dim=Dv)
    tol = 1e-4 if (dtype == "fp32" and dot == "ieee") else 1e-2
    for cfg in (cfgs if all_configs else cfgs[cfg_index:cfg_index + 1]):
        src = attention_source(head_dim=D, value_head_dim=Dv, mask=mkind,
                               sinks=sinks is not None, gqa_group=Hq // Hkv, dtype=dtype,
                               dot_precision=dot, fp32_dot=fp32_dot, interpret=False, **opts,
                               **cfg)
        mod = load_source(src, "kf_test_attention_gpu")
        args = [q, k, v] + ([mask] if mask is not None else []) + \
            ([sinks] if sinks is not None else [])
        (out,) = mod.launch(*args)
        ref = reference_attention(q.double(), k.double(), v.double(),
                                  mask=None if mask is None else
                                  (mask if mask.dtype == torch.bool else mask.double()),
                                  sinks=None if sinks is None else sinks.double(), **opts)
        try:
            _assert_close(out, ref, tol)
        except AssertionError as exc:
            raise AssertionError(f"{name} {cfg}: {exc}") from None


@cuda
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_kernel(name, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _gpu_case(name)


@cuda
@pytest.mark.parametrize("name", ["fp32_ieee_causal_d128", "bf16_causal_d128",
                                  "fp32_tf32_bool_mask", "decode_bf16_pack",
                                  "latent_bf16_d192_v128", "latent_fp32_ieee_d192_v128",
                                  "latent_fp32_tf32_d192_v128", "latent_fp32_bf16_d192_v128",
                                  "latent_fp32_fma_d192_v128", "latent_bf16_ieee_d192_v128",
                                  "latent_decode_bf16_d192_v128",
                                  "latent_decode_fp32_ieee_d192_v128", "fp32_tf32_d256",
                                  "bf16_d256", "fp32_ieee_d256", "fp32_bf16_d256",
                                  "latent_fp32_fp16x3_d192_v128", "fp32_fp16x3_d256"])
def test_gpu_every_config(name, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _gpu_case(name, all_configs=True)
