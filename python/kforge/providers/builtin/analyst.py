"""The rule-based performance analyst of the builtin provider.

Input: a profile of one verified candidate, as the synthesis loop measures it:
  {"time_ms": float, "config": dict, "floor_ms": float (optional),
   "kernels": [{"name", "n_regs", "n_spills", "shared"}, ...] (optional, GPU only)}.
Output: recommendations in words, and `config: {...}` lines naming the configurations of the
space to try next (the generator puts those first in the next round).
"""
from __future__ import annotations

import json
import math

# Hopper: 228 KiB shared memory per SM (227 usable by one block), 64K registers per SM.
_SHARED_LIMIT = 227 * 1024


def kernel_metadata(namespace) -> list[dict]:
    """Compile metadata of every Triton kernel a loaded candidate has compiled (GPU only):
    registers per thread, spilled registers, shared memory bytes."""
    import triton
    out = []
    for name, fn in sorted(vars(namespace).items() if not isinstance(namespace, dict)
                           else namespace.items()):
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            continue
        for caches in getattr(fn, "device_caches", {}).values():
            kernel_cache = caches[0]
            for compiled in kernel_cache.values():
                try:
                    compiled._init_handles()
                except Exception:       # not on a GPU (the interpreter has no binaries)
                    pass
                out.append({"name": name, "n_regs": getattr(compiled, "n_regs", None),
                            "n_spills": getattr(compiled, "n_spills", None),
                            "shared": getattr(getattr(compiled, "metadata", None), "shared",
                                              None)})
    return out


def _floor_ms(spec, target, precision: str) -> float | None:
    if not spec.flops and not spec.min_bytes:
        return None
    return target.floor_ms(spec.flops, spec.min_bytes, precision)


def _nearest(space: list[dict], base: dict, **changes) -> dict | None:
    """The configuration of the space closest to base with the given changes applied."""
    want = dict(base, **changes)
    best, best_d = None, math.inf
    for c in space:
        if any(c.get(k) != v for k, v in changes.items()):
            continue
        if "input_precision" not in changes and \
                bool(c.get("input_precision")) != bool(base.get("input_precision")):
            continue            # bf16: stay with bf16 operands (not its fp32 fallback)
        d = sum(abs(math.log2(max(1, c.get(k, 1))) - math.log2(max(1, want.get(k, 1))))
                for k in want if isinstance(want.get(k), int) and k in c)
        if c != base and d < best_d:
            best, best_d = c, d
    return best


def analyze_profile(spec, target, precision: str, shape, space: list[dict],
                    profile: dict) -> tuple[str, ...]:
    recs: list[str] = []
    picks: list[tuple[dict, str]] = []
    config = profile.get("config") or {}
    time_ms = profile.get("time_ms")
    floor = profile.get("floor_ms") or _floor_ms(spec, target, precision)
    kernels = profile.get("kernels") or []
    spills = max((k.get("n_spills") or 0 for k in kernels), default=0)
    regs = max((k.get("n_regs") or 0 for k in kernels), default=0)
    shared = max((k.get("shared") or 0 for k in kernels), default=0)

    if time_ms and floor:
        frac = floor / time_ms
        recs.append(f"runs at {frac:.0%} of the roofline floor ({floor:.4g} ms of "
                    f"{time_ms:.4g} ms)")
        if frac >= 0.85:
            recs.append("within 15% of the floor: further tuning is unlikely to pay")
            return tuple(recs)
    bound = "compute"
    if spec.flops and spec.min_bytes:
        intensity = spec.flops / spec.min_bytes
        ridge = target.peaks.flops_for(precision) / target.peaks.bytes_per_s
        bound = "compute" if intensity >= ridge else "memory"
        recs.append(f"{bound}-bound: {intensity:.1f} FLOP/byte against a ridge of {ridge:.0f}")

    if spills:
        recs.append(f"{spills} registers spilled ({regs} per thread): use smaller tiles or "
                    "more warps")
        for key in ("BLOCK_N", "BLOCK_M", "BLOCK_C", "BLOCK"):
            if key in config and config[key] > 16:
                c = _nearest(space, config, **{key: config[key] // 2})
                if c:
                    picks.append((c, f"halve {key} to stop spills"))
                    break
        if "num_warps" in config:
            c = _nearest(space, config, num_warps=config["num_warps"] * 2)
            if c:
                picks.append((c, "more warps per tile to stop spills"))
    if shared and shared > 0.9 * _SHARED_LIMIT and config.get("num_stages", 1) > 2:
        recs.append(f"{shared} bytes of shared memory: fewer pipeline stages")
        c = _nearest(space, config, num_stages=config["num_stages"] - 1)
        if c:
            picks.append((c, "one pipeline stage less"))

    if shape.kind == "gemm":
        M = shape.contraction.extent(shape.contraction.m)
        tiles = math.ceil(M / config.get("BLOCK_M", 128)) * math.ceil(
            shape.contraction.extent(shape.contraction.n) / config.get("BLOCK_N", 128))
        if tiles < 132 and config.get("SPLIT_K", 1) == 1:
            recs.append(f"only {tiles} output tiles for 132 SMs: split K or smaller tiles")
            for c in space:
                if c.get("SPLIT_K", 1) > 1:
                    picks.append((c, "split-K fills the machine"))
                    break
            c = _nearest(space, config, BLOCK_M=max(64, config.get("BLOCK_M", 128) // 2))
            if c:
                picks.append((c, "smaller BLOCK_M: more tiles"))
        elif bound == "compute":
            recs.append("compute-bound GEMM: larger tiles raise reuse; 8 warps keep wgmma fed")
            c = _nearest(space, config, BLOCK_N=min(256, config.get("BLOCK_N", 128) * 2))
            if c:
                picks.append((c, "wider N tile"))
            if precision == "strict" and config.get("input_precision") in ("3xtf32", "tf32x3",
                                                                              "bf16x6"):
                c = next((c for c in space if c.get("input_precision") == "fp16x3"
                          and c.get("SPLIT_K", 1) == config.get("SPLIT_K", 1)), None)
                if c:
                    picks.append((c, "fp16x3: three fp16 products (twice the tf32 rate), as "
                                     "accurate"))
            if precision == "strict" and config.get("input_precision") == "tf32x3":
                for c in space:
                    if c.get("input_precision") == "bf16x6" and all(
                            c.get(k) == config.get(k) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")):
                        picks.append((c, "bf16x6 is also fp32-accurate and may be faster"))
                        break
        else:
            c = _nearest(space, config, num_stages=config.get("num_stages", 3) + 1)
            if c:
                picks.append((c, "deeper pipeline for a memory-bound GEMM"))
    elif shape.kind == "rows":
        if config.get("BLOCK_C", 0) < shape.cols:
            c = next((c for c in space if c.get("BLOCK_C", 0) >= shape.cols), None)
            if c:
                picks.append((c, "one block per row: each element loaded once"))
        else:
            c = _nearest(space, config, num_warps=min(16, config.get("num_warps", 4) * 2))
            if c:
                picks.append((c, "more warps for wide rows"))
    else:
        c = _nearest(space, config, BLOCK=config.get("BLOCK", 1024) * 2)
        if c:
            picks.append((c, "larger blocks: fewer programs"))

    seen = set()
    for c, why in picks:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            recs.append(f"config: {key}  # {why}")
    return tuple(recs)
