"""The LLM providers over their real SDKs against a local fake server that speaks each wire
protocol (Anthropic Messages, OpenAI chat completions): prompts, tool round trips, prompt
caching, retries, timeouts, keys, budgets, the analysis agent.

The conversations through the real synthesis loop and verifier are in test_agents_loop.py.
"""
from __future__ import annotations

import importlib.util
import socket
import time

import pytest

from fake_llm_server import (FakeLLMServer, Received, Reply, anthropic_error, anthropic_text,
                             anthropic_tool_use, openai_completion, openai_error, python_block,
                             tool_result_of)
from kforge.agents.budget import BudgetExhausted, Price, load_prices, price_for
from kforge.providers.base import Candidate, ProviderError
from kforge.providers.llm import NO_CODE_NOTE, NO_CODE_REASK, TRUNCATED_REASK, extract_sources
from kforge.providers.registry import get_provider, parse_option
from test_agents_support import (BROKEN, FAST, GOOD, REGION_MLIR, WRONG, feedback, request,
                                 seed_candidate)


class Wire:
    """One protocol's answers and provider, so each test runs against both APIs."""

    def __init__(self, name: str) -> None:
        self.name = name

    def text(self, text: str, **kw) -> Reply:
        if self.name == "anthropic":
            return anthropic_text(text, **kw)
        finish = {"max_tokens": "length"}.get(kw.pop("stop_reason", ""), None)
        return openai_completion(text, finish_reason=finish, **kw)

    def tool(self, name: str, arguments: dict) -> Reply:
        if self.name == "anthropic":
            return anthropic_tool_use(name, arguments, text="Let me check it.")
        return openai_completion(None, tool_calls=[(name, arguments)])

    def error(self, status: int, message: str = "busy", headers: dict | None = None) -> Reply:
        if self.name == "anthropic":
            kind = {429: "rate_limit_error", 529: "overloaded_error", 401: "authentication_error",
                    400: "invalid_request_error"}.get(status, "api_error")
            return anthropic_error(status, kind, message, headers)
        return openai_error(status, "error", message, headers)

    def provider(self, server: FakeLLMServer, **options):
        options.setdefault("sleep", lambda s: None)
        options.setdefault("base_delay_s", 0.01)
        if self.name == "anthropic":
            return get_provider("anthropic", base_url=server.url, api_key="test-key",
                                model="claude-sonnet-4-6", **options)
        return get_provider("openai", base_url=server.url + "/v1", api_key="test-key",
                            model="gpt-test", **options)

    def system_text(self, r: Received) -> str:
        if self.name == "anthropic":
            return "\n".join(b["text"] for b in r.body["system"])
        return r.body["messages"][0]["content"]


@pytest.fixture(params=["anthropic", "openai"])
def wire(request) -> Wire:
    return Wire(request.param)


class RecordingTools:
    """The loop's tool callback, reduced to a script: what a verifier would answer per source.
    (The real verifier answers in test_agents_loop.py.)"""

    def __init__(self, answers: dict[str, dict]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str]] = []

    def _answer(self, method: str, source: str) -> dict:
        self.calls.append((method, source))
        default = {"status": "verified", "message": "ok"}
        if method == "time":
            default = {"time_ms": 0.1, "floor_ms": 0.05, "incumbent_ms": 0.2}
        return self.answers.get(source, default)

    def compile(self, source):
        return self._answer("compile", source)

    def verify(self, source):
        return self._answer("verify", source)

    def time(self, source):
        return self._answer("time", source)


# --- prompts, candidates, records ----------------------------------------------------------

def test_prompt_carries_region_contract_incumbent_feedback_and_cross_target(wire):
    cross = Candidate(id="cuda-kernel", provider="anthropic", source=FAST,
                      config={"target": "cuda"})
    req = request(phase="optimize", round=3, best=seed_candidate(), cross_target_reference=cross,
                  feedback=(feedback("verified", "", candidate_id="builtin-seed", time_ms=0.5,
                                     floor_ms=0.1,
                                     recommendations=("[memory_bandwidth] use BLOCK=1024",)),
                            feedback("mismatch", "max abs err 0.9 at [2, 3]")))
    with FakeLLMServer([wire.text(python_block(GOOD))]) as server:
        provider = wire.provider(server)
        candidates = provider.generate(req)
    assert [c.source for c in candidates] == [GOOD]
    assert candidates[0].provider == wire.name and candidates[0].config["origin"] == "answer"
    sent = server.received[0]
    text = sent.all_text()
    for needle in [REGION_MLIR.splitlines()[0],                       # region MLIR
                   "v1[d0, d1] = maximum((arg0[d0, d1] + arg1[d1]), 0.0)",  # PyTorch reference
                   "arg0  f32[None, 8]", "weight 'fc.bias'",           # shapes, dtypes, weights
                   "Precision policy: strict", "atol = rtol = 1e-4",   # precision contract
                   "Triton interpreter (TRITON_INTERPRET=1)",          # target description
                   "prepare_weights(weights: dict[int, torch.Tensor])",  # Candidate contract
                   "Best verified kernel so far (builtin, id builtin-seed)", "0.5 ms",
                   "MISMATCH", "max abs err 0.9 at [2, 3]",            # last round's feedback
                   "use BLOCK=1024",                                    # recommendations
                   "verified kernel for the same region on cuda", "BLOCK=1024)",  # cross target
                   "optimization pass"]:
        assert needle in text, needle
    records = provider.take_records()
    kinds = [r["kind"] for r in records]
    assert kinds == ["prompt", "answer", "candidates"]
    assert records[0]["user"] in text and records[0]["best"] == "builtin-seed"
    assert records[1]["text"].startswith("Here is the kernel.")
    assert all(r["region"] == "00aa11bb22cc33dd" and r["round"] == 3 for r in records)
    assert provider.take_records() == []


def test_anthropic_request_shape_caching_and_cost():
    usage = {"input_tokens": 300, "output_tokens": 500, "cache_creation_input_tokens": 4000,
             "cache_read_input_tokens": 0}
    usage2 = {"input_tokens": 300, "output_tokens": 500, "cache_creation_input_tokens": 0,
              "cache_read_input_tokens": 4000}
    with FakeLLMServer([anthropic_text(python_block(GOOD), usage=usage),
                        anthropic_text(python_block(GOOD), usage=usage2)]) as server:
        provider = get_provider("anthropic", base_url=server.url, api_key="sk-test",
                                model="claude-sonnet-4-6", max_output_tokens=1234)
        provider.generate(request())
        provider.generate(request(round=2))
    first, second = server.received
    assert first.path == "/v1/messages" and first.api_key() == "sk-test"
    assert first.body["model"] == "claude-sonnet-4-6" and first.body["max_tokens"] == 1234
    system = first.body["system"]
    # Two cached system parts: the fixed instructions and the region's context.
    assert [b.get("cache_control") for b in system] == [{"type": "ephemeral"}] * 2
    assert "Candidate contract" not in system[1]["text"] and "launch" in system[0]["text"]
    assert REGION_MLIR.splitlines()[0] in system[1]["text"]
    # The cached prefix is identical between rounds; only the round message differs.
    assert second.body["system"] == system
    assert "Round 2" in second.last_user_text()
    u = provider.usage()
    assert u["requests"] == 2 and u["cache_write_tokens"] == 4000 and u["cache_read_tokens"] == 4000
    price = Price(3.0, 15.0)
    expected = (price.dollars(300, 500, 4000, 0) + price.dollars(300, 500, 0, 4000))
    assert u["dollars"] == pytest.approx(expected) and u["price_source"] == "table"


def test_openai_request_shape_local_and_official():
    with FakeLLMServer([openai_completion(python_block(GOOD))], require_key=False) as server:
        local = get_provider("openai", base_url=server.url + "/v1", model="qwen-coder")
        assert local.generate(request())[0].source == GOOD
    sent = server.received[0]
    assert sent.path == "/v1/chat/completions" and sent.body["model"] == "qwen-coder"
    assert sent.body["messages"][0]["role"] == "system" and sent.body["max_tokens"] == 16000
    assert local.usage()["dollars"] == 0 and local.usage()["price_source"] == "endpoint"
    # The official endpoint wants a key, and the newer token-limit field.
    with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
        get_provider("openai", api_key=None, model="gpt-5")


# --- tools ---------------------------------------------------------------------------------

def test_tool_round_trip_broken_then_fixed(wire):
    error = "AttributeError: module has no attribute 'maximun'"
    tools = RecordingTools({BROKEN: {"status": "compile_error", "message": error}})

    def after_tool(received: Received) -> Reply:
        result = tool_result_of(received)
        assert "maximun" in result and "compile_error" in result
        return wire.text(python_block(GOOD, "Fixed the typo."))

    with FakeLLMServer([wire.tool("verify_kernel", {"source": BROKEN}), after_tool]) as server:
        provider = wire.provider(server, tools=tools)
        candidates = provider.generate(request())
    assert tools.calls == [("verify", BROKEN)]
    assert [c.source for c in candidates] == [GOOD] and "Fixed the typo." in candidates[0].notes
    offered = server.received[0].body["tools"]
    names = [t["name"] if wire.name == "anthropic" else t["function"]["name"] for t in offered]
    assert names == ["compile_kernel", "verify_kernel", "time_kernel"]
    if wire.name == "anthropic":   # the growing conversation carries a cache breakpoint
        assert server.received[1].body["messages"][-1]["content"][-1]["cache_control"]
    records = provider.take_records()
    call = next(r for r in records if r["kind"] == "tool_call")
    assert call["name"] == "verify_kernel" and call["arguments"]["source"] == BROKEN
    assert call["result"]["status"] == "compile_error"


def test_tools_come_from_the_request_when_the_loop_sets_them(wire):
    """A request carrying `tools` (the loop's callback) wins over the provider option."""
    import dataclasses
    tools = RecordingTools({})
    req = request()
    if "tools" in {f.name for f in dataclasses.fields(req)}:
        req = dataclasses.replace(req, tools=tools)
    else:
        object.__setattr__(req, "tools", tools)      # until base.py grows the field
    with FakeLLMServer([wire.tool("time_kernel", {"source": FAST}),
                        wire.text("The timed kernel above is my answer.")]) as server:
        candidates = wire.provider(server).generate(req)
    # No code in the final text: the kernel the tools verified and timed is the candidate.
    assert tools.calls == [("time", FAST)]
    assert [c.source for c in candidates] == [FAST]
    assert candidates[0].config["origin"] == "tool-verified"


def test_tool_budget_per_round(wire):
    tools = RecordingTools({})
    script = [wire.tool("compile_kernel", {"source": GOOD}),
              wire.tool("compile_kernel", {"source": GOOD}),
              lambda r: wire.text(python_block(GOOD)) if "tool budget" in tool_result_of(r)
              else wire.error(400, "expected the budget message")]
    with FakeLLMServer(script) as server:
        provider = wire.provider(server, tools=tools, max_tool_calls=1)
        assert provider.generate(request())[0].source == GOOD
    assert len(tools.calls) == 1


def test_no_tools_offered_without_a_callback(wire):
    with FakeLLMServer([wire.text(python_block(GOOD))]) as server:
        wire.provider(server).generate(request())
    assert "tools" not in server.received[0].body


# --- answers without code ------------------------------------------------------------------

def test_no_code_is_asked_again_once(wire):
    with FakeLLMServer([wire.text("I would use a 1D grid over all elements."),
                        wire.text(python_block(GOOD))]) as server:
        provider = wire.provider(server)
        assert [c.source for c in provider.generate(request())] == [GOOD]
    assert NO_CODE_REASK in server.received[1].last_user_text()
    assert any(r["kind"] == "no_code" for r in provider.take_records())


def test_no_code_twice_is_reported_to_the_next_round(wire):
    with FakeLLMServer([wire.text("Thinking about it."), wire.text("Still thinking."),
                        wire.text(python_block(GOOD))]) as server:
        provider = wire.provider(server)
        assert provider.generate(request(round=1)) == []
        assert provider.generate(request(round=2))[0].source == GOOD
    assert NO_CODE_NOTE in server.received[2].all_text()
    assert NO_CODE_NOTE not in server.received[0].all_text()


def test_truncated_answer_is_asked_again(wire):
    cut = "Here:\n```python\n" + GOOD[:200]
    with FakeLLMServer([wire.text(cut, stop_reason="max_tokens"),
                        wire.text(python_block(GOOD))]) as server:
        assert wire.provider(server).generate(request())[0].source == GOOD
    assert TRUNCATED_REASK in server.received[1].last_user_text()


def test_several_candidates_from_one_answer(wire):
    answer = "".join(python_block(source, prose) for source, prose in
                     [(GOOD, "First:"), (FAST, "Second:"), (WRONG, "Third:")])
    with FakeLLMServer([wire.text(answer)]) as server:
        candidates = wire.provider(server).generate(request(num_candidates=2))
    assert [c.source for c in candidates] == [GOOD, FAST]
    assert len({c.id for c in candidates}) == 2
    assert "2 different candidates" in server.received[0].last_user_text()


def test_extract_sources():
    assert extract_sources(python_block(GOOD)) == [GOOD]
    assert extract_sources("```py\n" + GOOD + "```\n```python\n" + GOOD + "```") == [GOOD]
    assert extract_sources("```python\nimport triton\n```") == []          # no launch
    assert extract_sources("```mlir\ndef launch(x):\n```") == []            # not python
    assert extract_sources(GOOD) == [GOOD]                                   # bare module
    assert extract_sources("Use def launch(x): ... like this") == []


# --- faults --------------------------------------------------------------------------------

def test_rate_limit_then_success(wire):
    slept = []
    with FakeLLMServer([wire.error(429, "rate limited", {"retry-after": "7"}),
                        wire.text(python_block(GOOD))]) as server:
        provider = wire.provider(server, sleep=slept.append)
        assert provider.generate(request())[0].source == GOOD
    assert len(server.received) == 2 and slept == [7.0]
    retry = next(r for r in provider.take_records() if r["kind"] == "retry")
    assert retry["retry_after_s"] == 7.0 and "429" in retry["error"]
    assert provider.usage()["retries"] == 1


def test_server_errors_and_dropped_connection_back_off_exponentially(wire):
    slept = []
    status = 529 if wire.name == "anthropic" else 503
    with FakeLLMServer([wire.error(500, "internal"), wire.error(status, "overloaded"),
                        Reply(drop=True), wire.text(python_block(GOOD))]) as server:
        provider = wire.provider(server, sleep=slept.append, base_delay_s=1.0, max_delay_s=3.0)
        assert provider.generate(request())[0].source == GOOD
    assert len(server.received) == 4
    # 1, 2, then capped at 3 (plus up to 25% jitter)
    assert [int(s) for s in slept] == [1, 2, 3] and all(s <= 3.0 for s in slept[2:])
    errors = [r["error"] for r in provider.take_records() if r["kind"] == "retry"]
    assert "HTTP 500" in errors[0] and f"HTTP {status}" in errors[1]
    assert "cannot connect" in errors[2] or "timed out" in errors[2]


def test_hang_past_the_client_timeout_is_retried(wire):
    with FakeLLMServer([Reply(delay_s=3.0, body={}), wire.text(python_block(GOOD))]) as server:
        provider = wire.provider(server, timeout_s=0.5)
        start = time.monotonic()
        assert provider.generate(request())[0].source == GOOD
        elapsed = time.monotonic() - start
    assert elapsed < 2.5 and len(server.received) == 2
    retry = next(r for r in provider.take_records() if r["kind"] == "retry")
    assert "timed out" in retry["error"]


def test_gives_up_after_max_attempts_with_a_clear_error(wire):
    with FakeLLMServer([wire.error(500, "down")] * 3) as server:
        provider = wire.provider(server, max_attempts=3)
        with pytest.raises(ProviderError, match="gave up after 3 attempts.*HTTP 500"):
            provider.generate(request())
    assert len(server.received) == 3


def test_rejected_key_is_not_retried(wire):
    with FakeLLMServer([wire.error(401, "invalid x-api-key")]) as server:
        provider = wire.provider(server)
        with pytest.raises(ProviderError, match="rejected the API key"):
            provider.generate(request())
    assert len(server.received) == 1


def test_missing_key(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ProviderError, match="set ANTHROPIC_API_KEY"):
        get_provider("anthropic")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    with FakeLLMServer([anthropic_text(python_block(GOOD))]) as server:
        get_provider("anthropic", base_url=server.url).generate(request())
    assert server.received[0].api_key() == "from-env"


def test_unreachable_endpoint(wire):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()                               # nothing listens there now

    class Nowhere:
        url = f"http://127.0.0.1:{port}"

    provider = wire.provider(Nowhere, max_attempts=2)
    with pytest.raises(ProviderError,
                       match=f"gave up after 2 attempts.*cannot connect to http://127.0.0.1:{port}"):
        provider.generate(request())


# --- budgets -------------------------------------------------------------------------------

def test_dollar_budget_stops_before_the_next_request(wire):
    usage = ({"input_tokens": 100_000, "output_tokens": 10_000} if wire.name == "anthropic"
             else {"prompt_tokens": 100_000, "completion_tokens": 10_000})
    prices = {model: {"input": 3, "output": 15} for model in ("claude-sonnet-4-6", "gpt-test")}
    with FakeLLMServer([wire.text(python_block(GOOD), usage=usage)]) as server:
        provider = wire.provider(server, max_dollars=0.40, prices=prices)
        provider.generate(request())                        # spends $0.45
        with pytest.raises(BudgetExhausted, match=r"dollar budget reached \(\$0.4500"):
            provider.generate(request(round=2))
    assert len(server.received) == 1
    assert provider.usage()["exhausted"].startswith("dollar budget")


def test_token_round_and_wall_budgets(wire):
    with FakeLLMServer([wire.text(python_block(GOOD))] * 2) as server:
        by_tokens = wire.provider(server, max_tokens=1000)
        by_tokens.generate(request())
        with pytest.raises(BudgetExhausted, match="token budget"):
            by_tokens.generate(request())
        by_rounds = wire.provider(server, max_rounds=1)
        by_rounds.generate(request())
        with pytest.raises(BudgetExhausted, match="round budget"):
            by_rounds.generate(request())
        by_wall = wire.provider(server, max_wall_s=0.0)
        with pytest.raises(BudgetExhausted, match="wall-time budget"):
            by_wall.generate(request())
    assert len(server.received) == 2
    assert isinstance(BudgetExhausted("x"), ProviderError)   # a loop that knows only the base stops


def test_prices():
    table = load_prices({"my-model": {"input": 1, "output": 2}})
    assert price_for("claude-sonnet-4-6-20260101", table) == (table["claude-sonnet-4-6"], "table")
    assert price_for("my-model", table)[0] == Price(1, 2)
    assert price_for("mystery", table)[1] == "assumed"


# --- the performance-analysis agent --------------------------------------------------------

ANALYSIS = {"limiter": "memory_bandwidth", "evidence": "5x the floor with 0 spills",
            "recommendations": [
                {"change": "raise BLOCK from 2 to 1024", "expected_gain": "4x",
                 "rationale": "too many tiny programs"},
                {"change": "num_warps=4", "expected_gain": "1.1x"}]}


def test_analysis_agent_returns_structured_recommendations(wire):
    profile = {"time_ms": 0.5, "floor_ms": 0.1, "source": FAST,
               "compile": {"num_regs": 32, "spills": 0, "shared": 0, "num_warps": 4,
                           "num_stages": 3}, "ncu": None}
    if wire.name == "anthropic":
        answer = anthropic_tool_use("report_analysis", ANALYSIS)
    else:
        answer = openai_completion(None, tool_calls=[("report_analysis", ANALYSIS)])
    with FakeLLMServer([answer]) as server:
        provider = wire.provider(server)
        recs = provider.analyze(request(phase="optimize", best=seed_candidate()), profile)
    assert recs == ("[memory_bandwidth] raise BLOCK from 2 to 1024 (expected gain: 4x)"
                    " — too many tiny programs",
                    "[memory_bandwidth] num_warps=4 (expected gain: 1.1x)")
    assert provider.last_analysis["limiter"] == "memory_bandwidth"
    body = server.received[0].body
    text = server.received[0].all_text()
    assert "5.00x the floor" in text and '"num_regs": 32' in text and "BLOCK=1024" in text
    if wire.name == "anthropic":
        assert body["tool_choice"] == {"type": "tool", "name": "report_analysis"}
    else:
        assert body["tool_choice"] == {"type": "function", "function": {"name": "report_analysis"}}
    record = next(r for r in provider.take_records() if r["kind"] == "analysis")
    assert record["ok"] and record["analysis"]["recommendations"][0]["expected_gain"] == "4x"


def test_analysis_without_tools_parses_json_text():
    import json
    with FakeLLMServer([openai_completion("Analysis:\n" + json.dumps(ANALYSIS))],
                       require_key=False) as server:
        provider = get_provider("openai", base_url=server.url + "/v1", model="local",
                                use_tools=False)
        recs = provider.analyze(request(best=seed_candidate()), {"time_ms": 1.0})
    assert len(recs) == 2 and "tools" not in server.received[0].body
    assert "Answer with one JSON object" in server.received[0].all_text()


def test_analysis_unusable_answer_gives_no_recommendations(wire):
    with FakeLLMServer([wire.text("It is probably fine.")]) as server:
        provider = wire.provider(server)
        assert provider.analyze(request(best=seed_candidate()), {"time_ms": 1.0}) == ()
    assert provider.last_analysis is None


# --- the registry --------------------------------------------------------------------------

def test_registry(monkeypatch):
    with pytest.raises(ProviderError, match="unknown provider 'gemini'"):
        get_provider("gemini")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("KFORGE_LLM_MAX_DOLLARS", "2.5")
    p = get_provider("Anthropic", model=None, max_rounds=4)
    assert p.name == "anthropic" and p.budget.max_dollars == 2.5 and p.budget.max_rounds == 4
    assert p.model == "claude-sonnet-4-6"
    assert parse_option("max-dollars=3") == ("max_dollars", 3)
    assert parse_option("use_tools=false") == ("use_tools", False)
    assert parse_option("base_url=http://h:1/v1") == ("base_url", "http://h:1/v1")
    unlimited = parse_option("max_dollars=unlimited")[1]
    assert get_provider("anthropic", max_dollars=unlimited).budget.max_dollars is None
    with pytest.raises(ProviderError, match="unknown option"):
        get_provider("anthropic", colour="blue")
    with pytest.raises(ProviderError, match="unknown option.*max_dollar"):
        get_provider("openai", api_key="k", max_dollar=3)     # a typo of max_dollars
    if importlib.util.find_spec("kforge.providers.builtin"):
        assert get_provider("builtin").name == "builtin"
        with pytest.raises(ProviderError, match="provider builtin does not take the option"):
            get_provider("builtin", model="x")


def test_openai_official_endpoint_settings(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    provider = get_provider("openai", api_key="sk-test", model="gpt-5")
    assert provider.backend.endpoint.startswith("https://api.openai.com")
    assert provider.backend.token_limit_field == "max_completion_tokens"
    assert provider.meter.price_source == "table"
