"""Gather the profile of one candidate on its target.

`collect_profile(spec, candidate, record, target, precision)`:
  timing and roofline  from the verification record (the verifier's timed runs) and the
                       target's peaks for the policy;
  compile metadata     on a device: the profiling worker launches the candidate once and dumps
                       its compiled kernels; for cuda without a GPU here: a cross-compile for
                       sm_90 (kforge.crosscompile); on the interpreter: absent;
  counters             Nsight Compute where `ncu` is on the PATH and the device is here, else
                       Proton (kernel times), else absent, with the reason.
`counters` ("auto" | "ncu" | "proton" | "none"; env KFORGE_PROFILE_COUNTERS overrides "auto")
picks the counter source. Nothing here raises for a kernel that cannot be profiled: the
source is recorded as absent with what went wrong.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kforge.profiling import ncu as _ncu
from kforge.profiling import proton as _proton
from kforge.profiling.schema import (KernelCounters, KernelFacts, Profile, Roofline, Source,
                                     Timing)
from kforge.profiling.triton_meta import facts_from_dump

WORKER = Path(__file__).with_name("_worker.py")
COUNTER_MODES = ("auto", "ncu", "proton", "none")


def work_at_size(spec, dynamic_size: int | None) -> tuple[float, float, str]:
    """(FLOPs, least bytes, note) of one launch at the timed size. The spec counts dynamic
    dimensions as 1: bytes are then recounted from the concrete shapes (also where the spec
    has no byte count), FLOPs scaled by the size (one dynamic dimension, as in a batch or
    sequence length)."""
    from kforge.verify.inputs import TORCH_DTYPES, signature_of
    flops, nbytes = float(spec.flops or 0), float(spec.min_bytes or 0)
    sig = signature_of(spec)
    dynamic = sig.is_dynamic and bool(dynamic_size)
    if nbytes and not dynamic:
        return flops, nbytes, ""
    size = dynamic_size or 1
    total = float(sum(math.prod(t.concrete(size)) * TORCH_DTYPES[t.dtype].itemsize
                      for t in sig.args + sig.results))
    if not dynamic:
        return flops, total, "bytes: each argument and result once (the spec has no count)"
    return flops * size, total, (f"dynamic dimensions at {size}: bytes from the concrete "
                                 "shapes, FLOPs scaled by the size")


def roofline_of(flops: float, nbytes: float, time_ms: float, peaks, precision: str,
                note: str = "", peaks_source: str = "") -> Roofline | None:
    if not time_ms or not (flops or nbytes):
        return None
    pf, pb = peaks.flops_for(precision), peaks.bytes_per_s
    sec = time_ms * 1e-3
    floor = peaks.floor_ms(flops, nbytes, precision)
    ridge = pf / pb
    intensity = flops / nbytes if nbytes else None
    bound = "memory" if (intensity is not None and intensity < ridge) or not flops else "compute"
    return Roofline(flops=flops, bytes=nbytes, peak_flops_per_s=pf, peak_bytes_per_s=pb,
                    achieved_flops_per_s=flops / sec, achieved_bytes_per_s=nbytes / sec,
                    flops_fraction=flops / sec / pf, bytes_fraction=nbytes / sec / pb,
                    intensity=intensity, ridge=ridge, bound=bound, floor_ms=floor,
                    floor_fraction=floor / time_ms, peaks_source=peaks_source, note=note)


def timing_of(record) -> Timing | None:
    if record is None or record.time_ms is None:
        return None
    return Timing(median_ms=record.time_ms, p20_ms=record.time_lo_ms, p80_ms=record.time_hi_ms,
                  noise=record.time_noise, method="verifier's timed runs (median, p20-p80)")


def _job(tmp: Path, candidate, spec, device: str, size: int, mode: str, reps: int) -> Path:
    from kforge.verify.inputs import signature_of
    import kforge.verify.inputs as inputs_mod
    src = tmp / "candidate.py"
    src.write_text(candidate.source)
    (tmp / "job.json").write_text(json.dumps({
        "source_path": str(src), "inputs_path": inputs_mod.__file__,
        "signature": signature_of(spec).to_json(), "device": device, "seed": 1,
        "size": size, "mode": mode, "reps": reps}))
    return tmp


def _run(cmd: list[str], tmp: Path, target_name: str, timeout_s: float):
    from kforge.verify.sandbox import worker_env
    env = worker_env(target_name)
    try:
        proc = subprocess.run(cmd, cwd=str(tmp), env=env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {timeout_s:.0f} s"
    if proc.returncode != 0:
        return None, (proc.stdout + proc.stderr).strip()[-800:] or f"exit {proc.returncode}"
    return proc, ""


def compile_facts_here(candidate, spec, device: str, size: int, target_name: str,
                       timeout_s: float = 300) -> tuple[list[KernelFacts], Source]:
    with tempfile.TemporaryDirectory(prefix="kforge-profile-") as d:
        tmp = _job(Path(d), candidate, spec, device, size, "meta", 1)
        _, err = _run([sys.executable, str(WORKER), str(tmp)], tmp, target_name, timeout_s)
        if err:
            return [], Source(False, f"the profiling worker failed: {err}")
        result = json.loads((tmp / "worker.json").read_text())
        facts = []
        for k in result.get("kernels", []):
            asm = {kind: (tmp / f).read_text() for kind, f in k.get("asm_files", {}).items()}
            facts.append(facts_from_dump(k, asm))
    if not facts:
        return [], Source(False, "the candidate's module holds no compiled Triton kernel")
    return facts, Source(True, f"Triton compile metadata and code of {len(facts)} kernel(s), "
                               f"compiled on this {device} device")


def compile_facts_cross(candidate, spec, target) -> tuple[list[KernelFacts], Source]:
    """A candidate on a machine without the target's device: compile it here for the target's
    architecture (Target.cross_compile: sm_90 with the local Triton, xpu with triton-xpu)."""
    from kforge.crosscompile import candidate_job
    try:
        [reports] = target.cross_compile([candidate_job(candidate.source, spec, name="profiled")])
    except Exception as exc:   # noqa: BLE001
        return [], Source(False, f"no {target.name} device here and the cross-compile failed: "
                                 f"{type(exc).__name__}: {str(exc)[:300]}")
    code = "ptx" if target.name == "cuda" else "spirv"
    facts = [KernelFacts(name=r.name, n_regs=r.registers, n_spills=r.spill_stores,
                         shared_bytes=r.shared_bytes, num_warps=r.num_warps,
                         num_stages=r.num_stages, wgmma=r.mma == "wgmma",
                         mma_sync=r.mma == "mma.sync", dpas=r.mma == "dpas", asm=(code,))
             for r in reports if r.ok]
    if not facts:
        why = next((r.error for r in reports if r.error), "no kernel compiled")
        return [], Source(False, f"cross-compile for {target.label}: {why[:300]}")
    how = ("with the local Triton (no GPU here; spills are ptxas spill-store bytes)"
           if target.name == "cuda" else
           f"({reports[0].compiler or 'its compiler'}; registers are allocated on the device)")
    return facts, Source(True, f"cross-compiled for {target.label} {how}")


def ncu_counters(candidate, spec, device: str, size: int, target_name: str,
                 timeout_s: float = 300, reps: int = 1) -> tuple[list[KernelCounters], Source]:
    ncu = _ncu.ncu_path()
    if ncu is None:
        return [], Source(False, "ncu (Nsight Compute) is not on the PATH")
    metrics = _ncu.metric_names()
    with tempfile.TemporaryDirectory(prefix="kforge-ncu-") as d:
        tmp = _job(Path(d), candidate, spec, device, size, "ncu", reps)
        log = tmp / "ncu.csv"
        for _ in range(3):      # drop metrics this ncu does not know, then again
            if log.exists():
                log.unlink()
            cmd = _ncu.command(ncu, metrics, str(log), [sys.executable, str(WORKER), str(tmp)])
            _, err = _run(cmd, tmp, target_name, timeout_s)
            text = log.read_text() if log.exists() else ""
            unknown = _ncu.unknown_metrics(text + err)
            if unknown and any(m in metrics for m in unknown):
                metrics = [m for m in metrics if m not in unknown]
                continue
            break
        if err:
            return [], Source(False, f"ncu failed: {err[-400:]}")
        counters = _ncu.parse_csv(text)
    if not counters:
        return [], Source(False, "ncu ran but profiled no kernel (see its log: "
                                 f"{text.strip()[-300:]!r})")
    return counters, Source(True, f"ncu --clock-control none, {len(metrics)} metrics, "
                                  f"{len(counters)} kernel launch(es)")


def proton_counters(candidate, spec, device: str, size: int, target_name: str,
                    timeout_s: float = 300, reps: int = 10) -> tuple[list[KernelCounters], Source]:
    ok, why = _proton.available()
    if not ok:
        return [], Source(False, why)
    with tempfile.TemporaryDirectory(prefix="kforge-proton-") as d:
        tmp = _job(Path(d), candidate, spec, device, size, "proton", reps)
        _, err = _run([sys.executable, str(WORKER), str(tmp)], tmp, target_name, timeout_s)
        path = tmp / "proton.hatchet"
        if err or not path.exists():
            return [], Source(False, f"Proton failed: {(err or 'no proton.hatchet')[-400:]}")
        counters = _proton.read_hatchet(path)
    return counters, Source(bool(counters), f"Proton (triton.profiler), {reps} launches: "
                                            "kernel times only")


def collect_profile(spec, candidate, record, target, precision: str, *,
                    counters: str = "auto", timeout_s: float = 300) -> Profile:
    """The profile of a verified candidate (see the module docstring)."""
    from kforge.targets import get_target
    from kforge.verify import target_available
    target = get_target(target)
    if counters not in COUNTER_MODES:
        from kforge.errors import UserError
        raise UserError(f"unknown counter source {counters!r}; one of {', '.join(COUNTER_MODES)}")
    if counters == "auto":
        counters = os.environ.get("KFORGE_PROFILE_COUNTERS", "auto")
    size = (record.dynamic_sizes[0] if record is not None and record.dynamic_sizes else 8)
    timing = timing_of(record)
    flops, nbytes, note = work_at_size(spec, size)
    roof = roofline_of(flops, nbytes, timing.median_ms, target.peaks, precision, note,
                       f"{target.name} target peaks") if timing else None
    here = target_available(target.name)
    sources: dict[str, Source] = {}
    kernels: list[KernelFacts] = []
    found: list[KernelCounters] = []
    if target.interpreter:
        sources["compile"] = Source(False, "the Triton interpreter compiles no device code")
        for name in ("ncu", "proton"):
            sources[name] = Source(False, f"target {target.name} runs the interpreter: no "
                                          "hardware counters")
    else:
        if here:
            kernels, sources["compile"] = compile_facts_here(candidate, spec, target.device,
                                                             size, target.name, timeout_s)
        elif target.can_cross_compile():
            kernels, sources["compile"] = compile_facts_cross(candidate, spec, target)
        else:
            sources["compile"] = Source(False, f"no {target.name} device here")
        if not here:
            sources["ncu"] = sources["proton"] = Source(False, f"no {target.name} device here")
        elif counters == "none":
            sources["ncu"] = sources["proton"] = Source(False, "counters switched off")
        else:
            if counters in ("auto", "ncu") and target.name == "cuda":
                found, sources["ncu"] = ncu_counters(candidate, spec, target.device, size,
                                                     target.name, timeout_s)
            else:
                sources["ncu"] = Source(False, "ncu profiles NVIDIA GPUs only" if
                                        target.name != "cuda" else "not asked for")
            if not found and counters in ("auto", "proton"):
                found, sources["proton"] = proton_counters(candidate, spec, target.device, size,
                                                           target.name, timeout_s)
            elif found:
                sources["proton"] = Source(False, "not needed: ncu's counters are present")
            else:
                sources["proton"] = Source(False, "not asked for")
    return Profile(candidate_id=candidate.id, target=target.name, precision=precision,
                   device=getattr(record, "device", "") or "", config=dict(candidate.config),
                   timing=timing, roofline=roof, kernels=tuple(kernels), counters=tuple(found),
                   sources=sources,
                   created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
