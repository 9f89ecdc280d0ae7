"""The synthesis loop: one region in, its best verified kernel (or its reference) out.

    functional passes   generate -> verify (static checks + sandboxed run) -> feedback,
                        until a candidate verifies or the functional rounds run out;
    optimization passes profile the incumbent (kforge.profiling: timing, roofline, compile
                        metadata and code facts, ncu or Proton counters where present) ->
                        provider.analyze (ranked recommendations citing the profile) ->
                        generate (refine) -> verify + time; a candidate replaces the incumbent
                        only when it is faster by more than the measured noise; the passes stop
                        when the analysis says so (a recommendation "stop: <evidence>"), when
                        rounds in a row gain nothing, or on rounds, wall time, tokens or dollars.

The loop knows providers only through kforge.providers.base.Provider. A provider that raises
ProviderError (no key, endpoint down, budget spent) is replaced by the builtin provider; what is
verified is kept. Everything is recorded as JSON lines in `<log_dir>/<hash>/log.jsonl`, and the
result goes to the kernel cache as soon as it is verified.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as _dt
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kforge.cache import CacheEntry, CacheKey, KernelCache
from kforge.providers.base import (Candidate, Feedback, GenerationRequest, Provider,
                                   ProviderError)
from kforge.verify import (OracleError, VerificationRecord, static_check, target_available,
                           target_name, verify_candidate)

FALLBACK_PROVIDER = "builtin"


@dataclass(frozen=True)
class SynthOptions:
    target: str = "cpu"
    precision: str = "strict"
    provider: str = "builtin"
    provider_options: dict = field(default_factory=dict)
    functional_rounds: int = 4          # generate/verify rounds to reach a correct kernel
    rounds: int = 2                     # optimization rounds after that
    time_budget_s: float | None = None  # wall time per region
    max_tokens: int | None = None       # provider budget, from provider.usage()
    max_dollars: float | None = None
    num_candidates: int = 1
    # a round's candidates verified side by side, each in its own sandbox process; an executor
    # raises it to the CPUs its task holds (kforge.workers.ray_cluster)
    parallel_verify: int = 1
    seeds: tuple = (1, 2, 3)
    dynamic_sizes: tuple = (8, 11)
    timeout_s: float | None = None      # per candidate run in the sandbox
    timing_reps: int = 3
    # optimization rounds in a row without a gain before the loop stops; None: 2 for the
    # builtin provider (a measured search over its configurations is cheap), 1 for the LLM
    # providers (each round costs tokens)
    patience: int | None = None
    # hardware counters in the incumbent's profile: auto (ncu where it is on the PATH, else
    # Proton), ncu, proton or none (kforge.profiling.collect); None: auto for the LLM providers,
    # none for the builtin (ncu costs seconds a kernel; its measured search is cheaper)
    profile_counters: str | None = None
    # only precision schemes that keep more than this many significant bits in their products'
    # operands (kforge.selection.scheme_bits; 0: any of the policy's): a floor the whole-model
    # check set for the region (the manifest's "finer_schemes")
    finer_than: int = 0


@dataclass(frozen=True)
class RegionResult:
    """What the loop settled on for one region."""
    hash: str
    name: str
    status: str                         # verified | candidate | reference
    provider: str
    candidate: Candidate | None = None
    record: VerificationRecord | None = None
    rounds: int = 0                     # generate calls made (by the original run, if cached)
    candidates_tried: int = 0
    time_ms: float | None = None
    from_cache: bool = False
    elapsed_s: float = 0.0
    message: str = ""                   # why there is no verified kernel, when there is none

    def to_json(self) -> dict:
        return {"hash": self.hash, "name": self.name, "status": self.status,
                "provider": self.provider, "rounds": self.rounds,
                "candidates_tried": self.candidates_tried, "time_ms": self.time_ms,
                "from_cache": self.from_cache, "elapsed_s": round(self.elapsed_s, 3),
                "message": self.message,
                "candidate": None if self.candidate is None else {
                    "id": self.candidate.id, "provider": self.candidate.provider,
                    "config": self.candidate.config, "notes": self.candidate.notes},
                "verification": None if self.record is None else self.record.to_json()}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class RegionLog:
    """Appends JSON lines to <dir>/log.jsonl: every request, candidate, record and decision."""

    def __init__(self, directory: Path | None):
        self.path = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / "log.jsonl"

    def write(self, event: str, **data) -> None:
        if self.path is None:
            return
        line = json.dumps({"time": _now(), "event": event, **data}, default=str)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def make_provider(name: str, options: dict | None = None) -> Provider:
    from kforge.providers.registry import get_provider
    return get_provider(name, **(options or {}))


class _LoopTools:
    """The compile/verify/time callbacks an LLM provider may call mid-conversation
    (kforge.agents.tools.CandidateTools): the same verifier the loop uses."""

    def __init__(self, loop: "_RegionLoop"):
        self.loop = loop

    def compile(self, source: str) -> dict:
        violations = static_check(source)
        if violations:
            return {"ok": False, "error": "; ".join(str(v) for v in violations)}
        if not self.loop.available:
            return {"ok": True, "note": f"no {self.loop.tname} device here: statically checked"}
        rec = self.loop.verify(Candidate("tool", "tool", source), measure=False, log=False)
        if rec.reason in ("compile_error", "syntax_error"):
            return {"ok": False, "error": rec.message}
        return {"ok": True, **self._metadata(source)}

    def _metadata(self, source: str) -> dict:
        """The compiled kernels' metadata (kforge.profiling), or why there is none."""
        from kforge.profiling import collect_profile
        prof = collect_profile(self.loop.spec, Candidate("tool", "tool", source), None,
                               self.loop.tname, self.loop.opt.precision, counters="none",
                               timeout_s=self.loop.opt.timeout_s or 300)
        if not prof.kernels:
            return {"metadata": None, "note": prof.sources["compile"].detail}
        return {"metadata": [{"name": k.name, "num_regs": k.n_regs, "spills": k.n_spills,
                              "shared": k.shared_bytes, "num_warps": k.num_warps,
                              "num_stages": k.num_stages, "wgmma": k.wgmma, "tma": k.tma,
                              "max_load_bytes": k.max_load_bytes} for k in prof.kernels]}

    def verify(self, source: str) -> dict:
        rec = self.loop.verify(Candidate("tool", "tool", source), measure=False, log=False)
        return {"status": rec.feedback_status, "message": rec.message or "verified",
                "max_abs_err": rec.max_abs_err}

    def time(self, source: str) -> dict:
        rec = self.loop.verify(Candidate("tool", "tool", source), measure=True, log=False)
        if not rec.verified:
            return {"status": rec.feedback_status, "message": rec.message}
        best = self.loop.best_record
        return {"time_ms": rec.time_ms, "noise": rec.time_noise,
                "incumbent_ms": best.time_ms if best else None,
                "floor_ms": self.loop.floor_ms}


class _RegionLoop:
    def __init__(self, spec, options: SynthOptions, provider: Provider | None,
                 log: RegionLog, region_mlir: str, reference_source: str,
                 reference: Callable | None, work_dir: Path | None,
                 progress: Callable[[str], None] | None):
        self.spec = spec
        self.opt = options
        self.tname = target_name(options.target)
        self.available = target_available(self.tname)
        self.log = log
        self.region_mlir = region_mlir
        self.reference_source = reference_source
        self.reference = reference
        self.work_dir = work_dir
        self.progress = progress or (lambda msg: None)
        self.started = time.monotonic()
        self.rounds = 0
        self.tried = 0
        self.tried_ids: list[str] = []      # every candidate verified for the region, in order
        self.tried_configs: list[dict] = []   # and their configurations
        self.profiles: dict[str, dict] = {}   # candidate id -> its profile (JSON)
        self.best: Candidate | None = None
        self.best_record: VerificationRecord | None = None
        self.floor_ms = self._floor_ms()
        self.provider_name = getattr(provider, "name", None) or options.provider \
            if provider is not None else options.provider
        self.provider = provider
        self.fallback_reason = ""
        if self.provider is None:
            try:
                self.provider = make_provider(options.provider, options.provider_options)
            except ProviderError as exc:
                self._fall_back(exc)
        self._bind_tools()

    def _floor_ms(self) -> float | None:
        """The region's roofline floor on this target (for the analysis and the feedback)."""
        target = self._target_object()
        floor = getattr(target, "floor_ms", None)
        if not callable(floor) or not (self.spec.flops or self.spec.min_bytes):
            return None
        return floor(self.spec.flops, self.spec.min_bytes, self.opt.precision)

    # -- provider management ----------------------------------------------------------------
    def _fall_back(self, exc: Exception) -> None:
        self.log.write("provider_error", provider=self.provider_name, error=str(exc))
        if self.provider_name == FALLBACK_PROVIDER:
            raise exc
        self.fallback_reason = f"{self.provider_name}: {exc}"
        self.progress(f"provider {self.provider_name} failed ({exc}); using {FALLBACK_PROVIDER}")
        self.provider_name = FALLBACK_PROVIDER
        self.provider = make_provider(FALLBACK_PROVIDER)
        self._bind_tools()

    def _bind_tools(self) -> None:
        if self.provider is not None and hasattr(self.provider, "tools"):
            self.provider.tools = _LoopTools(self)

    def _drain_provider_records(self) -> None:
        take = getattr(self.provider, "take_records", None)
        if callable(take):
            for rec in take() or ():
                self.log.write("provider_record", provider=self.provider_name, record=rec)

    # -- limits -------------------------------------------------------------------------------
    def out_of_budget(self) -> str:
        if self.opt.time_budget_s is not None and \
                time.monotonic() - self.started > self.opt.time_budget_s:
            return f"time budget of {self.opt.time_budget_s:g} s spent"
        usage = {}
        try:
            usage = self.provider.usage() or {}
        except Exception:  # noqa: BLE001 - usage is advisory
            pass
        tokens = usage.get("tokens", usage.get("total_tokens"))
        dollars = usage.get("dollars", usage.get("cost_usd"))
        if self.opt.max_tokens is not None and tokens is not None and \
                tokens >= self.opt.max_tokens:
            return f"token budget of {self.opt.max_tokens} spent"
        if self.opt.max_dollars is not None and dollars is not None and \
                dollars >= self.opt.max_dollars:
            return f"dollar budget of {self.opt.max_dollars:g} spent"
        return ""

    # -- steps --------------------------------------------------------------------------------
    def request(self, phase: str, round_: int, feedback: tuple) -> GenerationRequest:
        kwargs = dict(spec=self.spec, region_mlir=self.region_mlir,
                      reference_source=self.reference_source, precision=self.opt.precision,
                      target=self._target_object(), phase=phase, round=round_, best=self.best,
                      feedback=feedback, num_candidates=self.opt.num_candidates,
                      tried=tuple(self.tried_ids), finer_than=self.opt.finer_than)
        names = {f.name for f in dataclasses.fields(GenerationRequest)}
        if "tools" in names:
            kwargs["tools"] = _LoopTools(self)
        return GenerationRequest(**kwargs)

    def _target_object(self):
        try:
            from kforge.targets import get_target
            return get_target(self.tname)
        except Exception:  # noqa: BLE001 - a provider may work from the name alone
            return self.tname

    def generate(self, request: GenerationRequest) -> list[Candidate]:
        self.rounds += 1
        self.log.write("request", provider=self.provider_name, phase=request.phase,
                       round=request.round,
                       feedback=[dataclasses.asdict(f) for f in request.feedback],
                       best=request.best.id if request.best else None)
        while True:
            try:
                cands = list(self.provider.generate(request) or [])
                break
            except ProviderError as exc:
                self._drain_provider_records()
                self._fall_back(exc)
                request = dataclasses.replace(request, best=self.best)
        self._drain_provider_records()
        return cands[: max(1, self.opt.num_candidates)]

    def verify(self, cand: Candidate, measure: bool, log: bool = True) -> VerificationRecord:
        rec = verify_candidate(self.spec, cand, self.tname, self.opt.precision,
                               reference=self.reference, seeds=self.opt.seeds,
                               dynamic_sizes=self.opt.dynamic_sizes,
                               timeout_s=self.opt.timeout_s, measure=measure,
                               timing_reps=self.opt.timing_reps, work_dir=self.work_dir)
        if log:
            self.record(cand, rec)
        return rec

    def verify_round(self, cands: list[Candidate], measure: bool) -> list[VerificationRecord]:
        """A round's candidates, verified `parallel_verify` at a time (each in its own sandbox;
        timed runs still one at a time where $KFORGE_GPU_LOCK names the device's lock), and
        recorded in their order."""
        n = min(max(1, self.opt.parallel_verify), len(cands))
        if n == 1:
            return [self.verify(c, measure) for c in cands]
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            recs = list(pool.map(lambda c: self.verify(c, measure, log=False), cands))
        for cand, rec in zip(cands, recs):
            self.record(cand, rec)
        return recs

    def record(self, cand: Candidate, rec: VerificationRecord) -> None:
        """Count and log a candidate's verification (made here or handed in)."""
        self.tried += 1
        if cand.id not in self.tried_ids:
            self.tried_ids.append(cand.id)
            self.tried_configs.append(dict(cand.config))
        self.log.write("candidate", candidate={
            "id": cand.id, "provider": cand.provider, "config": cand.config,
            "notes": cand.notes, "source": cand.source}, verification=rec.to_json())

    def profile(self, cand: Candidate, rec: VerificationRecord) -> dict:
        """The candidate's profile (kforge.profiling), gathered once per candidate, written
        beside the region's log, as the JSON the analysts read; plus what the loop knows
        that a profile does not hold: the roofline floor of the region and the configurations
        already tried (so an analyst names untried ones)."""
        if cand.id not in self.profiles:
            from kforge.profiling import collect_profile
            started = time.monotonic()
            try:
                prof = collect_profile(self.spec, cand, rec, self.tname, self.opt.precision,
                                       counters=self.opt.profile_counters or os.environ.get(
                                           "KFORGE_PROFILE_COUNTERS") or (
                                           "none" if self.provider_name == "builtin"
                                           else "auto"),
                                       timeout_s=self.opt.timeout_s or 300).to_json()
            except Exception as exc:  # noqa: BLE001 - a profile is evidence, never a blocker
                prof = {"error": f"profiling failed: {type(exc).__name__}: {exc}",
                        "time_ms": rec.time_ms, "config": dict(cand.config)}
            self.profiles[cand.id] = prof
            self.log.write("profile", candidate=cand.id, profile=prof,
                           elapsed_s=round(time.monotonic() - started, 3))
            if self.log.path is not None and "schema" in prof:
                path = self.log.path.parent / "profiles" / f"{_safe(cand.id)}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(prof, indent=1) + "\n")
        return dict(self.profiles[cand.id], floor_ms=self.floor_ms,
                    time_ms=rec.time_ms, noise=rec.time_noise,
                    tried_configs=[dict(c) for c in self.tried_configs])

    @staticmethod
    def feedback(cand: Candidate, rec: VerificationRecord, recommendations=()) -> Feedback:
        return Feedback(candidate_id=cand.id, status=rec.feedback_status,
                        message=rec.message or "verified", time_ms=rec.time_ms,
                        recommendations=tuple(recommendations))

    # -- the two phases -----------------------------------------------------------------------
    def functional(self, feedback: tuple = ()) -> str:
        """Until a candidate verifies. Returns why it stopped without one ("" when verified).
        `feedback`: what the first request is told (the incumbent's verdict, for a repair)."""
        last = "the provider produced no candidate"
        empty = 0
        for r in range(self.opt.functional_rounds):
            reason = self.out_of_budget()
            if reason:
                return reason
            self.progress(f"functional round {r + 1}")
            request = self.request("functional", r, feedback)
            cands = self.generate(request)
            if not cands:
                self.log.write("empty_round", phase="functional", round=r)
                last = "the provider produced no candidate"
                empty += 1
                if empty >= 2:      # twice nothing to the same request: it has nothing to offer
                    unsupported = getattr(self.provider, "unsupported", None)
                    why = unsupported(request) if callable(unsupported) else None
                    return f"the provider produced no candidate ({empty} rounds)" + \
                        (f": {why}" if why else "")
                continue
            empty = 0
            fb = []
            # timed where the device is here; in the interpreter (cpu) only where a time
            # decides something: a pick among several candidates, or optimization rounds next
            # (an interpreter's time says nothing of the kernel's; timing it was 4 more runs)
            measure = self.available and (self.tname != "cpu" or self.opt.rounds > 0
                                          or len(cands) > 1)
            for cand, rec in zip(cands, self.verify_round(cands, measure=measure)):
                fb.append(self.feedback(cand, rec))
                if rec.status in ("verified", "candidate") and (
                        self.best_record is None or (rec.time_ms or 0) < (
                            self.best_record.time_ms or float("inf"))):
                    self.best, self.best_record = cand, rec
                if rec.status not in ("verified", "candidate"):
                    last = f"{rec.reason}: {rec.message.splitlines()[0][:300]}"
            if self.best is not None:
                return ""
            feedback = tuple(fb)
        return f"no candidate verified in {self.opt.functional_rounds} functional rounds " \
               f"(last: {last})"

    def optimize(self) -> None:
        if not self.available or self.best_record is None or self.best_record.time_ms is None:
            return
        patience = self.opt.patience or (2 if self.provider_name == "builtin" else 1)
        stale = 0
        for r in range(self.opt.rounds):
            reason = self.out_of_budget()
            if reason:
                self.log.write("stop", phase="optimize", reason=reason)
                return
            self.progress(f"optimization round {r + 1}")
            base = self.request("optimize", r, ())
            profile = self.profile(self.best, self.best_record)
            try:
                recs = tuple(self.provider.analyze(base, profile) or ())
            except ProviderError as exc:
                self._fall_back(exc)
                recs = ()
            self._drain_provider_records()
            self.log.write("analysis", round=r, profile=profile, recommendations=list(recs))
            stop = next((rec for rec in recs if isinstance(rec, str) and
                         rec.startswith(STOP_PREFIX)), None)
            if stop is not None:
                # the analyst's evidence that no further configuration pays (the builtin's:
                # its cost model against the incumbent's measurement); patience is the fallback
                self.log.write("stop", phase="optimize", reason=stop[len(STOP_PREFIX):].strip(),
                               source="analysis")
                return
            fb = (Feedback(self.best.id, "verified", "incumbent", self.best_record.time_ms,
                           self.floor_ms, recs),)
            cands = self.generate(dataclasses.replace(base, feedback=fb))
            if not cands:
                self.log.write("stop", phase="optimize", reason="no new candidates")
                return
            improved = False
            for cand, rec in zip(cands, self.verify_round(cands, measure=True)):
                if rec.verified and beats(rec, self.best_record):
                    self.log.write("improved", old_ms=self.best_record.time_ms,
                                   new_ms=rec.time_ms, old_noise=self.best_record.time_noise,
                                   new_noise=rec.time_noise, candidate=cand.id)
                    self.best, self.best_record, improved = cand, rec, True
            if improved:
                stale = 0
            else:
                stale += 1
                if stale >= patience:
                    self.log.write("stop", phase="optimize", reason=(
                        f"no candidate beat the incumbent by more than the noise "
                        f"({stale} round{'s' if stale > 1 else ''} in a row)"))
                    return


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:120]


MIN_GAIN = 0.02     # below 2 % a change is not worth a new kernel, whatever the noise says
STOP_PREFIX = "stop: "   # an analyst's recommendation that ends the optimization passes


def beats(new: VerificationRecord, old: VerificationRecord) -> bool:
    """Is `new` faster than `old` by more than the measured noise? Its typical slow sample
    (80th percentile) must beat the incumbent's typical fast one (20th percentile), and its
    median must be at least MIN_GAIN better."""
    if new.time_ms is None or old.time_ms is None:
        return False
    new_hi = new.time_hi_ms if new.time_hi_ms is not None else new.time_ms * (
        1 + (new.time_noise or 0.0) / 2)
    old_lo = old.time_lo_ms if old.time_lo_ms is not None else old.time_ms * (
        1 - (old.time_noise or 0.0) / 2)
    return new_hi < old_lo and new.time_ms < old.time_ms * (1 - MIN_GAIN)


def cache_key(spec, options: SynthOptions, provider_name: str | None = None) -> CacheKey:
    config = {k: v for k, v in sorted(options.provider_options.items())
              if not any(s in k.lower() for s in ("key", "token", "secret", "password"))
              and isinstance(v, (str, int, float, bool, type(None)))}
    if options.finer_than:      # a floor on the schemes: another kernel than the policy's own
        config["finer_than"] = options.finer_than
    return CacheKey(region=spec.hash, target=target_name(options.target),
                    precision=options.precision, provider=provider_name or options.provider,
                    provider_config=config)


def synthesize_region(spec, options: SynthOptions = SynthOptions(), *,
                      provider: Provider | None = None, cache: KernelCache | None = None,
                      log_dir: str | Path | None = None, region_mlir: str = "",
                      reference: Callable | None = None, work_dir: str | Path | None = None,
                      progress: Callable[[str], None] | None = None,
                      incumbent: Candidate | None = None,
                      incumbent_record: VerificationRecord | None = None,
                      on_verified: Callable[[RegionResult], None] | None = None
                      ) -> RegionResult:
    """Run the loop for one region (a kforge.spec.KernelSpec). Never raises for bad kernels;
    raises CacheMiss in cache-only mode, ProviderError if even the builtin provider fails.
    `incumbent`: a kernel to start from (e.g. `kforge tune` on a package's kernel); when it
    verifies, the functional passes are skipped and only optimization passes run;
    `incumbent_record`: its verification on this machine, when the caller has just made it
    (not repeated).
    `on_verified(result)`: called as soon as a kernel verifies, before optimization (a package
    records it then, so an interrupted compile does not redo the region)."""
    start = time.monotonic()
    tname = target_name(options.target)
    available = target_available(tname)
    log = RegionLog(Path(log_dir) / spec.hash if log_dir else None)
    key = cache_key(spec, options)
    log.write("start", region=spec.hash, name=spec.name, target=tname,
              precision=options.precision, provider=options.provider,
              cache_key=key.digest if cache else None)

    def finish(result: RegionResult) -> RegionResult:
        result = dataclasses.replace(result, elapsed_s=time.monotonic() - start)
        log.write("done", result=result.to_json())
        return result

    if cache is not None:
        entry = cache.get(key)
        if entry is not None:
            cand = Candidate(id=f"cache-{key.digest[:12]}", provider=entry.provider,
                             source=entry.source, config=entry.config, notes=entry.notes)
            rec = VerificationRecord.from_json(entry.verification) if entry.verification \
                else None
            if entry.status == "verified" or not available:
                log.write("cache_hit", key=key.digest, status=entry.status)
                return finish(RegionResult(spec.hash, spec.name, entry.status, entry.provider,
                                           cand, rec, entry.rounds, 0, entry.time_ms, True))
            # a candidate generated elsewhere, and its device is here now: verify it
            rec = verify_candidate(spec, cand, tname, options.precision, reference=reference,
                                   seeds=options.seeds, dynamic_sizes=options.dynamic_sizes,
                                   timeout_s=options.timeout_s, measure=True,
                                   timing_reps=options.timing_reps, work_dir=work_dir)
            log.write("cache_candidate_verified", key=key.digest, verification=rec.to_json())
            if rec.verified:
                cache.put(key, dataclasses.replace(entry, status="verified",
                                                   verification=rec.to_json(),
                                                   time_ms=rec.time_ms))
                return finish(RegionResult(spec.hash, spec.name, "verified", entry.provider,
                                           cand, rec, 0, 1, rec.time_ms, True))

    if reference is None and available:
        import torch

        from kforge.reference import reference_fn
        reference = reference_fn(spec, torch.float64)
    try:
        from kforge.reference import reference_source as _ref_src
        ref_text = _ref_src(spec)
    except Exception:  # noqa: BLE001 - prompts only
        ref_text = ""
    loop = _RegionLoop(spec, options, provider, log, region_mlir, ref_text, reference,
                       Path(work_dir) if work_dir else None, progress)
    why = ""
    try:
        first: tuple = ()
        if incumbent is not None and available:
            if incumbent_record is not None:
                rec = incumbent_record
                loop.record(incumbent, rec)
            else:
                rec = loop.verify(incumbent, measure=True)
            if rec.verified:
                loop.best, loop.best_record = incumbent, rec
            else:
                # a repair: the generator hears why the incumbent failed (a mismatch moves
                # the builtin to another product scheme, not another tile of the same one)
                first = (loop.feedback(incumbent, rec),)
        if loop.best is None:
            why = loop.functional(first)
    except OracleError as exc:
        log.write("oracle_error", error=str(exc))
        return finish(RegionResult(spec.hash, spec.name, "reference", loop.provider_name,
                                   rounds=loop.rounds, candidates_tried=loop.tried,
                                   message=f"no kernel can be verified: {exc}"))

    def store_key() -> CacheKey:
        # a result the fallback provider produced is not what the requested provider would
        if loop.fallback_reason:
            return cache_key(spec, dataclasses.replace(options, provider_options={}),
                             FALLBACK_PROVIDER)
        return key

    if loop.best is not None and loop.best_record.verified:
        if cache is not None:     # persist as soon as it is correct; tuning may improve it
            cache.put(store_key(), _entry(loop))
        if on_verified is not None:
            on_verified(RegionResult(spec.hash, spec.name, "verified", loop.best.provider,
                                     loop.best, loop.best_record, loop.rounds, loop.tried,
                                     loop.best_record.time_ms, False,
                                     time.monotonic() - start))
        loop.optimize()
    status = "reference"
    if loop.best is not None:
        status = "verified" if loop.best_record.verified else "candidate"
        if cache is not None:
            cache.put(store_key(), _entry(loop))
    message = why if status == "reference" else ""
    if loop.fallback_reason:
        message = (message + "; " if message else "") + f"fell back to builtin: " \
            f"{loop.fallback_reason}"
    return finish(RegionResult(
        spec.hash, spec.name, status,
        loop.best.provider if loop.best is not None else loop.provider_name,
        loop.best, loop.best_record, loop.rounds, loop.tried,
        loop.best_record.time_ms if loop.best_record else None, False, 0.0, message))


def _entry(loop: _RegionLoop) -> CacheEntry:
    rec = loop.best_record
    return CacheEntry(status="verified" if rec.verified else "candidate",
                      source=loop.best.source, provider=loop.best.provider,
                      config=dict(loop.best.config), verification=rec.to_json(),
                      time_ms=rec.time_ms, rounds=loop.rounds, notes=loop.best.notes)
