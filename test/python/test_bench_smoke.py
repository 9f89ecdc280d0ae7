"""`kforge bench` end to end on the CPU: two workloads at smoke size, eager baseline, KForge
compiled through the package API (kforge.compile, Triton interpreter), JSON + Markdown + PNG.

torch.compile is left out (`--baselines eager`): Inductor on a 2-core CI machine costs minutes;
the report must say it was skipped and why. The KForge half needs the compile stage (torch-mlir,
kforge-opt); where it is missing, that test is skipped with the reason the bench recorded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

WORKLOADS = ["gemm_bias_relu", "fuse_softmax_rows"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, repo_root):
    """`kforge bench` as a user runs it, in its own process: the Triton interpreter has to be
    chosen before triton is first imported, which other tests in this process may have done."""
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("bench")
    proc = _kforge(repo_root, "bench", *WORKLOADS, "--target", "cpu", "--smoke", "--baselines",
                   "eager", "--precision", "strict,bf16", "--out", str(out),
                   "--checkpoint", str(out / "partial" / "run.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "bench.json").read_text())


def _kforge(repo_root, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(repo_root / "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-m", "kforge.cli", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_outputs_written(smoke_run):
    out, doc = smoke_run
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "bench.md").read_text()
    assert "## Summary" in md and "| strict | all | 2 |" in md
    for name in WORKLOADS:
        assert f"| {name} |" in md
    assert "torch.compile: not requested (--baselines)" in md


def test_checkpoint_holds_every_workload_and_merges(smoke_run, repo_root, tmp_path):
    """The checkpoint rewritten after each workload ends with all of them, says it is partial,
    and `--merge` takes it as a shard (what run_h200.sh does for a call cut off by its limit)."""
    out, doc = smoke_run
    part = json.loads((out / "partial" / "run.json").read_text())
    assert [w["name"] for w in part["workloads"]] == WORKLOADS
    assert any(n.startswith("partial: 2 of 2") for n in part["notes"])
    assert part["environment"]["kforge_source_sha256"] == doc["environment"]["kforge_source_sha256"]
    proc = _kforge(repo_root, "bench", "--merge", str(out / "partial" / "run.json"),
                   "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    merged = json.loads((tmp_path / "bench.json").read_text())
    assert sorted(w["name"] for w in merged["workloads"]) == sorted(WORKLOADS)


def test_json_fields(smoke_run):
    _, doc = smoke_run
    assert doc["schema"] == "kforge.bench" and doc["version"] == 2
    env = doc["environment"]
    for key in ("hardware", "date", "torch", "triton", "python"):
        assert env[key], key
    assert doc["config"]["precisions"] == ["strict", "bf16"] and doc["config"]["scale"] == "smoke"
    assert doc["peaks"]["source"] in ("table", "measured") and doc["peaks"]["details"]
    assert [w["name"] for w in doc["workloads"]] == WORKLOADS
    for w in doc["workloads"]:
        assert w["status"] == "ok", w.get("reason")
        assert w["bytes_fp32"] > 0 and w["flops"] >= 0
        eager, compiled = w["baselines"]
        assert eager["name"] == "eager" and eager["status"] == "ok"
        assert eager["timing"]["median_ms"] > 0 and eager["timing"]["reps"] >= 3
        assert compiled["name"] == "torch.compile" and compiled["status"] == "skipped"
        assert compiled["reason"]
        assert w["best_baseline"] == "eager"
        policy, bf16 = w["policies"]
        assert policy["precision"] == "strict" and policy["atol"] == policy["rtol"] == 1e-4
        assert policy["floor_ms"] > 0
        assert policy["kforge"]["status"] in ("ok", "mismatch", "failed", "skipped")
        if policy["kforge"]["status"] != "ok":
            assert policy["kforge"]["reason"]
        # matched routes: strict's are the fp32 baselines; bf16's eager routes ran and were
        # checked at 1e-2, the compile routes are recorded as not requested
        assert [r["name"] for r in policy["routes"]] == ["eager", "torch.compile"]
        assert policy["matched_best"] == "eager"
        routes = {r["name"]: r for r in bf16["routes"]}
        assert bf16["precision"] == "bf16" and len(routes) == 4
        for name in ("eager[bf16 model]", "eager[autocast bf16]"):
            assert routes[name]["status"] in ("ok", "mismatch") and routes[name]["timing"]
            assert routes[name]["max_abs_err"] is not None
        assert routes["torch.compile[bf16 model]"]["status"] == "skipped"
        ok = [r for r in routes.values() if r["status"] == "ok"]
        if ok:
            assert bf16["matched_best"] == min(ok, key=lambda r: r["timing"]["median_ms"])["name"]
        else:
            assert bf16["matched_best"] == "eager" and bf16["matched_fallback"]
    assert doc["workloads"][0]["flops"] > 0            # the GEMM is counted
    summary = doc["summary"]["strict"]["all"]
    assert summary["workloads"] == 2 and set(summary["fast_p"]) == {"1", "1.5", "2", "4"}
    assert doc["config"]["matched_routes"]["bf16"]["eager[autocast bf16]"]
    assert "cudnn" in doc["config"]["baseline_note"]


def _compile_stage_missing() -> str | None:
    """Why `kforge.compile` cannot run here (None when it can): the package API, torch-mlir
    and kforge-opt are all needed to compile; the bench itself needs none of them."""
    import importlib.util

    import kforge
    from kforge.errors import UserError

    try:
        kforge.compile
    except AttributeError:
        return "kforge.compile is not in this build"
    if importlib.util.find_spec("torch_mlir") is None:
        return "torch-mlir is not installed"
    try:
        from kforge.tools import kforge_opt
        kforge_opt()
    except (ImportError, UserError) as exc:
        return f"kforge-opt is not available: {exc}"
    return None


def test_kforge_package_verified_and_timed(smoke_run):
    missing = _compile_stage_missing()
    if missing:
        pytest.skip(f"no KForge compile stage on this machine: {missing}")
    _, doc = smoke_run
    results = [w["policies"][0] for w in doc["workloads"]]
    for r in results:
        k = r["kforge"]
        assert k["status"] == "ok", k["reason"]
        # strict: the fp32-grade contract against the float64 model, and KernelBench's rule
        c = r["strict_contract"]
        assert c["passes"] is True, c
        assert c["kforge_max_err_vs_f64"] <= 2 * c["eager_fp32_max_err_vs_f64"] + 1e-6
        assert k["allclose"] is True
        assert r["speedup_matched"] == r["speedup"]      # strict's matched routes are fp32
        assert k["info"]["regions_total"] >= 1          # it went through the package runtime
        assert k["info"]["run_as"] == {"graphs": None}  # how it ran: no CUDA graphs on the CPU
        # where its time went, step by step: every region on a kernel here
        where = k["info"]["where"]
        assert where["ops"]["kernel"] >= 1 and where["kernel_flop_fraction"] == 1.0, where
        assert where["time_measured"] and where["time_share"]["kernel"] > 0.5, where
        assert abs(sum(where["time_share"].values()) - 1.0) < 1e-3 and where["stepwise_ms"] > 0
        kinds = where["kernel_share_by_kind"]       # the kernels' time by what they compute
        assert kinds and all(v is not None and v >= 0 for v in kinds.values()), kinds
        assert abs(sum(kinds.values()) - where["time_share"]["kernel"]) < 1e-3, (kinds, where)
        assert k["max_abs_err"] is not None and k["compile_s"] > 0
        assert k["timing"]["median_ms"] > 0
        assert r["speedup"] is not None and r["roofline_fraction"] > 0


def test_packages_compiled_elsewhere(smoke_run, tmp_path, repo_root):
    """The H200 path on the CPU: packages from another run, weights stripped (as
    benchmarks/build_packages.sh leaves them), loaded with `--packages` and bound to the live
    module by kforge.load."""
    missing = _compile_stage_missing()
    if missing:
        pytest.skip(f"no KForge compile stage on this machine: {missing}")
    import shutil

    from kforge.bench import packages

    out, _ = smoke_run
    pkgs = tmp_path / "packages"
    shutil.copytree(out / "work", pkgs)
    stripped = [s for p in pkgs.glob("strict/*") if p.is_dir() for s in packages.strip_weights(p, 0)]
    assert any(".safetensors" in s for s in stripped)
    proc = _kforge(repo_root, "bench", *WORKLOADS, "--target", "cpu", "--smoke", "--baselines",
                   "eager", "--precision", "strict", "--packages", str(pkgs), "--out",
                   str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "run" / "bench.json").read_text())
    for w in doc["workloads"]:
        k = w["policies"][0]["kforge"]
        assert k["status"] == "ok", k["reason"]
        assert k["info"]["source"] == "package" and k["info"]["kernels_verified"] >= 1
        assert w["policies"][0]["speedup"] is not None


def test_the_device_run_stops_when_its_named_packages_were_not_carried(repo_root, tmp_path):
    """`PACKAGES=.carry/x bash benchmarks/run_h200.sh` on a device copy without .carry/x (an
    ignored folder travels only when named in carry; 2026-12-07 a fresh checkout had none and a
    whole call timed the baselines alone) exits 2 with a message, before any timed work."""
    env = dict(os.environ, OUT=str(tmp_path / "out"), TARGET="cpu",
               PACKAGES=str(tmp_path / "not-carried"), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(repo_root / "benchmarks" / "run_h200.sh")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "not-carried is not here" in proc.stderr
    assert "not-carried is not here" in (tmp_path / "out" / "run.log").read_text()
    assert not (tmp_path / "out" / "bench.json").exists()
