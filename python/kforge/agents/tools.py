"""Tools the generation agent may call mid-conversation, and the callback the loop provides.

The agent never runs code itself: each tool call is handed to a `CandidateTools` object that the
synthesis loop owns (it compiles, verifies in its sandbox and times a candidate exactly as it
would between rounds). The provider only formats the call and the answer.
"""
from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class CandidateTools(Protocol):
    """What the loop offers the agent. Each method takes a complete kernel module's source and
    returns a JSON-able dict, e.g.

    * `compile`: `{"ok": false, "error": "...traceback..."}` or `{"ok": true, "metadata":
      {"num_regs": 96, "spills": 0, "shared": 32768, "num_warps": 4, "num_stages": 3}}`
    * `verify`: `{"status": "mismatch", "message": "max abs err 0.31 at [3, 17] ..."}`
      (status as in `Feedback.status`)
    * `time`: `{"time_ms": 0.41, "floor_ms": 0.12, "incumbent_ms": 0.55}` (only after it verifies)

    A method may raise; the exception text is returned to the agent as a tool error.
    """

    def compile(self, source: str) -> dict: ...

    def verify(self, source: str) -> dict: ...

    def time(self, source: str) -> dict: ...


_SOURCE = {"type": "object",
           "properties": {"source": {"type": "string",
                                     "description": "The complete Python module: imports, "
                                                    "@triton.jit kernel(s) and launch()."}},
           "required": ["source"]}

# name -> (CandidateTools method, description, JSON schema of the input)
GENERATION_TOOLS: dict[str, tuple[str, str, dict]] = {
    "compile_kernel": (
        "compile",
        "Compile the candidate for the target with Triton (no correctness check). Returns the "
        "compiler error, or the compile metadata: registers, spills, shared memory, warps, stages.",
        _SOURCE),
    "verify_kernel": (
        "verify",
        "Run the project's verifier on the candidate: several random inputs, every output "
        "element compared with the PyTorch reference under the precision policy, plus the static "
        "anti-cheating checks. Returns the status and the mismatch or rejection report.",
        _SOURCE),
    "time_kernel": (
        "time",
        "Verify, then time the candidate on the target device. Returns its time in ms, the "
        "region's roofline floor and the incumbent's time.",
        _SOURCE),
}

ANALYSIS_TOOL_NAME = "report_analysis"
LIMITERS = ("memory_bandwidth", "compute", "latency", "occupancy", "register_spills",
            "shared_memory", "launch_overhead", "precision_emulation", "other")
ANALYSIS_TOOL: tuple[str, dict] = (
    "Report the performance analysis of the kernel: what limits it and what to change, most "
    "promising change first.",
    {"type": "object",
     "properties": {
         "limiter": {"type": "string", "enum": list(LIMITERS),
                     "description": "What limits the kernel now."},
         "evidence": {"type": "string",
                      "description": "The numbers from the profile that show it."},
         "recommendations": {
             "type": "array", "minItems": 1, "maxItems": 5,
             "items": {"type": "object",
                       "properties": {
                           "change": {"type": "string",
                                      "description": "One concrete change to the kernel."},
                           "expected_gain": {"type": "string",
                                             "description": "e.g. '1.3x' or '-0.1 ms'."},
                           "rationale": {"type": "string"},
                           "evidence": {"type": "string",
                                        "description": "The profile numbers this change "
                                                       "rests on, e.g. 'DRAM 91% of peak, "
                                                       "FLOP/s 40% of peak'."}},
                       "required": ["change", "expected_gain", "evidence"]}}},
     "required": ["limiter", "recommendations"]},
)

MAX_TOOL_RESULT_CHARS = 8000


def run_tool(tools: Any, name: str, arguments: dict) -> tuple[str, bool, dict | None]:
    """Run one generation tool through the loop's callback.

    Returns (text for the model, is_error, the callback's result or None)."""
    if name not in GENERATION_TOOLS:
        return f"unknown tool {name!r}; the tools are {', '.join(GENERATION_TOOLS)}", True, None
    method, _, _ = GENERATION_TOOLS[name]
    source = arguments.get("source") if isinstance(arguments, dict) else None
    if not isinstance(source, str) or not source.strip():
        return (f"{name} needs a 'source' argument: the complete kernel module as a string",
                True, None)
    try:
        result = getattr(tools, method)(source)
    except Exception as exc:  # the loop's failure is the agent's information, not our crash
        return f"{name} failed: {type(exc).__name__}: {exc}", True, None
    if not isinstance(result, dict):
        result = {"result": result}
    return truncate(json.dumps(result, default=str, indent=1)), False, result


def passed(name: str, result: dict | None) -> bool:
    """Whether a tool result says the source verified (verify_kernel, or time_kernel's timing)."""
    if not result:
        return False
    if name == "verify_kernel":
        return result.get("status") == "verified" or result.get("ok") is True
    if name == "time_kernel":
        return result.get("time_ms") is not None and not result.get("error")
    return False


def truncate(text: str, limit: int = MAX_TOOL_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    return (text[:head] + f"\n... [{len(text) - limit} characters cut] ...\n"
            + text[-(limit - head):])


class VerifierTools:
    """`CandidateTools` over the project's own verifier (kforge.verify): the checks the loop
    runs between rounds, offered to the agent mid-conversation. The loop may pass its own object
    instead (e.g. one that also returns Triton compile metadata from its profiler).

    * compile: the static checks and Python parsing, without running anything;
    * verify: `verify_candidate` in its sandbox (all seeds and sizes);
    * time: `verify_candidate(measure=True)`, with the region's roofline floor and the incumbent's
      time for comparison.
    """

    def __init__(self, spec: Any, target: Any, precision: str,
                 incumbent_ms: float | None = None, **verify_options: Any) -> None:
        self.spec, self.target, self.precision = spec, target, precision
        self.incumbent_ms = incumbent_ms
        self.verify_options = verify_options

    def compile(self, source: str) -> dict:
        from kforge.verify import static_check
        violations = static_check(source)
        if violations:
            return {"ok": False, "reason": violations[0].reason,
                    "error": "; ".join(str(v) for v in violations[:6])}
        return {"ok": True, "note": "parses and passes the static checks; Triton compiles the "
                                    "kernel at its first launch (verify_kernel runs it)"}

    def _verify(self, source: str, measure: bool) -> tuple[dict, Any]:
        from kforge.verify import verify_candidate
        record = verify_candidate(self.spec, source, self.target, self.precision,
                                  measure=measure, **self.verify_options)
        out = {"status": record.feedback_status, "message": record.message,
               "max_abs_err": record.max_abs_err, "max_rel_err": record.max_rel_err,
               "checks": record.checks}
        if record.status == "candidate":        # no device here: statically checked only
            out["status"] = "unverified"
        return out, record

    def verify(self, source: str) -> dict:
        return self._verify(source, measure=False)[0]

    def time(self, source: str) -> dict:
        out, record = self._verify(source, measure=True)
        if out["status"] != "verified":
            return {**out, "error": "not timed: the candidate does not verify"}
        return {**out, "time_ms": record.time_ms, "noise": record.time_noise,
                "floor_ms": self._floor(), "incumbent_ms": self.incumbent_ms}

    def _floor(self) -> float | None:
        floor = getattr(self.target, "floor_ms", None)
        if not callable(floor):
            return None
        return floor(getattr(self.spec, "flops", 0), getattr(self.spec, "min_bytes", 0),
                     self.precision)
