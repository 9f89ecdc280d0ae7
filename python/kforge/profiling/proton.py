"""Triton's Proton profiler, where Nsight Compute is absent: kernel times per kernel name.

The worker runs the launches inside `triton.profiler.start(path, hook="triton")` ...
`finalize()`, which writes a Hatchet-format JSON tree (`path.hatchet`): frames with children
and metrics such as `time (ns)` and `count`. Kernels are the frames with a time and no children.
"""
from __future__ import annotations

import json
from pathlib import Path

from kforge.profiling.schema import KernelCounters


def available() -> tuple[bool, str]:
    try:
        import triton.profiler  # noqa: F401
    except Exception as exc:   # noqa: BLE001
        return False, f"triton.profiler (Proton) does not import: {type(exc).__name__}: {exc}"
    return True, ""


def parse_hatchet(data) -> list[KernelCounters]:
    """KernelCounters (name, mean time per launch) from Proton's Hatchet JSON (list or dict)."""
    roots = data if isinstance(data, list) else [data]
    found: dict[str, list[float]] = {}

    def walk(node):
        if not isinstance(node, dict):
            return
        children = node.get("children") or []
        metrics = node.get("metrics") or {}
        name = (node.get("frame") or {}).get("name", "?")
        time_ns = metrics.get("time (ns)")
        if not children and time_ns is not None and name != "ROOT":
            entry = found.setdefault(name, [0.0, 0.0])
            entry[0] += float(time_ns)
            entry[1] += float(metrics.get("count", 1) or 1)
        for c in children:
            walk(c)

    for r in roots:
        walk(r)
    return [KernelCounters(name=n, time_ms=t / max(c, 1.0) * 1e-6,
                           raw={"proton_time_ns_total": t, "proton_count": c})
            for n, (t, c) in sorted(found.items())]


def read_hatchet(path: str | Path) -> list[KernelCounters]:
    return parse_hatchet(json.loads(Path(path).read_text()))
