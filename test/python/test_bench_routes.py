"""Matched baselines (issue 13): the routes a user would take in PyTorch at each policy's
precision, run for real on the CPU (eager routes; the torch.compile routes only with
KFORGE_TEST_COMPILE_ROUTES=1, Inductor costs minutes on a 2-core machine), each checked against
eager fp32 at the policy's tolerance, and the headline chosen from the correct ones."""
from __future__ import annotations

import json
import os
import textwrap
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from kforge.bench import report, routes, timing
from kforge.bench.roofline import DESIGN_H200
from kforge.bench.runner import BenchConfig, ContenderResult, Runner
from kforge.bench.timing import Timing
from kforge.bench.workloads import Workload

# out = x @ W - 1000 x with W = 1000 I + small: exact in fp32 to ~1e-4 of 1, hopeless in bf16
# (x @ W rounded to 8 bits of mantissa is off by ~4): every bf16 route must fail 1e-2
CANCEL = '''
import torch
import torch.nn as nn
TAGS = ("gemm",)

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(1000 * torch.eye(n) + 0.01 * torch.randn(n, n, generator=g))

    def forward(self, x):
        return x @ self.w - 1000 * x

def get_inputs(scale="full"):
    return [torch.randn(8, 16)]

def get_init_inputs(scale="full"):
    return [16]
'''

# a plain Linear + ReLU: bf16 routes pass 1e-2
LINEAR = '''
import torch
import torch.nn as nn
TAGS = ("gemm",)

class Model(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x):
        return torch.relu(self.fc(x))

def get_inputs(scale="full"):
    return [torch.randn(8, 32)]

def get_init_inputs(scale="full"):
    return [32, 16]
'''


def _workload(tmp_path: Path, name: str, text: str) -> Workload:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return Workload(name, path)


def _runner(tmp_path, precisions, baselines=("eager",)) -> Runner:
    cfg = BenchConfig(target="cpu", precisions=tuple(precisions), scale="smoke",
                      baselines=tuple(baselines), packages=tmp_path / "no-packages",
                      workdir=tmp_path / "work")
    return Runner(cfg, timing.CpuTimer(reps=3), DESIGN_H200, log=lambda m: None)


def _t(ms):
    return Timing(ms, ms, ms, 3, "test")


def test_headline_is_the_faster_correct_route():
    fast_wrong = ContenderResult("eager[bf16 model]", "mismatch", timing=_t(1.0))
    slow_right = ContenderResult("eager[autocast bf16]", "ok", timing=_t(3.0))
    faster_right = ContenderResult("torch.compile[bf16 model]", "ok", timing=_t(2.0))
    skipped = ContenderResult("torch.compile[bf16 model, max-autotune-no-cudagraphs]", "skipped")
    assert routes.headline([fast_wrong, slow_right, skipped]) is slow_right
    assert routes.headline([fast_wrong, slow_right, faster_right]) is faster_right
    assert routes.headline([fast_wrong, skipped]) is None
    # the same on the JSON form (what `kforge bench --merge` reads back)
    as_json = [asdict(r) for r in (fast_wrong, slow_right, faster_right)]
    assert routes.headline(as_json)["name"] == "torch.compile[bf16 model]"


def test_route_table_is_what_the_issue_names():
    names = {p: [r.name for r in routes.matched_routes(p)] for p in ("strict", "tf32", "bf16")}
    assert names["strict"] == ["eager", "torch.compile"]
    assert names["tf32"] == ["eager[tf32]", "torch.compile[tf32]"]
    bf16 = {r.name: r for r in routes.matched_routes("bf16")}
    assert bf16["torch.compile[bf16 model, max-autotune-no-cudagraphs]"].compile_mode == \
        "max-autotune-no-cudagraphs"
    assert bf16["eager[autocast bf16]"].numerics == "autocast-bf16" and \
        bf16["eager[autocast bf16]"].cast is None
    assert all(r.cast == "bf16" for n, r in bf16.items() if "bf16 model" in n)


def test_numerics_switch_tf32_for_matmuls_and_cudnn_and_restore():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    cudnn.allow_tf32 = True                     # PyTorch's default for convolutions
    try:
        with routes.numerics("fp32", "cpu"):
            assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, False)
            with routes.numerics("tf32", "cpu"):
                assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
            assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, False)
        assert cudnn.allow_tf32 is True
        with routes.numerics("autocast-bf16", "cpu"):
            assert torch.is_autocast_enabled("cpu")
            y = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4))
            assert y.dtype == torch.bfloat16
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


def test_bf16_routes_run_checked_and_headline(tmp_path):
    """A Linear + ReLU: the bf16 model and autocast routes run for real, pass 1e-2 and the
    headline is the faster of them; the fp32 baseline is the strict route; compile routes are
    recorded as not requested."""
    res = _runner(tmp_path, ["strict", "bf16"]).run_one(_workload(tmp_path, "lin", LINEAR))
    strict, bf16 = res.policies
    assert strict.kforge.status == "skipped"            # no package here: routes still run
    assert [r.name for r in strict.routes] == ["eager", "torch.compile"]
    assert strict.matched_best == "eager" == res.best_baseline
    by_name = {r.name: r for r in bf16.routes}
    assert set(by_name) == {r.name for r in routes.matched_routes("bf16")}
    for name in ("eager[bf16 model]", "eager[autocast bf16]"):
        r = by_name[name]
        assert r.status == "ok", r.reason
        assert 0 < r.max_abs_err < 5e-2 and r.timing.median_ms > 0 and r.allclose is not None
    for name in ("torch.compile[bf16 model]",
                 "torch.compile[bf16 model, max-autotune-no-cudagraphs]"):
        assert by_name[name].status == "skipped" and "--baselines" in by_name[name].reason
    fastest = min((by_name["eager[bf16 model]"], by_name["eager[autocast bf16]"]),
                  key=lambda r: r.timing.median_ms)
    assert bf16.matched_best == fastest.name and bf16.matched_fallback is None
    assert bf16.matched_best_ms == fastest.timing.median_ms


def test_bf16_routes_that_miss_the_tolerance_do_not_count(tmp_path):
    """x @ W - 1000 x: every bf16 route misses 1e-2 (measured, not assumed): they are timed
    but `mismatch`, and the headline falls back to the fp32 baseline, saying why."""
    res = _runner(tmp_path, ["bf16", "tf32"]).run_one(_workload(tmp_path, "cancel", CANCEL))
    bf16, tf32 = res.policies
    ran = [r for r in bf16.routes if r.status != "skipped"]
    assert {r.name for r in ran} == {"eager[bf16 model]", "eager[autocast bf16]"}
    for r in ran:
        assert r.status == "mismatch" and r.max_abs_err > 1e-2 and r.timing is not None
        assert "outside atol=0.01" in r.reason and r.allclose is False
    assert bf16.matched_best == "eager" and "fp32 baselines" in bf16.matched_fallback
    # on the CPU allow_tf32 changes nothing: the tf32 eager route is fp32 and passes
    (eager_tf32,) = [r for r in tf32.routes if r.status != "skipped"]
    assert eager_tf32.status == "ok" and tf32.matched_best == "eager[tf32]"


def test_report_and_merge_of_old_documents(tmp_path):
    res = _runner(tmp_path, ["strict", "bf16"]).run_one(_workload(tmp_path, "lin", LINEAR))
    cfg = {"target": "cpu", "precisions": ["strict", "bf16"], "scale": "smoke"}
    doc = report.build_document({"hardware": "cpu"}, cfg, DESIGN_H200.to_json(),
                                [res.to_json()], [])
    doc = json.loads(json.dumps(doc, default=report._json_default))
    assert doc["version"] == 2
    md = report.markdown(doc)
    assert "## Matched routes" in md and "**" + res.policies[1].matched_best + "**" in md
    # a v1 document (matched_baselines instead of routes) still merges, upgraded
    v1 = json.loads(json.dumps(doc))
    v1["version"] = 1
    for w in v1["workloads"]:
        for p in w["policies"]:
            p["matched_baselines"] = [] if p["precision"] == "strict" else p.pop("routes")
            for k in ("matched_best", "matched_fallback", "strict_contract"):
                p.pop(k, None)
    merged = report.merge([v1])
    (w,) = merged["workloads"]
    strict, bf16 = w["policies"]
    assert [r["name"] for r in strict["routes"]] == ["eager", "torch.compile"]
    assert bf16["matched_best"] == res.policies[1].matched_best
    assert any("upgraded from kforge.bench v1" in n for n in merged["notes"])
    # a version this code cannot read is refused with a reason
    with pytest.raises(ValueError, match="version 99 cannot be read"):
        report.merge([dict(doc, version=99)])
    with pytest.raises(ValueError, match="not a kforge.bench document"):
        report.merge([{"schema": "other"}])


def test_merge_refuses_unreadable_file_clearly(tmp_path, capsys):
    from kforge.cli import main

    bad = tmp_path / "future.json"
    bad.write_text(json.dumps({"schema": "kforge.bench", "version": 99, "workloads": []}))
    rc = main(["bench", "--merge", str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc != 0 and "version 99 cannot be read" in err and "Traceback" not in err


@pytest.mark.skipif(os.environ.get("KFORGE_TEST_COMPILE_ROUTES") != "1",
                    reason="torch.compile routes on the CPU cost minutes (set "
                           "KFORGE_TEST_COMPILE_ROUTES=1 to run them)")
def test_compile_routes_for_real(tmp_path):
    res = _runner(tmp_path, ["bf16"], baselines=("eager", "compile")).run_one(
        _workload(tmp_path, "lin", LINEAR))
    (bf16,) = res.policies
    by_name = {r.name: r for r in bf16.routes}
    for name in ("torch.compile[bf16 model]",
                 "torch.compile[bf16 model, max-autotune-no-cudagraphs]"):
        r = by_name[name]
        assert r.status == "ok", r.reason
        assert r.compile_s > 0 and r.info["mode"] in ("default", "max-autotune-no-cudagraphs")
    assert bf16.matched_best in by_name


def test_a_workload_is_checkpointed_after_every_route(tmp_path):
    """`on_result` is called after each route of the workload running, with that workload as
    "partial" and what it measured so far (a run stopped by its time limit keeps it), and once
    more when it ends; each route's line says when it finished and what it measured."""
    lines, seen = [], []
    runner = _runner(tmp_path, ["strict", "bf16"])
    runner.log = lines.append
    results = runner.run([_workload(tmp_path, "lin", LINEAR)],
                         on_result=lambda rs: seen.append(
                             (rs[-1].status, len(rs[-1].baselines), len(rs[-1].policies))))
    assert results[0].status == "ok" and seen[-1] == ("ok", 2, 2)
    partial = [s for s in seen if s[0] == "partial"]
    assert partial[0] == ("partial", 1, 0)              # after eager, before anything else
    assert ("partial", 2, 1) in partial and ("partial", 2, 2) in partial
    assert any(line.lstrip().startswith("[") and "] eager: " in line and " ms, ok" in line
               for line in lines)
    assert any("] eager[bf16 model]: " in line for line in lines)


def test_the_bf16_model_package_runs_beside_and_the_faster_correct_one_is_kforges(tmp_path,
                                                                                  monkeypatch):
    """Under bf16 KForge has two packages: the fp32 model under the bf16 policy, and the model
    cast to bf16 (`bf16-model`, built by kforge.bench.packages from the workload's source with
    the cast appended: bf16 in and out, as PyTorch's bf16 routes). Both are built and run here
    for real (cpu target), weights stripped as benchmarks/build_packages.sh leaves them; both
    are checked against eager fp32; KForge's bf16 result is the faster correct one and the
    other is kept; the report has a section comparing them."""
    from kforge.bench import packages
    from kforge.frontend.regions import compile_half_missing
    if compile_half_missing():
        pytest.skip(compile_half_missing())
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))    # this test's kernels only
    wl = _workload(tmp_path, "lin", LINEAR)
    pkgs, tmp = tmp_path / "packages", tmp_path / "tmp"
    tmp.mkdir()
    records = packages.build_workload(wl, ["bf16", "bf16-model"], pkgs, "cpu", "builtin",
                                      smoke=True, keep_weights=False, timeout_s=600, extra=[],
                                      tmp=tmp, skip_existing=False)
    assert [r["status"] for r in records] == ["ok", "ok"], [r["log_tail"] for r in records]
    assert records[1]["regions_from"] is None           # its own import, not bf16's regions
    source = (pkgs / "bf16-model" / "lin" / "model.py").read_text()
    assert "class Model(_KForgeFp32Model)" in source and "import torch" in source
    cfg = BenchConfig(target="cpu", precisions=("bf16",), scale="smoke", baselines=("eager",),
                      packages=pkgs, workdir=tmp_path / "work")
    res = Runner(cfg, timing.CpuTimer(reps=3), DESIGN_H200, log=lambda m: None).run_one(wl)
    (pr,) = res.policies
    (other,) = pr.kforge_variants
    both = {k.info["model"]: k for k in (pr.kforge, other)}
    assert set(both) == {"fp32", "bf16"}
    for k in both.values():
        assert k.name == "kforge[bf16]" and k.status == "ok", k.reason
        assert 0 <= k.max_abs_err < 5e-2 and k.timing.median_ms > 0
    assert pr.kforge_model == pr.kforge.info["model"]
    assert pr.kforge.timing.median_ms <= other.timing.median_ms
    # bf16 in and out: fewer bytes to move than the fp32 model's activations
    assert both["bf16"].info["min_bytes"] < both["fp32"].info["min_bytes"]
    # each says how many of its regions run on kernels (the report's `kernels` column)
    for k in both.values():
        assert k.info["regions_on_kernels"] == k.info["regions_total"] >= 1, k.info
    assert pr.speedup_matched == pr.matched_best_ms / pr.kforge.timing.median_ms
    doc = report.build_document({"hardware": "cpu"}, {"target": "cpu", "precisions": ["bf16"],
                                                      "scale": "smoke"},
                                DESIGN_H200.to_json(), [res.to_json()], [])
    md = report.markdown(json.loads(json.dumps(doc, default=report._json_default)))
    assert "## bf16: KForge's package of the fp32 model and of the bf16 model" in md
    assert f"| {pr.kforge_model} |" in md


def test_the_precompile_pass_warms_the_compiled_matched_routes(tmp_path):
    """`python -m kforge.bench.precompile --routes bf16,tf32` (run_h200.sh with matched
    baselines): after the fp32 compile, the bf16 model under Inductor's default mode and
    max-autotune-no-cudagraphs and the tf32 compile are each compiled and called once, for
    real, and their cold times recorded; strict's compile is the fp32 one. An unknown policy is
    a clear error."""
    import subprocess
    import sys
    out = tmp_path / "times"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "python"))
    proc = subprocess.run([sys.executable, "-m", "kforge.bench.precompile", "--out", str(out),
                           "--smoke", "--routes", "strict,bf16,tf32", "--jobs", "1",
                           "gemm_bias_relu"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((out / "gemm_bias_relu.json").read_text())
    assert record["status"] == "ok" and record["compile_s"] > 0
    assert set(record["routes"]) == {"torch.compile[bf16 model]",
                                     "torch.compile[bf16 model, max-autotune-no-cudagraphs]",
                                     "torch.compile[tf32]"}
    assert all(r["status"] == "ok" for r in record["routes"].values()), record["routes"]
    bad = subprocess.run([sys.executable, "-m", "kforge.bench.precompile", "--out", str(out),
                          "--routes", "fp8", "gemm_bias_relu"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 2 and "no matched routes for policy 'fp8'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_route_warm_up_keeps_no_autotuning_choice():
    """warm_route compiles with Inductor's autotune cache off (its processes share the GPU, so
    their choices are not the timed run's to reuse), the FX graph cache off under max-autotune
    (the graph holds the GEMM it chose) and on otherwise; both settings are restored after."""
    import torch._inductor.config as inductor_config

    from kforge.bench.precompile import route_warmups, warm_route
    from kforge.targets import get_target
    seen = []
    real = torch.compile

    def watch(model, mode=None, **kw):
        seen.append((mode, inductor_config.autotune_local_cache, inductor_config.fx_graph_cache))
        return model             # runs eagerly: this test is about the settings, not Inductor
    before = (inductor_config.autotune_local_cache, inductor_config.fx_graph_cache)
    torch.compile = watch
    try:
        model = torch.nn.Linear(8, 4)
        for r in route_warmups(("bf16",)):
            assert warm_route(r, model, [torch.randn(2, 8)], get_target("cpu"))["status"] == "ok"
    finally:
        torch.compile = real
    assert seen == [(None, False, True), ("max-autotune-no-cudagraphs", False, False)]
    assert (inductor_config.autotune_local_cache, inductor_config.fx_graph_cache) == before
