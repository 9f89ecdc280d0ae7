"""The profile of one candidate kernel: versioned JSON, one object per candidate.

A profile gathers what the profiler layer could measure or read about a kernel on one target:

  timing     median and spread of the verifier's timed runs
  roofline   achieved FLOP/s and bytes/s against the policy's peaks, the floor, the bound
  kernels    per Triton kernel the candidate launched: compile metadata (registers, spills,
             shared memory, warps, stages) and code facts read from its PTX / TTGIR (wgmma,
             mma.sync, TMA, DPAS, the widths of its global loads)
  counters   per kernel, Nsight Compute's small fixed metric set (or Proton's kernel times)
  sources    for each source (compile, ncu, proton): present, how it was read, or absent and why

Every part is optional; an absent source says why, so a reader (the analyst, a person) never
confuses "not measured" with "zero". The JSON carries `schema` and `version`; `load_profile`
rejects anything else with a clear error.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kforge.errors import UserError

SCHEMA = "kforge.profile"
SCHEMA_VERSION = 1
SOURCES = ("compile", "ncu", "proton")


@dataclass(frozen=True)
class Source:
    """Whether one source of profiling data is in the profile: `detail` says how it was read
    when present, why not when absent."""
    present: bool
    detail: str


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float | None = None
    p80_ms: float | None = None
    noise: float | None = None          # relative spread (p80 - p20) / median
    method: str = ""


@dataclass(frozen=True)
class Roofline:
    flops: float                        # of one launch, at the timed size
    bytes: float                        # least traffic: each input and output once
    peak_flops_per_s: float             # the precision policy's peak (targets' Peaks)
    peak_bytes_per_s: float
    achieved_flops_per_s: float
    achieved_bytes_per_s: float
    flops_fraction: float               # achieved / peak
    bytes_fraction: float
    intensity: float | None             # FLOP per byte (None without bytes)
    ridge: float                        # peak FLOP/s over peak bytes/s
    bound: str                          # "compute" | "memory"
    floor_ms: float
    floor_fraction: float               # floor / measured time: 1.0 is the roofline
    peaks_source: str = ""
    note: str = ""


@dataclass(frozen=True)
class KernelFacts:
    """One compiled Triton kernel: its metadata and what its code contains."""
    name: str
    n_regs: int | None = None
    n_spills: int | None = None         # spilled registers (Triton) or spill-store bytes (ptxas)
    shared_bytes: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_ctas: int | None = None
    wgmma: bool = False                 # Hopper warp-group matrix instructions
    mma_sync: bool = False              # Ampere-style mma.sync
    tma: bool = False                   # bulk tensor copies (cp.async.bulk.tensor / TMA descriptors)
    dpas: bool = False                  # Intel XMX matrix instructions
    load_widths: dict = field(default_factory=dict)   # bytes per global load -> count
    max_load_bytes: int | None = None
    asm: tuple = ()                     # the code kinds the facts were read from (ptx, ttgir...)


@dataclass(frozen=True)
class KernelCounters:
    """Nsight Compute's metrics for one kernel (percentages as 0-100), or Proton's time."""
    name: str
    time_ms: float | None = None
    dram_pct: float | None = None            # DRAM throughput, % of peak
    l2_pct: float | None = None              # L2 throughput, % of peak
    tensor_pct: float | None = None          # tensor pipe active, % of peak
    sm_pct: float | None = None              # SM throughput, % of peak
    occupancy_pct: float | None = None       # achieved occupancy (warps active / max)
    l2_hit_pct: float | None = None
    dram_bytes: float | None = None
    top_stalls: tuple = ()                   # ((reason, cycles per issued instruction), ...)
    raw: dict = field(default_factory=dict)  # every metric read, by ncu's name


@dataclass(frozen=True)
class Profile:
    candidate_id: str
    target: str
    precision: str
    device: str = ""
    config: dict = field(default_factory=dict)
    timing: Timing | None = None
    roofline: Roofline | None = None
    kernels: tuple[KernelFacts, ...] = ()
    counters: tuple[KernelCounters, ...] = ()
    sources: dict = field(default_factory=dict)     # name -> Source
    created: str = ""

    # -- views the analysts use ------------------------------------------------------------
    @property
    def time_ms(self) -> float | None:
        return self.timing.median_ms if self.timing else None

    def main_kernel(self) -> KernelFacts | None:
        """The kernel that matters most: the matrix kernel, else the one with most registers."""
        if not self.kernels:
            return None
        return max(self.kernels, key=lambda k: (k.wgmma or k.mma_sync or k.dpas,
                                                k.n_regs or 0, k.shared_bytes or 0))

    def main_counters(self) -> KernelCounters | None:
        """The counters of the kernel that took longest (the first when none has a time)."""
        if not self.counters:
            return None
        return max(self.counters, key=lambda c: c.time_ms or 0.0)

    def to_json(self) -> dict:
        d = asdict(self)
        d["sources"] = {k: asdict(v) for k, v in self.sources.items()}
        for k in d["kernels"]:
            k["load_widths"] = {str(w): n for w, n in k["load_widths"].items()}
            k["asm"] = list(k["asm"])
        for c in d["counters"]:
            c["top_stalls"] = [list(s) for s in c["top_stalls"]]
        return {"schema": SCHEMA, "version": SCHEMA_VERSION, **_finite(d)}

    @staticmethod
    def from_json(d: dict) -> "Profile":
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise UserError(f"not a KForge profile (schema {d.get('schema') if isinstance(d, dict) else type(d).__name__!r}, "
                            f"expected {SCHEMA!r})")
        if d.get("version") != SCHEMA_VERSION:
            raise UserError(f"profile schema version {d.get('version')} is not supported "
                            f"(this KForge reads version {SCHEMA_VERSION}); profile the "
                            "kernel again with `kforge profile`")
        try:
            kernels = tuple(KernelFacts(**dict(k, load_widths={int(w): n for w, n in
                                                               (k.get("load_widths") or {}).items()},
                                               asm=tuple(k.get("asm") or ())))
                            for k in d.get("kernels") or ())
            counters = tuple(KernelCounters(**dict(c, top_stalls=tuple(
                tuple(s) for s in c.get("top_stalls") or ())))
                for c in d.get("counters") or ())
            return Profile(
                candidate_id=d["candidate_id"], target=d["target"], precision=d["precision"],
                device=d.get("device", ""), config=dict(d.get("config") or {}),
                timing=Timing(**d["timing"]) if d.get("timing") else None,
                roofline=Roofline(**d["roofline"]) if d.get("roofline") else None,
                kernels=kernels, counters=counters,
                sources={k: Source(**v) for k, v in (d.get("sources") or {}).items()},
                created=d.get("created", ""))
        except (KeyError, TypeError) as exc:
            raise UserError(f"malformed KForge profile: {exc}") from None


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def load_profile(path: str | Path) -> Profile:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"no profile at {path}") from None
    except ValueError as exc:
        raise UserError(f"{path} is not JSON: {exc}") from None
    return Profile.from_json(data)


def save_profile(profile: Profile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    return path
