"""What an LLM provider may spend: token, dollar, wall-time and round limits, and model prices.

One `Meter` per provider instance counts every request; the provider checks it before each call
and stops with `BudgetExhausted` (a `ProviderError`, so a loop that knows only the base interface
stops using the provider and keeps what it has verified) once any limit is reached.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from kforge.providers.base import ProviderError


class BudgetExhausted(ProviderError):
    """A user-set limit (tokens, dollars, wall time, rounds) is reached: no more requests."""


@dataclass(frozen=True)
class Budget:
    """Limits for one provider instance (one `kforge compile`/`kforge synth` run).

    `None` means unlimited. Tokens count everything a request is billed for: input, cache writes,
    cache reads and output. Rounds count `generate` calls; turns and tool calls are per call.
    """
    max_tokens: int | None = 2_000_000
    max_dollars: float | None = 10.0
    max_wall_s: float | None = 3600.0
    max_rounds: int | None = None
    max_turns: int = 8                 # model answers within one generate() (tool round trips)
    max_tool_calls: int = 12           # tool calls within one generate()
    max_output_tokens: int = 16000     # per answer

    @classmethod
    def from_options(cls, options: dict) -> "Budget":
        """Build from provider options, e.g. `{"max_dollars": 2, "max_wall_s": 600}`."""
        known = {f.name for f in fields(cls)}
        values = {k: (None if isinstance(v, str) and v.lower() in ("unlimited", "none") else v)
                  for k, v in options.items() if k in known}
        return replace(cls(), **values)


@dataclass(frozen=True)
class Price:
    """Dollars per million tokens."""
    input: float
    output: float
    cache_write: float | None = None    # default: 1.25 x input (Anthropic's 5-minute cache)
    cache_read: float | None = None     # default: 0.1 x input

    def dollars(self, input_tokens: int, output_tokens: int,
                cache_write_tokens: int = 0, cache_read_tokens: int = 0) -> float:
        write = self.cache_write if self.cache_write is not None else 1.25 * self.input
        read = self.cache_read if self.cache_read is not None else 0.1 * self.input
        return (input_tokens * self.input + output_tokens * self.output
                + cache_write_tokens * write + cache_read_tokens * read) / 1e6


# List prices known when this table was written; they change. Override with the `prices`
# provider option or KFORGE_LLM_PRICES (a JSON file: {"model": {"input": 3, "output": 15}}).
# A model missing here is charged ASSUMED_PRICE, so a dollar budget errs on the safe side.
DEFAULT_PRICES: dict[str, Price] = {
    "claude-opus-4-6": Price(5.0, 25.0),
    "claude-sonnet-4-6": Price(3.0, 15.0),
    "claude-opus-4-5": Price(5.0, 25.0),
    "claude-opus-4-1": Price(15.0, 75.0),
    "claude-opus-4": Price(15.0, 75.0),
    "claude-sonnet-4-5": Price(3.0, 15.0),
    "claude-sonnet-4": Price(3.0, 15.0),
    "claude-haiku-4-5": Price(1.0, 5.0),
    "gpt-5": Price(1.25, 10.0, cache_write=1.25, cache_read=0.125),
    "gpt-5-mini": Price(0.25, 2.0, cache_write=0.25, cache_read=0.025),
    "gpt-4.1": Price(2.0, 8.0, cache_write=2.0, cache_read=0.5),
    "gpt-4o": Price(2.5, 10.0, cache_write=2.5, cache_read=1.25),
}
ASSUMED_PRICE = Price(15.0, 75.0)
FREE = Price(0.0, 0.0, 0.0, 0.0)


def load_prices(extra: dict | str | Path | None = None, defaults: bool = True) -> dict[str, Price]:
    """The default table (unless `defaults` is false), updated from KFORGE_LLM_PRICES and then
    from `extra` (a dict or a JSON file)."""
    table = dict(DEFAULT_PRICES) if defaults else {}
    for source in (os.environ.get("KFORGE_LLM_PRICES"), extra):
        if not source:
            continue
        if isinstance(source, (str, Path)):
            try:
                source = json.loads(Path(source).read_text())
            except (OSError, ValueError) as exc:
                raise ProviderError(f"cannot read the price table {source}: {exc}; expected JSON "
                                    '{"model": {"input": 3.0, "output": 15.0}} in $/Mtok') from exc
        for model, price in source.items():
            table[model] = price if isinstance(price, Price) else Price(**price)
    return table


def price_for(model: str, table: dict[str, Price]) -> tuple[Price, str]:
    """The price of `model` and where it came from: 'table' (exact or a dated variant) or
    'assumed'."""
    if model in table:
        return table[model], "table"
    # Dated snapshots ("claude-sonnet-4-5-20250929") cost what their family costs.
    for name in sorted(table, key=len, reverse=True):
        if model.startswith(name + "-"):
            return table[name], "table"
    return ASSUMED_PRICE, "assumed"


@dataclass
class Meter:
    """Counts what a provider spent; `exhausted()` says which limit is reached, if any."""
    budget: Budget
    price: Price
    price_source: str = "table"
    requests: int = 0
    retries: int = 0
    rounds: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    dollars: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def add(self, usage: "TokenUsage") -> None:
        self.requests += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        self.cache_read_tokens += usage.cache_read_tokens
        self.dollars += usage.dollars(self.price)

    @property
    def tokens(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_write_tokens
                + self.cache_read_tokens)

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def wall_left(self) -> float | None:
        return None if self.budget.max_wall_s is None else self.budget.max_wall_s - self.wall_s

    def exhausted(self) -> str | None:
        b = self.budget
        if b.max_tokens is not None and self.tokens >= b.max_tokens:
            return f"token budget reached ({self.tokens} of {b.max_tokens} tokens)"
        if b.max_dollars is not None and self.dollars >= b.max_dollars:
            return f"dollar budget reached (${self.dollars:.4f} of ${b.max_dollars:.2f})"
        if b.max_wall_s is not None and self.wall_s >= b.max_wall_s:
            return f"wall-time budget reached ({self.wall_s:.0f} s of {b.max_wall_s:.0f} s)"
        return None

    def as_dict(self) -> dict:
        return {"requests": self.requests, "retries": self.retries, "rounds": self.rounds,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cache_write_tokens": self.cache_write_tokens,
                "cache_read_tokens": self.cache_read_tokens, "tokens": self.tokens,
                "dollars": round(self.dollars, 6), "price_source": self.price_source,
                "wall_s": round(self.wall_s, 3), "exhausted": self.exhausted()}


@dataclass(frozen=True)
class TokenUsage:
    """One answer's usage, normalized: `input_tokens` excludes cache reads and writes."""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0

    def dollars(self, price: Price) -> float:
        return price.dollars(self.input_tokens, self.output_tokens,
                             self.cache_write_tokens, self.cache_read_tokens)

    def as_dict(self) -> dict:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cache_write_tokens": self.cache_write_tokens,
                "cache_read_tokens": self.cache_read_tokens}
