"""The profiler layer (kforge.profiling) and the builtin analyst that reads it.

Parsers run on fixtures recorded on the H200 (test/python/fixtures/profile/, made by
benchmarks/profile/record_fixtures.py on 2026-12-01: ncu 2025.3 with --clock-control none, Triton
3.6.0): the builtin's bf16 GEMM kernel for gemm_bias_relu (1024x8192x8192) and its elementwise
kernel for gelu_tanh. The collector runs for real on the cpu target (the Triton interpreter).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kforge.errors import UserError
from kforge.profiling import (SCHEMA_VERSION, KernelFacts, Profile, Source, Timing,
                              collect_profile, load_profile, roofline_of, save_profile)
from kforge.profiling import ncu, proton
from kforge.profiling.report import profile_markdown, profile_row, summarize
from kforge.profiling.triton_meta import code_facts, facts_from_dump, ptx_load_widths
from kforge.providers.builtin import BuiltinProvider, config_space
from kforge.providers.builtin.analyst import analyze_profile, rank_configs, tile_model
from kforge.providers.builtin.analysis import analyze_region
from kforge.providers.base import GenerationRequest
from kforge.spec import load_spec
from kforge.targets import get_target

FIX = Path(__file__).parent / "fixtures" / "profile"
ROOT = Path(__file__).resolve().parents[2]
GEMM_SPEC = ROOT / "benchmarks" / "profile" / "specs" / "gemm_bias_relu.json"
GEMM_KERNEL = "kforge_region_80d9f83587410198_gemm"


def gemm_facts() -> KernelFacts:
    meta = json.loads((FIX / "gemm_bf16.kernels.json").read_text())[0]
    ptx = gzip.decompress((FIX / f"gemm_bf16.{GEMM_KERNEL}_0.ptx.gz").read_bytes()).decode()
    ttgir = (FIX / f"gemm_bf16.{GEMM_KERNEL}_0.ttgir").read_text()
    return facts_from_dump(meta, {"ptx": ptx, "ttgir": ttgir})


def gemm_profile(config: dict) -> Profile:
    """The H200 GEMM as the loop would profile it: ncu's counters and kernel time, the
    recorded compile metadata, the roofline at that time."""
    counters = ncu.parse_csv((FIX / "gemm_bf16.ncu_raw.csv").read_text())
    spec = load_spec(GEMM_SPEC)
    t = counters[0].time_ms
    roof = roofline_of(spec.flops, spec.min_bytes, t, get_target("cuda").peaks, "bf16")
    return Profile(candidate_id="c0", target="cuda", precision="bf16", config=config,
                   timing=Timing(t, t * 0.99, t * 1.01, 0.02), roofline=roof,
                   kernels=(gemm_facts(),), counters=tuple(counters),
                   sources={"compile": Source(True, "fixture"), "ncu": Source(True, "fixture"),
                            "proton": Source(False, "not needed")})


# --- schema ---------------------------------------------------------------------------------

def test_profile_round_trips_and_rejects_other_versions(tmp_path):
    prof = gemm_profile({"BLOCK_M": 128})
    path = save_profile(prof, tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["schema"] == "kforge.profile" and data["version"] == SCHEMA_VERSION
    assert load_profile(path) == prof
    with pytest.raises(UserError, match="version 99 is not supported"):
        Profile.from_json(dict(data, version=99))
    with pytest.raises(UserError, match="not a KForge profile"):
        Profile.from_json({"schema": "something.else"})
    with pytest.raises(UserError, match="malformed"):
        Profile.from_json({"schema": "kforge.profile", "version": SCHEMA_VERSION})
    with pytest.raises(UserError, match="no profile at"):
        load_profile(tmp_path / "missing.json")


def test_the_profile_recorded_on_the_h200_loads():
    prof = load_profile(FIX / "gemm_bf16.profile.json")
    assert prof.sources["compile"].present and prof.sources["ncu"].present
    assert not prof.sources["proton"].present and "ncu" in prof.sources["proton"].detail
    k = prof.main_kernel()
    assert k.name == GEMM_KERNEL and k.wgmma and k.n_regs == 186 and k.n_spills == 0
    c = prof.main_counters()
    assert 0.2 < c.time_ms < 0.25 and c.tensor_pct > 50


# --- ncu ------------------------------------------------------------------------------------

def test_ncu_command_leaves_the_clocks_alone():
    cmd = ncu.command("ncu", ncu.metric_names(), "log.csv", ["python", "w.py"])
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert "--profile-from-start" in cmd and cmd[cmd.index("--page") + 1] == "raw"
    assert cmd[-2:] == ["python", "w.py"]
    assert len(ncu.metric_names()) == len(set(ncu.metric_names())) == 24


def test_ncu_raw_csv_from_the_h200():
    (c,) = ncu.parse_csv((FIX / "gemm_bf16.ncu_raw.csv").read_text())
    assert c.name == GEMM_KERNEL
    assert c.time_ms == pytest.approx(0.222688)          # gpu__time_duration in ns -> ms
    assert (c.dram_pct, c.l2_pct, c.tensor_pct, c.occupancy_pct, c.l2_hit_pct) == (
        21.03, 56.06, 71.17, 12.48, 78.81)
    assert c.dram_bytes == pytest.approx(225331968.0)
    assert [r for r, _ in c.top_stalls] == ["long_scoreboard", "short_scoreboard", "wait"]
    assert set(c.raw) == set(ncu.metric_names())         # only the fixed set is kept


def test_ncu_details_csv_agrees_with_the_raw_page():
    (raw,) = ncu.parse_csv((FIX / "gemm_bf16.ncu_raw.csv").read_text())
    (det,) = ncu.parse_csv((FIX / "gemm_bf16.ncu_details.csv").read_text())
    assert det.name == raw.name
    for field in ("time_ms", "dram_pct", "tensor_pct", "occupancy_pct"):
        assert getattr(det, field) == pytest.approx(getattr(raw, field), rel=0.1)
    (ew,) = ncu.parse_csv((FIX / "gelu_tanh.ncu_raw.csv").read_text())
    assert ew.name == "kforge_region_gelu_tanh_elementwise" and ew.tensor_pct == 0.0


def test_ncu_log_without_csv_and_unknown_metrics():
    assert ncu.parse_csv("==PROF== Connected to process 1\n==ERROR== no kernels\n") == []
    log = "==ERROR== Failed to find metric sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"
    assert ncu.unknown_metrics(log) == [
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"]


def test_proton_trace_from_the_h200():
    (c,) = proton.read_hatchet(FIX / "gemm_bf16.proton.hatchet")
    assert c.name == GEMM_KERNEL and c.raw["proton_count"] == 3
    assert c.time_ms == pytest.approx(657117 / 3 * 1e-6)
    assert c.dram_pct is None                  # Proton gives times, not counters


# --- Triton compile metadata and code facts ---------------------------------------------------

def test_triton_metadata_and_code_facts_of_the_h200_gemm():
    k = gemm_facts()
    assert (k.name, k.n_regs, k.n_spills, k.shared_bytes, k.num_warps, k.num_stages) == (
        GEMM_KERNEL, 186, 0, 163840, 8, 3)
    assert k.wgmma and not k.mma_sync and not k.tma and not k.dpas
    assert k.load_widths == {4: 1, 16: 48} and k.max_load_bytes == 16
    # TTGIR alone also shows the warp-group dot
    assert code_facts({"ttgir": (FIX / f"gemm_bf16.{GEMM_KERNEL}_0.ttgir").read_text()})["wgmma"]


def test_code_facts_of_the_elementwise_kernel_and_of_snippets():
    meta = json.loads((FIX / "gelu_tanh.kernels.json").read_text())[0]
    ptx = (FIX / "gelu_tanh.kforge_region_gelu_tanh_elementwise_0.ptx").read_text()
    k = facts_from_dump(meta, {"ptx": ptx})
    assert not k.wgmma and k.n_spills == 0 and k.load_widths == {4: 8}
    widths = ptx_load_widths("ld.global.L1::evict_last.v4.b32 {%r1,%r2,%r3,%r4}, [%rd1];\n"
                             "ld.global.nc.v2.f16 {%h1,%h2}, [%rd2];\n"
                             "cp.async.cg.shared.global [ %r9 + 0 ], [ %rd3 + 0 ], 0x10, %r2;")
    assert widths == {16: 2, 4: 1}
    assert code_facts({"ptx": "cp.async.bulk.tensor.2d.shared::cluster.global"})["tma"]
    assert code_facts({"ttgir": "#ttig.dpas<{repeatCount = 8}>"})["dpas"]


# --- the collector, for real on the interpreter -------------------------------------------------

def test_collect_profile_on_the_interpreter_records_absent_sources():
    from kforge.providers.builtin import candidates
    from kforge.verify import verify_candidate
    spec = load_spec(Path(__file__).parent / "fixtures" / "specs" / "gelu_tanh.json")
    cand = candidates(spec, "cpu", "strict")[0]
    rec = verify_candidate(spec, cand, "cpu", "strict", measure=True, seeds=(1,))
    prof = collect_profile(spec, cand, rec, "cpu", "strict")
    assert prof.timing.median_ms == rec.time_ms and prof.roofline.floor_ms > 0
    assert prof.roofline.achieved_bytes_per_s == pytest.approx(
        prof.roofline.bytes / (rec.time_ms * 1e-3))
    assert {n: s.present for n, s in prof.sources.items()} == {
        "compile": False, "ncu": False, "proton": False}
    assert "interpreter" in prof.sources["compile"].detail
    assert "absent: ncu" in summarize(prof)
    with pytest.raises(UserError, match="unknown counter source"):
        collect_profile(spec, cand, rec, "cpu", "strict", counters="perf")


# --- the builtin analyst on the profile -------------------------------------------------------

def test_builtin_analyst_cites_the_h200_counters_and_ranks_configs():
    spec = load_spec(GEMM_SPEC)
    shape = analyze_region(spec)
    space = config_space(spec, "cuda", "bf16")
    prof = gemm_profile(space[0])
    recs = analyze_profile(spec, get_target("cuda"), "bf16", shape, space, prof.to_json())
    text = "\n".join(recs)
    assert "DRAM 21% of peak" in text and "tensor pipe 71%" in text and "occupancy 12%" in text
    assert "compute-bound" in text
    ranked = [r for r in recs if r[:1].isdigit()]
    assert ranked and ranked[0].startswith("1. ")
    picks = [json.loads(r[len("config: "):].split("  #")[0]) for r in recs
             if r.startswith("config: ")]
    order = rank_configs(shape, space, prof, spec=spec)
    assert picks == [c for c, _ in order[:4]] and space[0] not in picks
    # configurations already tried are not named again
    later = rank_configs(shape, space, prof, tried=[c for c, _ in order[:2]], spec=spec)
    assert [c for c, _ in later][:2] == [c for c, _ in order[2:4]]


def test_builtin_analyst_reads_spills_and_moves_away_from_them():
    spec = load_spec(GEMM_SPEC)
    shape = analyze_region(spec)
    space = config_space(spec, "cuda", "bf16")
    spilled = KernelFacts(GEMM_KERNEL, n_regs=255, n_spills=64, shared_bytes=163840,
                          num_warps=8, num_stages=3, wgmma=True, asm=("ptx",))
    prof = Profile("c0", "cuda", "bf16", config=space[0], timing=Timing(1.0),
                   kernels=(spilled,))
    recs = analyze_profile(spec, get_target("cuda"), "bf16", shape, space, prof)
    assert recs[[r[:1].isdigit() for r in recs].index(True)].startswith("1. [spills] 64")
    best, _ = rank_configs(shape, space, prof)[0]
    assert tile_model(shape, best)["acc_regs"] < tile_model(shape, space[0])["acc_regs"]


def test_provider_analyze_takes_the_loops_profile_dict():
    spec = load_spec(GEMM_SPEC)
    space = config_space(spec, "cuda", "bf16")
    req = GenerationRequest(spec=spec, region_mlir="", reference_source="", precision="bf16",
                            target="cuda", phase="optimize", round=0)
    prof = dict(gemm_profile(space[0]).to_json(), floor_ms=0.1,
                tried_configs=[space[0], space[1]])
    recs = BuiltinProvider().analyze(req, prof)
    picks = [json.loads(r[len("config: "):].split("  #")[0]) for r in recs
             if r.startswith("config: ")]
    assert picks and space[1] not in picks


def test_profile_table_and_report_section():
    prof = gemm_profile({"BLOCK_M": 128})
    row = profile_row("80d9f835", prof, ("runs at 77% of the floor", "1. [compute] x"))
    assert row["top"] == "1. [compute] x" and row["code"] == "wgmma"
    assert row["dram_pct"] == 21.03 and row["tflops"] == pytest.approx(
        prof.roofline.achieved_flops_per_s / 1e12)
    md = "\n".join(profile_markdown({"when": "now", "plot": "profile/roofline.png",
                                     "plot_note": "roofline plot", "rows": [row]}))
    assert "![roofline](profile/roofline.png)" in md and "| 80d9f835 |" in md
    assert profile_markdown(None) == []


# --- kforge profile PKG [REGION] ---------------------------------------------------------------

def test_kforge_profile_command(tmp_path, run_kforge, kforge_opt, examples_dir):
    pkg = tmp_path / "pkg"
    r = run_kforge("compile", examples_dir / "mlp_gelu.py", "-o", pkg, "--target", "cpu",
                   "--rounds", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_kforge("profile", pkg)
    assert r.returncode == 0, r.stderr[-2000:]
    regions = sorted(p.stem for p in (pkg / "profile").glob("*.json") if p.stem != "profiles")
    assert len(regions) == 2
    for h in regions:
        assert h in r.stdout
        prof = load_profile(pkg / "profile" / f"{h}.json")
        assert prof.timing is not None and prof.roofline is not None
    assert "absent: compile: the Triton interpreter compiles no device code" in r.stdout
    assert "1. [" in r.stdout.split("kforge profile")[1].split("absent:")[0]   # the table
    assert "roofline plot:" in r.stdout and (pkg / "profile" / "roofline.png").stat().st_size > 0
    report = (pkg / "report.md").read_text()
    assert "## Kernel profiles (`kforge profile`)" in report
    assert "![roofline](profile/roofline.png)" in report and f"| {regions[0]} |" in report
    one = run_kforge("profile", pkg, regions[1][:6])
    assert one.returncode == 0 and regions[1] in one.stdout and regions[0] not in one.stdout
    bad = run_kforge("profile", pkg, "ffffffff")
    assert bad.returncode != 0 and "no cpu kernel for region 'ffffffff'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_collect_profile_cross_compiles_a_cuda_kernel_without_the_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the GPU is here: the profile compiles on it instead")
    from kforge.providers.builtin import candidates
    spec = load_spec(Path(__file__).parent / "fixtures" / "specs" / "matmul_bias_relu.json")
    cand = candidates(spec, "cuda", "bf16")[0]
    prof = collect_profile(spec, cand, None, "cuda", "bf16")
    assert prof.sources["compile"].present and "sm_90" in prof.sources["compile"].detail
    k = prof.main_kernel()
    assert k.wgmma and k.n_regs > 0 and k.n_spills == 0 and k.num_warps == cand.config["num_warps"]
    assert prof.sources["ncu"].detail == "no cuda device here" and prof.timing is None


def test_profiling_worker_refuses_what_the_sandbox_refuses(tmp_path):
    import subprocess
    import sys
    from kforge.profiling.collect import WORKER, _job
    from kforge.providers.base import Candidate
    spec = load_spec(Path(__file__).parent / "fixtures" / "specs" / "gelu_tanh.json")
    evil = Candidate("x", "x", "import kforge.reference\ndef launch(*a):\n    return a\n")
    job = _job(tmp_path, evil, spec, "cpu", 8, "meta", 1)
    p = subprocess.run([sys.executable, str(WORKER), str(job)], capture_output=True, text=True,
                       env={**__import__("os").environ, "TRITON_INTERPRET": "1"}, timeout=120)
    assert p.returncode != 0 and "kforge profiler: a kernel may not import kforge" in p.stderr
