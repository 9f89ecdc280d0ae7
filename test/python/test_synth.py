"""The synthesis loop: functional passes with feedback, optimization passes, fallback, logs."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kforge.spec import load_spec
from kforge.synth import SynthOptions, synthesize_region

FIXTURES = Path(__file__).parent / "fixtures" / "engine"
_spec = importlib.util.spec_from_file_location("engine_fixture_provider",
                                               FIXTURES / "fixture_provider.py")
fixture_provider = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixture_provider)
ScriptedProvider = fixture_provider.ScriptedProvider


def spec(name):
    return load_spec(FIXTURES / f"{name}.json")


def log_events(log_dir: Path, h: str) -> list[dict]:
    return [json.loads(line) for line in (log_dir / h / "log.jsonl").read_text().splitlines()]


def test_functional_pass_feeds_compile_error_back(tmp_path):
    provider = ScriptedProvider(script=[("broken",), ("good",)])
    result = synthesize_region(spec("add_relu"), SynthOptions(rounds=0), provider=provider,
                               log_dir=tmp_path)
    assert result.status == "verified" and result.record.verified
    assert result.rounds == 2 and result.candidates_tried == 2
    fb = provider.requests[1].feedback
    assert fb[0].status == "compile_error" and "stor" in fb[0].message
    events = log_events(tmp_path, "e1e1e1e1e1e1e1e1")
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done"
    cands = [e for e in events if e["event"] == "candidate"]
    assert [c["verification"]["status"] for c in cands] == ["rejected", "verified"]
    assert "tl.stor(" in cands[0]["candidate"]["source"]          # sources are recorded


def test_mismatch_report_is_fed_back(tmp_path):
    provider = ScriptedProvider(script=[("wrong",), ("good",)])
    result = synthesize_region(spec("add_relu"), SynthOptions(rounds=0), provider=provider)
    assert result.status == "verified"
    fb = provider.requests[1].feedback[0]
    assert fb.status == "mismatch" and "first at" in fb.message


def test_no_verified_kernel_means_reference(tmp_path):
    provider = ScriptedProvider(script=[("wrong",), ("broken",)])
    result = synthesize_region(spec("add_relu"), SynthOptions(functional_rounds=2),
                               provider=provider, log_dir=tmp_path)
    assert result.status == "reference" and result.candidate is None
    assert "no candidate verified in 2 functional rounds" in result.message


def test_optimization_keeps_incumbent_unless_faster_than_noise(tmp_path):
    provider = ScriptedProvider(script=[("good",), ("good",), ("good",)],
                                analysis=("use BLOCK_M=8",))
    result = synthesize_region(spec("add_relu"), SynthOptions(rounds=2), provider=provider,
                               log_dir=tmp_path)
    assert result.status == "verified"
    assert result.candidate.id == "s1-0-good" or any(
        e["event"] == "improved" for e in log_events(tmp_path, "e1e1e1e1e1e1e1e1"))
    # the analysis saw the measured time, and its recommendations reached the writer
    assert provider.profiles and provider.profiles[0]["time_ms"] > 0
    opt_req = provider.requests[1]
    assert opt_req.phase == "optimize" and opt_req.best is not None
    assert opt_req.feedback[0].recommendations == ("use BLOCK_M=8",)
    events = log_events(tmp_path, "e1e1e1e1e1e1e1e1")
    assert any(e["event"] == "analysis" for e in events)
    assert any(e["event"] in ("stop", "improved") for e in events)


def test_provider_error_falls_back_to_builtin(tmp_path):
    result = synthesize_region(spec("matmul_bias"), SynthOptions(rounds=0),
                               provider=fixture_provider.FailingProvider(), log_dir=tmp_path)
    assert result.status == "verified" and result.provider == "builtin"
    assert "fell back to builtin" in result.message
    assert any(e["event"] == "provider_error"
               for e in log_events(tmp_path, "a2a2a2a2a2a2a2a2"))


def test_absent_target_gives_unverified_candidate(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("cuda present")
    provider = ScriptedProvider(script=[("good",)])
    result = synthesize_region(spec("add_relu"), SynthOptions(target="cuda"),
                               provider=provider)
    assert result.status == "candidate" and result.record.status == "candidate"


def test_wall_time_budget_stops_the_loop():
    provider = ScriptedProvider(script=[("broken",)] * 5)
    result = synthesize_region(spec("add_relu"), SynthOptions(time_budget_s=0.0),
                               provider=provider)
    assert result.status == "reference" and "time budget" in result.message
    assert provider.calls == 0


def test_noise_gate():
    from kforge.synth import beats
    from kforge.verify import VerificationRecord as R
    old = R("verified", time_ms=10.0, time_lo_ms=9.0, time_hi_ms=20.0, time_noise=1.1)
    assert beats(R("verified", time_ms=2.0, time_lo_ms=1.9, time_hi_ms=2.5), old)
    assert not beats(R("verified", time_ms=8.0, time_lo_ms=6.0, time_hi_ms=9.5), old)  # overlap
    assert not beats(R("verified", time_ms=9.9, time_lo_ms=8.0, time_hi_ms=8.9),
                     R("verified", time_ms=10.0, time_lo_ms=9.95, time_hi_ms=10.05))  # < 2 %
    assert not beats(R("verified"), old)


def test_optimization_patience_and_tried_history(tmp_path):
    """The loop tells the provider every candidate it tried, and stops after `patience`
    optimization rounds in a row without a gain (or when its rounds run out). Timing on a
    shared CPU is noisy, so which rounds gain is read from the log, not assumed."""
    class Slow(ScriptedProvider):
        def generate(self, request):
            self.requests.append(request)
            self.calls += 1
            src = (fixture_provider.good_source(request.spec.hash) if self.calls == 1
                   else fixture_provider.slow_source(request.spec.hash))
            return [fixture_provider.Candidate(id=f"c{self.calls}", provider=self.name,
                                               source=src)]

    rounds = 4
    for patience in (1, 2):
        provider = Slow()
        log_dir = tmp_path / str(patience)
        synthesize_region(spec("add_relu"), SynthOptions(rounds=rounds, patience=patience),
                          provider=provider, log_dir=log_dir)
        # every request names all candidates tried before it
        for i, req in enumerate(provider.requests):
            assert req.tried == tuple(f"c{j}" for j in range(1, i + 1))
        events = [e["event"] for e in log_events(log_dir, "e1e1e1e1e1e1e1e1")]
        stops = [e for e in log_events(log_dir, "e1e1e1e1e1e1e1e1") if e["event"] == "stop"]
        if stops and "in a row" in stops[-1]["reason"]:
            # stopped by patience: after the last gain, exactly `patience` analysed rounds
            after_gain = events[len(events) - events[::-1].index("improved"):] \
                if "improved" in events else events
            assert after_gain.count("analysis") == patience
            assert f"({patience} round" in stops[-1]["reason"]
        else:                                  # every round gained: the rounds ran out
            assert provider.calls == 1 + rounds


def test_a_repair_hears_why_the_incumbent_failed():
    """`kforge tune`'s repair hands the loop the kernel that failed on the device and its
    record: the first new candidate is generated with that verdict, so a mismatch moves it to
    another product scheme (Llama-3-8B prefill's bf16 attention spent its repair on another
    bf16 tile, H200, 2026-12-02)."""
    from kforge.providers.builtin import candidates, config_space
    from kforge.providers.builtin.__init__ import _scheme
    from kforge.spec import load_spec
    from kforge.synth import SynthOptions, synthesize_region
    from kforge.verify import VerificationRecord
    spec = load_spec(Path(__file__).parent / "fixtures" / "engine" / "matmul_bias.json")
    space = config_space(spec, "cpu", "strict")
    assert _scheme(space[1]) == _scheme(space[0])          # the next in order: another tile
    first = candidates(spec, "cpu", "strict", [space[0]])[0]
    failed = VerificationRecord(status="rejected", reason="mismatch", target="cpu",
                                precision="strict", message="check 1/3: outside the tolerance")
    res = synthesize_region(spec, SynthOptions(target="cpu", precision="strict", rounds=0,
                                               functional_rounds=1),
                            incumbent=first, incumbent_record=failed)
    assert res.status == "verified", res.message
    assert _scheme(res.candidate.config) != _scheme(space[0]), res.candidate.config
