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
space by a cost model of the H200 (`tile_model`: wgmma tile efficiency, waves over the SMs,
product counts per scheme, the bytes each scheme reads, split-K's partial sums, register
spills), with the profile's evidence (a spilling incumbent lowers the register budget).
`stop_evidence` is the stop rule: a `stop: ...` line when the incumbent runs near the model's
floor, when no untried configuration is predicted to gain MIN_GAIN even at the model's
measured error (MODEL_ERROR), or, without that margin, when the model explains the incumbent
(measured within EXPLAINED of its predicted time, and a tile for every SM or memory-bound);
the synthesis loop ends its optimization passes there.
Other kernel kinds keep the rules below.
"""
from __future__ import annotations

import json
import math

from kforge.profiling.schema import KernelFacts, Profile, Source, Timing
from kforge.synth import MIN_GAIN       # the loop's: a smaller gain is no new kernel
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


# --- the GEMM cost model (Hopper wgmma, the H200) -----------------------------------------
#
# A configuration's time is predicted from the tile, the product scheme and the device's peaks:
#   compute  the busiest SM's tiles (wave quantization over the SMs) x a tile's products, at
#            the scheme's tensor-core rate (bf16/fp16, or tf32 at about half of it) times the
#            tile's efficiency: wgmma's instruction is m64nNk16, widest (most efficient) at
#            N = 256; a 64-row tile is one warpgroup and reuses B half as much; BLOCK_K 32 pays
#            a k-step's barriers twice as often;
#   memory   the bytes the kernel reads as it reads them (a weight prepared once in the
#            scheme's form; an fp32 activation cast in the kernel, or split by a pass), its
#            output, split-K's partial sums, at the peak bandwidth or at what the active SMs
#            keep in flight (Little's law: pipeline stages x tile bytes / DRAM latency);
#   extra    the scheme's split pass and split-K's epilogue: their bytes and a launch each;
#   spills   a thread's accumulators plus (fp32-operand schemes) its split operand values over
#            what 255 registers leave after addressing and loop state: local-memory traffic.
# time = max(compute, memory) + OVERLAP x min(compute, memory) + extra, x SPILL when it spills.
#
# The five efficiency constants were fitted by eye on the H200 measurements of
# benchmarks/results/2026-12-01-profile/tuner-call3.json (5 GEMMs x bf16, strict: 170
# configurations), which are therefore its training data; benchmarks/profile/specs_holdout/
# holds GEMMs it was not fitted on. MODEL_ERROR is its error there (test_tuner_model.py).
_N_EFF = {256: 1.0, 128: 0.70, 64: 0.43}    # by BLOCK_N (the wgmma instruction's N)
_M64_EFF = 0.81                             # BLOCK_M 64 against 128
# BLOCK_K 32 against 64; not for the schemes that split fp32 operands in registers, whose work
# is per element: on the 26 recorded spaces their 128x128x64 (2 stages) measured 0.93-1.35x
# the time of 128x128x32 (3 stages), never the 1/0.84 gain
_K32_EFF = 0.84
# the persistent TMA kernel (a config with "TMA"; kernels.tma_configs) against the pointer
# kernel at the same tile: H200 2026-12-04 (benchmarks/results/2026-12-04b-h200-builtin-tma),
# 1.03-1.26x under fp16x1 and 1.17-1.20x with bf16 operands on compute-bound shapes; its bf16
# operands come from a cast pass (A read in fp32, written in bf16), not cast in the kernel
_TMA_EFF = 1.15
_OVERLAP = 0.3                              # how much of the shorter side does not hide
_SPILL = 2.5                                # a spilling kernel's slowdown (measured 2-4x)
_VALUES_PER_THREAD = 200                    # of 255 registers, the rest: addresses and state
# the fp32-operand schemes' split arithmetic, against their products at the tensor-core rate
_SCHEME_EFF = {"3xtf32": 0.9, "tf32x3": 0.7, "bf16x6": 0.6}
# tf32-rate products (tf32, 3xtf32, tf32x3) with a B whose contiguous dimension is N (bmm's
# second operand, a weight used as x @ W): wgmma reads 32-bit operands from shared memory only
# K-major (its transpose bits are for 16-bit types), so B is transposed each k-step. On the two
# recorded batched spaces (bmm_scale, bmm16_sigmoid: strict) their non-spilling tiles measured a
# median 2.9-3.5x the model's time against 1.2-1.4x for K-major B (all 24 other strict spaces)
_TF32_MN_EFF = 0.4
_DRAM_LATENCY_S = 1.0e-6                    # a loaded H200's DRAM round trip (order of)
_LAUNCH_S = 4e-6                            # one more kernel launch
# the stop rule's safety margin: how much too pessimistic the model's ratio of a candidate's
# time to the incumbent's may be. On the training data, for incumbents within 10 % of their
# space's best (where a stop decides something), the largest such error is 6.6 % (90th
# percentile 5.2 %, 55 pairs; test_tuner_model.py recomputes it); from incumbents further off,
# it reaches 21 % (split-K 8 against 4 on 256x1024x32768), but there the model's best pick is
# a clear gain and the rule does not fire.
MODEL_ERROR = 0.08
NEAR_FLOOR = 0.88                           # floor / time at which tuning stops paying
# The model explains a kernel when it measures at most this many times its predicted time: on
# the recorded H200 data (2026-12-01 call 3 and the 2026-12-02 held-out set, 26 spaces), the
# measured best of every space ran at 0.97x-1.96x its prediction; kernels the model does not
# understand ran up to 4.8x (an fp16 split pass on 64x4096x4096).
EXPLAINED = 2.0

_PRODUCTS = {None: 1, "fp16x1": 1, "fp16x3": 3, "3xtf32": 3, "tf32x3": 3, "bf16x6": 6,
             "tf32": 1, "ieee": 1}
_TF32_RATE = ("tf32", "3xtf32", "tf32x3")
_FP32_SPLIT = ("3xtf32", "tf32x3", "bf16x6")     # fp32 operands split in registers per k-step
_FP16_PLANES = {"fp16x1": 1, "fp16x3": 2}        # fp16 planes a split pass writes
# bytes an element of a prepared weight takes in each scheme (None: bf16)
_WEIGHT_BYTES = {None: 2, "fp16x1": 2, "fp16x3": 4, "3xtf32": 8, "tf32x3": 4, "bf16x6": 4,
                 "tf32": 4, "ieee": 4}
_DEFAULT_PEAKS = CudaTarget.archs["sm_90"].peaks


def _gemm_dims(shape):
    c = shape.contraction
    return (c.extent(c.m) or 1, c.extent(c.n) or 1, c.extent(c.k) or 1, c.extent(c.batch) or 1)


def _acc_regs(c: dict) -> float:
    """fp32 accumulator values a thread holds. wgmma's 64-row granule: warps beyond one
    warpgroup per 64 rows replicate rows rather than split them (fp16x3 keeps a second partial
    product)."""
    bm, warps = c.get("BLOCK_M", 128), c.get("num_warps", 4)
    threads = 32 * min(warps, 4 * max(1, bm // 64))
    per = bm * c.get("BLOCK_N", 128) / threads
    if c.get("input_precision") != "fp16x3":
        return per
    # the partial product spans one of the tile's N_PARTS column parts (TMA kernel)
    return per * (1 + 1 / c.get("N_PARTS", 1))


def _values_per_thread(c: dict) -> float:
    """Accumulators plus, for schemes that split fp32 operands in the loop, their hi/lo values."""
    v = _acc_regs(c)
    if c.get("input_precision") in _FP32_SPLIT:
        v += 2 * (c.get("BLOCK_M", 128) + c.get("BLOCK_N", 128)) * c.get("BLOCK_K", 32) \
            / (32 * c.get("num_warps", 4))
    return v


def _tile_eff(bm: int, bn: int, scheme) -> float:
    """The tile's tensor-core efficiency. The table holds for one 16-bit product a k-step
    (bf16 operands, fp16x1); fp16x3's three products a k-step amortize the tile's operand
    traffic, which halves its BLOCK_N loss (square root; its 64-row loss is bf16's);
    tf32-rate and split-in-registers schemes run at half the rate or less and measure within
    +-25% of flat: no tile term."""
    if scheme in _TF32_RATE or scheme in _FP32_SPLIT or scheme == "ieee":
        return 1.0
    n_eff = _N_EFF.get(min(bn, 256), 0.43 * bn / 64)
    return (math.sqrt(n_eff) if scheme == "fp16x3" else n_eff) * \
        (_M64_EFF if bm < 128 else 1.0)


def compute_units(target) -> int:
    units = getattr(target, "compute_units", None)
    return units if isinstance(units, int) and units > 0 else SMS


def shared_limit(target) -> int:
    """Shared memory (SLM on Intel) a block may use on the target's architecture."""
    info = getattr(target, "arch_info", None)
    return getattr(info, "shared_bytes", None) or _SHARED_LIMIT


def _b_mn_major(spec, shape) -> bool:
    """Whether B's contiguous dimension is an output column (N), as the region holds it."""
    if spec is None:
        return False
    from kforge.providers.builtin.schemes import b_n_major
    return b_n_major(spec, shape.contraction)


def _operands(spec, shape) -> tuple[int, int, bool]:
    """(bytes of an A element, of a B element, is B a weight) as the region holds them."""
    if spec is None:
        return 4, 4, True
    from kforge.providers.builtin.analysis import weight_source
    con = shape.contraction
    size = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2}
    a, b = con.op.operands[con.a], con.op.operands[con.b]
    return (size.get(spec.tensor(a).dtype, 4), size.get(spec.tensor(b).dtype, 4),
            weight_source(spec, b) is not None)


def _rate(peaks, scheme) -> float:
    """The tensor-core (or fp32) FLOP rate a scheme's products run at."""
    return peaks.tf32 if scheme in _TF32_RATE else peaks.fp32 if scheme == "ieee" \
        else peaks.bf16


def tile_model(shape, c: dict, sms: int = SMS, spec=None, peaks=None) -> dict:
    """The predicted time of configuration c (`time_ms`) and its parts: tiles, waves (the
    busiest SM's tiles) and how full the last is, compute / memory / extra ms, DRAM bytes,
    accumulator and register values a thread, whether it spills."""
    peaks = peaks or _DEFAULT_PEAKS
    M, N, K, B = _gemm_dims(shape)
    bm, bn, bk = c.get("BLOCK_M", 128), c.get("BLOCK_N", 128), c.get("BLOCK_K", 32)
    sk, stages = c.get("SPLIT_K", 1), c.get("num_stages", 3)
    scheme = c.get("input_precision")
    tiles = math.ceil(M / bm) * math.ceil(N / bn) * B * sk
    per_sm = math.ceil(tiles / sms)
    k_tile = math.ceil(K / sk / bk) * bk
    rate = _rate(peaks, scheme)
    eff = _tile_eff(bm, bn, scheme) * (_K32_EFF if bk < 64 and scheme not in _FP32_SPLIT
                                       else 1.0) \
        * _SCHEME_EFF.get(scheme, 1.0) \
        * (_TF32_MN_EFF if scheme in _TF32_RATE and _b_mn_major(spec, shape) else 1.0) \
        * (_TMA_EFF if c.get("TMA") else 1.0)
    # bytes, as the kernel reads them
    a_e, b_e, b_weight = _operands(spec, shape)
    compute = per_sm * 2 * bm * bn * k_tile * _PRODUCTS.get(scheme, 1) / (rate / sms * eff)
    planes = _FP16_PLANES.get(scheme)
    extra = 0.0
    # A split by a pass (and a B that is no weight), or cast to bf16 by one for the TMA kernel
    a_k = 2 * planes if planes else 2 if c.get("TMA") and a_e > 2 else a_e
    if a_k != a_e or planes:
        extra += _LAUNCH_S + B * M * K * (a_e + a_k) / peaks.bytes_per_s
    if planes and not b_weight:
        extra += B * N * K * (b_e + a_k) / peaks.bytes_per_s
    b_k = _WEIGHT_BYTES.get(scheme, 4) if b_weight else (2 * planes if planes else b_e)
    traffic = B * (M * K * a_k + N * K * b_k) + B * M * N * 4 * (2 * sk - 1)
    if sk > 1:                       # the epilogue re-reads the partial sums
        extra += _LAUNCH_S + B * M * N * 4 * sk / peaks.bytes_per_s
    in_flight = max(1, stages - 1) * (bm * a_k + bn * b_k) * bk   # bytes a CTA has requested
    bw = min(peaks.bytes_per_s, min(tiles, sms) * in_flight / _DRAM_LATENCY_S)
    memory = traffic / bw
    values = _values_per_thread(c)
    t = max(compute, memory) + _OVERLAP * min(compute, memory) + extra
    spills = values > _VALUES_PER_THREAD
    return {"tiles": tiles, "waves": per_sm, "wave_eff": tiles / (per_sm * sms),
            "compute_ms": compute * 1e3, "memory_ms": memory * 1e3, "extra_ms": extra * 1e3,
            "traffic": traffic, "acc_regs": _acc_regs(c), "values": values, "spills": spills,
            "time_ms": (t * _SPILL if spills else t) * 1e3}


def model_floor_ms(shape, space: list[dict], spec=None, peaks=None) -> float:
    """The fastest any configuration of the space could be: its products at the scheme's peak
    on every SM and its bytes (as that scheme reads them) at the peak bandwidth."""
    peaks = peaks or _DEFAULT_PEAKS
    M, N, K, B = _gemm_dims(shape)
    best = math.inf
    for c in space:
        scheme = c.get("input_precision")
        rate = _rate(peaks, scheme)
        m = tile_model(shape, dict(c, SPLIT_K=1), spec=spec, peaks=peaks)
        best = min(best, max(2 * M * N * K * B * _PRODUCTS.get(scheme, 1) / rate,
                             m["traffic"] / peaks.bytes_per_s) * 1e3)
    return best


def _weights(profile: Profile, config: dict) -> tuple[dict, list[str]]:
    """What the profile's evidence changes in the model (and the evidence): a spilling
    incumbent lowers the register budget to below its own count."""
    w = {"values": float(_VALUES_PER_THREAD)}
    why: list[str] = []
    k = profile.main_kernel()
    if k is not None and k.n_spills:
        w["values"] = min(w["values"], 0.75 * _values_per_thread(config))
        why.append(f"{k.n_spills} spilled ({k.n_regs} registers a thread)")
    elif k is not None and k.n_regs and k.n_regs >= 240:
        w["values"] = min(w["values"], _values_per_thread(config))
        why.append(f"{k.n_regs} registers a thread, at the limit")
    cnt = profile.main_counters()
    roof = profile.roofline
    if cnt is not None and cnt.dram_pct is not None and cnt.tensor_pct is not None:
        why.append(f"DRAM {cnt.dram_pct:.0f}% vs tensor pipe {cnt.tensor_pct:.0f}%")
    elif roof is not None:
        why.append(f"{roof.bound}-bound by the roofline ({roof.intensity or 0:.0f} FLOP/B, "
                   f"ridge {roof.ridge:.0f})")
    return w, why


def _predicted(shape, c: dict, weights: dict, sms: int = SMS, spec=None, peaks=None) -> float:
    """Predicted ms of config c, with the register budget the profile's evidence allows."""
    m = tile_model(shape, c, sms, spec, peaks)
    t = m["time_ms"]
    if not m["spills"] and m["values"] > weights["values"]:
        t *= _SPILL
    return t


def rank_configs(shape, space: list[dict], profile: dict | Profile,
                 tried: list[dict] = (), sms: int = SMS, spec=None,
                 peaks=None) -> list[tuple[dict, float]]:
    """The untried GEMM configurations of `space`, best predicted first, with their predicted
    time relative to the incumbent's (the profile's config)."""
    profile = as_profile(profile)
    base = profile.config or (space[0] if space else {})
    w, _ = _weights(profile, base)
    seen = {json.dumps(c, sort_keys=True) for c in tried}
    seen.add(json.dumps(base, sort_keys=True))
    ref = _predicted(shape, base, w, sms, spec, peaks)
    ranked = [(c, _predicted(shape, c, w, sms, spec, peaks) / ref) for c in space
              if json.dumps(c, sort_keys=True) not in seen]
    ranked.sort(key=lambda cr: cr[1])
    return ranked


def stop_evidence(shape, space: list[dict], profile: dict | Profile, tried: list[dict] = (),
                  sms: int = SMS, spec=None, peaks=None, min_gain: float = MIN_GAIN) -> str:
    """Why measuring another configuration will not pay ("" when it may): the incumbent runs
    within NEAR_FLOOR of the model's floor, or the best untried configuration, even at the
    model's error in its favour, is not predicted to beat the incumbent by min_gain."""
    prof = as_profile(profile)
    t = prof.time_ms
    if not t:
        return ""
    floor = model_floor_ms(shape, space, spec, peaks)
    if floor / t >= NEAR_FLOOR:
        return (f"the incumbent runs at {floor / t:.0%} of the floor of its configuration "
                f"space ({floor:.4g} ms of {t:.4g} ms; products at peak, operand bytes as "
                "the schemes read them)")
    ranked = rank_configs(shape, space, prof, tried, sms, spec, peaks)
    if not ranked:
        return "every configuration of the space has been measured"
    c, r = ranked[0]
    if r * (1 - MODEL_ERROR) >= 1 - min_gain:
        return (f"the best untried configuration is predicted at {r:.2f}x the incumbent's "
                f"{t:.4g} ms; at the model's error ({MODEL_ERROR:.0%}) it gains under "
                f"{min_gain:.0%}: {json.dumps(c, sort_keys=True)}")
    # no untried configuration is predicted to gain, and the model explains the incumbent: measured
    # within EXPLAINED of its prediction, and either every SM has a tile or the time is the
    # memory side's (with idle SMs the model's compute waves erred by 23 %: split-K 4 against 8
    # on 256x1024x32768, compute-bound; its memory side has no wave term)
    base = prof.config or {}
    if base and r >= 1 + min_gain:
        m = tile_model(shape, base, sms, spec, peaks)
        full = m["tiles"] >= sms
        if t <= EXPLAINED * m["time_ms"] and (full or m["memory_ms"] >= m["compute_ms"]):
            where = (f"{m['tiles']} tiles for {sms} SMs" if full else
                     f"{m['tiles']} tiles for {sms} SMs, memory-bound: {m['memory_ms']:.3g} ms "
                     f"of bytes against {m['compute_ms']:.3g} ms of products")
            return (f"no untried configuration is predicted to gain {min_gain:.0%} (the best "
                    f"at {r:.2f}x the incumbent's time) and the model explains the incumbent: "
                    f"{t:.4g} ms measured, {m['time_ms']:.4g} ms predicted (within "
                    f"{EXPLAINED:g}x); {where}")
    return ""


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
    stop = ""
    picks: list[tuple[dict, str]] = []
    head: list[str] = []

    if time_ms and floor:
        frac = floor / time_ms
        head.append(f"runs at {frac:.0%} of the roofline floor ({floor:.4g} ms of "
                    f"{time_ms:.4g} ms)")
        # a GEMM's floor is the cost model's (its operands as the schemes read them: a
        # prepared bf16 weight moves half the bytes of the region's fp32 one)
        if frac >= 0.85 and shape.kind != "gemm":
            return tuple(head + ["1. within 15% of the floor: further tuning is unlikely to "
                                 f"pay [evidence: floor {floor:.4g} ms, measured "
                                 f"{time_ms:.4g} ms]",
                                 f"stop: the incumbent runs at {frac:.0%} of the roofline "
                                 f"floor ({floor:.4g} ms of {time_ms:.4g} ms)"])
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
        peaks = getattr(target, "peaks", None)
        t = tile_model(shape, config, sms, spec, peaks)
        if t["tiles"] < sms and config.get("SPLIT_K", 1) == 1:
            found.append((0.8, f"[occupancy] only {t['tiles']} output tiles for {sms} SMs "
                               f"(M={M}, N={N}, {config.get('BLOCK_M')}x{config.get('BLOCK_N')}"
                               " tiles): split K or smaller tiles"))
        elif t["wave_eff"] < 0.75:
            found.append((1.8, f"[waves] {t['tiles']} tiles make {t['waves']} waves on {sms} "
                               f"SMs, the last {t['wave_eff']:.0%} full: a tile size that "
                               "divides the work into full waves"))
        ranked = rank_configs(shape, space, prof, tried, sms, spec, peaks)
        for c, r in ranked[:4]:
            m = tile_model(shape, c, sms, spec, peaks)
            picks.append((c, f"predicted {r:.2f}x the incumbent's time: {m['tiles']} tiles, "
                             f"{m['waves']} a busiest SM ({m['wave_eff']:.0%} of the SMs' "
                             f"last wave), compute {m['compute_ms']:.3g} ms, memory "
                             f"{m['memory_ms']:.3g} ms, {m['acc_regs']:.0f} accumulators a "
                             "thread"))
        # the stop rule: measured evidence against the model (the H200's: cuda only)
        if prof.target == "cuda" or getattr(target, "name", "") == "cuda":
            stop = stop_evidence(shape, space, prof, tried, sms, spec, peaks)
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

    if stop:
        found.append((-1.0, f"[stop] {stop}"))
    found.sort(key=lambda pt: pt[0])
    recs = head + [f"{i}. {text}" for i, (_, text) in enumerate(found, 1)]
    seen = set()
    for c, why in picks:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            recs.append(f"config: {key}  # {why}")
    if stop:        # the loop stops here (kforge.synth: a recommendation "stop: ...")
        recs.append(f"stop: {stop}")
    return tuple(recs)
