"""The rule-based performance analyst of the builtin provider.

Input: the profile of one verified candidate (kforge.profiling: a `kforge.profile` JSON dict:
timing, roofline position, compile metadata and code facts per kernel, Nsight Compute counters
when present). A bare dict {"time_ms", "config", "floor_ms", "kernels": [{"name", "n_regs", "n_spills",
"shared"}]} is read too (what older loops handed it).
Output: ranked recommendations, most promising first, each citing the numbers it rests on
("1. [memory] DRAM at 91% of peak, FLOP/s at 40% of the policy's peak: ..."), then
`config: {...}  # why` lines naming the configurations of the space to measure next, in the
order `rank_configs` puts them (the generator measures those first in the next round).

`rank_configs` is the profile-driven tuner: it orders the untried configurations of a GEMM's
space by a cost model of the tile (waves on 132 SMs, operand traffic through the tile's reuse,
accumulator registers per thread) weighted by what the profile shows binds the kernel: spills
(registers per thread over budget), the roofline bound and, with ncu, DRAM against tensor-pipe
utilization, and the warp stalls. Other kernel kinds keep the rules below.
"""
from __future__ import annotations

import json
import math

from kforge.profiling.schema import KernelFacts, Profile, Source, Timing
from kforge.targets.cuda import CudaTarget

# where a target does not say (Target.compute_units, Arch.shared_bytes): the H200's
SMS = CudaTarget.archs["sm_90"].compute_units
_SHARED_LIMIT = CudaTarget.archs["sm_90"].shared_bytes
_REG_BUDGET = 255               # registers per thread


def kernel_metadata(namespace) -> list[dict]:
    """Compile metadata of every Triton kernel a loaded candidate has compiled (GPU only):
    registers per thread, spilled registers, shared memory bytes."""
    import triton
    from kforge.profiling.triton_meta import facts_from_compiled
    out = []
    for name, fn in sorted(vars(namespace).items() if not isinstance(namespace, dict)
                           else namespace.items()):
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            continue
        for caches in getattr(fn, "device_caches", {}).values():
            for compiled in caches[0].values():
                f = facts_from_compiled(compiled, name)
                out.append({"name": name, "n_regs": f.n_regs, "n_spills": f.n_spills,
                            "shared": f.shared_bytes})
    return out


def as_profile(profile: dict | Profile) -> Profile:
    """A Profile from what the loop hands the analyst (a profile JSON dict, or the bare
    {"time_ms", "config", ...} of older loops)."""
    if isinstance(profile, Profile):
        return profile
    if profile.get("schema"):
        return Profile.from_json(profile)
    t = profile.get("time_ms")
    kernels = tuple(KernelFacts(name=str(k.get("name", "?")), n_regs=k.get("n_regs"),
                                n_spills=k.get("n_spills"), shared_bytes=k.get("shared"))
                    for k in profile.get("kernels") or () if isinstance(k, dict))
    return Profile(candidate_id=str(profile.get("candidate_id", "?")),
                   target=str(profile.get("target", "?")),
                   precision=str(profile.get("precision", "?")),
                   config=dict(profile.get("config") or {}),
                   timing=Timing(t, noise=profile.get("noise")) if t else None,
                   kernels=kernels,
                   sources={s: Source(False, "not in this profile") for s in
                            ("compile", "ncu", "proton")})


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


# --- the GEMM cost model ------------------------------------------------------------------

_OPERAND_BYTES = {None: 2, "fp16x1": 2, "fp16x3": 4, "3xtf32": 8, "tf32x3": 4, "bf16x6": 4,
                  "tf32": 4, "ieee": 4}
_PRODUCTS = {None: 1, "fp16x1": 1, "fp16x3": 3, "3xtf32": 3, "tf32x3": 3, "bf16x6": 6,
             "tf32": 1, "ieee": 1}


def _gemm_dims(shape):
    c = shape.contraction
    return (c.extent(c.m) or 1, c.extent(c.n) or 1, c.extent(c.k) or 1, c.extent(c.batch) or 1)


def _acc_regs(c: dict) -> float:
    """fp32 accumulator values a thread holds (fp16x3 keeps a second partial product)."""
    per = c.get("BLOCK_M", 128) * c.get("BLOCK_N", 128) / (32 * c.get("num_warps", 4))
    return per * (2 if c.get("input_precision") == "fp16x3" else 1)


def compute_units(target) -> int:
    units = getattr(target, "compute_units", None)
    return units if isinstance(units, int) and units > 0 else SMS


def shared_limit(target) -> int:
    """Shared memory (SLM on Intel) a block may use on the target's architecture."""
    info = getattr(target, "arch_info", None)
    return getattr(info, "shared_bytes", None) or _SHARED_LIMIT


def tile_model(shape, c: dict, sms: int = SMS) -> dict:
    """The tile's waves, wave efficiency and operand traffic (relative units) for config c."""
    M, N, K, B = _gemm_dims(shape)
    bm, bn, sk = c.get("BLOCK_M", 128), c.get("BLOCK_N", 128), c.get("SPLIT_K", 1)
    tiles = math.ceil(M / bm) * math.ceil(N / bn) * B * sk
    waves = math.ceil(tiles / sms)
    e = _OPERAND_BYTES.get(c.get("input_precision"), 4)
    # each A row-panel is read once per N tile, each B column-panel once per M tile (GROUP_M
    # swizzling keeps a group's panels in L2: count DRAM traffic per group of GROUP_M rows)
    g = max(1, c.get("GROUP_M", 8))
    traffic = (M * K * math.ceil(N / bn) / g + N * K * math.ceil(M / bm) / g) * e * B \
        + M * N * 4 * B * (2 * sk - 1)
    return {"tiles": tiles, "waves": waves, "wave_eff": tiles / (waves * sms),
            "traffic": traffic, "acc_regs": _acc_regs(c)}


def _predicted(shape, c: dict, weights: dict, sms: int = SMS) -> float:
    """Relative predicted time of config c (smaller is better)."""
    M, N, K, B = _gemm_dims(shape)
    t = tile_model(shape, c, sms)
    bm, bn, bk = c.get("BLOCK_M", 128), c.get("BLOCK_N", 128), c.get("BLOCK_K", 32)
    products = _PRODUCTS.get(c.get("input_precision"), 1)
    # compute: waves x the tile's work, at a tile efficiency that grows with the tile (wgmma
    # issue and epilogue amortized over BM x BN) and with pipeline depth
    tile_eff = min(1.0, (bm * bn / (128 * 128)) ** 0.25) * min(1.0, 0.7 + 0.1 *
                                                                c.get("num_stages", 3))
    compute = t["waves"] * bm * bn * (K / c.get("SPLIT_K", 1)) * products / tile_eff \
        / (sms * 128 * 128)
    memory = t["traffic"] / (M * N * K * 4 / 128 * B)   # normalized to compute's units
    pred = max(compute * weights["compute"], memory * weights["memory"]) \
        + 0.15 * min(compute, memory)
    if t["acc_regs"] > weights["reg_limit"]:            # spills: local-memory traffic
        pred *= 1.0 + weights["spill"] * (t["acc_regs"] / weights["reg_limit"] - 1.0)
    if c.get("SPLIT_K", 1) > 1:                         # the partials' extra pass
        pred *= 1.0 + 0.05 * c["SPLIT_K"]
    return pred


def _weights(profile: Profile, config: dict) -> tuple[dict, list[str]]:
    """How much each term of the model counts, from the profile's evidence (and the evidence)."""
    w = {"compute": 1.0, "memory": 1.0, "reg_limit": 128.0, "spill": 1.0}
    why: list[str] = []
    k = profile.main_kernel()
    if k is not None and k.n_spills:
        # the incumbent spills: its accumulator count is over what this scheme can hold
        w["reg_limit"] = min(w["reg_limit"], 0.75 * _acc_regs(config))
        w["spill"] = 3.0
        why.append(f"{k.n_spills} spilled ({k.n_regs} registers a thread)")
    elif k is not None and k.n_regs and k.n_regs >= 240:
        w["reg_limit"] = min(w["reg_limit"], _acc_regs(config))
        why.append(f"{k.n_regs} registers a thread, at the limit")
    cnt = profile.main_counters()
    roof = profile.roofline
    if cnt is not None and cnt.dram_pct is not None and cnt.tensor_pct is not None:
        if cnt.dram_pct > 60 and cnt.dram_pct > cnt.tensor_pct:
            w["memory"] = 1.5
            why.append(f"DRAM {cnt.dram_pct:.0f}% vs tensor pipe {cnt.tensor_pct:.0f}%")
        elif cnt.tensor_pct > 60:
            w["compute"] = 1.5
            why.append(f"tensor pipe {cnt.tensor_pct:.0f}% of peak")
    elif roof is not None:
        if roof.bound == "memory":
            w["memory"] = 1.5
        why.append(f"{roof.bound}-bound by the roofline ({roof.intensity or 0:.0f} FLOP/B, "
                   f"ridge {roof.ridge:.0f})")
    return w, why


def rank_configs(shape, space: list[dict], profile: dict | Profile,
                 tried: list[dict] = (), sms: int = SMS) -> list[tuple[dict, float]]:
    """The untried GEMM configurations of `space`, best predicted first, with their predicted
    time relative to the incumbent's (the profile's config). The incumbent's scheme
    (input_precision) is kept unless the profile shows the tensor pipe saturated."""
    profile = as_profile(profile)
    base = profile.config or (space[0] if space else {})
    w, _ = _weights(profile, base)
    seen = {json.dumps(c, sort_keys=True) for c in tried}
    seen.add(json.dumps(base, sort_keys=True))
    ref = _predicted(shape, base, w, sms)
    ranked = []
    for c in space:
        if json.dumps(c, sort_keys=True) in seen:
            continue
        r = _predicted(shape, c, w, sms) / ref
        if c.get("input_precision") != base.get("input_precision"):
            cnt = profile.main_counters()
            saturated = cnt is not None and (cnt.tensor_pct or 0) > 70
            cheaper = _PRODUCTS.get(c.get("input_precision"), 1) < \
                _PRODUCTS.get(base.get("input_precision"), 1)
            r *= 0.9 if (saturated and cheaper) else 1.25     # another scheme: a bigger jump
        ranked.append((c, r))
    ranked.sort(key=lambda cr: cr[1])
    return ranked


# --- recommendations ------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def analyze_profile(spec, target, precision: str, shape, space: list[dict],
                    profile: dict | Profile, tried: list[dict] = ()) -> tuple[str, ...]:
    prof = as_profile(profile)
    extra = profile if isinstance(profile, dict) else {}
    tried = list(tried) or list(extra.get("tried_configs") or ())   # the loop adds them
    config = prof.config or {}
    time_ms = prof.time_ms
    roof = prof.roofline
    floor = roof.floor_ms if roof else extra.get("floor_ms") or (
        target.floor_ms(spec.flops, spec.min_bytes, precision)
        if (spec.flops or spec.min_bytes) else None)
    k = prof.main_kernel()
    cnt = prof.main_counters()
    found: list[tuple[float, str]] = []       # (priority, text with evidence)
    picks: list[tuple[dict, str]] = []
    head: list[str] = []

    if time_ms and floor:
        frac = floor / time_ms
        head.append(f"runs at {frac:.0%} of the roofline floor ({floor:.4g} ms of "
                    f"{time_ms:.4g} ms)")
        if frac >= 0.85:
            return tuple(head + ["1. within 15% of the floor: further tuning is unlikely to "
                                 f"pay [evidence: floor {floor:.4g} ms, measured "
                                 f"{time_ms:.4g} ms]"])
    if roof is not None:
        bound = roof.bound
        head.append(f"{bound}-bound: {roof.intensity or 0:.1f} FLOP/byte against a ridge of "
                    f"{roof.ridge:.0f}; FLOP/s at {_pct(roof.flops_fraction)} and bytes/s at "
                    f"{_pct(roof.bytes_fraction)} of the {precision} peaks")
    else:
        bound = "compute"
        if spec.flops and spec.min_bytes:
            intensity = spec.flops / spec.min_bytes
            ridge = target.peaks.flops_for(precision) / target.peaks.bytes_per_s
            bound = "compute" if intensity >= ridge else "memory"
            head.append(f"{bound}-bound: {intensity:.1f} FLOP/byte against a ridge of "
                        f"{ridge:.0f}")

    # evidence from the code and the compile
    if k is not None:
        if k.n_spills:
            found.append((0.0, f"[spills] {k.n_spills} registers spilled in {k.name} "
                               f"({k.n_regs} a thread): use smaller tiles or more warps"))
        if shape.kind == "gemm" and not (k.wgmma or k.mma_sync or k.dpas) and \
                prof.target == "cuda" and "ptx" in k.asm:
            found.append((0.5, f"[no tensor cores] no wgmma/mma in {k.name}'s PTX: BLOCK_M a "
                               "multiple of 64 and 4 or 8 warps let tl.dot use wgmma"))
        limit = shared_limit(target)
        if k.shared_bytes and k.shared_bytes > 0.9 * limit and \
                config.get("num_stages", 1) > 2:
            found.append((1.0, f"[shared memory] {k.shared_bytes} bytes of shared memory "
                               f"({k.shared_bytes / limit:.0%} of {limit // 1024} KiB): one "
                               "pipeline stage less"))
            c = _nearest(space, config, num_stages=config["num_stages"] - 1)
            if c:
                picks.append((c, "one pipeline stage less"))
        if k.max_load_bytes is not None and k.max_load_bytes < 16 and not k.tma and \
                shape.kind != "gemm":
            found.append((2.0, f"[narrow loads] widest global load {k.max_load_bytes} bytes "
                               f"(widths {k.load_widths}): contiguous 16-byte loads want the "
                               "inner dimension last and a block size that is a multiple of 4"))
    # evidence from the hardware counters
    if cnt is not None and cnt.dram_pct is not None:
        ev = (f"DRAM {cnt.dram_pct:.0f}% of peak, L2 {cnt.l2_pct or 0:.0f}%, tensor pipe "
              f"{cnt.tensor_pct or 0:.0f}%, SM {cnt.sm_pct or 0:.0f}%, occupancy "
              f"{cnt.occupancy_pct or 0:.0f}%, L2 hit {cnt.l2_hit_pct or 0:.0f}%")
        stalls = ", ".join(f"{r} {v:.2g}" for r, v in cnt.top_stalls)
        if cnt.dram_pct >= 70:
            found.append((1.0, f"[memory] {ev}: memory-bound on DRAM; move fewer bytes (fuse "
                               "the cast/split pass, larger tiles for reuse, bf16 operands "
                               "where the policy allows)"))
        elif shape.kind == "gemm" and (cnt.tensor_pct or 0) >= 70:
            found.append((3.0, f"[compute] {ev}: the tensor pipe is busy; only a cheaper "
                               "product scheme or fewer wasted tiles gain more"))
        elif (cnt.occupancy_pct or 100) < 20 and cnt.top_stalls and \
                cnt.top_stalls[0][0] in ("long_scoreboard", "barrier", "wait"):
            found.append((1.5, f"[latency] {ev}; top stalls {stalls}: few warps wait on "
                               "memory; a deeper pipeline (num_stages) or more warps hide it"))
        else:
            found.append((2.5, f"[counters] {ev}" + (f"; top stalls {stalls}" if stalls else "")))
    elif cnt is not None and cnt.time_ms is not None:
        found.append((4.0, f"[proton] {cnt.name} {cnt.time_ms:.4g} ms a launch (Proton); no "
                           "hardware counters here"))

    if shape.kind == "gemm":
        M, N, K, B = _gemm_dims(shape)
        sms = compute_units(target)
        t = tile_model(shape, config, sms)
        if t["tiles"] < sms and config.get("SPLIT_K", 1) == 1:
            found.append((0.8, f"[occupancy] only {t['tiles']} output tiles for {sms} SMs "
                               f"(M={M}, N={N}, {config.get('BLOCK_M')}x{config.get('BLOCK_N')}"
                               " tiles): split K or smaller tiles"))
        elif t["wave_eff"] < 0.75:
            found.append((1.8, f"[waves] {t['tiles']} tiles make {t['waves']} waves on {sms} "
                               f"SMs, the last {t['wave_eff']:.0%} full: a tile size that "
                               "divides the work into full waves"))
        ranked = rank_configs(shape, space, prof, tried, sms)
        for c, r in ranked[:4]:
            m = tile_model(shape, c, sms)
            picks.append((c, f"predicted {r:.2f}x the incumbent's time: {m['tiles']} tiles in "
                             f"{m['waves']} waves ({m['wave_eff']:.0%} full), "
                             f"{m['acc_regs']:.0f} accumulators a thread"))
        if ranked:
            _, why = _weights(prof, config)
            found.append((2.0, f"[tile] next configuration by the tile model"
                               + (f" weighted by {'; '.join(why)}" if why else "")
                               + f": {json.dumps(ranked[0][0], sort_keys=True)}"))
    elif shape.kind == "rows":
        if config.get("BLOCK_C", 0) < shape.cols:
            c = next((c for c in space if c.get("BLOCK_C", 0) >= shape.cols), None)
            if c:
                found.append((1.0, f"[rows] BLOCK_C {config.get('BLOCK_C')} < {shape.cols} "
                                   "columns: one block per row loads each element once"))
                picks.append((c, "one block per row: each element loaded once"))
        else:
            c = _nearest(space, config, num_warps=min(16, config.get("num_warps", 4) * 2))
            if c:
                picks.append((c, "more warps for wide rows"))
    else:
        c = _nearest(space, config, BLOCK=config.get("BLOCK", 1024) * 2)
        if c:
            picks.append((c, "larger blocks: fewer programs"))
    if k is not None and k.n_spills and shape.kind != "gemm":
        for key in ("BLOCK_C", "BLOCK"):
            if key in config and config[key] > 16:
                c = _nearest(space, config, **{key: config[key] // 2})
                if c:
                    picks.insert(0, (c, f"halve {key} to stop spills"))
                    break

    found.sort(key=lambda pt: pt[0])
    recs = head + [f"{i}. {text}" for i, (_, text) in enumerate(found, 1)]
    seen = set()
    for c, why in picks:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            recs.append(f"config: {key}  # {why}")
    return tuple(recs)
