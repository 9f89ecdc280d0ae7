"""Intel XPU kernels compiled for real: the builtin's kernels, an example and the small zoo
models, compiled to SPIR-V by `triton-xpu` in its own environment (kforge.targets.xpu_env; made
on first use with pip from PyPI, then reused), with DPAS in every GEMM. No Intel GPU is here:
what runs is the compiler, not the kernels."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.crosscompile import candidate_job, compile_package
from kforge.errors import UserError
from kforge.providers.builtin import candidates
from kforge.spec import load_spec
from kforge.targets import get_target, xpu_env

REPO = Path(__file__).resolve().parents[2]
SPECS = Path(__file__).parent / "fixtures" / "specs"
ZOO = REPO / "benchmarks" / "models"


@pytest.fixture(scope="module")
def xpu_ready():
    """The xpu environment, made here where it is missing (a fresh CI machine)."""
    xpu_env.ensure(progress=lambda m: print(m, file=sys.stderr))
    return True


def test_targets_are_backend_and_arch():
    assert get_target("xpu").label == "xpu:pvc" and get_target("xpu:bmg").compute_units == 20
    assert get_target("cuda").label == "cuda:sm_90" and get_target("cuda").compute_units == 132
    assert get_target("cuda:sm_80").peaks.bf16 < get_target("cuda").peaks.bf16
    with pytest.raises(UserError, match="unknown architecture 'sm_00'.*sm_90"):
        get_target("cuda:sm_00")
    with pytest.raises(UserError, match="unknown target 'hip:gfx942': choose one of cuda, xpu, cpu"):
        get_target("hip:gfx942")


def test_bench_and_verifier_ask_the_targets(capsys, tmp_path, monkeypatch):
    """Availability, timers and peak tables come from the target objects; --target takes
    BACKEND[:ARCH] in `kforge run` and `kforge bench` as in `kforge compile`."""
    from kforge.bench import roofline, timing
    from kforge.cli import build_parser, main
    from kforge.verify import device_name, target_available
    a100 = roofline.table_peaks("cuda:sm_80")
    assert (a100.bf16_tflops, a100.source) == (312, "table") and "A100" in a100.details
    assert roofline.table_peaks("cpu") == roofline.DESIGN_H200
    assert isinstance(timing.timer_for("cpu"), timing.CpuTimer)
    with pytest.raises(UserError, match="no timer for xpu:bmg"):
        timing.timer_for("xpu:bmg")
    assert target_available("cpu") and not target_available("tpu")
    monkeypatch.setenv("KFORGE_CUDA_ARCH", "sm_90")          # restored after the test
    args = build_parser().parse_args(["run", "PKG", "--target", "cuda:sm_80"])
    assert args.target == "cuda" and os.environ["KFORGE_CUDA_ARCH"] == "sm_80"
    for argv in (["run", "PKG", "--target", "hip:gfx942"],
                 ["bench", "gemm_bias_relu", "--target", "cuda:sm_00", "--out", str(tmp_path)]):
        with pytest.raises(SystemExit):
            main(argv)
    err = capsys.readouterr().err
    assert "unknown target 'hip:gfx942'" in err and "unknown architecture 'sm_00'" in err
    if not get_target("xpu").available():
        assert not target_available("xpu") and device_name("xpu") == "xpu"
        assert main(["bench", "gemm_bias_relu", "--target", "xpu", "--out", str(tmp_path)]) == 2
        assert "--target xpu: no xpu device visible to PyTorch here" in capsys.readouterr().err


def test_unmakeable_environment_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("KFORGE_XPU_VENV", str(blocker / "venv"))   # under a plain file
    assert not xpu_env.ready()
    with pytest.raises(UserError, match="could not make the xpu compile environment"):
        xpu_env.ensure()


@pytest.mark.parametrize("target,policy", [("xpu:pvc", "strict"), ("xpu:pvc", "tf32"),
                                           ("xpu:pvc", "bf16"), ("xpu:bmg", "bf16")])
def test_builtin_gemm_compiles_to_spirv_with_dpas(xpu_ready, target, policy, monkeypatch):
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")           # the configuration as the space orders it
    spec = load_spec(SPECS / "matmul_bias_relu.json")
    cand = candidates(spec, target, policy)[0]
    assert "grf_mode='large'" in cand.source             # Intel's large-tile GEMM setting
    [reports] = get_target(target).cross_compile([candidate_job(cand.source, spec, name="t")])
    assert reports and all(r.ok for r in reports), [r.error for r in reports]
    gemm = [r for r in reports if r.name.endswith("_gemm")]
    assert gemm and all(r.mma == "dpas" and r.threads_per_warp == 16 for r in gemm)
    assert all(r.spirv_bytes > 1000 and r.grf_mode == "large" for r in gemm)
    assert reports[0].compiler.startswith("triton-xpu 3.3")


@pytest.mark.parametrize("name", ["matvec_bias_relu", "conv2d_pad_1x1"])
def test_gemm_tiles_whose_address_skips_a_tile_axis_compile(xpu_ready, name, monkeypatch):
    """triton-xpu 3.3 does not broadcast a store's value or a load's mask to the pointer's
    shape ("Cannot broadcast ... ['8', '512'], ['8', '1']"), as ConvNeXt's N = 1 GEMMs and
    padded 1x1 images needed: the builtin broadcasts the pointer, and all candidates compile."""
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")
    spec = load_spec(SPECS / f"{name}.json")
    target = get_target("xpu")
    for policy in ("strict", "bf16"):
        cands = candidates(spec, "xpu", policy)
        results = target.cross_compile([candidate_job(c.source, spec, name=f"c{i}")
                                        for i, c in enumerate(cands)])
        assert cands and all(r.ok for reports in results for r in reports), \
            [r.error[-300:] for reports in results for r in reports if not r.ok][:2]
        # Triton's own tf32x3 does not become DPAS in triton-xpu 3.3 (fp32 FMA, sub-group 32)
        assert all(r.mma == "dpas" for c, reports in zip(cands, results) for r in reports
                   if r.name.endswith("_gemm") and c.config.get("input_precision") != "tf32x3")


def test_profile_of_an_xpu_candidate_reads_its_spirv(xpu_ready, monkeypatch):
    """Without the device, a profile compiles the candidate for the target as cuda's does
    (Target.cross_compile), so the analyst sees DPAS; no counters, no timing."""
    from kforge.profiling.collect import collect_profile
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")
    spec = load_spec(SPECS / "matmul_bias_relu.json")
    cand = candidates(spec, "xpu", "bf16")[0]
    prof = collect_profile(spec, cand, None, "xpu", "bf16")
    assert prof.sources["compile"].present, prof.sources["compile"].detail
    assert "xpu:pvc" in prof.sources["compile"].detail
    assert prof.main_kernel().dpas and prof.sources["ncu"].detail == "no xpu device here"


def test_compile_errors_are_reported_per_kernel(xpu_ready):
    spec = load_spec(SPECS / "layer_norm.json")
    good = candidates(spec, "xpu", "strict")[0]
    bad = good.source.replace("tl.reduce(", "tl.reduce_nope(", 1)
    assert bad != good.source
    target = get_target("xpu")
    ok, broken, unloadable = target.cross_compile(
        [candidate_job(good.source, spec, name="ok"), candidate_job(bad, spec, name="bad"),
         {"name": "syntax", "source": "def launch(:", "args": []}])
    assert all(r.ok and r.mma == "" for r in ok)
    assert not all(r.ok for r in broken) and "reduce_nope" in " ".join(r.error for r in broken)
    assert not unloadable[0].ok and "does not load" in unloadable[0].error


def _compile_for_xpu(model: Path, pkg: Path):
    from kforge.build import compile_model
    from kforge.synth import SynthOptions
    compile_model(model, pkg, SynthOptions(target="xpu", precision="strict", rounds=0))
    assert json.loads((pkg / "package.json").read_text())["arch"] == "pvc"


def _assert_all_spirv_with_dpas(report: dict, model: str):
    kernels = [k for ks in report.values() for k in ks]
    assert kernels, model
    assert all(k.ok and k.spirv_bytes for k in kernels), \
        (model, [(k.name, k.error[:300]) for k in kernels if not k.ok])
    gemms = [k.name for k in kernels if k.name.endswith("_gemm")]
    assert all(k.mma == "dpas" for k in kernels if k.name.endswith("_gemm")), (model, gemms)
    return gemms


def test_example_compiles_for_xpu_and_xcompile_reports_it(xpu_ready, tmp_path, kforge_opt,
                                                          monkeypatch):
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")           # candidates as ordered; compiled below
    pkg = tmp_path / "pkg"
    _compile_for_xpu(REPO / "examples" / "mlp_gelu.py", pkg)
    assert _assert_all_spirv_with_dpas(compile_package(pkg), "mlp_gelu")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kforge.cli", "xcompile", str(pkg), "--target",
                           "xpu:bmg", "--json", str(tmp_path / "x.json")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dpas" in proc.stdout and "failed to compile for xpu:bmg" in proc.stdout
    doc = json.loads((tmp_path / "x.json").read_text())
    assert all(k["ok"] and k["spirv_bytes"] for ks in doc.values() for k in ks)
    wrong = subprocess.run([sys.executable, "-m", "kforge.cli", "xcompile", str(pkg), "--target",
                            "cuda"], capture_output=True, text=True, env=env, timeout=300)
    assert wrong.returncode != 0 and "compiled for xpu" in wrong.stderr + wrong.stdout


# every model, convnext included: its N = 1 GEMMs and padded 1x1 images once stored / loaded
# through pointers of another shape than the value (test_gemm_tiles_whose_address_skips_...)
_ZOO = sorted(p.stem for p in ZOO.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("name", _ZOO)
def test_zoo_model_kernels_compile_for_xpu_with_dpas(xpu_ready, name, tmp_path, kforge_opt,
                                                     monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("KFORGE_ZOO_SIZE", "small")
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")
    pkg = tmp_path / "pkg"
    _compile_for_xpu(ZOO / f"{name}.py", pkg)
    gemms = _assert_all_spirv_with_dpas(compile_package(pkg), name)
    assert gemms, f"{name}: no GEMM kernel"
