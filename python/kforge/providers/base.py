"""The provider interface: what every kernel writer (builtin, anthropic, openai) implements.

The synthesis loop (kforge.synth) drives providers through this interface only. A provider gets a
GenerationRequest (the region, the contract, the target, the best kernel so far and the feedback
of the last round) and answers with candidate kernels as Python source text. It never verifies its
own code: the loop compiles, verifies (in a sandbox) and times every candidate and feeds the
results back in the next request.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

Phase = Literal["functional", "optimize"]


@dataclass(frozen=True)
class Feedback:
    """What happened to one earlier candidate, in words a kernel writer can act on."""
    candidate_id: str
    status: Literal["compile_error", "mismatch", "timeout", "crash", "rejected", "verified"]
    message: str                         # compiler error, mismatch report, rejection reason...
    time_ms: float | None = None         # measured time when verified
    floor_ms: float | None = None        # roofline floor of the region on this device
    recommendations: tuple[str, ...] = ()  # from the performance-analysis agent / analyst


@dataclass(frozen=True)
class GenerationRequest:
    spec: Any                            # kforge.spec.KernelSpec
    region_mlir: str                     # the region's MLIR text (for prompts)
    reference_source: str                # readable PyTorch reference of the region
    precision: str                       # strict | tf32 | bf16
    target: Any                          # kforge.targets.Target
    phase: Phase
    round: int
    best: "Candidate | None" = None      # incumbent verified kernel (builtin seed when available)
    feedback: tuple[Feedback, ...] = ()  # results of the previous round
    cross_target_reference: "Candidate | None" = None  # verified kernel for another target
    num_candidates: int = 1
    tried: tuple[str, ...] = ()          # ids of every candidate the loop has tried for the region
    # only precision schemes keeping more than this many significant bits in their products'
    # operands (kforge.selection.scheme_bits; 0: any): the builtin honours it; an LLM provider's
    # kernel is not bound by it, and a region with a floor runs only builtin kernels above it
    finer_than: int = 0


@dataclass(frozen=True)
class Candidate:
    """A kernel as Python source defining `launch(*args) -> tuple[torch.Tensor, ...]`.

    `launch` receives the region's arguments (torch tensors, in spec order; weights already
    prepared by `prepare_weights` when the source defines it) and returns the region's results.
    It must launch at least one Triton kernel and must not compute the result with torch ops.
    The source may also define `prepare_weights(weights: dict[int, torch.Tensor]) -> dict[int,
    torch.Tensor]`, called once at load with the weight arguments (by argument index); what it
    returns replaces those arguments in every later `launch` call (e.g. bf16 casts, hi/lo splits).
    Verification calls it too, on fresh weights for every check.
    """
    id: str
    provider: str
    source: str
    config: dict = field(default_factory=dict)   # tuning parameters, for the record
    notes: str = ""                              # the writer's own explanation


class Provider(abc.ABC):
    name: str = "provider"

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> list[Candidate]:
        """Return up to request.num_candidates candidates (may be empty: the loop records it)."""

    def analyze(self, request: GenerationRequest, profile: dict) -> tuple[str, ...]:
        """Performance analysis: turn profiling data into recommendations (optional)."""
        return ()

    def unsupported(self, request: GenerationRequest) -> str | None:
        """Why this provider writes no kernel for the request's region at all, where it knows
        (optional): the loop says it when generation comes back empty."""
        return None

    def usage(self) -> dict:
        """Tokens, dollars, requests spent so far (LLM providers)."""
        return {}


class ProviderError(RuntimeError):
    """A provider cannot work at all (missing key, unreachable endpoint): the loop falls back."""
