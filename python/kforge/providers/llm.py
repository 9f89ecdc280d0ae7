"""The conversation engine shared by the LLM providers (anthropic, openai).

`LLMProvider` implements the provider interface on top of a `ChatBackend` (one wire protocol):

* `generate`: one conversation per round. The prompt is the fixed instructions, the region's
  context and the round (incumbent, feedback, cross-target reference); the agent may call the
  loop's tools (compile, verify, time) until it answers with code. An answer without code is
  asked again once, then reported to the next round of the same region.
* `analyze`: the performance-analysis agent turns a profile into ranked recommendations.
* every request is retried with bounded exponential backoff on rate limits, server errors,
  timeouts and dropped connections; a missing key, a rejected key or an endpoint that stays
  unreachable is a `ProviderError` (the loop falls back to the builtin provider);
* every prompt, answer, tool call, retry and usage is a JSON-able record: the loop takes them
  with `take_records()` (or gets them live through `on_record`) and writes them to the region's
  log;
* budgets (tokens, dollars, wall time, rounds) are checked before every request.
"""
from __future__ import annotations

import abc
import email.utils
import hashlib
import json
import random
import re
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Literal

from kforge.agents import prompts
from kforge.agents.budget import (Budget, BudgetExhausted, Meter, Price, TokenUsage, load_prices,
                                  price_for)
from kforge.agents.tools import (ANALYSIS_TOOL, ANALYSIS_TOOL_NAME, GENERATION_TOOLS, LIMITERS,
                                 passed, run_tool)
from kforge.providers.base import Candidate, GenerationRequest, Provider, ProviderError

__all__ = ["LLMProvider", "ChatBackend", "RetryPolicy", "Turn", "ToolCall", "ToolSpec",
           "ToolResult", "Message", "SystemPart", "extract_sources", "classify_sdk_error",
           "Budget", "BudgetExhausted", "ProviderError"]


# --- The neutral conversation: what both wire protocols are translated from ---------------

@dataclass(frozen=True)
class SystemPart:
    text: str
    cache: bool = False          # a prompt-cache breakpoint after this part (Anthropic)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    schema: dict


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict
    raw_arguments: str | None = None   # OpenAI sends JSON text; kept to replay it verbatim


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class Message:
    role: Literal["user", "assistant"]
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()       # assistant
    tool_results: tuple[ToolResult, ...] = ()   # user, answering the previous tool calls


@dataclass(frozen=True)
class Turn:
    """One answer of the model."""
    text: str
    tool_calls: tuple[ToolCall, ...]
    stop_reason: str
    usage: TokenUsage
    model: str = ""


class ChatBackend(abc.ABC):
    """One wire protocol. `complete` sends the whole conversation and returns the answer; it
    raises the SDK's own exceptions, which `classify` sorts into retry / fatal."""
    name: str
    model: str
    endpoint: str
    default_price: Price | None = None   # e.g. free for a local server

    @abc.abstractmethod
    def complete(self, system: list[SystemPart], messages: list[Message], tools: list[ToolSpec],
                 tool_choice: str | None, max_tokens: int, timeout: float) -> Turn: ...

    @abc.abstractmethod
    def classify(self, exc: BaseException) -> tuple[str, float | None, str]:
        """('retry' | 'fatal' | 'unknown', retry-after seconds or None, one-line description)."""


def classify_sdk_error(sdk: Any, exc: BaseException, endpoint: str,
                       key_hint: str) -> tuple[str, float | None, str]:
    """Classify an exception of the anthropic or openai SDK (they share their exception names)."""
    if isinstance(exc, sdk.APITimeoutError):
        return "retry", None, f"request to {endpoint} timed out"
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f": {type(cause).__name__}: {cause}" if cause else ""
        return "retry", None, f"cannot connect to {endpoint}{detail}"
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        message = _api_message(exc)
        if status in (408, 409, 429) or status >= 500:
            return "retry", _retry_after(exc.response.headers), f"HTTP {status}: {message}"
        if status in (401, 403):
            return "fatal", None, (f"{endpoint} rejected the API key (HTTP {status}: {message}); "
                                   f"{key_hint}")
        if status == 404:
            return "fatal", None, (f"{endpoint} answered 404 ({message}): check the model name "
                                   "and the base URL")
        return "fatal", None, f"{endpoint} refused the request (HTTP {status}: {message})"
    return "unknown", None, f"{type(exc).__name__}: {exc}"


def _api_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc))


def _retry_after(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: attempt n waits base_delay_s * 2**(n-1) plus up to 25% jitter, or what the
    server's retry-after asks; never more than max_delay_s."""
    max_attempts: int = 6
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    timeout_s: float = 600.0        # one request; a hang past it is retried

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        base = self.base_delay_s * 2 ** (attempt - 1)
        return min(self.max_delay_s, base * (1 + 0.25 * random.random()))


# --- Code extraction ----------------------------------------------------------------------

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$",
                    re.S | re.M)
_LAUNCH = re.compile(r"^def launch\s*\(", re.M)


def extract_sources(text: str) -> list[str]:
    """The complete kernel modules in an answer: fenced python blocks that define `launch`, in
    order, without duplicates. An answer that is nothing but a module (no fences) counts too."""
    found: list[str] = []
    blocks = _FENCE.findall(text or "")
    for lang, body in blocks:
        if lang.lower() in ("", "python", "py", "python3") and _LAUNCH.search(body):
            source = body.strip() + "\n"
            if source not in found:
                found.append(source)
    if not blocks and text and _LAUNCH.search(text) and \
            text.lstrip().startswith(("import ", "from ", "#", '"""')):
        found.append(text.strip() + "\n")
    return found


def _prose(text: str, limit: int = 2000) -> str:
    prose = _FENCE.sub("[code]", text or "").strip()
    return prose if len(prose) <= limit else prose[:limit] + " ..."


NO_CODE_REASK = ("Your answer contains no complete kernel module. Reply with the complete module "
                 "(imports, @triton.jit kernel, launch) in one ```python block.")
TRUNCATED_REASK = ("Your answer was cut off by the output limit before the code block closed. "
                   "Reply again with only the complete module in one ```python block, concisely.")
TOOL_BUDGET_SPENT = ("The tool budget of this round is spent: give your final answer now, with "
                     "the complete module in a ```python block.")
NO_CODE_NOTE = ("Your previous answer for this region contained no usable code (no ```python "
                "block defining launch), so it could not be verified. Answer with the complete "
                "module this time.")


# --- The provider ---------------------------------------------------------------------------

class LLMProvider(Provider):
    """A provider whose kernels come from an LLM agent; the backend says which API.

    Options (all optional): budget fields (`max_tokens`, `max_dollars`, `max_wall_s`,
    `max_rounds`, `max_turns`, `max_tool_calls`, `max_output_tokens`), retry fields
    (`max_attempts`, `base_delay_s`, `max_delay_s`, `timeout_s`), `prices` (dict or JSON file),
    `use_tools` (offer compile/verify/time tools, default true), `tools` (a CandidateTools
    object used when a request carries none), `on_record` (callable receiving each record),
    `sleep` (for tests).
    """

    def __init__(self, backend: ChatBackend, *, budget: Budget | None = None,
                 retry: RetryPolicy | None = None, prices: dict | str | None = None,
                 use_tools: bool = True, tools: Any = None,
                 on_record: Callable[[dict], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.backend = backend
        self.name = backend.name
        self.model = backend.model
        self.budget = budget or Budget()
        self.retry = retry or RetryPolicy()
        user_prices = load_prices(prices, defaults=False)
        if backend.default_price is not None and backend.model not in user_prices:
            price, source = backend.default_price, "endpoint"    # e.g. a local server: free
        else:
            price, source = price_for(backend.model, {**load_prices(), **user_prices})
        self.meter = Meter(self.budget, price, source)
        self.use_tools = use_tools
        self.tools = tools
        self.on_record = on_record
        self._sleep = sleep
        self._records: list[dict] = []
        self._notes: dict[str, list[str]] = {}   # region -> notes for its next round
        self.last_analysis: dict | None = None

    # --- records ---------------------------------------------------------------------------
    def _record(self, ctx: dict, kind: str, **data: Any) -> None:
        rec = {"provider": self.name, "model": self.model, **ctx, "kind": kind,
               "t": round(time.time(), 3), **data}
        self._records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)

    def take_records(self) -> list[dict]:
        """Records since the last call (prompts, answers, tool calls, retries, usage)."""
        records, self._records = self._records, []
        return records

    def usage(self) -> dict:
        return {"provider": self.name, "model": self.model, "endpoint": self.backend.endpoint,
                **self.meter.as_dict()}

    # --- one request, with retries ---------------------------------------------------------
    def _call(self, ctx: dict, system: list[SystemPart], messages: list[Message],
              tools: list[ToolSpec], tool_choice: str | None = None) -> Turn:
        attempt = 0
        while True:
            attempt += 1
            reason = self.meter.exhausted()
            if reason:
                self._record(ctx, "budget", reason=reason)
                raise BudgetExhausted(f"{self.name}: {reason}")
            timeout = self.retry.timeout_s
            wall_left = self.meter.wall_left()
            if wall_left is not None:
                timeout = min(timeout, max(1.0, wall_left))
            started = time.monotonic()
            try:
                turn = self.backend.complete(system, messages, tools, tool_choice,
                                             self.budget.max_output_tokens, timeout)
            except Exception as exc:
                kind, retry_after, what = self.backend.classify(exc)
                elapsed = round(time.monotonic() - started, 3)
                if kind == "unknown":
                    raise
                if kind == "fatal":
                    self._record(ctx, "error", attempt=attempt, error=what, elapsed_s=elapsed)
                    raise ProviderError(f"{self.name}: {what}") from exc
                if attempt >= self.retry.max_attempts:
                    self._record(ctx, "error", attempt=attempt, error=what, elapsed_s=elapsed)
                    raise ProviderError(
                        f"{self.name}: gave up after {attempt} attempts; last error: {what}. "
                        f"Check that {self.backend.endpoint} is reachable, or use --provider "
                        "builtin.") from exc
                delay = self.retry.delay(attempt, retry_after)
                self.meter.retries += 1
                self._record(ctx, "retry", attempt=attempt, error=what, elapsed_s=elapsed,
                             retry_after_s=retry_after, delay_s=round(delay, 3))
                if wall_left is not None and delay >= wall_left:
                    self._record(ctx, "budget", reason="wall-time budget reached while waiting")
                    raise BudgetExhausted(f"{self.name}: wall-time budget reached while "
                                          f"waiting to retry ({what})") from exc
                self._sleep(delay)
                continue
            self.meter.add(turn.usage)
            self._record(ctx, "answer", attempt=attempt,
                         elapsed_s=round(time.monotonic() - started, 3),
                         text=turn.text, stop_reason=turn.stop_reason,
                         tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments}
                                     for c in turn.tool_calls],
                         usage=turn.usage.as_dict(),
                         dollars=round(turn.usage.dollars(self.meter.price), 6),
                         total_dollars=round(self.meter.dollars, 6))
            return turn

    # --- the generation agent --------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> list[Candidate]:
        region = _region(request)
        ctx = {"agent": "generate", "region": region, "round": request.round,
               "phase": request.phase}
        b = self.budget
        reason = self.meter.exhausted()
        if b.max_rounds is not None and self.meter.rounds >= b.max_rounds:
            reason = f"round budget reached ({self.meter.rounds} of {b.max_rounds} rounds)"
        if reason:
            self._record(ctx, "budget", reason=reason)
            raise BudgetExhausted(f"{self.name}: {reason}")
        self.meter.rounds += 1

        tools = getattr(request, "tools", None) or self.tools
        specs = [] if not self.use_tools or tools is None else [
            ToolSpec(name, desc, schema) for name, (_, desc, schema) in GENERATION_TOOLS.items()]
        system = [SystemPart(prompts.generation_instructions(), cache=True),
                  SystemPart(prompts.region_context(request), cache=True)]
        user = prompts.round_prompt(request, tuple(self._notes.pop(region, ())))
        self._record(ctx, "prompt", system=[p.text for p in system], user=user,
                     tools=[t.name for t in specs],
                     best=request.best.id if request.best else None,
                     feedback=[f"{f.candidate_id}:{f.status}" for f in request.feedback])

        sources, origin, text = self._converse(ctx, system, user, specs, tools)
        if not sources:
            self._record(ctx, "no_code", action="reported to the next round")
            self._notes.setdefault(region, []).append(NO_CODE_NOTE)
            return []
        candidates = []
        for k, source in enumerate(sources[: max(1, request.num_candidates)]):
            digest = hashlib.sha1(source.encode()).hexdigest()[:8]
            candidates.append(Candidate(
                id=f"{self.name}-r{request.round}-{k}-{digest}", provider=self.name,
                source=source, config={"model": self.model, "origin": origin},
                notes=_prose(text)))
        self._record(ctx, "candidates", ids=[c.id for c in candidates], origin=origin,
                     usage=self.meter.as_dict())
        return candidates

    def _converse(self, ctx: dict, system: list[SystemPart], user: str,
                  specs: list[ToolSpec], tools: Any) -> tuple[list[str], str, str]:
        """One round's conversation: tool round trips until an answer with code, asking once
        more when an answer has none. Returns (sources, origin, the last answer's text)."""
        b = self.budget
        messages = [Message("user", user)]
        text = ""
        submitted: str | None = None      # the last source the agent sent to a tool
        verified: str | None = None       # the last source a tool reported as verified
        tool_calls = 0
        reasked = False
        for turn_no in range(1, b.max_turns + 1):
            try:
                turn = self._call(ctx, system, messages, specs)
            except BudgetExhausted:
                if verified or submitted:
                    break                 # keep what the conversation produced so far
                raise
            messages.append(Message("assistant", turn.text, turn.tool_calls))
            text = turn.text
            if turn.tool_calls:
                results = []
                for call in turn.tool_calls:
                    if tool_calls >= b.max_tool_calls:
                        content, is_error, result = TOOL_BUDGET_SPENT, True, None
                    else:
                        tool_calls += 1
                        content, is_error, result = run_tool(tools, call.name, call.arguments)
                        source = call.arguments.get("source")
                        if isinstance(source, str) and source.strip():
                            submitted = source
                            verified = source if passed(call.name, result) else verified
                    self._record(ctx, "tool_call", id=call.id, name=call.name,
                                 arguments=call.arguments, result=result, content=content,
                                 is_error=is_error)
                    results.append(ToolResult(call.id, call.name, content, is_error))
                messages.append(Message("user", tool_results=tuple(results)))
                continue
            sources = extract_sources(turn.text)
            if sources:
                return sources, "answer", text
            if verified or reasked or turn_no == b.max_turns:
                break      # an answer that points at its tool-verified kernel is an answer
            reasked = True
            truncated = turn.stop_reason in ("max_tokens", "length")
            self._record(ctx, "no_code", stop_reason=turn.stop_reason, action="asked again")
            messages.append(Message("user", TRUNCATED_REASK if truncated else NO_CODE_REASK))
        if verified:
            return [verified], "tool-verified", text
        if submitted:
            return [submitted], "tool-submitted", text
        return [], "", text

    # --- the performance-analysis agent ----------------------------------------------------
    def analyze(self, request: GenerationRequest, profile: dict) -> tuple[str, ...]:
        """Recommendations as lines for Feedback.recommendations; the structured analysis
        ({limiter, evidence, recommendations: [{change, expected_gain, rationale}]}) is kept in
        `last_analysis` and in the records."""
        region = _region(request)
        ctx = {"agent": "analyze", "region": region, "round": request.round,
               "phase": request.phase}
        self.last_analysis = None
        reason = self.meter.exhausted()
        if reason:
            self._record(ctx, "budget", reason=reason)
            return ()
        desc, schema = ANALYSIS_TOOL
        specs = [ToolSpec(ANALYSIS_TOOL_NAME, desc, schema)] if self.use_tools else []
        system = [SystemPart(prompts.analysis_instructions(), cache=True)]
        user = prompts.analysis_prompt(request, profile)
        if not specs:
            user += ("\n\nAnswer with one JSON object only: {\"limiter\": one of "
                     f"{list(LIMITERS)}, \"evidence\": str, \"recommendations\": "
                     "[{\"change\": str, \"expected_gain\": str, \"rationale\": str, "
                     "\"evidence\": str}]}")
        self._record(ctx, "prompt", system=[p.text for p in system], user=user,
                     profile=profile, tools=[t.name for t in specs])
        turn = self._call(ctx, system, [Message("user", user)], specs,
                          ANALYSIS_TOOL_NAME if specs else None)
        analysis = _parse_analysis(turn)
        if analysis is None:
            self._record(ctx, "analysis", ok=False, error="no usable analysis in the answer")
            return ()
        self.last_analysis = analysis
        self._record(ctx, "analysis", ok=True, analysis=analysis)
        return tuple(prompts.format_recommendation(analysis["limiter"], rec)
                     for rec in analysis["recommendations"])


def _region(request: GenerationRequest) -> str:
    spec = request.spec
    return str(prompts._get(spec, "hash", "") or prompts._get(spec, "name", "") or "region")


def _parse_analysis(turn: Turn) -> dict | None:
    data: Any = None
    for call in turn.tool_calls:
        if call.name == ANALYSIS_TOOL_NAME:
            data = call.arguments
    if data is None and turn.text:
        match = re.search(r"\{.*\}", turn.text, re.S)
        if match:
            try:
                data = json.loads(match.group(0))
            except ValueError:
                data = None
    if not isinstance(data, dict):
        return None
    recs = [r for r in data.get("recommendations") or () if isinstance(r, dict) and r.get("change")]
    if not recs:
        return None
    limiter = str(data.get("limiter") or "other")
    return {"limiter": limiter, "evidence": str(data.get("evidence") or ""),
            "recommendations": [{"change": str(r["change"]),
                                 "expected_gain": str(r.get("expected_gain", "?")),
                                 "rationale": str(r.get("rationale", "")),
                                 "evidence": str(r.get("evidence", ""))} for r in recs]}


def split_options(options: dict) -> dict:
    """Sort flat provider options into LLMProvider keyword arguments (budget, retry, rest)."""
    budget_keys = {f.name for f in fields(Budget)}
    retry_keys = {f.name for f in fields(RetryPolicy)}
    budget = {k: options[k] for k in options if k in budget_keys}
    retry = {k: options[k] for k in options if k in retry_keys}
    rest = {k: v for k, v in options.items() if k not in budget_keys | retry_keys}
    kwargs: dict[str, Any] = {"budget": Budget.from_options(budget), "retry": RetryPolicy(**retry)}
    for key in ("prices", "use_tools", "tools", "on_record", "sleep"):
        if key in rest:
            kwargs[key] = rest.pop(key)
    return {"provider": kwargs, "backend": rest}


def unknown_options(provider: str, unknown: dict, backend_keys: tuple[str, ...]) -> ProviderError:
    """The error for options nobody takes, listing the ones that exist."""
    known = sorted(set(backend_keys) | {f.name for f in fields(Budget)}
                   | {f.name for f in fields(RetryPolicy)}
                   | {"prices", "use_tools", "tools", "on_record", "sleep"})
    return ProviderError(f"{provider}: unknown option(s) {', '.join(sorted(unknown))}; the "
                         f"options are {', '.join(known)}")

