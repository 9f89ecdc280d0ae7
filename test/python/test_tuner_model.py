"""The builtin's GEMM cost model and stop rule (kforge.providers.builtin.analyst) against the H200
measurements of benchmarks/results/2026-12-01-profile/tuner-call3.json (every configuration of
5 GEMMs x 2 policies timed: the model's training data), and the synthesis loop's stop on a
`stop:` recommendation (a real loop on the cpu target)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kforge.profiling import Profile, Timing
from kforge.providers.builtin import BuiltinProvider, config_space
from kforge.providers.builtin import analyst
from kforge.providers.builtin.analysis import analyze_region
from kforge.spec import load_spec
from kforge.synth import MIN_GAIN, STOP_PREFIX, SynthOptions, synthesize_region
from kforge.targets import get_target

ROOT = Path(__file__).resolve().parents[2]
CALL3 = ROOT / "benchmarks" / "results" / "2026-12-01-profile" / "tuner-call3.json"
SPECS = ROOT / "benchmarks" / "profile" / "specs"
# the 2026-12-02 held-out measurement: seen data since the confident stop was fitted on it
HOLDOUT = ROOT / "benchmarks" / "results" / "2026-12-02-h200-profile-holdout" / "tuner.json"
SPECS_HOLDOUT = ROOT / "benchmarks" / "profile" / "specs_holdout"
# the 2026-12-04 second held-out measurement: seen data since the tie and tf32-layout rules
HOLDOUT2 = ROOT / "benchmarks" / "results" / "2026-12-04-h200-profile-holdout2" / "tuner.json"
SPECS_HOLDOUT2 = ROOT / "benchmarks" / "profile" / "specs_holdout2"
HOLDOUT3 = ROOT / "benchmarks" / "results" / "2026-12-04-h200-profile-holdout3" / "tuner.json"
SPECS_HOLDOUT3 = ROOT / "benchmarks" / "profile" / "specs_holdout3"


def recorded():
    """(name, policy, spec, shape, rows measured) of every region of call 3."""
    for r in json.loads(CALL3.read_text())["results"]:
        spec = load_spec(SPECS / f"{r['workload']}.json")
        rows = [x for x in r["rows"] if x.get("correct") and x.get("time_ms")]
        yield r["workload"], r["policy"], spec, analyze_region(spec), rows


def predicted(shape, spec, rows):
    return [analyst.tile_model(shape, x["config"], spec=spec)["time_ms"] for x in rows]


def test_model_orders_the_measured_configurations():
    """On every recorded region the model's fastest configuration measures within 25 % of the
    space's best (8 of 10 exactly the best), and it orders >= 85 % of the pairs as measured."""
    exact = 0
    for name, policy, spec, shape, rows in recorded():
        pred, meas = predicted(shape, spec, rows), [x["time_ms"] for x in rows]
        top = min(range(len(rows)), key=pred.__getitem__)
        assert meas[top] <= 1.25 * min(meas), (name, policy, rows[top]["config"])
        exact += meas[top] == min(meas)
        n = len(rows)
        agree = sum((pred[i] < pred[j]) == (meas[i] < meas[j])
                    for i in range(n) for j in range(i + 1, n)) / (n * (n - 1) / 2)
        assert agree >= 0.85, (name, policy, agree)
    assert exact >= 8


def test_stop_margin_covers_the_models_error_near_the_best():
    """MODEL_ERROR is at least the model's largest optimistic error on the training data for an
    incumbent within 10 % of its space's best and a candidate predicted at most 1.3x it."""
    worst = 0.0
    for _, _, spec, shape, rows in recorded():
        pred, meas = predicted(shape, spec, rows), [x["time_ms"] for x in rows]
        for i in range(len(rows)):
            if meas[i] > 1.1 * min(meas):
                continue
            for j in range(len(rows)):
                if i != j and pred[j] / pred[i] <= 1.3:
                    worst = max(worst, 1 - (meas[j] / meas[i]) / (pred[j] / pred[i]))
    assert 0.03 < worst <= analyst.MODEL_ERROR
    assert analyst.MIN_GAIN == MIN_GAIN


def test_explained_covers_every_measured_best():
    """EXPLAINED (how many times its predicted time the model's own best may measure before the
    stop trusts the model) is at least what the measured best of each recorded space took, and
    below what the kernels the model misjudged took."""
    worst_best, worst_any = 0.0, 0.0
    for path, specs in ((CALL3, SPECS), (HOLDOUT, SPECS_HOLDOUT)):
        for r in json.loads(path.read_text())["results"]:
            spec = load_spec(specs / f"{r['workload']}.json")
            shape = analyze_region(spec)
            rows = [x for x in r["rows"] if x.get("correct") and x.get("time_ms")]
            ratio = [x["time_ms"] / analyst.tile_model(shape, x["config"], spec=spec)["time_ms"]
                     for x in rows]
            best = min(range(len(rows)), key=lambda i: rows[i]["time_ms"])
            worst_best = max(worst_best, ratio[best])
            worst_any = max(worst_any, max(ratio))
    assert 1.5 < worst_best <= analyst.EXPLAINED < worst_any


def _recorded(path, specs, name, policy, index=0):
    """(spec, shape, recorded space, configuration #index's measured profile)."""
    r = next(r for r in json.loads(path.read_text())["results"]
             if r["workload"] == name and r["policy"] == policy)
    spec = load_spec(specs / f"{name}.json")
    row = r["rows"][index]
    return (spec, analyze_region(spec), [x["config"] for x in r["rows"]],
            dict(row["profile"], time_ms=row["time_ms"]))


def _recorded_first(path, specs, name, policy):
    return _recorded(path, specs, name, policy, 0)


def test_confident_stop_needs_the_models_best_explained():
    # 32 x (512x512x128) strict, measured #0 then #8 (fp16x3 128x128x64, the space's best,
    # 1.69x its prediction, 512 tiles): every untried configuration predicted >= 1.04x: stop
    spec, shape, space, prof = _recorded(HOLDOUT, SPECS_HOLDOUT, "bmm_scale", "strict", 8)
    tried = [space[0], space[8]]
    why = analyst.stop_evidence(shape, space, prof, tried, spec=spec)
    assert why.startswith("no untried configuration is predicted to gain 2%"), why
    assert "512 tiles for 132 SMs" in why
    # the same kernel, had it measured over EXPLAINED x its prediction: the model does not
    # explain it (as the fp16 split pass of 64x4096x4096, 4.8x), so its ranking is no evidence
    slow_ms = 2.5 * analyst.tile_model(shape, space[8], spec=spec)["time_ms"]
    slow = dict(prof, time_ms=slow_ms, timing=dict(prof["timing"], median_ms=slow_ms))
    assert analyst.stop_evidence(shape, space, slow, tried, spec=spec) == ""
    # 256x1024x32768 bf16, split-K 4: 128 tiles for 132 SMs and compute-bound, where the
    # model's waves are wrong by 23 % (split-K 8 measured faster, predicted 1.03x slower): no stop
    spec, shape, space, prof = _recorded_first(CALL3, SPECS, "gemm_max_const_long_k", "bf16")
    m = analyst.tile_model(shape, space[0], spec=spec)
    assert m["tiles"] < analyst.SMS and m["compute_ms"] > m["memory_ms"]
    assert analyst.stop_evidence(shape, space, prof, [space[0]], spec=spec) == ""
    # 64x4096x14336 strict, split-K 4: 128 tiles too, but memory-bound (the weight's bytes):
    # measured the space's best, and the model's best: stop
    spec, shape, space, prof = _recorded_first(HOLDOUT, SPECS_HOLDOUT, "decode_down_residual",
                                               "strict")
    why = analyst.stop_evidence(shape, space, prof, [space[0]], spec=spec)
    assert why.startswith("no untried configuration") and "memory-bound" in why


def test_confident_stop_not_on_a_tie():
    """An untried configuration predicted within MIN_GAIN of the incumbent is a tie the model
    cannot break (it differs in what the model does not see): no confident stop. On the
    recorded data every wrong confident stop had one (at 0.99x-1.012x), every right one none
    under 1.019x."""
    # 24576x128x1024 bf16 after #0 and #6 (64x128x64 w4, 1.089x the best): 128x128x64 w8 (#3,
    # the space's best) predicted 1.012x; the stop that ended the 2026-12-04 search there
    spec, shape, space, prof = _recorded(HOLDOUT2, SPECS_HOLDOUT2, "narrow_n_tanh_scale",
                                         "bf16", 6)
    tried = [space[0], space[6]]
    c, r = analyst.rank_configs(shape, space, prof, tried, spec=spec)[0]
    assert 1 <= r < 1 + MIN_GAIN and space.index(c) in (2, 3)
    assert analyst.stop_evidence(shape, space, prof, tried, spec=spec) == ""


def test_tf32_products_on_an_n_major_b_pay_the_transpose():
    """bmm's B is N-major: wgmma takes 32-bit operands K-major only, so the tf32-rate schemes
    run at _TF32_MN_EFF there (measured 2.9-3.5x the model's time before the term); on a
    Linear's K-major weight they do not."""
    for path, specs, name in ((HOLDOUT, SPECS_HOLDOUT, "bmm_scale"),
                              (HOLDOUT2, SPECS_HOLDOUT2, "bmm16_sigmoid")):
        spec, shape, space, prof = _recorded_first(path, specs, name, "strict")
        assert analyst._b_mn_major(spec, shape) and space[0]["input_precision"] == "3xtf32"
        pick, r = analyst.rank_configs(shape, space, prof, [space[0]], spec=spec)[0]
        # the model's first pick leaves the tf32 schemes (measured 1.7x the best at #0)
        assert pick["input_precision"] in ("fp16x3", "bf16x6") and r < 0.8
    spec = load_spec(SPECS / "gemm_const_scale.json")
    assert not analyst._b_mn_major(spec, analyze_region(spec))


def _profile(config, time_ms):
    return Profile("c0", "cuda", "bf16", config=config, timing=Timing(time_ms))


def test_stop_rule_fires_at_the_floor_and_not_far_from_it():
    spec = load_spec(SPECS / "gemm_tanh_small_m.json")        # 128x16384x16384: weight-bound
    shape, space = analyze_region(spec), config_space(spec, "cuda", "bf16")
    floor = analyst.model_floor_ms(shape, space, spec)
    # the floor reads the weight as bf16 (prepared): half the fp32 bytes of the spec's floor
    assert floor < 0.6 * spec.min_bytes / get_target("cuda").peaks.bytes_per_s * 1e3
    near = analyst.stop_evidence(shape, space, _profile(space[0], 1.05 * floor), [space[0]],
                                 spec=spec)
    assert "of the floor" in near
    # measured on the H200: 0.2213 ms, with 64x256 tiles (0.1726 ms) untried: no stop
    assert analyst.stop_evidence(shape, space, _profile(space[0], 0.2213), [space[0]],
                                 spec=spec) == ""
    recs = analyst.analyze_profile(spec, get_target("cuda"), "bf16", shape, space,
                                   _profile(space[0], 0.2213), [space[0]])
    assert not any(r.startswith(STOP_PREFIX) for r in recs)
    picks = [json.loads(r[len("config: "):].split("  #")[0]) for r in recs
             if r.startswith("config: ")]
    # 128 tiles of 64x256 for 132 SMs: the measured best (#4 in call 3's order)
    assert (picks[0]["BLOCK_M"], picks[0]["BLOCK_N"], picks[0].get("SPLIT_K")) == (64, 256, 1)
    # the square 4096^3 GEMM at its first bf16-operand pointer configuration (measured best,
    # when bf16 operands came first; fp16x1 comes first now, and its untried configurations
    # are predicted slower) with the TMA kernel's twins of its tile tried too (the model
    # predicts them within 1% of it, as measured on the H200 on 2026-12-04: 0.228 against
    # 0.232 ms): the model says stop
    spec = load_spec(SPECS / "gemm_const_scale.json")
    shape, space = analyze_region(spec), config_space(spec, "cuda", "bf16")
    assert space[0]["input_precision"] == "fp16x1"
    measured = next(c for c in space if not c.get("input_precision") and not c.get("TMA"))
    assert (measured["BLOCK_M"], measured["BLOCK_N"]) == (128, 256)
    twins = [c for c in space if c.get("TMA") and (c["BLOCK_M"], c["BLOCK_N"]) == (128, 256)]
    # (per scheme, fp16x1 and bf16 operands: the tile with its epilogue in four column slices,
    # pipelined with the next tile's loads and not, and with its whole-tile epilogue)
    assert len(twins) == 6
    recs = analyst.analyze_profile(spec, get_target("cuda"), "bf16", shape, space,
                                   _profile(measured, 0.2332), [measured] + twins)
    stop = [r for r in recs if r.startswith(STOP_PREFIX)]
    assert len(stop) == 1 and "predicted at 1.1" in stop[0] and recs[-1] == stop[0]


def test_replay_on_the_recorded_h200_data():
    """bench_tuner --replay over call 3: the profile-driven search never ends slower than 2 %
    over blind search's final time and never measures more; the goal holds on 9 of 10."""
    path = ROOT / "benchmarks" / "profile" / "bench_tuner.py"
    mod_spec = importlib.util.spec_from_file_location("bench_tuner", path)
    bench = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(bench)
    rep = bench.replay_file(CALL3)
    rows = [r["search"] for r in rep["results"]]
    assert len(rows) == 10
    for s in rows:
        b, p = s["blind"], s["profile"]
        assert p["final_ms"] <= b["final_ms"] * (1 + MIN_GAIN)
        assert p["measured"] <= b["measured"]
        assert b["measured"] >= 3                # blind stops after 2 stale rounds at best
    assert sum(s["goal_met"] for s in rows) == 9
    assert "| gemm_clamp | bf16 | 12 |" in bench.table(rep["results"])


@pytest.mark.parametrize("path, specs, met", [(HOLDOUT, SPECS_HOLDOUT, 11),
                                              (HOLDOUT2, SPECS_HOLDOUT2, 10)])
def test_replay_on_the_held_out_h200_data(monkeypatch, path, specs, met):
    """bench_tuner --replay over the two held-out measurements (fit data now): never slower
    than blind search (2026-12-04: narrow_n_tanh_scale bf16 was, 1.089x, before the tie
    rule), the goal on 11 of 16 and 10 of 16 rows, and both batched strict GEMMs reach a
    faster kernel than blind in 2 measurements (3 and 5 before the tf32-layout term)."""
    monkeypatch.setenv("KF_SPEC_DIRS", str(specs))
    mod_path = ROOT / "benchmarks" / "profile" / "bench_tuner.py"
    mod_spec = importlib.util.spec_from_file_location("bench_tuner", mod_path)
    bench = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(bench)
    rows = {(r["workload"], r["policy"]): r["search"]
            for r in bench.replay_file(path)["results"]}
    assert len(rows) == 16
    for s in rows.values():
        assert s["profile"]["final_ms"] <= s["blind"]["final_ms"] * (1 + MIN_GAIN)
    assert sum(s["goal_met"] for s in rows.values()) == met
    bmm = rows[("bmm_scale" if path == HOLDOUT else "bmm16_sigmoid", "strict")]
    assert bmm["profile"]["measured"] == 2 and bmm["goal_met"]


def test_suite_reading_of_the_third_held_out_set(monkeypatch):
    """Issue 14's goal read over the whole third held-out set (measured on the H200 with this
    analyst, never fitted on): fewer configurations than blind search (37 of 54) and a faster
    final kernel (4 rows faster, none slower), while row by row it holds on 10 of 16."""
    monkeypatch.setenv("KF_SPEC_DIRS", str(SPECS_HOLDOUT3))
    mod_path = ROOT / "benchmarks" / "profile" / "bench_tuner.py"
    mod_spec = importlib.util.spec_from_file_location("bench_tuner", mod_path)
    bench = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(bench)
    results = bench.replay_file(HOLDOUT3)["results"]
    suite = bench.suite_summary(results)
    assert (suite["rows"], suite["profile_measured"], suite["blind_measured"]) == (16, 37, 54)
    assert (suite["faster"], suite["same"], suite["slower"]) == (4, 12, 0)
    assert 1.05 < suite["final_geomean"] < 1.10
    assert sum(r["search"]["goal_met"] for r in results) == 10
    assert "suite: profile-driven measured 37 configurations where blind measured 54 (69%)" \
        in bench.table(results)


GEMM = ROOT / "test" / "python" / "fixtures" / "engine" / "matmul_bias.json"


class StopAfterAnalysis(BuiltinProvider):
    """The builtin provider whose analysis ends with a stop line (a fake analyst only: the
    generator, verifier and timing are real)."""

    def __init__(self, stop: bool):
        self.stop = stop

    def analyze(self, request, profile):
        recs = tuple(super().analyze(request, profile))
        return recs + ((f"{STOP_PREFIX}test evidence: {profile.get('time_ms')} ms",)
                       if self.stop else ())


@pytest.mark.parametrize("stop", [True, False])
def test_loop_stops_on_a_stop_recommendation(tmp_path, stop):
    spec = load_spec(GEMM)
    assert len(config_space(spec, "cpu", "strict")) >= 3
    opts = SynthOptions(target="cpu", rounds=2, patience=5)
    result = synthesize_region(spec, opts, provider=StopAfterAnalysis(stop), log_dir=tmp_path)
    assert result.status == "verified"
    events = [json.loads(line) for line in
              (tmp_path / spec.hash / "log.jsonl").read_text().splitlines()]
    stops = [e for e in events if e["event"] == "stop"]
    if stop:
        assert result.candidates_tried == 1
        assert stops and stops[0]["source"] == "analysis"
        assert stops[0]["reason"].startswith("test evidence: ")
    else:
        assert result.candidates_tried == 3 and not stops     # both rounds ran
