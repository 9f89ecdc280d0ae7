"""LLM workloads in `kforge bench` (issue 12): one zoo file, two workloads (prefill and decode,
its VARIANTS), each under its own environment; tokens/s for every route; the issue's goals in
the report. Real zoo files (benchmarks/models/llama3_8b.py, gpt_oss_20b.py) at their small size,
real eager routes on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kforge.bench import packages, report, timing
from kforge.bench.roofline import DESIGN_H200
from kforge.bench.runner import BenchConfig, Runner
from kforge.bench.workloads import discover
from kforge.errors import UserError

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "benchmarks" / "models" / "llama3_8b.py"
GPT_OSS = REPO / "benchmarks" / "models" / "gpt_oss_20b.py"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("KFORGE_LLM_PHASE", "KFORGE_LLM_BATCH", "KFORGE_LLM_SEQ", "KFORGE_LLM_CONTEXT",
              "KFORGE_LLM_LAYERS", "KFORGE_ZOO_SIZE"):
        monkeypatch.delenv(k, raising=False)


def test_a_zoo_llm_file_is_a_prefill_and_a_decode_workload():
    wls = discover([str(LLAMA)])
    assert [w.name for w in wls] == ["llama3_8b.prefill", "llama3_8b.decode"]
    prefill, decode = wls
    assert dict(decode.env) == {"KFORGE_LLM_PHASE": "decode"}
    _, ids = prefill.instantiate("smoke", "cpu")
    assert [tuple(t.shape) for t in ids] == [(2, 32)]
    model, inputs = decode.instantiate("smoke", "cpu")
    # input_ids [B, 1] and a key and a value per layer [B, Hkv, C, D]
    assert [tuple(t.shape) for t in inputs] == [(4, 1)] + [(4, 2, 24, 16)] * 4
    assert model.phase == "decode" and "KFORGE_LLM_PHASE" not in os.environ   # restored
    with torch.no_grad():
        assert tuple(model(*inputs).shape) == (4, 1, 256)
    assert prefill.tokens_per_call("smoke") == 64 and decode.tokens_per_call("smoke") == 4


def test_one_variant_by_name_and_a_clear_error_for_an_unknown_one(monkeypatch):
    (wl,) = discover([f"{GPT_OSS}::decode"])
    assert wl.name == "gpt_oss_20b.decode"
    monkeypatch.setenv("KFORGE_LLM_BATCH", "3")           # the user's overrides still apply
    assert wl.tokens_per_call("smoke") == 3
    with pytest.raises(UserError, match="no variant 'generate'.*gpt_oss_20b.prefill"):
        discover([f"{GPT_OSS}::generate"])


def test_the_file_kforge_compile_gets_carries_the_variant_and_the_scale(tmp_path):
    """Packages for the bench are compiled by `kforge compile FILE` in another process, which
    calls get_inputs() without arguments: the wrapper sets the variant's phase and the scale."""
    decode = discover([f"{LLAMA}::decode"])[0]
    path = packages.model_file(decode, False, tmp_path)       # full scale
    assert path != decode.path
    code = ("import importlib.util as u, json; s = u.spec_from_file_location('w', %r); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); "
            "print(json.dumps([list(t.shape) for t in m.get_inputs()]))" % str(path))
    env = dict(os.environ, KFORGE_ZOO_SIZE="small",        # full scale: the env's row
               PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")]))
    env.pop("KFORGE_LLM_PHASE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[4, 1]] + [[4, 2, 24, 16]] * 4


def test_the_bf16_model_file_of_a_variant_casts_the_model_and_its_cache(tmp_path):
    """Issue 12's bf16 route compiled by KForge: `bf16-model` of an LLM variant is the scale
    wrapper (the phase, the sizes) with the cast: bf16 weights, bf16 input ids untouched
    (integers), each layer's cached keys and values in bf16, bf16 logits."""
    decode = discover([f"{LLAMA}::decode"])[0]
    path = packages.cast_model_file(decode, False, tmp_path)
    code = ("import importlib.util as u, json, torch; s = u.spec_from_file_location('w', %r); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); x = m.get_inputs(); "
            "model = m.Model(*m.get_init_inputs()); out = model(*x); "
            "print(json.dumps([[str(t.dtype), list(t.shape)] for t in x] + "
            "[sorted({str(p.dtype) for p in model.parameters()}), str(out.dtype)]))"
            % str(path))
    env = dict(os.environ, KFORGE_ZOO_SIZE="small",
               PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")]))
    env.pop("KFORGE_LLM_PHASE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got[0] == ["torch.int64", [4, 1]]
    assert got[1:5] == [["torch.bfloat16", [4, 2, 24, 16]]] * 4
    assert got[5:] == [["torch.bfloat16"], "torch.bfloat16"]


def test_tokens_per_second_of_every_route_and_the_goals_in_the_report(tmp_path):
    """The eager routes for real on the decode step; no package here (kforge is skipped), so
    the issue-12 goals are stated as not reached."""
    cfg = BenchConfig(target="cpu", precisions=("strict", "bf16"), scale="smoke",
                      baselines=("eager",), packages=tmp_path / "none", workdir=tmp_path / "w")
    runner = Runner(cfg, timing.CpuTimer(reps=3), DESIGN_H200, log=lambda m: None)
    res = runner.run_one(discover([f"{LLAMA}::decode"])[0])
    assert res.tokens_per_call == 4
    eager = res.baselines[0]
    assert eager.status == "ok"
    assert eager.tokens_per_s == pytest.approx(4 / (eager.timing.median_ms / 1e3))
    bf16 = {r.name: r for r in res.policies[1].routes}["eager[bf16 model]"]
    assert bf16.timing is not None and bf16.tokens_per_s > 0
    doc = {"environment": {}, "config": {"target": "cpu", "precisions": ["strict", "bf16"],
                                         "scale": "full", "baseline_note": "", "timing_method": ""},
           "peaks": DESIGN_H200.to_json(), "notes": [], "workloads": [res.to_json()]}
    doc["summary"] = report.summarize_suite(doc["workloads"], ["strict", "bf16"])
    md = report.markdown(doc)
    assert "## LLM inference: tokens/s" in md
    row = next(line for line in md.splitlines() if line.startswith("| llama3_8b.decode | 4 |"))
    assert f"{eager.tokens_per_s:,.0f}" in row
    # torch.compile routes were not requested: the bf16 goal has no yardstick and is not
    # listed; the strict goal's yardstick (torch.compile fp32) is missing as well
    goals = report.llm_goals(doc)
    assert goals == []
    # with a yardstick and a kforge result, the ratio is computed and judged
    w = doc["workloads"][0]
    tc = next(r for r in w["policies"][1]["routes"] if r["name"] == "torch.compile[bf16 model]")
    tc.update(status="ok", tokens_per_s=1000.0)
    w["policies"][1]["kforge"].update(status="ok", tokens_per_s=1200.0)
    ((goal, value, ok),) = report.llm_goals(doc)
    assert "kforge[bf16] >= 1.10x" in goal and value.startswith("1.20x") and ok
    w["policies"][1]["kforge"]["tokens_per_s"] = 1050.0
    assert report.llm_goals(doc)[0][2] is False


def test_checks_work_a_chunk_at_a_time_on_references_in_host_memory(monkeypatch):
    """A real LLM's logits are GBs (gpt-oss-20b prefill: 13 GB in fp32): the bench keeps its
    references in host memory and compares a chunk at a time. The chunked errors and rules are
    the whole-tensor ones."""
    from kforge.bench import runner
    from kforge.verify import contract
    monkeypatch.setattr(contract, "CHUNK", 64)
    torch.manual_seed(3)
    ref = torch.randn(10, 103) * 5
    out = ref + torch.randn(10, 103) * 1e-3
    out[4, 7] += 0.2                                      # one element far off
    d = (out.double() - ref.double())
    a, r = runner._errors(out, runner._host(ref))
    assert a == pytest.approx(d.abs().max().item()) and \
        r == pytest.approx((d.norm() / ref.double().norm()).item())
    rms = ref.double().pow(2).mean().sqrt().item()
    for atol in (1e-3, 5e-3, 5e-2):
        for scaled in (False, True):
            want = bool((d.abs() <= atol * (max(1.0, rms) if scaled else 1.0)
                         + 1e-3 * ref.double().abs()).all())
            assert runner._within((out,), (ref,), atol, 1e-3, scaled) is want
    bad = out.clone()
    bad[0, 0] = float("nan")
    assert runner._errors(bad, ref) == (float("inf"), float("inf"))
    assert runner._within(bad, ref, 1.0, 1.0, True) is False



def test_a_mismatch_says_how_many_rows_it_is_confined_to(monkeypatch):
    """A token whose router picked other experts is off in its own row of logits only: the
    check counts the rows (last dimension) with an element outside the rule, over the checks
    that failed, a block of rows at a time."""
    from kforge.bench import runner
    torch.manual_seed(4)
    ref = torch.randn(2, 6, 50)
    out = ref + torch.randn(2, 6, 50) * 1e-6
    out[1, 2, 7] += 0.5                                    # one token's row
    out[0, 5] += 0.3                                       # another, all along
    assert runner._rows_outside(out, ref, 1e-4, 1e-4) == (2, 12)
    assert runner._rows_outside((ref,), (ref,), 1e-4, 1e-4) == (0, 12)
    from kforge.modelcheck import margin                    # (the rule _rows_outside applies)
    blocked = margin(out, ref, 1e-4, 1e-4, elements=100)   # two rows a block: the same count
    assert (blocked.rows_outside, blocked.rows) == (2, 12)
    checks = [((torch.zeros(1),), ref), ((torch.ones(1),), ref)]
    fn = lambda x: out if float(x[0]) else ref             # noqa: E731 - the second check fails
    chk = runner.Runner._check(None, fn, checks, 1e-4, 1e-4)
    assert not chk.ok and (chk.rows_outside, chk.rows) == (2, 12)
    assert runner._outside_text(chk) == "; 2 of 12 rows outside"

def test_where_the_time_goes_names_the_kernels_kinds_and_the_launch_gaps():
    """The LLM section's explanation: the kernels' time by what they compute (attention, MoE,
    GEMMs...), and the step-by-step run against the timed one (what launches and
    synchronization cost, which the CUDA graph removes)."""
    k = {"status": "ok", "timing": {"median_ms": 3.41}, "regions": 15, "kernels": 15,
         "info": {"where": {"time_share": {"kernel": 0.73, "host": 0.19, "fallback": 0.08},
                            "kernel_share_by_kind": {"gemm": 0.5, "attention": 0.2,
                                                     "rows": 0.03},
                            "stepwise_ms": 11.6, "fallback_ops": []}}}
    text = report._kernel_kinds(k)
    assert text.startswith("gemm 50%, attention 20%, rows 3%"), text
    assert "step by step 11.6 ms, timed 3.41 ms" in text
    assert report._kernel_kinds({"info": {}}) == "–"


def test_the_float64_reference_of_an_llm_runs_a_part_of_the_batch_at_a_time_when_memory_is_short():
    """gpt-oss-20b prefill's float64 copy ran out of GPU memory (attention scores of 8 x 64
    heads x 2048^2 in float64 are 17 GB a layer): an LLM workload declares its sequences
    independent, and the strict contract's reference then runs on halves, quarters, ... of the
    batch, with the same result. A model that does not declare it gets the error."""
    from kforge.bench import runner
    (prefill, _) = discover([str(GPT_OSS)])
    model, (ids,) = prefill.instantiate("smoke", "cpu")
    assert model.BATCH_SEPARABLE and ids.shape[0] == 2
    model64 = model.double()
    ids = torch.cat([ids, ids.flip(0), ids[:1]])          # 5 sequences
    with torch.no_grad():
        whole = model64(ids)
    seen = []

    def short_of_memory(x):                               # the device holds one sequence
        seen.append(x.shape[0])
        if x.shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 17.00 GiB")
        return model64(x)

    with torch.no_grad():
        parts = runner._rows_on_device(short_of_memory, [ids], separable=True)
    assert seen == [5, 3, 2, 1, 1, 1, 1, 1]               # whole, halves, quarters, ones
    assert parts.dtype == torch.float64 and torch.equal(parts, whole)
    with pytest.raises(torch.OutOfMemoryError):
        runner._rows_on_device(short_of_memory, [ids], separable=False)
    with pytest.raises(ValueError):                       # not a memory error: not retried
        runner._rows_on_device(lambda x: (_ for _ in ()).throw(ValueError("shape")), [ids], True)


def test_the_float64_copy_widens_in_place_of_copying_and_goes_to_the_cpu_when_the_device_is_full(
        monkeypatch):
    """The strict contract's float64 model is built a tensor at a time (deepcopy-then-convert
    held a whole fp32 copy beside it: gpt-oss's 4 layers ran out of memory on an 80 GB card),
    with tied weights still tied; where even that does not fit on the device, it is built and
    run on the CPU, with the same outputs."""
    import copy
    from types import SimpleNamespace

    from kforge.bench import runner
    (_, decode) = discover([str(LLAMA)])
    model, inputs = decode.instantiate("smoke", "cpu")
    first = next(model.parameters())
    model64 = runner.float64_copy(model)
    assert first.dtype == torch.float32 and next(model.parameters()) is first    # untouched
    assert all(p.dtype == torch.float64 for p in model64.parameters())
    with torch.no_grad():
        want = copy.deepcopy(model).double()(*[x.double() if x.is_floating_point() else x
                                               for x in inputs])
        got = model64(*[x.double() if x.is_floating_point() else x for x in inputs])
    assert torch.equal(got, want)
    tied = torch.nn.Linear(4, 4)
    pair = torch.nn.Sequential(tied, torch.nn.ReLU(), tied)
    pair64 = runner.float64_copy(pair)
    assert pair64[0].weight is pair64[2].weight and pair64[0].weight.dtype == torch.float64

    asked, real = [], runner.float64_copy

    def device_full(m, device=None):                      # the device holds no float64 copy
        asked.append(device)
        if device is None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 35.00 GiB")
        return real(m, device)

    monkeypatch.setattr(runner, "float64_copy", device_full)
    host = SimpleNamespace(target=SimpleNamespace(empty_cache=lambda: None))
    out = Runner._float64_references(host, model, [(inputs, None)])
    assert asked == [None, "cpu"] and isinstance(out, list), out
    assert out[0].dtype == torch.float64 and torch.equal(out[0], want)
    # another error is the model's, not memory's: its reason, no retry on the CPU
    asked.clear()
    monkeypatch.setattr(runner, "float64_copy", lambda m, device=None: (
        asked.append(device), (_ for _ in ()).throw(TypeError("fp32 only")))[1])
    why = Runner._float64_references(host, model, [(inputs, None)])
    assert asked == [None] and "did not run in float64: TypeError: fp32 only" in why


def test_float64_arbitrates_the_bench_rows_where_eager_fp32_is_off():
    """The bench's correctness, where KForge is outside against eager fp32: a float64 copy of the
    model arbitrates (gpt-oss-20b at 3 layers x 2 x 1,200 tokens, 2026-12-06: eager fp32 on the
    CPU took another expert than float64 at both router near-ties measured). A row counts as
    outside only where it is outside against both. A function that is no package (no `run`)
    has no selections to follow (kforge.ties)."""
    from types import SimpleNamespace

    from kforge.bench.runner import Runner
    exact = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    eager = exact.float().clone()
    eager[1] += 1.0                                  # eager fp32 off the exact answer on row 1
    checks = [((torch.zeros(1),), eager)]
    host = SimpleNamespace()
    # the package at the exact answer: outside against eager on row 1, within against float64
    assert Runner._arbitrate(host, lambda x: exact.float(), None, checks, [exact], 1e-2,
                             1e-2) == (0, 4, [])
    # a package off by 1 everywhere: row 1 agrees with eager's error, the rest are outside both
    assert Runner._arbitrate(host, lambda x: exact.float() + 1.0, None, checks, [exact], 1e-2,
                             1e-2) == (3, 4, [])


class _Package:
    """What the bench needs of kforge.runtime.CompiledModel, over an eager module."""
    def __init__(self, module):
        self.module = module

    def __call__(self, *inputs):
        return self.module(*inputs)

    def run(self, inputs, graphs=True):
        assert graphs is False          # a CUDA graph's replay would hide its selections
        return self.module(*inputs)


def _routed_tie_package():
    """(the routed_tie fixture's Model class, a "package" of it tied the other way: -1e-6)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "routed_tie", REPO / "test/python/fixtures/routed_tie.py")
    fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixture)
    return fixture.Model, _Package(fixture.Model(-1e-6))


def test_the_bench_follows_a_package_near_tie_choice_and_not_a_wrong_one():
    """Where KForge is outside against eager fp32 and float64 alike, the bench compares the
    package's topk choices with the float64 model's (kforge.ties): rows that differ only by a
    choice at a near-tie count as within; a choice farther off keeps them outside. Here the
    "package" is a model whose router ties experts 0 and 1 to 1e-6 the other way."""
    from types import SimpleNamespace

    from kforge.bench.runner import Runner, float64_runs

    Routed, package = _routed_tie_package()
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    host = SimpleNamespace()
    for bump, within in ((1e-6, True), (0.5, False)):
        model = Routed(bump)
        with torch.no_grad():
            checks = [((x,), model(x))]
        f64, why = float64_runs(model, [x_ for x_, _ in checks])
        assert f64 is not None, why
        bad, rows, notes = Runner._arbitrate(host, package, model, checks, f64, 1e-2, 1e-2)
        assert rows == 32 and len(notes) == 1
        if within:
            assert bad == 0 and "near-tie(s)" in notes[0] and "wrong choice" not in notes[0]
        else:
            assert bad > 3 and "a wrong choice, not followed" in notes[0], notes


def test_the_strict_contract_follows_a_package_near_tie_choice_and_not_a_wrong_one():
    """strict's contract holds each element of KForge's result to twice eager fp32's own error
    against a float64 model. At a router's near-tie the package may pick the other expert,
    and every element of that token is then far from float64's. The bench runs the contract
    again with the float64 model following the package's choices where they are near-ties
    (eager fp32's error still measured against the float64 model's own); a choice farther
    off is not followed, and the contract fails."""
    from types import SimpleNamespace

    from kforge.bench.runner import Runner, float64_runs

    Routed, package = _routed_tie_package()
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    host = SimpleNamespace(target=SimpleNamespace(empty_cache=lambda: None))
    for bump, passes in ((1e-6, True), (0.5, False)):
        model = Routed(bump)
        with torch.no_grad():
            checks = [((x,), model(x))]
        f64, why = float64_runs(model, [x_ for x_, _ in checks])
        assert f64 is not None, why
        plain = Runner._check(host, package, checks, f64=f64)
        assert plain.contract_ok is False and plain.over_bound > 0
        res, notes = Runner._contract_by_ties(host, package, model, checks, f64)
        assert len(notes) == 1, notes
        if passes:
            assert res.contract_ok and res.over_bound == 0, res
            assert "near-tie(s)" in notes[0] and "wrong choice" not in notes[0]
        else:
            assert res.contract_ok is False and res.over_bound > 0
            assert "a wrong choice, not followed" in notes[0], notes
