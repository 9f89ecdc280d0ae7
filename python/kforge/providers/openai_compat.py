"""The `openai` provider: any OpenAI-compatible chat-completions endpoint, with tool calls.

    get_provider("openai", model="gpt-5")                                   # api.openai.com
    get_provider("openai", base_url="http://127.0.0.1:8000/v1", model="qwen") # a local server

The endpoint comes from `base_url=` or OPENAI_BASE_URL (the SDK's default otherwise); the key
from `api_key=` or OPENAI_API_KEY, and none is needed for a server other than OpenAI's own; the
model from `model=` or KFORGE_OPENAI_MODEL. A local endpoint costs nothing unless `prices` says
otherwise. Servers without tool support: `use_tools=False`. Servers that only know the older
`max_tokens` field: `token_limit_field="max_tokens"` (the default for non-OpenAI endpoints).
"""
from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import urlparse

from kforge.agents.budget import FREE, TokenUsage
from kforge.providers.base import ProviderError
from kforge.providers.llm import (ChatBackend, LLMProvider, Message, SystemPart, ToolCall,
                                  ToolSpec, Turn, classify_sdk_error, split_options,
                                  unknown_options)

DEFAULT_MODEL = "gpt-5"
OPENAI_HOST = "api.openai.com"


class OpenAIBackend(ChatBackend):
    name = "openai"

    def __init__(self, model: str | None = None, api_key: str | None = None,
                 base_url: str | None = None, token_limit_field: str | None = None,
                 **unknown: Any) -> None:
        if unknown:
            raise unknown_options("openai", unknown,
                                  ("model", "api_key", "base_url", "token_limit_field"))
        try:
            import openai
        except ImportError as exc:
            raise ProviderError("the openai provider needs the `openai` package: "
                                "pip install 'kforge[agents]'") from exc
        self.sdk = openai
        self.model = model or os.environ.get("KFORGE_OPENAI_MODEL") or DEFAULT_MODEL
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        official = base_url is None or urlparse(base_url).hostname == OPENAI_HOST
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        if not api_key:
            if official:
                raise ProviderError("the openai provider needs an API key for api.openai.com: "
                                    "set OPENAI_API_KEY, or point --base-url (OPENAI_BASE_URL) "
                                    "at a local OpenAI-compatible server, or use --provider "
                                    "builtin")
            api_key = "unused"          # local servers ignore it; the SDK wants a string
        self.client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0)
        self.endpoint = str(self.client.base_url).rstrip("/")
        self.token_limit_field = token_limit_field or (
            "max_completion_tokens" if official else "max_tokens")
        self.default_price = None if official else FREE

    def complete(self, system: list[SystemPart], messages: list[Message], tools: list[ToolSpec],
                 tool_choice: str | None, max_tokens: int, timeout: float) -> Turn:
        kwargs: dict[str, Any] = {self.token_limit_field: max_tokens}
        if tools:
            kwargs["tools"] = [{"type": "function",
                                "function": {"name": t.name, "description": t.description,
                                             "parameters": t.schema}} for t in tools]
            if tool_choice:
                kwargs["tool_choice"] = {"type": "function", "function": {"name": tool_choice}}
        response = self.client.chat.completions.create(
            model=self.model, timeout=timeout,
            messages=self.wire_messages(system, messages), **kwargs)
        if not response.choices:
            return Turn("", (), "empty", _usage(response.usage), response.model or self.model)
        choice = response.choices[0]
        message = choice.message
        calls = []
        for call in message.tool_calls or ():
            fn = getattr(call, "function", None)
            if fn is None:
                continue
            raw = fn.arguments or ""
            try:
                arguments = json.loads(raw) if raw.strip() else {}
            except ValueError:
                arguments = {"_unparsed": raw}
            if not isinstance(arguments, dict):
                arguments = {"_unparsed": raw}
            calls.append(ToolCall(call.id, fn.name, arguments, raw))
        return Turn(message.content or "", tuple(calls), choice.finish_reason or "",
                    _usage(response.usage), response.model or self.model)

    @staticmethod
    def wire_messages(system: list[SystemPart], messages: list[Message]) -> list[dict]:
        # OpenAI caches long common prefixes by itself; the stable parts come first.
        wire: list[dict] = [{"role": "system", "content": "\n\n".join(p.text for p in system)}]
        for m in messages:
            if m.role == "assistant":
                msg: dict[str, Any] = {"role": "assistant", "content": m.text or None}
                if m.tool_calls:
                    msg["tool_calls"] = [
                        {"id": c.id, "type": "function",
                         "function": {"name": c.name,
                                      "arguments": c.raw_arguments or json.dumps(c.arguments)}}
                        for c in m.tool_calls]
                elif not m.text:
                    msg["content"] = "(empty answer)"
                wire.append(msg)
                continue
            wire += [{"role": "tool", "tool_call_id": r.call_id, "content": r.content}
                     for r in m.tool_results]
            if m.text:
                wire.append({"role": "user", "content": m.text})
        return wire

    def classify(self, exc: BaseException) -> tuple[str, float | None, str]:
        return classify_sdk_error(self.sdk, exc, self.endpoint,
                                  "set OPENAI_API_KEY to a key this endpoint accepts")


def _usage(u: Any) -> TokenUsage:
    if u is None:
        return TokenUsage()
    details = getattr(u, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
    prompt = u.prompt_tokens or 0
    return TokenUsage(input_tokens=max(0, prompt - cached), output_tokens=u.completion_tokens or 0,
                      cache_read_tokens=cached)


class OpenAIProvider(LLMProvider):
    """Any OpenAI-compatible chat endpoint as the generation and performance-analysis agents."""

    def __init__(self, **options: Any) -> None:
        parts = split_options(options)
        super().__init__(OpenAIBackend(**parts["backend"]), **parts["provider"])
