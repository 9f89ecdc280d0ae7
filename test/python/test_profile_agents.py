"""The performance-analysis agents read the profile, and their recommendations reach the next
generation request: the real synthesis loop, verifier (Triton interpreter), profiler and SDKs;
only the LLM server is fake (the builtin provider needs none)."""
from __future__ import annotations

import json

from fake_llm_server import FakeLLMServer, Received, Reply, anthropic_text, anthropic_tool_use, \
    python_block
from test_agents_loop import TARGET, provider_records, read_log, run_loop
from test_agents_support import FAST, SLOW, spec

from kforge.synth import SynthOptions, synthesize_region


def test_llm_analysis_agent_receives_the_profile_and_its_advice_reaches_generation(tmp_path):
    analysis = {"limiter": "launch_overhead", "evidence": "BLOCK=2: n/2 programs",
                "recommendations": [{"change": "use BLOCK=1024", "expected_gain": "5x",
                                     "evidence": "time 40x the roofline floor"}]}
    seen = {}

    def analyze(received: Received) -> Reply:
        seen["analysis"] = received.all_text()
        return anthropic_tool_use("report_analysis", analysis)

    def optimize_round(received: Received) -> Reply:
        seen["generation"] = received.all_text()
        return anthropic_text(python_block(FAST, "Bigger blocks."))

    with FakeLLMServer([anthropic_text(python_block(SLOW)), analyze, optimize_round]) as server:
        result, log = run_loop(server, tmp_path, rounds=1, timing_reps=3)
    assert result.status == "verified"
    # profile in: the agent got the profile JSON and its numbers
    text = seen["analysis"]
    assert '"schema": "kforge.profile"' in text and "# Profile in numbers" in text
    assert "time: median" in text and "roofline:" in text
    assert f"absent: compile: {'the Triton interpreter' if TARGET == 'cpu' else ''}" in text
    # recommendations out, into the next generation request, with their evidence
    assert ("[launch_overhead] use BLOCK=1024 (expected gain: 5x) [evidence: time 40x the "
            "roofline floor]") in seen["generation"]
    # the transcript: the profile event, the prompt with the profile, the analysis
    profiles = [e for e in log if e["event"] == "profile"]
    assert len(profiles) == 1 and profiles[0]["profile"]["schema"] == "kforge.profile"
    prompt = [r for r in provider_records(log, "prompt") if r["agent"] == "analyze"][0]
    assert prompt["profile"]["timing"]["median_ms"] == profiles[0]["profile"]["timing"]["median_ms"]
    analyses = [e for e in log if e["event"] == "analysis"]
    assert analyses[0]["recommendations"][0].startswith("[launch_overhead] use BLOCK=1024")
    saved = list((tmp_path / spec().hash / "profiles").glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["candidate_id"] == \
        profiles[0]["candidate"]


def test_builtin_analyst_reads_the_profile_and_its_picks_drive_the_next_round(tmp_path):
    from pathlib import Path
    from kforge.spec import load_spec
    s = load_spec(Path(__file__).parent / "fixtures" / "specs" / "matmul_bias_relu.json")
    opts = SynthOptions(target="cpu", precision="strict", provider="builtin", rounds=1,
                        seeds=(1,), patience=1, timing_reps=2)
    result = synthesize_region(s, opts, log_dir=tmp_path)
    log = read_log(tmp_path / s.hash / "log.jsonl")
    assert result.status == "verified"
    (analysis,) = [e for e in log if e["event"] == "analysis"]
    assert analysis["profile"]["schema"] == "kforge.profile"
    assert analysis["profile"]["timing"]["median_ms"] > 0
    recs = analysis["recommendations"]
    ranked = [r for r in recs if r[:1].isdigit()]
    assert ranked and ranked[0].startswith("1. ")
    picks = [json.loads(r[len("config: "):].split("  #")[0]) for r in recs
             if r.startswith("config: ")]
    assert picks
    requests = [e for e in log if e["event"] == "request" and e["phase"] == "optimize"]
    assert requests[0]["feedback"][0]["recommendations"] == recs
    candidates = [e["candidate"] for e in log if e["event"] == "candidate"]
    assert candidates[1]["config"] == picks[0]          # measured next: the analyst's first pick


def test_compile_tool_answers_with_the_compile_metadata_or_why_none(tmp_path):
    from fake_llm_server import tool_result_of
    from test_agents_support import GOOD

    def after_compile(received: Received) -> Reply:
        result = json.loads(tool_result_of(received))
        assert result["ok"] is True and "metadata" in result, result
        if TARGET == "cpu":
            assert result["metadata"] is None
            assert result["note"] == "the Triton interpreter compiles no device code"
        else:
            assert result["metadata"][0]["num_regs"] > 0
        return anthropic_text(python_block(GOOD))

    with FakeLLMServer([anthropic_tool_use("compile_kernel", {"source": GOOD}),
                        after_compile]) as server:
        result, log = run_loop(server, tmp_path)
    assert result.status == "verified"
    call = provider_records(log, "tool_call")[0]
    assert call["name"] == "compile_kernel" and "metadata" in call["result"]
