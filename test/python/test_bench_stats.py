"""Unit tests of the benchmark's statistics and reports, on synthetic numbers (no timing)."""
from __future__ import annotations

import json
import math

import pytest

from kforge.bench import report, roofline, stats


def test_geomean():
    assert stats.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert stats.geomean([1.5]) == pytest.approx(1.5)
    assert stats.geomean([]) is None
    with pytest.raises(ValueError):
        stats.geomean([1.0, 0.0])


def test_fast_p_counts_only_correct_and_strictly_faster():
    # 7 workloads: two incorrect or missing (None), one exactly at 1.0, one exactly at 2.0.
    speedups = [0.8, 1.0, 1.2, 2.0, 4.5, None, None]
    assert stats.fast_p(speedups, 1.0) == pytest.approx(3 / 7)     # 1.2, 2.0, 4.5
    assert stats.fast_p(speedups, 1.5) == pytest.approx(2 / 7)     # 2.0, 4.5
    assert stats.fast_p(speedups, 2.0) == pytest.approx(1 / 7)     # 4.5 (2.0 is not > 2)
    assert stats.fast_p(speedups, 4.0) == pytest.approx(1 / 7)
    assert stats.fast_p(speedups, 0.0) == pytest.approx(5 / 7)     # every correct one
    assert stats.fast_p([], 1.0) is None


def test_percentile_matches_numpy_linear():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert stats.median(xs) == 3.0
    assert stats.percentile(xs, 20) == pytest.approx(1.8)
    assert stats.percentile([7.0], 80) == 7.0


def test_summarize():
    s = stats.summarize([2.0, 8.0, None, 0.5], [0.5, None, 0.2, 0.8])
    assert s["workloads"] == 4 and s["correct"] == 3
    assert s["geomean_speedup"] == pytest.approx(2.0)              # (2 * 8 * 0.5) ** (1/3)
    assert s["fast_p"] == {"1": 0.5, "1.5": 0.5, "2": 0.25, "4": 0.25}
    assert s["geomean_roofline_fraction"] == pytest.approx((0.5 * 0.2 * 0.8) ** (1 / 3))


def test_roofline_floor_uses_policy_peak():
    peaks = roofline.DESIGN_H200
    flops, nbytes = 2 * 1024 * 8192 * 8192, 0
    assert roofline.floor_ms(flops, nbytes, peaks, "fp32") == pytest.approx(flops / 51e12 * 1e3)
    assert roofline.floor_ms(flops, nbytes, peaks, "strict") == pytest.approx(flops / (786e12 / 3) * 1e3)
    assert roofline.floor_ms(flops, nbytes, peaks, "bf16") == pytest.approx(flops / 786e12 * 1e3)
    # tf32: a TF32-grade product runs at the 16-bit rate (fp16x1), faster than TF32's own
    assert roofline.floor_ms(flops, nbytes, peaks, "tf32") == pytest.approx(flops / 786e12 * 1e3)
    # A memory-bound workload: bytes / bandwidth wins.
    assert roofline.floor_ms(0, 4.28e9, peaks, "bf16") == pytest.approx(1.0)


def _workload(name, tags, speedups: dict, fractions: dict | None = None):
    fractions = fractions or {}
    return {"name": name, "tags": tags, "status": "ok", "flops": 1, "bytes_fp32": 1,
            "baselines": [{"name": "eager", "status": "ok", "timing": {"median_ms": 1.0}},
                          {"name": "torch.compile", "status": "skipped", "reason": "not requested",
                           "timing": None}],
            "baseline_roofline_fraction": 0.9,
            "policies": [{"precision": p, "speedup": s, "roofline_fraction": fractions.get(p, 0.5),
                          "kforge": {"status": "ok" if s else "mismatch", "reason": "" if s else "bad",
                                     "timing": {"median_ms": 1.0 / s if s else 3.0},
                                     "compile_s": 1.0, "max_rel_err": 1e-6}}
                         for p, s in speedups.items()]}


def _doc(workloads, precisions=("strict", "bf16"), shard=None):
    env = {"hardware": "synthetic", "date": "2026-11-30T00:00:00Z", "torch": "x", "triton": "y",
           "python": "3", "git_commit": None}
    cfg = {"target": "cpu", "precisions": list(precisions), "scale": "smoke", "shard": shard,
           "provider": "builtin", "kforge_source": "test", "baseline_note": "b", "timing_method": "t"}
    return report.build_document(env, cfg, roofline.DESIGN_H200.to_json(), workloads, [])


def test_suite_summary_groups_and_fast_p():
    doc = _doc([
        _workload("gemm_a", ["gemm"], {"strict": 2.5, "bf16": 10.0}),
        _workload("gemm_b", ["gemm"], {"strict": None, "bf16": 4.0}),
        _workload("fuse_a", ["fusion"], {"strict": 1.2, "bf16": 1.6}),
        _workload("block", ["transformer", "gemm"], {"strict": 0.9, "bf16": 3.0}),
    ])
    strict = doc["summary"]["strict"]
    assert strict["all"]["workloads"] == 4 and strict["all"]["correct"] == 3
    assert strict["all"]["fast_p"]["1"] == pytest.approx(0.5)
    assert strict["all"]["geomean_speedup"] == pytest.approx((2.5 * 1.2 * 0.9) ** (1 / 3))
    assert strict["gemm"]["fast_p"]["2"] == pytest.approx(0.5)
    assert strict["transformer"]["workloads"] == 1
    assert doc["summary"]["bf16"]["all"]["fast_p"]["4"] == pytest.approx(0.25)   # only 10.0 > 4


def test_markdown_json_png_and_merge(tmp_path):
    pytest.importorskip("matplotlib")
    a = _doc([_workload("gemm_a", ["gemm"], {"strict": 2.0})], ("strict",), shard="0/2")
    b = _doc([_workload("fuse_a", ["fusion"], {"strict": 0.5}),
              {"name": "late", "path": "x", "tags": [], "status": "skipped",
               "reason": "time budget exhausted", "policies": [], "baselines": []}],
             ("strict",), shard="1/2")
    merged = report.merge([a, b])
    assert [w["name"] for w in merged["workloads"]] == ["fuse_a", "gemm_a", "late"]
    assert merged["summary"]["strict"]["all"]["workloads"] == 2          # the skipped one is not counted
    assert merged["summary"]["strict"]["all"]["geomean_speedup"] == pytest.approx(1.0)
    paths = report.write_all(merged, tmp_path)
    doc = json.loads(paths["json"].read_text())
    assert doc["schema"] == "kforge.bench" and doc["version"] == report.VERSION == 2
    md = paths["md"].read_text()
    assert "| strict | all | 2 | 2 | 0 | 1.00x | 0.50 |" in md
    assert "time budget exhausted" in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        report.merge([{"schema": "other"}])


def test_fraction_and_speedup_are_finite_in_markdown():
    doc = _doc([_workload("w", ["gemm"], {"strict": 3.0})], ("strict",))
    md = report.markdown(doc)
    assert "3.00" in md and "nan" not in md.lower() and not math.isnan(
        doc["summary"]["strict"]["all"]["geomean_speedup"])


def test_goals_of_issue_6():
    ws = [_workload("gemm_a", ["gemm"], {"strict": 2.5, "bf16": 9.0}, {"strict": 0.7, "bf16": 0.7}),
          _workload("gemm_b", ["gemm"], {"strict": 1.8, "bf16": 6.0}, {"strict": 0.7, "bf16": 0.5})]
    for w in ws:
        for p in w["policies"]:
            p["kforge"]["info"] = {"regions_total": 1, "regions_on_kernels": 1}
    doc = _doc(ws, ("strict", "bf16"))
    assert report.goals(doc) == []                     # smoke sizes: no goals
    doc["config"]["scale"] = "full"
    text = "\n".join(report.goals(doc))
    assert "| every workload verified (strict) | 2/2 correct, 2 with every region on a kernel | reached |" in text
    assert "| GEMM suite geomean >= 2x (strict) | 2.12x | reached |" in text     # sqrt(2.5 * 1.8)
    assert "| GEMM suite geomean >= 8x (bf16) | 7.35x | not reached |" in text   # sqrt(9 * 6)
    assert "| geomean >= 60% of the roofline floor (bf16) | 59% | not reached |" in text


def test_merge_of_a_one_policy_remeasurement_keeps_the_other_policies(tmp_path):
    """A later call that re-measures bf16 alone replaces the bf16 result; strict stays, marked
    with the baselines of its own run; a later full result replaces everything."""
    first = _doc([_workload("gemm_a", ["gemm"], {"strict": 2.0, "bf16": None}),
                  _workload("gemm_b", ["gemm"], {"strict": 3.0, "bf16": 9.0})])
    again = _doc([_workload("gemm_a", ["gemm"], {"bf16": 8.0})], ("bf16",))
    again["workloads"][0]["baselines"][0]["timing"]["median_ms"] = 1.5
    merged = report.merge([first, again])
    a = next(w for w in merged["workloads"] if w["name"] == "gemm_a")
    by = {p["precision"]: p for p in a["policies"]}
    assert by["bf16"]["speedup"] == 8.0 and "own_run" not in by["bf16"]
    assert by["strict"]["speedup"] == 2.0 and by["strict"]["own_run"]["baselines"]["eager"] == 1.0
    assert a["baselines"][0]["timing"]["median_ms"] == 1.5          # the later run's baselines
    bf16 = merged["summary"]["bf16"]["all"]
    assert bf16["correct"] == 2 and bf16["geomean_speedup"] == pytest.approx((8.0 * 9.0) ** 0.5)
    assert merged["summary"]["strict"]["all"]["geomean_speedup"] == pytest.approx(6 ** 0.5)
    assert "ok (earlier run; its faster baseline" in report.markdown(merged)
    full = _doc([_workload("gemm_a", ["gemm"], {"strict": 1.0, "bf16": 1.0})])
    assert all("own_run" not in p for p in
               report.merge([first, full])["workloads"][0]["policies"])


def test_environment_names_the_commit_and_whether_the_code_is_it(monkeypatch):
    """The commit comes from git unless KFORGE_SOURCE_COMMIT names it (a device copy's git
    metadata can be stale); a report says when the code that ran differs from the commit."""
    env = report.environment("cpu")
    if env["git_commit"]:
        assert isinstance(env["git_code_matches_commit"], bool)
    monkeypatch.setenv("KFORGE_SOURCE_COMMIT", "abc1234")
    env = report.environment("cpu")
    assert env["git_commit"] == "abc1234" and env["git_commit_from"] == "KFORGE_SOURCE_COMMIT"
    doc = _doc([_workload("gemm_a", ["gemm"], {"strict": 2.0})])
    doc["environment"].update(git_commit="0123abc", git_code_matches_commit=False)
    assert "commit `0123abc` (the code that ran differs from it)" in report.markdown(doc)


def test_a_merge_of_runs_on_other_code_says_where_each_workload_comes_from():
    """Runs of other commits or machines merged (two sessions' calls): the report's header
    lists each run and how many workloads keep its result (a workload measured in both keeps
    the later one); runs of one machine, code and day add no such lines."""
    a = _doc([_workload("gemm_a", ["gemm"], {"strict": 2.0}),
              _workload("gemm_b", ["gemm"], {"strict": 3.0})], ("strict",))
    b = _doc([_workload("gemm_b", ["gemm"], {"strict": 4.0}),
              _workload("gemm_c", ["gemm"], {"strict": 5.0})], ("strict",))
    assert "merged from" not in report.markdown(report.merge([a, b]))
    b["environment"].update(git_commit="23297e1", date="2026-12-07T12:51:56Z")
    merged = report.merge([a, b])
    assert [s["kept"] for s in merged["shards"]] == [["gemm_a"], ["gemm_b", "gemm_c"]]
    md = report.markdown(merged)
    assert "merged from 2 runs that differ in machine, code or day" in md
    assert "run 1: synthetic, 2026-11-30T00:00:00Z, commit `None`: kept for 1 workload" in md
    assert "run 2: synthetic, 2026-12-07T12:51:56Z, commit `23297e1`: kept for 2 workloads" in md
