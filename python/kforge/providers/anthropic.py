"""The `anthropic` provider: Claude through the Messages API, with tool use and prompt caching.

    get_provider("anthropic", model="claude-sonnet-4-6", max_dollars=5)

The key comes from `api_key=` or ANTHROPIC_API_KEY; the endpoint from `base_url=` or
ANTHROPIC_BASE_URL (the SDK's default otherwise); the model from `model=` or
KFORGE_ANTHROPIC_MODEL. The fixed instructions and the region's context are sent as system
blocks with `cache_control` breakpoints, so every round after the first of a region reads them
from the prompt cache; in a tool conversation the last message carries a breakpoint too.
"""
from __future__ import annotations

import os
from typing import Any

from kforge.agents.budget import TokenUsage
from kforge.providers.base import ProviderError
from kforge.providers.llm import (ChatBackend, LLMProvider, Message, SystemPart, ToolCall,
                                  ToolSpec, Turn, classify_sdk_error, split_options,
                                  unknown_options)

DEFAULT_MODEL = "claude-sonnet-4-6"
_EPHEMERAL = {"type": "ephemeral"}


class AnthropicBackend(ChatBackend):
    name = "anthropic"

    def __init__(self, model: str | None = None, api_key: str | None = None,
                 base_url: str | None = None, **unknown: Any) -> None:
        if unknown:
            raise unknown_options("anthropic", unknown, ("model", "api_key", "base_url"))
        try:
            import anthropic
        except ImportError as exc:
            raise ProviderError("the anthropic provider needs the `anthropic` package: "
                                "pip install 'kforge[agents]'") from exc
        self.sdk = anthropic
        self.model = model or os.environ.get("KFORGE_ANTHROPIC_MODEL") or DEFAULT_MODEL
        api_key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not api_key:
            raise ProviderError("the anthropic provider needs an API key: set ANTHROPIC_API_KEY "
                                "(or pass api_key=...), or use --provider builtin")
        base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        # Retries are ours (recorded, budgeted), so the SDK's are off.
        self.client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0)
        self.endpoint = str(self.client.base_url).rstrip("/")

    def complete(self, system: list[SystemPart], messages: list[Message], tools: list[ToolSpec],
                 tool_choice: str | None, max_tokens: int, timeout: float) -> Turn:
        kwargs: dict[str, Any] = {}
        if tools:
            kwargs["tools"] = [{"name": t.name, "description": t.description,
                                "input_schema": t.schema} for t in tools]
            if tool_choice:
                kwargs["tool_choice"] = {"type": "tool", "name": tool_choice}
        response = self.client.messages.create(
            model=self.model, max_tokens=max_tokens, timeout=timeout,
            system=[_text_block(p.text, p.cache) for p in system],
            messages=self.wire_messages(messages, cache_last=bool(tools) and not tool_choice),
            **kwargs)
        text, calls = [], []
        for block in response.content:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                calls.append(ToolCall(block.id, block.name, dict(block.input or {})))
        u = response.usage
        usage = TokenUsage(input_tokens=u.input_tokens or 0, output_tokens=u.output_tokens or 0,
                           cache_write_tokens=u.cache_creation_input_tokens or 0,
                           cache_read_tokens=u.cache_read_input_tokens or 0)
        return Turn("\n".join(text), tuple(calls), response.stop_reason or "", usage,
                    response.model or self.model)

    @staticmethod
    def wire_messages(messages: list[Message], cache_last: bool) -> list[dict]:
        wire = []
        for m in messages:
            content: list[dict] = []
            if m.role == "assistant":
                if m.text:
                    content.append({"type": "text", "text": m.text})
                content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                            for c in m.tool_calls]
                if not content:
                    content.append({"type": "text", "text": "(empty answer)"})
            else:
                content += [{"type": "tool_result", "tool_use_id": r.call_id,
                             "content": r.content, "is_error": r.is_error}
                            for r in m.tool_results]
                if m.text:
                    content.append({"type": "text", "text": m.text})
            wire.append({"role": m.role, "content": content})
        if cache_last and wire:
            # The growing conversation is cached too: each turn reads the previous turn's prefix.
            wire[-1]["content"][-1]["cache_control"] = _EPHEMERAL
        return wire

    def classify(self, exc: BaseException) -> tuple[str, float | None, str]:
        return classify_sdk_error(self.sdk, exc, self.endpoint,
                                  "set ANTHROPIC_API_KEY to a valid key")


def _text_block(text: str, cache: bool) -> dict:
    block = {"type": "text", "text": text}
    if cache:
        block["cache_control"] = _EPHEMERAL
    return block


class AnthropicProvider(LLMProvider):
    """Claude as the generation and performance-analysis agents."""

    def __init__(self, **options: Any) -> None:
        parts = split_options(options)
        super().__init__(AnthropicBackend(**parts["backend"]), **parts["provider"])
