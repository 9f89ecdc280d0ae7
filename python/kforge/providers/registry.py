"""`get_provider(name, **options)`: the one place that knows which providers exist.

    get_provider("builtin")
    get_provider("anthropic", model="claude-sonnet-4-6", max_dollars=5)
    get_provider("openai", base_url="http://127.0.0.1:8000/v1", model="qwen", use_tools=False)

Heavy or optional imports (the SDKs) happen only for the provider asked for. A provider that
cannot work (missing SDK, missing key) raises ProviderError with what to do.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

from kforge.providers.base import Provider, ProviderError

# name -> (module, class)
PROVIDERS: dict[str, tuple[str, str]] = {
    "builtin": ("kforge.providers.builtin", "BuiltinProvider"),
    "anthropic": ("kforge.providers.anthropic", "AnthropicProvider"),
    "openai": ("kforge.providers.openai_compat", "OpenAIProvider"),
}
LLM_PROVIDERS = ("anthropic", "openai")

# Options the LLM providers also read from the environment (flags win over these).
ENV_OPTIONS = {
    "KFORGE_LLM_MAX_DOLLARS": ("max_dollars", float),
    "KFORGE_LLM_MAX_TOKENS": ("max_tokens", int),
    "KFORGE_LLM_MAX_WALL_S": ("max_wall_s", float),
    "KFORGE_LLM_MAX_ROUNDS": ("max_rounds", int),
    "KFORGE_LLM_TIMEOUT_S": ("timeout_s", float),
    "KFORGE_LLM_MAX_ATTEMPTS": ("max_attempts", int),
}


def get_provider(name: str, **options: Any) -> Provider:
    """The provider called `name` (builtin | anthropic | openai), configured by `options`.

    Options with value None are dropped, so a CLI can pass its flags through unconditionally.
    """
    key = name.strip().lower()
    if key not in PROVIDERS:
        raise ProviderError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    options = {k: v for k, v in options.items() if v is not None}
    if key in LLM_PROVIDERS:
        options = {**env_options(), **options}
    module_name, class_name = PROVIDERS[key]
    provider_class = getattr(importlib.import_module(module_name), class_name)
    try:
        return provider_class(**options)
    except TypeError as exc:      # an option the provider does not take
        raise ProviderError(f"provider {key} does not take the option(s) "
                            f"{', '.join(sorted(options))}: {exc}") from exc


def env_options() -> dict[str, Any]:
    found = {}
    for var, (option, kind) in ENV_OPTIONS.items():
        value = os.environ.get(var)
        if value:
            try:
                found[option] = kind(value)
            except ValueError as exc:
                raise ProviderError(f"{var}={value!r} is not a {kind.__name__}") from exc
    return found


def parse_option(text: str) -> tuple[str, Any]:
    """'KEY=VALUE' from a `--provider-option` flag, with numbers and booleans typed."""
    if "=" not in text:
        raise ProviderError(f"provider option {text!r} is not KEY=VALUE")
    key, value = text.split("=", 1)
    key, value = key.strip().replace("-", "_"), value.strip()
    lowered = value.lower()
    if lowered in ("true", "yes", "on"):
        return key, True
    if lowered in ("false", "no", "off"):
        return key, False
    if lowered in ("none", "unlimited"):
        return key, "unlimited"      # a budget limit of None; None itself means "not given"
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value
