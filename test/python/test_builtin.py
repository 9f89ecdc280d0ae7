"""The builtin provider: generated Triton kernels run under the interpreter (TRITON_INTERPRET=1)
against the reference, for every fixture kind and every precision policy."""
import dataclasses
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch

from kforge.providers.base import Feedback, GenerationRequest
from kforge.providers.builtin import (BuiltinProvider, CannotGenerate, analyze_region,
                                      candidates, config_space, generate_source, region_shape)
from kforge.reference import reference_fn
from kforge.spec import load_spec
from kforge.targets import get_target

SPECS = Path(__file__).parent / "fixtures" / "specs"
TOL = {"strict": 1e-4, "tf32": 1e-2, "bf16": 1e-2}
GENERATED = ["matmul_bias_relu", "softmax", "log_softmax", "layer_norm", "conv2d_bias",
             "gelu_erf", "gelu_tanh", "causal_mask", "bmm_scale_softmax",
             "linear_gelu_layer_norm_softmax", "sum_middle", "group_norm", "attention",
             "group_norm_silu_row_mean", "conv2d_pad_relu", "matvec_bias_relu",
             "conv2d_pad_1x1"]
NOT_GENERATED = ["argmax_rows"]      # first index of the max: a combiner with no template


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def spec(name):
    return load_spec(SPECS / f"{name}.json")


def load_candidate(source: str, path: Path):
    path.write_text(source)
    mod_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def make_args(s, seed):
    """Inputs like a real model's: activations ~N(0,1), weights scaled by 1/sqrt(fan_in)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for a in s.args:
        t = torch.randn(a.shape, generator=g)
        if a.weight and len(a.shape) >= 2:
            t = t / math.sqrt(math.prod(a.shape[1:]))
        out.append(t)
    return out


def run_candidate(module, s, args):
    args = list(args)
    if hasattr(module, "prepare_weights"):
        prepared = module.prepare_weights({i: args[i] for i, a in enumerate(s.args) if a.weight})
        for i, t in prepared.items():
            args[i] = t
    return module.launch(*args)


def check(cand, s, precision, tmp_path, seeds=(0, 1)):
    module = load_candidate(cand.source, tmp_path / f"{cand.id.replace('-', '_')}.py")
    ref = reference_fn(s)
    for seed in seeds:
        args = make_args(s, seed)
        before = [a.clone() for a in args]
        expected = ref(*args)
        got = run_candidate(module, s, args)
        assert len(got) == len(expected)
        for a, b in zip(args, before):
            assert torch.equal(a, b)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype
            tol = TOL[precision]
            torch.testing.assert_close(g, e, atol=tol, rtol=tol, equal_nan=True)


@pytest.mark.parametrize("name", GENERATED)
def test_strict_every_config(name, tmp_path):
    s = spec(name)
    cands = candidates(s, "cpu", "strict")
    assert cands, f"no candidate for {name}"
    for cand in cands:
        check(cand, s, "strict", tmp_path)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("name", GENERATED)
def test_looser_policies(name, precision, tmp_path):
    s = spec(name)
    cands = candidates(s, "cpu", precision)
    assert cands
    check(cands[0], s, precision, tmp_path, seeds=(3,))


@pytest.mark.parametrize("name", NOT_GENERATED)
def test_unsupported_regions_get_no_candidate(name):
    s = spec(name)
    assert candidates(s, "cpu", "strict") == []
    req = GenerationRequest(spec=s, region_mlir="", reference_source="", precision="strict",
                            target=get_target("cpu"), phase="functional", round=0)
    assert BuiltinProvider().generate(req) == []


def test_gemm_then_rows_kernel_when_n_is_wider_than_a_tile(tmp_path):
    """Row reductions over a GEMM output too wide for one tile run as a second kernel."""
    s = spec("bmm_scale_softmax")
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 1, "input_precision": "ieee",
              "rows": {"BLOCK_R": 2, "BLOCK_C": 8, "num_warps": 4}}
    source = generate_source(s, get_target("cpu"), "strict", config)
    assert "_gemm[" in source and "_rows[" in source
    from kforge.providers.base import Candidate
    check(Candidate("two-kernels", "builtin", source, config), s, "strict", tmp_path)


def test_split_k_writes_partials_then_epilogue():
    s = spec("matmul_bias_relu")
    split = [c for c in config_space(s, "cpu", "strict") if c["SPLIT_K"] > 1]
    assert split
    source = generate_source(s, get_target("cpu"), "strict", split[0])
    assert "_gemm_partial[" in source and "_epilogue[" in source


def test_split_k_epilogue_writes_outputs_of_every_size(tmp_path):
    """A q projection with RoPE's pieces (exported from Llama-3-8B decode, shrunk): the product
    times cos ([.., 128]) and its two rotated halves ([.., 64]). Split-K stores the partial
    products and an epilogue finishes each output; one launch over the halves' domain left half
    of the [.., 128] output unwritten (found on the H200, batch 64 against a 2048 cache)."""
    s = spec("gemm_rope_split_outputs")
    sizes = {math.prod(s.tensor(r).shape) for r in s.results}
    assert len(sizes) == 2
    split = [c for c in config_space(s, "cpu", "strict") if c["SPLIT_K"] > 1]
    assert len(split) >= 2
    for cand in candidates(s, "cpu", "strict", split):
        assert cand.source.count("_epilogue_") >= 2       # one kernel per output size
        check(cand, s, "strict", tmp_path, seeds=(0,))


def test_a_mismatch_moves_the_repair_to_another_product_scheme():
    """After a mismatch, the next candidate is not another tile of the scheme that failed (it
    rounds the same operands the same way) but the next scheme of the space."""
    s = spec("gemm_rope_split_outputs")
    target = get_target("cpu")
    space = config_space(s, target, "bf16")
    first = space[0].get("input_precision")
    assert sum(c.get("input_precision") == first for c in space) > 1      # more tiles of it
    req = GenerationRequest(spec=s, region_mlir="", reference_source="", precision="bf16",
                            target=target, phase="functional", round=1,
                            feedback=(Feedback(f"builtin-{s.hash}-bf16-cpu-c0", "mismatch",
                                               "outside the tolerance"),))
    got = BuiltinProvider().generate(req)
    assert got and got[0].config.get("input_precision") != first
    # other feedback (a compile error) keeps the space's order
    req = dataclasses.replace(req, feedback=(Feedback(f"builtin-{s.hash}-bf16-cpu-c0",
                                                      "compile_error", "x"),))
    assert BuiltinProvider().generate(req)[0].config == space[1]


def test_an_attention_mismatch_moves_the_repair_to_another_dot_scheme():
    """Attention's schemes are its `dot_precision` / `fp32_dot`: a mismatch skips the other
    tiles of the scheme that failed (on Llama-3-8B decode the repair spent its two rounds on
    more bf16 tiles and the region ran on its reference, 6 ms a layer). Decoding over an fp32
    cache under bf16 takes the fp32-accurate products first: reading the cache is the time."""
    from kforge.spec import load_spec
    # Llama-3-8B's decode attention as exported (fp32 q [64, 32, 1, 128] over a 2048-token cache
    # and the step's key): the region of the H200 run
    s = load_spec(Path(__file__).parent / "fixtures" / "regions" / "llama3_decode_attention.json")
    target = get_target("cpu")
    space = config_space(s, target, "strict")
    first = (space[0].get("dot_precision"), space[0].get("fp32_dot"))
    assert (space[1].get("dot_precision"), space[1].get("fp32_dot")) == first   # more tiles
    req = GenerationRequest(spec=s, region_mlir="", reference_source="", precision="strict",
                            target=target, phase="functional", round=1,
                            feedback=(Feedback(f"builtin-{s.hash}-strict-cpu-c0", "mismatch",
                                               "outside the tolerance"),))
    got = BuiltinProvider().generate(req)
    assert got and (got[0].config.get("dot_precision"), got[0].config.get("fp32_dot")) != first
    assert config_space(s, target, "bf16")[0]["dot_precision"] == "ieee"
    # between them under bf16, fp32-grade scores with one fp16 p@v, then one fp16 product each
    # on power-of-two-scaled operands (fp32 q, k, v only)
    order = [c["dot_precision"] for c in config_space(s, target, "bf16")]
    assert list(dict.fromkeys(order)) == ["ieee", "fp16x3", "fp16x1", "bf16"]
    order = [c["dot_precision"] for c in config_space(s, target, "tf32")]
    assert list(dict.fromkeys(order)) == ["tf32", "fp16x1", "ieee"]
    # prefill over fp32 q, k, v (Llama-3-8B's, 4 x 1024 tokens, causal) under bf16: bf16 first;
    # a rejected bf16 kernel (its scores missed the tolerance on the H200) is repaired with
    # fp16x1, whose k and v are scaled once before the kernel (16-bit tiles, 128x64 w8 s3)
    s = load_spec(Path(__file__).parent / "fixtures" / "regions" / "llama3_prefill_attention.json")
    space = config_space(s, "cuda", "bf16")
    assert list(dict.fromkeys(c["dot_precision"] for c in space)) == \
        ["bf16", "fp16x1", "fp16x3", "ieee"]
    req = GenerationRequest(spec=s, region_mlir="", reference_source="", precision="bf16",
                            target=get_target("cuda"), phase="functional", round=1,
                            feedback=(Feedback(f"builtin-{s.hash}-bf16-cuda-c0", "mismatch",
                                               "outside the tolerance"),))
    got = BuiltinProvider().generate(req)[0]
    assert got.config["dot_precision"] == "fp16x1"
    assert (got.config["block_m"], got.config["block_n"], got.config["num_stages"]) == (128, 64, 3)
    assert "PREP_KV = True" in got.source


def test_a_region_without_operands_computes_on_the_target_device(tmp_path):
    """gpt-oss decode's sliding-window mask is a region of index arithmetic alone: its kernel
    allocated its output on the CPU (no operand to take the device from), and the H200 rejected
    it ("cannot be accessed from Triton")."""
    s = load_spec(Path(__file__).parent / "fixtures" / "regions" / "gpt_oss_decode_mask.json")
    assert not s.args
    assert "device = 'cuda'" in candidates(s, "cuda", "strict")[0].source
    cand = candidates(s, "cpu", "strict")[0]
    assert "device = 'cpu'" in cand.source
    got = load_candidate(cand.source, tmp_path / "mask.py").launch()[0]
    ref = reference_fn(s)()[0]
    assert got.shape == ref.shape and torch.equal(got, ref)


def test_cpu_bf16_products_round_operands_to_nearest_even(tmp_path):
    """The CPU target's bf16 GEMM computes what the GPU's does: operands rounded to bf16 to
    nearest-even, products summed in fp32. Triton's interpreter truncates `.to(tl.bfloat16)`;
    truncated operands are off by ~1e-2 relative here, rounded ones by ~1e-6."""
    s = spec("gemm_rope_split_outputs")
    config = next(c for c in config_space(s, "cpu", "bf16")
                  if c.get("input_precision") is None and c["SPLIT_K"] == 1)
    cand = candidates(s, "cpu", "bf16", [config])[0]
    assert "_bf16_rne(" in cand.source
    module = load_candidate(cand.source, tmp_path / "bf16_rne.py")
    g = torch.Generator().manual_seed(3)
    x, cos, w = torch.randn(8, 256, generator=g), torch.rand(1, 1, 1, 128, generator=g) + 0.5, \
        torch.randn(256, 256, generator=g) / 16
    got = run_candidate(module, s, [x, cos, w])[1]                 # q * cos: [8, 2, 1, 128]
    q = (x.bfloat16().float() @ w.bfloat16().float().T).view(8, 1, 2, 128).transpose(1, 2)
    assert got.shape == q.shape
    assert (got - q * cos).abs().max() < 1e-5 * (q * cos).abs().max()


def test_bf16_casts_weights_once_in_prepare_weights(tmp_path):
    s = spec("matmul_bias_relu")
    cand = candidates(s, "cpu", "bf16")[0]
    module = load_candidate(cand.source, tmp_path / "bf16_mod.py")
    w = {1: torch.randn(12, 16), 2: torch.randn(12)}
    out = module.prepare_weights(w)
    assert out[1].dtype == torch.bfloat16          # the matmul weight
    assert out[2].dtype == torch.float32           # the bias is read by the epilogue
    assert "prepare_weights" not in candidates(s, "cpu", "strict")[0].source


def test_generated_source_is_readable_and_launches_only_triton():
    s = spec("matmul_bias_relu")
    src = candidates(s, "cpu", "strict")[0].source
    assert "def kforge_region_matmul_bias_relu_gemm(" in src
    assert "# arith.maximumf" in src and "# linalg.matmul" in src
    launch = src[src.index("def launch"):]
    torch_calls = set(re.findall(r"torch\.(\w+)", launch))
    assert torch_calls <= {"empty", "float32", "float64", "bfloat16", "float16", "int64",
                           "int32", "bool"}
    compile(src, "candidate.py", "exec")


@pytest.mark.parametrize("target", ["cuda", "xpu"])
def test_device_targets_generate_their_own_code(target):
    """GPU sources are checked on the H200 later; here: they are generated and compile."""
    s = spec("gelu_tanh")
    src = candidates(s, target, "strict")[0].source
    assert "libdevice.tanh" in src and "from triton.language.extra import libdevice" in src
    compile(src, "candidate.py", "exec")
    s = spec("matmul_bias_relu")
    cands = candidates(s, target, "strict")
    # fp16x3: fp16 tensor-core products of power-of-two-scaled hi/lo planes
    fp16 = next(c for c in cands if c.config["input_precision"] == "fp16x3")
    assert "part = tl.dot(a_hi, b_hi, part)" in fp16.source
    assert "_split_a[" in fp16.source and "torch.frexp" in fp16.source
    tf32x3 = next(c for c in cands if c.config["input_precision"] == "3xtf32")
    assert "part = tl.dot(a_hi, b_hi, part, input_precision=\"tf32\")" in tf32x3.source
    assert "planes[1, k:k + block] = x - hi" in tf32x3.source
    for c in cands:
        compile(c.source, "candidate.py", "exec")
        if target == "cuda":    # Hopper wgmma needs BLOCK_M % 64 == 0 and 4 or 8 warps
            assert c.config["BLOCK_M"] % 64 == 0 and c.config["num_warps"] in (4, 8)
    bf16 = candidates(s, target, "bf16")
    assert bf16[0].config["input_precision"] == "fp16x1"     # 8 rows: decode-shaped
    src = next(c for c in bf16 if c.config.get("input_precision") is None).source
    assert ".to(tl.bfloat16)" in src and "prepare_weights" in src


def test_generate_is_deterministic_and_follows_the_analyst():
    s = spec("matmul_bias_relu")
    provider = BuiltinProvider()
    target = get_target("cuda")
    req = GenerationRequest(spec=s, region_mlir="", reference_source="", precision="strict",
                            target=target, phase="functional", round=0, num_candidates=2)
    first = provider.generate(req)
    assert [c.source for c in first] == [c.source for c in provider.generate(req)]
    assert len(first) == 2
    recs = provider.analyze(req, {"time_ms": 1.0, "config": first[0].config,
                                  "kernels": [{"n_regs": 255, "n_spills": 40,
                                               "shared": 100000}]})
    assert any("spilled" in r for r in recs)
    picks = [json.loads(r[len("config: "):].split("  #")[0]) for r in recs
             if r.startswith("config: ")]
    assert picks
    fb = tuple(Feedback(c.id, "verified", "", time_ms=1.0, recommendations=recs)
               for c in first)
    nxt = provider.generate(GenerationRequest(spec=s, region_mlir="", reference_source="",
                                              precision="strict", target=target,
                                              phase="optimize", round=1, feedback=fb,
                                              num_candidates=1))
    assert nxt[0].config == picks[0] and nxt[0].id not in {c.id for c in first}


def test_analyst_near_the_floor_stops():
    s = spec("gelu_erf")
    provider = BuiltinProvider()
    req = GenerationRequest(spec=s, region_mlir="", reference_source="", precision="strict",
                            target="cuda", phase="optimize", round=1)
    recs = provider.analyze(req, {"time_ms": 1.0, "floor_ms": 0.95, "config": {"BLOCK": 1024}})
    assert any("unlikely to pay" in r for r in recs)
    assert not any(r.startswith("config:") for r in recs)


def test_region_kinds():
    assert analyze_region(spec("gelu_erf")).kind == "elementwise"
    shape = analyze_region(spec("layer_norm"))
    assert (shape.kind, shape.rows, shape.cols) == ("rows", 5, 24)
    shape = analyze_region(spec("conv2d_bias"))
    assert shape.kind == "gemm" and len(shape.contraction.k) == 3     # implicit GEMM
    shape = analyze_region(spec("sum_middle"))         # a strided reduction over a middle dim
    assert (shape.kind, shape.rows, shape.cols) == ("rows", 12, 5)
    with pytest.raises(CannotGenerate, match="combiner"):
        generate_source(spec("argmax_rows"), get_target("cpu"), "strict",
                        {"BLOCK_R": 1, "BLOCK_C": 8, "num_warps": 4})


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------
def test_targets_answer_the_same_questions():
    from kforge.errors import UserError
    from kforge.targets import Target, target_names
    assert target_names() == ("cuda", "xpu", "cpu")
    for name in target_names():
        t = get_target(name)
        assert isinstance(t, Target) and t.name == name and get_target(t) is t
        assert t.describe() and t.device in ("cuda", "xpu", "cpu")
        for policy in ("strict", "tf32", "bf16"):
            assert t.dot_input_precisions(policy)
        assert t.configs("elementwise", {"numel": 1 << 20})
        assert t.configs("rows", {"rows": 4096, "cols": 4096})
        assert t.configs("gemm", {"M": 4096, "N": 4096, "K": 4096, "precision": "strict"})
        assert t.math("math.exp") == "tl.exp({0})"
    with pytest.raises(UserError, match="unknown target 'tpu'"):
        get_target("tpu")
    cuda, cpu = get_target("cuda"), get_target("cpu")
    assert cpu.interpreter and not cpu.bf16_dot_ok and cuda.bf16_dot_ok
    assert cuda.math("math.tanh").startswith("libdevice") and "tl.exp" in cpu.math("math.tanh")
    # H200 roofline: 2*1024*8192*8192 FLOP at bf16/3 (262 TFLOP/s, fp16x3) ~ 0.525 ms
    assert cuda.floor_ms(2 * 1024 * 8192 * 8192, 0, "strict") == pytest.approx(0.5246, rel=1e-3)
    assert cuda.floor_ms(0, 4.28e9, "bf16") == pytest.approx(1.0)
    assert cpu.time_ms(lambda: None) >= 0


def test_cuda_rows_of_a_few_columns_get_thousands_of_elements_a_block():
    """Pooling windows (2-4 columns): BLOCK_R x BLOCK_C of 2-8K elements, not 8-64."""
    t = get_target("cuda")
    for cols in (2, 4, 16, 256):
        for c in t.configs("rows", {"rows": 1 << 22, "cols": cols}):
            assert 2048 <= c["BLOCK_R"] * c["BLOCK_C"] <= 32768, (cols, c)
    assert t.configs("rows", {"rows": 4096, "cols": 4096})[0] == \
        {"BLOCK_R": 1, "BLOCK_C": 4096, "num_warps": 4}


def test_cuda_gemm_space_suits_hopper_and_small_m():
    t = get_target("cuda")
    big = t.configs("gemm", {"M": 4096, "N": 4096, "K": 4096, "precision": "bf16"})
    assert all(c["BLOCK_M"] % 64 == 0 and c["num_warps"] in (4, 8) for c in big)
    assert all(c["SPLIT_K"] == 1 for c in big)
    small = t.configs("gemm", {"M": 128, "N": 4096, "K": 16384, "precision": "strict"})
    assert small[0]["SPLIT_K"] > 1
    fused = t.configs("gemm", {"M": 4096, "N": 200, "K": 1024, "full_rows": True,
                               "reductions": True})
    assert all(c["BLOCK_N"] == 256 for c in fused)
    wide = t.configs("gemm", {"M": 4096, "N": 8192, "K": 1024, "full_rows": True,
                              "reductions": True})
    assert wide and all(c["BLOCK_N"] <= 256 and c["SPLIT_K"] == 1 for c in wide)


def test_cuda_decode_gemms_give_every_sm_a_tile():
    """A decode step's GEMMs (M = 64 sequences) are weight-bandwidth bound: the first tiles
    are 64 rows and narrow enough for a tile per SM (or the narrowest), where 128x256 tiles
    over N = 4096 would keep 16 of 132 SMs busy; large M keeps its measured order."""
    t = get_target("cuda")
    sms = t.compute_units

    def tiles(c, M, N):
        return -(-M // c["BLOCK_M"]) * -(-N // c["BLOCK_N"]) * c["SPLIT_K"]

    for N, K, rows in ((14336, 4096, False), (4096, 14336, True), (128256, 4096, False)):
        first = t.configs("gemm", {"M": 64, "N": N, "K": K, "precision": "bf16",
                                   "reductions": rows, "full_rows": rows})[0]
        assert first["BLOCK_M"] == 64 and first["SPLIT_K"] == 1
        assert tiles(first, 64, N) >= sms or first["BLOCK_N"] == 32, (N, first)
        assert tiles(first, 64, N) < 4 * sms or first["BLOCK_N"] == 256, (N, first)
    big = t.configs("gemm", {"M": 16384, "N": 4096, "K": 4096, "precision": "bf16"})
    assert big[0]["BLOCK_M"] == 128 and big[0]["BLOCK_N"] == 256


# ---------------------------------------------------------------------------------------------
# Real exports: torch model -> torch-mlir -> kforge-opt regions -> builtin kernels, vs eager
# ---------------------------------------------------------------------------------------------
from test_reference import REAL_MODELS, export_regions, real_export  # noqa: E402


@real_export
@pytest.mark.parametrize("precision", ["strict", "bf16"])
@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_builtin_kernels_on_real_exports(name, precision, tmp_path):
    from kforge.reference import run_host_plan
    torch.manual_seed(0)
    cls, make_inputs = REAL_MODELS[name]
    model = cls().eval()
    inputs = make_inputs()
    plan, weights = export_regions(model, inputs, tmp_path)
    specs = {s.call: load_spec(Path(plan.directory) / f"{s.call}.json")
             for s in plan.steps if hasattr(s, "call")}
    kernels = {}
    for h, s in specs.items():
        cands = candidates(s, "cpu", precision)
        assert cands, f"no builtin kernel for region {h} ({s.root_kind}: {s.fused})"
        module = load_candidate(cands[0].source, tmp_path / f"k_{h}_{precision}.py")
        kernels[h] = (lambda m, sp: lambda *a: run_candidate(m, sp, a))(module, s)
    got = run_host_plan(plan, specs, inputs, weights, kernels=kernels)
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=TOL[precision], rtol=TOL[precision])


# ---------------------------------------------------------------------------------------------
# fp16x3 (strict): power-of-two scaled fp16 hi/lo planes, three fp16 products per K step
# ---------------------------------------------------------------------------------------------
def _fp16x3(name, target="cpu"):
    return next(c for c in candidates(spec(name), target, "strict")
                if c.config.get("input_precision") == "fp16x3")


def _big_spec(tmp_path, builder, **sizes):
    import sys
    sys.path.insert(0, str(SPECS))
    import make_fixtures as mf
    tmp_path.mkdir(parents=True, exist_ok=True)
    old, mf.HERE = mf.HERE, tmp_path
    try:
        getattr(mf, builder)(**sizes)
    finally:
        mf.HERE = old
    return load_spec(next(tmp_path.glob("*.json")))


@pytest.mark.parametrize("K", [24, 14336, 16400])
def test_split_pass_reads_a_row_once_up_to_16384_columns(K, tmp_path):
    """The fp16 split pass keeps a row of at most 16384 columns in registers (one read, its max
    and its planes from the same values; Llama-3-8B's down projection, K = 14336) and loops
    over longer rows twice; both match the reference under strict (fp16x3) and bf16
    (fp16x1)."""
    s = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=3, K=K, N=8)
    for precision, scheme in (("strict", "fp16x3"), ("bf16", "fp16x1")):
        cands = [c for c in candidates(s, "cpu", precision)
                 if c.config.get("input_precision") == scheme][:1]
        assert cands
        split = cands[0].source.split("_split_a(")[1].split("@triton.jit")[0]
        assert ("xr = " in split) == (K <= 16384)
        assert split.count("tl.load(arg0") == (1 if K <= 16384 else 2)
        check(cands[0], s, precision, tmp_path)


def test_fp16x3_first_where_its_passes_pay(tmp_path):
    """GPU order: fp16x3 first when its operand passes cost less than it saves (a large
    linear), after the first 3xtf32 configs otherwise (a small conv's im2col-sized A)."""
    big = _big_spec(tmp_path / "mm", "matmul_bias_relu", M=1024, K=8192, N=8192)
    assert config_space(big, "cuda", "strict")[0]["input_precision"] == "fp16x3"
    conv = _big_spec(tmp_path / "conv", "conv2d", N=16, C=64, H=34, W=34, O=128, KH=3, KW=3)
    order = [c["input_precision"] for c in config_space(conv, "cuda", "strict")]
    assert order[0] == "3xtf32" and "fp16x3" in order
    tiny = [c["input_precision"] for c in config_space(spec("matmul_bias_relu"), "cuda", "strict")]
    assert tiny[0] == "3xtf32" and "fp16x3" in tiny


def test_fp16x3_is_offered_on_gpus_and_last_in_the_interpreter():
    s = spec("matmul_bias_relu")
    cuda = config_space(s, "cuda", "strict")
    fp16 = [c for c in cuda if c["input_precision"] == "fp16x3"]
    # 2-byte tiles; at most 64 accumulator values a thread (acc + part fit in registers)
    assert all(c["BLOCK_K"] == 64 and c["BLOCK_M"] * c["BLOCK_N"] <= 64 * 32 * c["num_warps"]
               for c in fp16)
    assert all(2 * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2 * c["num_stages"]
               <= 220 * 1024 for c in fp16)
    assert {c["input_precision"] for c in cuda} == {"fp16x3", "3xtf32", "tf32x3", "bf16x6"}
    assert config_space(s, "cpu", "strict")[-1]["input_precision"] == "fp16x3"
    assert all(c.get("input_precision") != "fp16x3" for c in config_space(s, "cuda", "bf16"))
    # tf32 (a GEMM of few rows: fp16x1 first on a GPU, see test_builtin_tma): fp16x3 is the
    # fallback for a first kernel the verifier rejects: second, then last
    tf32 = [c.get("input_precision") for c in config_space(s, "cuda", "tf32")]
    assert tf32[:2] == ["fp16x1", "fp16x3"] and tf32[-1] == "fp16x3"
    assert tf32.index("fp16x3", 2) > max(i for i, p in enumerate(tf32) if p == "tf32")
    assert "fp16x3" not in [c.get("input_precision") for c in config_space(s, "cpu", "tf32")]
    # small M: split-K first, also for fp16x3
    small = [c for c in candidates(s, "cpu", "strict") if c.config["input_precision"] == "fp16x3"]
    assert any(c.config["SPLIT_K"] > 1 for c in small)


def test_fp16x3_prepare_weights_scales_each_output_column(tmp_path):
    cand = _fp16x3("matmul_bias_relu")
    module = load_candidate(cand.source, tmp_path / "fp16x3_prep.py")
    w = torch.randn(12, 16, dtype=torch.float64)
    w = (w * torch.logspace(-20, 20, 12, dtype=torch.float64)[:, None]).float()
    w[3] = 0.0                                              # a zero column of the product
    out = module.prepare_weights({1: w, 2: torch.randn(12)})
    p = out[1]
    assert p.dtype == torch.float16 and p.shape == (2 * 12 * 16 + 12,)
    hi, lo = p[:192].view(12, 16).float(), p[192:384].view(12, 16).float()
    e = p[384:].float()                                     # e - 15 per output column
    assert torch.equal(e, e.round())
    assert hi.abs().max() <= 2 ** 15 and torch.isfinite(hi).all() and torch.isfinite(lo).all()
    back = (hi.double() + lo.double()) * torch.pow(2.0, e.double())[:, None]
    rel = (back - w.double()).abs() / w.double().abs().amax(1, keepdim=True).clamp_min(1e-300)
    assert rel.max() < 2 ** -21
    assert out[2].dtype == torch.float32                    # the bias is untouched


def _whole_fp16_planes(w, n_dims, planes):
    """The fp16x3 / fp16x1 weight split as prepare_weights computed it before 2026-12-04: the
    whole weight at once (3.5 weight-sized temporaries)."""
    w = w.to(torch.float32)
    k_dims = tuple(d for d in range(w.dim()) if d not in n_dims)
    amax = w.abs().amax(dim=k_dims, keepdim=True) if k_dims else w.abs()
    e = torch.frexp(amax)[1].clamp(-100, 100)
    e = torch.where(amax > 0, e, torch.zeros_like(e))
    ws = w * torch.ldexp(torch.ones_like(amax), 15 - e)
    hi = ws.to(torch.float16)
    parts = [hi.reshape(-1)]
    if planes == 2:
        parts.append((ws - hi.to(torch.float32)).to(torch.float16).reshape(-1))
    return torch.cat(parts + [(e - 15).to(torch.float16).reshape(-1)])


@pytest.mark.parametrize("shape, n_dims", [((12, 16), (0,)), ((16, 12), (1,)),
                                           ((3, 10, 7), (0, 2)), ((5, 6, 4), (0, 1)),
                                           ((9,), ()), ((6, 5), (0, 1))])
@pytest.mark.parametrize("planes", [2, 1])
def test_fp16_prepare_weights_in_blocks_gives_the_whole_splits_planes(shape, n_dims, planes,
                                                                     tmp_path):
    """prepare_weights splits a block of the weight at a time (a 32768x32768 weight split whole
    held 3.5 weights of temporaries): bit for bit the planes of the whole split, for every
    block size from one element to the whole weight, with columns decades apart, a zero column
    and signed zeros."""
    from kforge.providers.builtin.host import FP16_PREPARE_WEIGHTS
    source = "import torch\n\n" + FP16_PREPARE_WEIGHTS.replace(
        "FP16_WEIGHTS", repr({0: (n_dims, planes)}))
    module = load_candidate(source, tmp_path / "prep.py")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    if n_dims:
        col = [n if d in n_dims else 1 for d, n in enumerate(shape)]
        w = w * torch.logspace(-20, 20, math.prod(col), dtype=torch.float64).reshape(col)
    w = w.float()
    w.view(-1)[1] = -0.0
    if n_dims:
        w[(slice(None),) * n_dims[0] + (1,)] = 0.0              # a zero column
    expected = _whole_fp16_planes(w, n_dims, planes)
    for block in (1, 3, 7, 16, 64, w.numel(), 1 << 24):
        got = module.prepare_weights({0: w, 1: torch.ones(2)}, block=block)
        assert got[0].dtype == torch.float16 and got[0].shape == expected.shape
        assert torch.equal(got[0].view(torch.int16), expected.view(torch.int16)), block
        assert got[1] is not None and torch.equal(got[1], torch.ones(2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("planes", [2, 1])
def test_fp16_prepare_weights_in_blocks_on_the_gpu(planes, tmp_path):
    """On the device the planes are the whole split's too (a 4096x8192 weight, the default
    block of 2**24 elements and blocks of 2**20), and the temporaries are a few blocks."""
    from kforge.providers.builtin.host import FP16_PREPARE_WEIGHTS
    source = "import torch\n\n" + FP16_PREPARE_WEIGHTS.replace(
        "FP16_WEIGHTS", repr({0: ((0,), planes)}))
    module = load_candidate(source, tmp_path / "prep_gpu.py")
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(4096, 8192, generator=g, device="cuda") * \
        torch.logspace(-6, 6, 4096, device="cuda")[:, None]
    expected = _whole_fp16_planes(w, (0,), planes)
    for block in (1 << 24, 1 << 20):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        got = module.prepare_weights({0: w}, block=block)[0]
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base - got.numel() * 2
        assert torch.equal(got.view(torch.int16), expected.view(torch.int16)), block
        assert extra <= 5 * 4 * block + (1 << 20), (block, extra)   # a few fp32 blocks
        del got


def test_fp16x3_generated_prepare_weights_is_the_blocked_split(tmp_path):
    """The generated candidate's own prepare_weights (default block) equals the whole split."""
    cand = _fp16x3("matmul_bias_relu")
    assert "block=1 << 24" in cand.source
    module = load_candidate(cand.source, tmp_path / "fp16x3_blocked.py")
    w = torch.randn(12, 16) * torch.logspace(-8, 8, 12)[:, None]
    got = module.prepare_weights({1: w, 2: torch.randn(12)}, block=5)[1]
    assert torch.equal(got.view(torch.int16), _whole_fp16_planes(w, (0,), 2).view(torch.int16))


@pytest.mark.parametrize("shape", [(12, 16), (3, 5, 7)])
def test_tf32_prepare_weights_in_blocks_gives_the_whole_splits_planes(shape, tmp_path):
    """3xtf32's [hi, lo] weight planes, split a block at a time: bit for bit the whole split."""
    from kforge.providers.builtin.host import TF32_PREPARE_WEIGHTS
    source = "import torch\n\n" + TF32_PREPARE_WEIGHTS.replace("TF32_WEIGHTS", "(0,)")
    module = load_candidate(source, tmp_path / "prep_tf32.py")
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 1e3
    hi = ((w.view(torch.int32) + 0x1000) & -8192).view(torch.float32)
    expected = torch.stack([hi, w - hi])                    # the whole split, as before
    for block in (1, 4, 13, w.numel(), 1 << 24):
        got = module.prepare_weights({0: w}, block=block)[0]
        assert got.shape == expected.shape and torch.equal(got.view(torch.int32),
                                                           expected.view(torch.int32)), block


def test_fp16x3_survives_rows_and_columns_decades_apart(tmp_path):
    """Rows of A and columns of W from 1e-30 to 1e30, a zero row and a zero column: each output
    stays within fp32 accuracy of the fp64 result (relative to sum |a||w|)."""
    s = spec("matmul_bias_relu")
    module = load_candidate(_fp16x3("matmul_bias_relu").source, tmp_path / "fp16x3_range.py")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g, dtype=torch.float64)
    x *= torch.tensor([1e-30, 1e-12, 1e-3, 1.0, 0.0, 1e3, 1e12, 1e30], dtype=torch.float64)[:, None]
    x[2, ::2] *= 1e-6                                      # small entries beside large ones
    w = torch.randn(12, 16, generator=g, dtype=torch.float64)
    w *= torch.logspace(-6, 6, 12, dtype=torch.float64)[:, None]
    w[5] = 0.0
    b = torch.zeros(12, dtype=torch.float64)
    expected = torch.relu(x @ w.T + b)
    bound = x.abs() @ w.abs().T
    got, = run_candidate(module, s, [x.float(), w.float(), b.float()])
    assert torch.isfinite(got).all()
    err = (got.double() - expected).abs()
    assert (err <= 1e-6 * bound + 1e-300).all(), (err / bound.clamp_min(1e-300)).max()
    assert (got[4] == 0).all() and (got[:, 5] == 0).all()


@pytest.mark.parametrize("name", ["matmul_bias_relu", "conv2d_bias", "bmm_scale_softmax",
                                  "linear_gelu_layer_norm_softmax"])
def test_fp16x3_on_the_verifiers_inputs(name, tmp_path):
    """kforge.verify.inputs: mixed signs, magnitudes over decades, three per-seed scales."""
    from kforge.verify.inputs import make_inputs, signature_of
    s = spec(name)
    module = load_candidate(_fp16x3(name).source, tmp_path / f"fp16x3_{name}.py")
    ref = reference_fn(s, dtype=torch.float64)
    for seed in (0, 1, 2):
        args = make_inputs(signature_of(s), seed, 0)
        expected = ref(*args)
        got = run_candidate(module, s, args)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g.double(), e.double(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["matmul_bias_relu", "conv2d_pad_relu"])
def test_fp16x3_candidates_pass_the_verifier(name):
    """The engine's own verifier (static checks, sandboxed run, fp64 oracle, several seeds)."""
    from kforge.verify.verifier import verify_candidate
    record = verify_candidate(spec(name), _fp16x3(name), "cpu", "strict")
    assert record.status == "verified", (record.reason, record.message)


# ---------------------------------------------------------------------------------------------
# 3-D activations (batch, seq, hidden): GEMMs on the collapsed [B*S, D] view whose epilogue
# continues after the reshape back to 3-D (residuals, head transposes), and row reductions over
# the last dim of 3-D/4-D tensors (layer norm, attention softmax)
# ---------------------------------------------------------------------------------------------
import runpy  # noqa: E402

import torch.nn.functional as F  # noqa: E402

WORKLOADS = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads"


class _Residual3d(torch.nn.Module):
    """Linear + GELU on [B, S, D] with a residual: expand_shape back to 3-D after the GEMM."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + F.gelu(self.fc(x), approximate="tanh")


class _HeadNormRope(torch.nn.Module):
    """Qwen3's query path: a projection, an RMS norm per head (over 16 of the product's 64
    columns), the head transpose, then RoPE with rotate_half's halves: outputs the GEMM's row
    kernel cannot store from its [row, 16] tile (a stage after it finishes them)."""

    def __init__(self, heads=4, dim=16, per_head=True):
        super().__init__()
        self.heads, self.dim, self.per_head = heads, dim, per_head
        self.q = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        self.norm = torch.nn.Parameter(torch.rand(dim if per_head else heads * dim) + 0.5)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q(x)
        if self.per_head:
            q = q.view(b, s, self.heads, self.dim)
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm
        q = q.view(b, s, self.heads, self.dim).transpose(1, 2)
        half = self.dim // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * cos + rotated * sin


class _WindowReverseNorm(torch.nn.Module):
    """Swin's attention output: a projection over the windows' tokens, the windows put back in
    image order (a permutation of the product's rows), the residual, a layer norm: the norm's
    rows are not the GEMM tile's, so its reductions get a rows stage of their own."""

    def __init__(self, dim=16, window=2, side=4):
        super().__init__()
        self.window, self.side = window, side
        self.proj = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, windows, shortcut):
        w, n = self.window, self.side // self.window
        x = self.proj(windows)                          # [B * n * n, w * w, C]
        b = x.shape[0] // (n * n)
        x = x.view(b, n, n, w, w, -1).permute(0, 1, 3, 2, 4, 5).reshape(b, n * w * n * w, -1)
        return self.norm(shortcut + x)


def _tiny_block():
    ns = runpy.run_path(str(WORKLOADS / "transformer_block.py"))
    return ns["Model"](8, 2, 16)            # D=8, 2 heads, MLP 16


MODELS_3D = {
    "residual_3d": (_Residual3d, lambda: [torch.randn(2, 4, 8)]),
    "transformer_block": (_tiny_block, lambda: [torch.randn(2, 4, 8)]),
    "head_norm_rope": (_HeadNormRope, lambda: [torch.randn(2, 8, 64),    # x, then cos and sin
                                               *torch.rand(2, 8, 16).mul(6.3).sin().unbind()]),
    # OLMo-2's: the norm over the whole projection, whose rows the head transpose reorders
    # (the rows kernel stores only the norm's statistics; an elementwise stage the rest)
    "row_norm_rope": (lambda: _HeadNormRope(per_head=False),
                      lambda: [torch.randn(2, 8, 64), *torch.rand(2, 8, 16).mul(6.3).sin().unbind()]),
    "window_reverse_norm": (_WindowReverseNorm, lambda: [torch.randn(8, 4, 16),
                                                         torch.randn(2, 16, 16)]),
}


@pytest.fixture(scope="module")
def exported_3d(tmp_path_factory):
    out = {}
    for name, (make, make_inputs) in MODELS_3D.items():
        torch.manual_seed(0)
        model = make().eval()
        inputs = make_inputs()
        plan, weights = export_regions(model, inputs, tmp_path_factory.mktemp(name))
        specs = {s.call: load_spec(Path(plan.directory) / f"{s.call}.json")
                 for s in plan.steps if hasattr(s, "call")}
        out[name] = (model, inputs, plan, weights, specs)
    return out


@real_export
@pytest.mark.parametrize("precision", ["strict", "bf16"])
@pytest.mark.parametrize("name", sorted(MODELS_3D))
def test_builtin_kernels_on_3d_models(exported_3d, name, precision, tmp_path):
    """Every region gets a kernel (no reference fallback); the whole model vs eager."""
    from kforge.reference import run_host_plan
    model, inputs, plan, weights, specs = exported_3d[name]
    kernels = {}
    for h, s in specs.items():
        cands = candidates(s, "cpu", precision)
        assert cands, f"no builtin kernel for region {h} ({s.root_kind}: {s.fused})"
        # the first configuration keeps the GEMM's own tile (no split-K epilogue detour), in
        # the cut the provider chose for the region
        shape = region_shape(s, "cpu", precision)
        assert generate_source(s, get_target("cpu"), precision,
                               config_space(s, "cpu", precision, shape)[0], shape)
        module = load_candidate(cands[0].source, tmp_path / f"k_{h}_{precision}.py")
        kernels[h] = (lambda m, sp: lambda *a: run_candidate(m, sp, a))(module, s)
    got = run_host_plan(plan, specs, inputs, weights, kernels=kernels)
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=TOL[precision], rtol=TOL[precision])


@real_export
def test_3d_regions_pass_the_verifier(exported_3d):
    """The transformer block's regions (attention, head transposes, layer norms over the last
    dim, GEMM + reshape + residual): the first strict candidate passes the real verifier."""
    from kforge.verify.verifier import verify_candidate
    *_, specs = exported_3d["transformer_block"]
    kinds = set()
    for h, s in specs.items():
        cand = candidates(s, "cpu", "strict")[0]
        record = verify_candidate(s, cand, "cpu", "strict")
        assert record.status == "verified", (h, s.fused, record.reason, record.message)
        kinds.add(analyze_region(s).kind)
        if "copy" in s.fused:       # q, k, v: slices of one projection, not the tile moved
            assert "_epilogue(" in cand.source and cand.config["SPLIT_K"] == 1
    assert kinds == {"gemm", "rows"}


def test_gemm_epilogue_maps_reshapes_and_transposes_back_onto_the_tile():
    """[B*S, N] -> [B, S, N] and head transposes are the tile moved: the GEMM stores them itself,
    and the epilogue reads the product from the accumulator (no reduction re-inlined)."""
    from kforge.providers.builtin import indexing as ix
    rm, rn, b = ix.IVar("rm"), ix.IVar("rn"), ix.IVar("batch")
    with ix.ranges({"rm": (0, 32), "rn": (0, 64), "batch": (0, 4)}):
        flat = ix.add(ix.mul(rm, ix.const(64)), rn)
        assert ix.unravel(flat, (2, 16, 64)) == (ix.floordiv(rm, ix.const(16)),
                                                  ix.mod(rm, ix.const(16)), rn)
        three = ix.unravel(flat, (2, 16, 64))
        assert ix.unravel(ix.ravel(three, (2, 16, 64)), (32, 64)) == (rm, rn)
        # a head split of the batch: (b // 2, b % 2) raveled back is b
        heads = (ix.floordiv(b, ix.const(2)), ix.mod(b, ix.const(2)), rm)
        assert ix.ravel(heads, (2, 2, 32)) == ix.add(ix.mul(b, ix.const(32)), rm)


def test_bf16_offers_fp16x1_second_and_fp32_operands_last(monkeypatch):
    """Under bf16, after the first bf16-operand configuration: fp16x1 (scaled fp16 operands,
    one product: the bf16 rate, 8x finer rounding), which the loop's next round takes when the
    bf16 kernel misses the verifier's margin; fp32 operands (tf32 tiles; ieee in the
    interpreter) last. On a GPU a GEMM whose activation pass costs no more than its product
    (and every decode-shaped one, <= 128 rows) takes fp16x1 first: the same tensor-core rate,
    8x finer rounding; bf16 operands missed the policy at the output of four Llama layers."""
    from kforge.providers.builtin import schemes
    s = spec("matmul_bias_relu")                   # 8 rows
    space = config_space(s, "cuda", "bf16")
    assert space[0]["input_precision"] == "fp16x1"
    assert space[1]["input_precision"] == "tf32"   # the accurate fallback, then the rest
    assert any(c.get("input_precision") is None for c in space)
    monkeypatch.setattr(schemes, "fp16x1_first",
                        lambda spec, target, stage: False)     # the pass would cost more
    for target, scheme in (("cuda", "tf32"), ("cpu", "ieee")):
        space = config_space(s, target, "bf16")
        assert space[0].get("input_precision") is None
        assert space[1]["input_precision"] == "fp16x1"
        tail = [c.get("input_precision") for c in space if c.get("input_precision")]
        assert tail == ["fp16x1", "fp16x1", scheme, scheme]
        assert space[-1]["input_precision"] == scheme
        assert target == "cpu" or all(c["BLOCK_K"] == 32 for c in space
                                      if c.get("input_precision") == scheme)   # 4-byte tiles
    src = generate_source(s, get_target("cpu"), "bf16", config_space(s, "cpu", "bf16")[-1])
    assert "bfloat16" not in src and 'input_precision="ieee"' in src
    for policy in ("strict", "tf32"):
        assert all(c.get("input_precision") != "fp16x1" for c in config_space(s, "cuda", policy))


def _fp16x1(name, target="cpu"):
    return next(c for c in candidates(spec(name), target, "bf16")
                if c.config.get("input_precision") == "fp16x1")


def test_fp16x1_one_product_of_hi_planes(tmp_path):
    """fp16x1 for the GPU: the activation pass writes one fp16 plane (no lo plane), the K loop
    has one fp16 product and undoes the power-of-two scales after it; the weight keeps
    prepare_weights' scaled fp16 layout."""
    src = _fp16x1("matmul_bias_relu", "cuda").source
    assert src.count("tl.dot(") == 1 and "a_lo" not in src and "b_lo" not in src
    assert "torch.empty((1, " in src and "dtype=torch.float16" in src
    assert "def prepare_weights" in src and "acc = acc *" in src
    # the weight: its hi plane and one exponent per output column, nothing else
    module = load_candidate(_fp16x1("matmul_bias_relu").source, tmp_path / "fp16x1_prep.py")
    w = torch.randn(12, 16) * torch.logspace(-3, 3, 12)[:, None]
    p = module.prepare_weights({1: w, 2: torch.randn(12)})[1]
    assert p.dtype == torch.float16 and p.shape == (12 * 16 + 12,)
    back = p[:192].view(12, 16).double() * torch.pow(2.0, p[192:].double())[:, None]
    assert ((back - w.double()).abs() <= 2 ** -11 * w.double().abs().amax(1, keepdim=True)).all()


@pytest.mark.parametrize("name", ["matmul_bias_relu", "bmm_scale_softmax",
                                  "linear_gelu_layer_norm_softmax"])
def test_fp16x1_rounds_operands_finer_than_bf16(name, tmp_path):
    """On the verifier's inputs (the interpreter computes the fp16 operands' products exactly in
    fp32), fp16x1 is within the bf16 policy's tolerance and at least 4x closer to the exact
    result than the exact result of bf16-rounded operands."""
    from kforge.verify.inputs import make_inputs, signature_of
    s = spec(name)
    module = load_candidate(_fp16x1(name).source, tmp_path / f"fp16x1_{name}.py")
    exact = reference_fn(s, dtype=torch.float64)
    bf16 = reference_fn(s, dtype=torch.float64, operand_format="bf16")
    for seed in (1, 2, 3):
        args = make_inputs(signature_of(s), seed, 0)
        got = run_candidate(module, s, args)
        for g, e, r in zip(got, exact(*args), bf16(*args)):
            torch.testing.assert_close(g.double(), e.double(), atol=1e-2, rtol=1e-2)
            err, err_bf16 = (g.double() - e).abs().max(), (r - e).abs().max()
            assert err * 4 < err_bf16, (float(err), float(err_bf16))


def test_generate_skips_every_candidate_the_loop_tried():
    """The tuner never proposes a configuration the loop has already measured."""
    import dataclasses
    provider = BuiltinProvider()
    req = GenerationRequest(spec=spec("matmul_bias_relu"), region_mlir="", reference_source="",
                            precision="strict", target=get_target("cuda"), phase="optimize",
                            round=0, num_candidates=1)
    seen: list[str] = []
    for _ in range(4):
        cand = provider.generate(dataclasses.replace(req, tried=tuple(seen)))[0]
        assert cand.id not in seen
        seen.append(cand.id)


def test_tf32_policy_takes_fp16x3_first_when_b_is_n_major_in_memory():
    """Hopper's tf32 wgmma needs a K-major B: `x @ W` with W [K, N] read as it lies goes to
    fp16x3 first (16-bit wgmma takes either layout); nn.Linear (W^T, K-major) stays tf32; the
    interpreter keeps the target's own order."""
    from kforge.providers.builtin import region_shape
    from kforge.providers.builtin.schemes import gemm_input_precisions
    engine = Path(__file__).parent / "fixtures" / "engine"
    x_at_w = load_spec(engine / "matmul_bias.json")
    linear = load_spec(SPECS / "matmul_bias_relu.json")

    def first(spec, target):        # fp16x1 aside (first on GPUs wherever its pass pays)
        target = get_target(target)
        schemes = gemm_input_precisions(spec, target, "tf32",
                                        region_shape(spec, target, "tf32"))
        return [p for p in schemes if p != "fp16x1"][0]
    assert first(x_at_w, "cuda") == "fp16x3"
    assert first(linear, "cuda") == "tf32"
    assert first(x_at_w, "cpu") != "fp16x3"


@pytest.mark.parametrize("name", ["matmul_bias_relu", "attention", "layer_norm"])
def test_tensors_of_2_31_elements_are_addressed_in_int64(name, tmp_path, monkeypatch):
    """A region with a tensor of 2**31 elements or more (gpt-oss's prefill logits, 16384 x
    201088: an illegal address on the H200 with int32 offsets) computes every address in
    int64. Here the threshold is lowered so that a small region takes that path, and its
    kernel is run on the interpreter against the reference."""
    from kforge.providers.builtin import emitter
    s = spec(name)
    narrow = candidates(s, "cpu", "strict")[0].source
    assert ".to(tl.int64)" not in narrow.split("def launch")[0].replace(
        "pid.to(tl.int64)", "")
    monkeypatch.setattr(emitter, "WIDE_OFFSETS", 16)
    cand = candidates(s, "cpu", "strict")[0]
    assert cand.source != narrow and ".to(tl.int64)" in cand.source
    check(cand, s, "strict", tmp_path, seeds=(0,))


@pytest.mark.parametrize("m, n, k, first", [
    (16384, 1024, 4096, True),    # Llama-3-8B prefill's K / V projection (8 x 2048 tokens)
    (16384, 14336, 4096, True),   # its MLP up-projection
    (64, 128, 4096, True),        # a decode step: bound by the weights, fp16x1 reads as many
    (16 * 34 * 34, 64, 144, False),   # a small convolution's implicit GEMM: A is the cost
    (16384, 256, 4096, False),    # a narrow N: the pass outweighs the product
])
def test_fp16x1_first_where_its_pass_costs_no_more_than_the_product(m, n, k, first):
    """bf16 on the H200: fp16x1 first wherever its activation pass (10 bytes an element of A
    at the measured bandwidth) takes no longer than the product at the bf16 rate."""
    from kforge.providers.builtin.analysis import Contraction
    from kforge.providers.builtin.schemes import fp16x1_first
    con = Contraction(op=None, a=0, b=1, batch=[], m=[0], n=[1], k=[2], sizes=[m, n, k])
    stage = dataclasses.replace(analyze_region(spec("matmul_bias_relu")), contraction=con)
    assert fp16x1_first(None, get_target("cuda"), stage) is first


def _first_kernels(model, inputs, tmp_path, precision="strict"):
    """A module exported to regions, each with the builtin's first candidate loaded:
    (plan, specs, weights, kernels for run_host_plan, the candidates' sources)."""
    plan, weights = export_regions(model, inputs, tmp_path)
    specs = {s.call: load_spec(Path(plan.directory) / f"{s.call}.json")
             for s in plan.steps if hasattr(s, "call")}
    kernels, sources = {}, []
    for h, s in specs.items():
        sources.append(candidates(s, "cpu", precision)[0].source)
        module = load_candidate(sources[-1], tmp_path / f"k_{h}_{precision}.py")
        kernels[h] = (lambda m, sp: lambda *a: run_candidate(m, sp, a))(module, s)
    return plan, specs, weights, kernels, sources


class _BoolMask(torch.nn.Module):
    """transformers' mask builders start from an all-True tensor and `&` conditions onto it
    (Gemma-2's causal and padding masks): a splat i1 constant in the region."""

    def forward(self, q_idx, kv_idx, keep):
        mask = torch.ones(q_idx.shape[0], kv_idx.shape[1], dtype=torch.bool)
        mask = mask & (kv_idx <= q_idx) & (keep == kv_idx)
        return torch.where(mask, 0.0, torch.finfo(torch.float32).min)


@real_export
def test_i1_splat_constants_are_bools(tmp_path):
    """`1 & x` on an i1 is an int32 in Triton, and tl.where on it is deprecated (an error in a
    future Triton): a splat `true` is emitted as `True`, and the kernel runs with Triton's
    warnings as errors."""
    import warnings
    from kforge.reference import run_host_plan
    model = _BoolMask()
    inputs = [torch.arange(8).view(8, 1), torch.arange(8).view(1, 8),
              torch.tensor([[0, 1, 2, 3, 4, 5, 0, 0]]).view(1, 8)]
    plan, specs, weights, kernels, sources = _first_kernels(model, inputs, tmp_path)
    for source in sources:
        assert not re.search(r"\b1 & |& 1\b", source), source
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="tl.where with a non-boolean condition")
        got = run_host_plan(plan, specs, inputs, weights, kernels=kernels)
    torch.testing.assert_close(got[0], model(*inputs), atol=0, rtol=0)


class _Downsample(torch.nn.Module):
    """A bilinear resize to one pixel (MobileViT's): torch-mlir's lowering compares constants
    (`0.5 >= 0.0`), and an unordered compare of constants spelled out was `~True`, -2 in
    Python: the kernel took the wrong branch."""

    def forward(self, x):
        return torch.relu(F.interpolate(x, size=(1, 1), mode="bilinear", align_corners=False))


@real_export
def test_compares_of_constants_fold_to_bools(tmp_path):
    from kforge.reference import run_host_plan
    model = _Downsample()
    inputs = [torch.randn(2, 4, 2, 2)]
    plan, specs, weights, kernels, sources = _first_kernels(model, inputs, tmp_path)
    for source in sources:
        assert "~(" not in source or "~(x" in source, source
    got = run_host_plan(plan, specs, inputs, weights, kernels=kernels)
    torch.testing.assert_close(got[0], model(*inputs), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["bmm_scale_softmax", "linear_gelu_layer_norm_softmax",
                                  "matmul_bias_relu"])
def test_partial_row_reductions_refuse_what_needs_the_whole_row(name, monkeypatch):
    """KFORGE_BUILTIN_PARTIAL offers tile partials only for single-level sums, maxes and mins
    stored one value a row: a softmax (a sum of exp(x - max): it reads another reduction's
    result, and stores whole rows), a layer norm, and a GEMM without reductions get none, and
    their configuration space is the same as without the variable."""
    from kforge.providers.builtin.analysis import partial_reductions
    s = spec(name)
    shape = analyze_region(s)
    assert all(partial_reductions(s, st) is None for st in shape.stages or [shape])
    without = config_space(s, "cuda", "bf16")
    monkeypatch.setenv("KFORGE_BUILTIN_PARTIAL", "1")
    assert config_space(s, "cuda", "bf16") == without
    assert not any(c.get("PARTIAL") for c in without)


def test_partial_row_reductions_are_the_default_only_where_they_were_faster(monkeypatch):
    """Partials come first by default only for bf16 operands read as they lie (a bf16 model's
    GEMM) at K <= 1024, where they beat the bf16 handoff on the H100 (2026-12-07d: K = 1024
    1.22x and 1.02x; K >= 4096 0.86-0.97x); never in the interpreter unless asked; the
    variable forces them either way (the compiled default at K = 256 for sm_90:
    test_compile.py::test_partial_row_reductions_over_a_wide_n_verify)."""
    from kforge.providers.builtin.schemes import partial_wanted
    monkeypatch.delenv("KFORGE_BUILTIN_PARTIAL", raising=False)
    assert partial_wanted(1024, True, False)
    assert not partial_wanted(4096, True, False)
    assert not partial_wanted(1024, False, False)      # fp16x1: a pass, not measured
    assert not partial_wanted(1024, True, True)
    monkeypatch.setenv("KFORGE_BUILTIN_PARTIAL", "0")
    assert not partial_wanted(256, True, False)
    monkeypatch.setenv("KFORGE_BUILTIN_PARTIAL", "1")
    assert partial_wanted(8192, False, True)
