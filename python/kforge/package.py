"""Compiled packages: what `kforge compile` writes and `kforge run` / `kforge.load` read.

    PKG/
      package.json          what was compiled, for which target and policy; model and weights
      model.py              a copy of the model source (for `kforge run --check` and kforge.load)
      model.mlir            the imported linalg IR (locations name their FX nodes);
                            model.safetensors: its weights; model.fx.json: the aten graph
      model.linked.mlir     regions replaced by custom calls of verified kernels (kforge-opt)
      regions/              <hash>.json + <hash>.mlir per region, host_plan.json, outlined.mlir,
                            <hash>/log.jsonl (every candidate and its verification),
                            <hash>.aten.json + aten.json (the regions' aten programs,
                            kforge.aten_regions)
      kernels/<hash>/kernel.py   the chosen kernel of each region
      manifest.json         per region: kernel, launch config, verification record, time
      report.json, report.md

Stages write their files as soon as they are done: a region's kernel and manifest entry are on
disk the moment it is verified, so a killed compile resumes without redoing verified regions.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from kforge.cache import KernelCache, atomic_write_text
from kforge.errors import UserError
from kforge.selection import (above_floor, raised_regions, region_precision, scheme_floors,
                              selection_feeders)

PACKAGE_SCHEMA = "kforge.package"
MANIFEST_SCHEMA = "kforge.manifest"
VERSION = 1
MANIFEST = "manifest.json"
META = "package.json"
PLAN = "regions/host_plan.json"
LINKED_PLAN = "linked_plan.json"     # the host plan of model.linked.mlir: what the runtime runs


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# Manifest
# ---------------------------------------------------------------------------------------------
def read_manifest(pkg: Path) -> dict:
    path = Path(pkg) / MANIFEST
    if not path.exists():
        return {"schema": MANIFEST_SCHEMA, "version": VERSION, "kernels": {}}
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); delete it and compile again") from None
    if doc.get("schema") != MANIFEST_SCHEMA or int(doc.get("version", 0)) > VERSION:
        raise UserError(f"{path}: not a kforge manifest of version {VERSION}")
    doc.setdefault("kernels", {})
    return doc


def write_manifest(pkg: Path, manifest: dict) -> None:
    atomic_write_text(Path(pkg) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))


def manifest_entry(pkg: Path, result, options) -> dict:
    """Write kernels/<hash>/kernel.py and return the manifest entry for a synthesis result."""
    entry = entry_fields(result, options)
    atomic_write_text(Path(pkg) / entry["source"], result.candidate.source)
    return entry


def launch_of(config: dict | None) -> dict:
    """A manifest entry's `launch`: the candidate's configuration, and its launch keys."""
    cfg = dict(config or {})
    return {"config": cfg, **{k: cfg[k] for k in ("grid", "num_warps", "num_stages") if k in cfg}}


def entry_config(entry: dict) -> dict | None:
    """The candidate configuration a manifest entry's `launch` records (launch_of's); None
    where it has none."""
    return (entry.get("launch") or {}).get("config")


def entry_fields(result, options) -> dict:
    """The manifest entry for a synthesis result, its kernel file not written (a worker makes
    it; the package's writer writes both)."""
    rel = f"kernels/{result.hash}/kernel.py"
    launch = launch_of(result.candidate.config)
    return {
        "symbol": f"kforge_kernel_{result.hash}_{options.target}",
        "target": options.target, "provider": result.provider, "precision": options.precision,
        "requested_provider": options.provider,
        "source": rel, "sha256": hashlib.sha256(result.candidate.source.encode()).hexdigest(),
        "launch": launch,
        "verification": result.record.to_json() if result.record else {"status": "candidate"},
        "status": result.status,
        "time_ms": result.time_ms,
        "rounds": result.rounds,
        "notes": result.candidate.notes,
        "candidate_id": result.candidate.id,
    }


def reusable_entry(pkg: Path, entry: dict | None, options) -> bool:
    """A manifest entry from an earlier (maybe interrupted) compile that still answers."""
    if not entry:
        return False
    if entry.get("target") != options.target or entry.get("precision") != options.precision:
        return False
    if entry.get("requested_provider", entry.get("provider")) != options.provider:
        return False
    if not above_floor(entry_config(entry), options.precision, options.finer_than):
        return False            # a scheme the whole-model check has taken the region above
    status = entry.get("verification", {}).get("status")
    if status not in ("verified", "candidate"):
        return False
    path = Path(pkg) / entry.get("source", "")
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == entry.get("sha256")


# ---------------------------------------------------------------------------------------------
# Reading a package
# ---------------------------------------------------------------------------------------------
@dataclass
class Package:
    root: Path
    meta: dict
    plan: object                       # kforge.spec.HostPlan
    specs: dict                        # hash -> KernelSpec
    manifest: dict
    linked: bool = False               # plan is the linked IR's (LINKED_PLAN), not the outlined

    def kernel_hashes(self) -> set[str]:
        """Regions the plan runs on kernels when a verified one is here: in a linked plan, its
        kernel steps and the one-op regions of kernel-backed fallbacks (attention, MoE), which the
        IR keeps as fallback calls; in an unlinked plan, every region."""
        from kforge.kernel_fallbacks import is_kernel_fallback
        from kforge.spec import KernelStep
        if not self.linked:
            return set(self.specs)
        # a region split off at a call runs its own kernel there, whatever its step kind: the
        # link saw only the region it was split from
        return {s.kernel for s in self.plan.steps if isinstance(s, KernelStep)} | \
            {h for h, spec in self.specs.items() if is_kernel_fallback(spec)} | \
            set(self.site_regions)

    @property
    def target(self) -> str:
        return self.meta.get("target", "cpu")

    @property
    def precision(self) -> str:
        return self.meta.get("precision", "strict")

    def weights_path(self) -> Path | None:
        w = self.meta.get("weights") or {}
        if not w.get("path"):
            return None
        p = Path(w["path"])
        return p if p.is_absolute() else self.root / p

    def model_path(self) -> Path | None:
        m = self.meta.get("model") or {}
        if m.get("copy") and (self.root / m["copy"]).is_file():
            return self.root / m["copy"]
        if m.get("origin") and Path(m["origin"]).is_file():
            return Path(m["origin"])
        return None

    @property
    def site_regions(self) -> dict[str, str]:
        """Regions split off a shared region at one of its calls (the manifest's
        "site_regions", applied by open_package): new hash -> the region it was split from."""
        return {h: rec["region"] for h, rec in (self.manifest.get(SITE_REGIONS) or {}).items()
                if h in self.specs and isinstance(rec, dict) and rec.get("region") in self.specs}

    def region_hashes(self) -> list[str]:
        seen = []
        for step in self.plan.steps:
            h = getattr(step, "call", None)
            if h and h not in seen:
                seen.append(h)
        return seen


def open_package(pkg: str | os.PathLike) -> Package:
    """Reads a package directory (needs only torch: no MLIR)."""
    from kforge.spec import load_host_plan, load_spec
    root = Path(pkg)
    meta_path = root / META
    if not meta_path.is_file():
        raise UserError(f"{root}: not a kforge package (no {META}); create one with "
                        "`kforge compile MODEL.py -o PKG`")
    meta = json.loads(meta_path.read_text())
    if meta.get("schema") != PACKAGE_SCHEMA or int(meta.get("version", 0)) > VERSION:
        raise UserError(f"{meta_path}: not a kforge package of version {VERSION}")
    plan_path = root / PLAN
    if not plan_path.is_file():
        raise UserError(f"{root}: the package has no host plan ({PLAN}); its compile did not "
                        "finish the regions stage; run `kforge compile` again")
    linked = (root / LINKED_PLAN).is_file()
    if linked:
        # what the linked IR says; attention fallbacks become their one-op regions again
        from kforge.kernel_fallbacks import promote
        plan, _ = promote(load_host_plan(root / LINKED_PLAN))
        plan = replace(plan, directory=str(root / "regions"))     # the specs live there
    else:
        plan = load_host_plan(plan_path)
    specs = {}
    for step in plan.steps:
        h = getattr(step, "call", None)
        if h and h not in specs:
            specs[h] = load_spec(root / "regions" / f"{h}.json")
    manifest = read_manifest(root)
    plan, specs = apply_site_regions(plan, specs, manifest)
    return Package(root, meta, plan, specs, manifest, linked)


# ---------------------------------------------------------------------------------------------
# Regions split at a call site
# ---------------------------------------------------------------------------------------------
# Layers of one shape share their regions: one hash, one kernel, called once per layer. The
# whole-model check may find that one call of such a region carries the model's error (the first
# decoder layer's, whose error the later layers carry forward). It then splits that call off as
# a region of its own, with the same spec under a new hash, so that a finer kernel runs there
# and the region's kernel stays at the other calls. The plan files are not rewritten (kforge-opt
# re-links from the outlined IR, which knows only the shared region); the manifest's
# "site_regions" {new hash: {"region": hash, "call": k, "why": ...}} says which call (k: the
# region's k-th call in the plan, from 0) each split takes, and open_package applies it.
SITE_REGIONS = "site_regions"


def region_calls(plan) -> dict[str, list[int]]:
    """Region hash -> the plan steps that call it, in order."""
    calls: dict[str, list[int]] = {}
    for i, step in enumerate(plan.steps):
        h = getattr(step, "call", None)
        if h:
            calls.setdefault(h, []).append(i)
    return calls


def site_region_hash(h: str, call: int) -> str:
    """The hash of region `h` split off at its `call`-th call: as long as a region hash, hex."""
    return hashlib.sha256(f"{h}@{call}".encode()).hexdigest()[:max(len(h), 16)]


def retarget(step, h: str):
    """A plan step that calls region `h` instead (a call step or a linked kernel step)."""
    from kforge.spec import KernelStep
    return replace(step, kernel=h) if isinstance(step, KernelStep) else replace(step, call=h)


def apply_site_regions(plan, specs: dict, manifest: dict):
    """(plan, specs) with the manifest's split calls taking their own region hashes (a copy of
    the spec under the new hash). A record that names no call of this plan is ignored."""
    sites = manifest.get(SITE_REGIONS) or {}
    if not sites:
        return plan, specs
    calls = region_calls(plan)            # the plan as linked: calls counted before any split
    steps, specs = list(plan.steps), dict(specs)
    for h2, rec in sorted(sites.items()):
        if not isinstance(rec, dict):
            continue
        h, k = rec.get("region"), rec.get("call")
        at = calls.get(h, [])
        if h not in specs or not isinstance(k, int) or not 0 <= k < len(at) or len(at) < 2:
            continue
        steps[at[k]] = retarget(steps[at[k]], h2)
        specs[h2] = replace(specs[h], hash=h2)
    return replace(plan, steps=tuple(steps)), specs


def split_site(pkg: Path, h: str, k: int, why: str) -> tuple[str, int]:
    """Split region `h`'s k-th call (from 0, in the plan open_package gives: as the whole-model
    check numbers them) off as a region of its own (see SITE_REGIONS): the manifest records it,
    and the region's entry and kernel file are copied to the new hash, so that the split call
    runs the same verified kernel until `kforge tune` gives it another. Returns (the new hash,
    the call's place among all the region's calls in the plan as linked, earlier splits
    included)."""
    pkg = Path(pkg)
    package = open_package(pkg)
    at = region_calls(package.plan).get(h, [])
    if not 0 <= k < len(at):
        raise UserError(f"{pkg}: region {h} has no call {k + 1} in the plan")
    base = package.site_regions
    call = sum(1 for s in package.plan.steps[:at[k]]
               if getattr(s, "call", None) == h or base.get(getattr(s, "call", None)) == h)
    h2 = site_region_hash(h, call)
    manifest = read_manifest(pkg)
    spec_file = pkg / "regions" / f"{h}.json"
    if spec_file.is_file():       # for tools that read a region's spec by its hash
        doc = json.loads(spec_file.read_text())
        doc["hash"] = h2
        atomic_write_text(pkg / "regions" / f"{h2}.json", json.dumps(doc, indent=1) + "\n")
    entry = manifest["kernels"].get(h)
    if entry is not None:
        copy = json.loads(json.dumps(entry))
        src = pkg / entry.get("source", "")
        if entry.get("source") and src.is_file():
            copy["source"] = f"kernels/{h2}/kernel.py"
            atomic_write_text(pkg / copy["source"], src.read_text())
        manifest["kernels"][h2] = copy
    manifest.setdefault(SITE_REGIONS, {})[h2] = {"region": h, "call": call, "why": why}
    write_manifest(pkg, manifest)
    return h2, call


# Only with KFORGE_SPLIT_UNSELECTED=1. On the H100 (2026-12-06, benchmarks/results/
# 2026-12-06f-h100-gptoss-prefill-last-experts/) gpt-oss-20b's split last-layer experts got the
# fp16x1 MoE kernel, which the verifier rejected on its mixed-magnitude inputs (8 of 11.8M
# elements outside: the activation's clamp at 7 turns fp16 rounding near it into jumps), and
# the region ran its fp32 reference: 42.6 ms a call where every MoE call on fp16x3 took 26.5.
SPLIT_UNSELECTED_ENV = "KFORGE_SPLIT_UNSELECTED"


def split_unselected_calls(pkg: Path, policy: str) -> list[str]:
    """With KFORGE_SPLIT_UNSELECTED=1, under a reduced-precision policy, split off (split_site)
    each call of a region upstream of a selection op (kforge.selection: compiled strict) whose
    own results reach none, so that it keeps the policy: gpt-oss's last layer's experts, after its last router, run the
    policy's scheme instead of strict's. Returns the new hashes (none under strict, or where
    every call of every such region feeds a selection)."""
    from kforge.selection import unselected_calls
    if policy == "strict" or os.environ.get(SPLIT_UNSELECTED_ENV) != "1":
        return []
    new = []
    while True:
        package = open_package(pkg)
        todo = unselected_calls(package.plan)
        if not todo:
            return new
        h, ks = sorted(todo.items())[0]
        h2, _ = split_site(pkg, h, ks[-1],
                           "its results reach no selection op, unlike the region's other calls: "
                           f"split off to keep the {policy} policy")
        new.append(h2)


# ---------------------------------------------------------------------------------------------
# Building a package
# ---------------------------------------------------------------------------------------------
@dataclass
class CompileReport:
    package: Path
    target: str
    precision: str
    provider: str
    regions: list = field(default_factory=list)      # RegionResult.to_json() + spec facts
    linked: bool = False
    link_note: str = ""
    elapsed_s: float = 0.0
    stages: dict = field(default_factory=dict)       # stage -> seconds
    workers: dict = field(default_factory=dict)      # the executor and every task attempt

    def to_json(self) -> dict:
        n_ver = sum(r["status"] == "verified" for r in self.regions)
        return {"schema": "kforge.report", "version": VERSION, "package": str(self.package),
                "target": self.target, "precision": self.precision, "provider": self.provider,
                "linked": self.linked, "link_note": self.link_note,
                "elapsed_s": round(self.elapsed_s, 3), "stages": self.stages,
                "workers": self.workers,
                "summary": {"regions": len(self.regions), "verified": n_ver,
                            "candidate": sum(r["status"] == "candidate" for r in self.regions),
                            "reference": sum(r["status"] == "reference" for r in self.regions),
                            "from_cache": sum(bool(r.get("from_cache")) for r in self.regions),
                            "resumed": sum(bool(r.get("resumed")) for r in self.regions)},
                "regions": self.regions}


def _region_row(spec, result_json: dict) -> dict:
    ver = result_json.get("verification") or {}
    return {**result_json, "root_kind": getattr(spec, "root_kind", ""),
            "fused": list(getattr(spec, "fused", ()) or ()),
            "max_abs_err": ver.get("max_abs_err"), "device": ver.get("device")}


def write_meta(pkg: Path, **fields_) -> dict:
    path = Path(pkg) / META
    meta = json.loads(path.read_text()) if path.exists() else {
        "schema": PACKAGE_SCHEMA, "version": VERSION, "created_at": _now()}
    meta.update(fields_)
    meta["updated_at"] = _now()
    atomic_write_text(path, json.dumps(meta, indent=2, sort_keys=True))
    return meta


def synthesize_package(pkg: Path, options, *, cache: KernelCache | None,
                       progress: "ProgressSink | None" = None,
                       dynamic_size: int | None = None, provider=None,
                       executor=None) -> CompileReport:
    """Synth (per region, resuming) + link + report, for a package whose regions/ exists.
    Regions run on `executor` (kforge.workers; default: the one `use_workers` set, else this
    process); each outcome is recorded in the package as it arrives."""
    from kforge.workers import (RegionTask, absorb, cache_location, current_executor,
                                find_attempt)
    started = time.monotonic()
    pkg = Path(pkg)
    split_unselected_calls(pkg, options.precision)
    package = open_package(pkg)
    manifest = package.manifest
    report = CompileReport(pkg, options.target, options.precision, options.provider)
    hashes = package.region_hashes()
    sink = progress or ProgressSink()
    executor = executor or current_executor()
    if dynamic_size:
        second = dynamic_size + 3 if dynamic_size + 3 != dynamic_size else dynamic_size + 1
        options = replace(options, dynamic_sizes=(dynamic_size, second))
    write_meta(pkg, dynamic_sizes=list(options.dynamic_sizes))   # `kforge tune` checks the same
    sink.start(len(hashes))
    t0 = time.monotonic()
    rows, tasks = {}, []
    cache_root, cache_mode = cache_location(cache)
    feeders = selection_feeders(package.plan)
    escalated, floors = raised_regions(manifest), scheme_floors(manifest)
    region_opts, raised = {}, {}
    for h in hashes:
        precision, why = region_precision(options.precision, feeders, h, escalated)
        region_opts[h] = replace(options, precision=precision,
                                 finer_than=floors.get(h, 0) if precision != "strict" else 0)
        if why:
            raised[h] = why
    for h in hashes:
        spec = package.specs[h]
        entry = manifest["kernels"].get(h)
        if reusable_entry(pkg, entry, region_opts[h]):
            sink.region(h, spec)
            row = {"hash": h, "name": spec.name, "status": entry["status"],
                   "provider": entry["provider"], "rounds": entry.get("rounds", 0),
                   "candidates_tried": 0,
                   "time_ms": entry.get("time_ms"), "from_cache": False, "resumed": True,
                   "elapsed_s": 0.0, "message": "", "verification": entry["verification"]}
            rows[h] = _region_row(spec, row)
            sink.done(h, row)
            continue
        mlir_path = pkg / "regions" / f"{h}.mlir"
        tasks.append(RegionTask(
            "synth", h, spec, region_opts[h],
            mlir_path.read_text() if mlir_path.is_file() else "",
            cache_root, cache_mode, None if executor.remote() else str(pkg / "regions"),
            provider=provider))
    attempts, finished, verified = [], set(), set()

    def on_event(ev) -> None:
        if ev.kind == "started":
            if find_attempt(attempts, ev.data) is not None:     # arrived after its outcome
                return
            attempts.append(ev.data.to_json())
            if ev.hash not in finished:
                sink.region(ev.hash, package.specs[ev.hash])
                sink.started(ev.hash, ev.data)
        elif ev.kind == "note":
            sink.note(ev.hash, ev.data)
        elif ev.kind == "verified" and ev.hash not in finished:
            _record_entry(pkg, manifest, ev.hash, ev.data, region_opts[ev.hash])  # before tuning
            verified.add(ev.hash)

    for outcome in executor.run(tasks, on_event):
        h = outcome.hash
        finished.add(h)
        absorb(outcome, cache, pkg / "regions", attempts)
        kept = manifest["kernels"].get(h) if outcome.error and h in verified else None
        if outcome.entry is not None:
            atomic_write_text(pkg / outcome.entry["source"], outcome.kernel_source)
            manifest["kernels"][h] = outcome.entry
        elif kept is None:
            manifest["kernels"].pop(h, None)
        write_manifest(pkg, manifest)            # persisted per region, as soon as known
        if outcome.error:                        # its workers died; what verified stays
            row = {"hash": h, "name": package.specs[h].name,
                   "status": kept["status"] if kept else "reference",
                   "provider": kept["provider"] if kept else options.provider,
                   "rounds": kept.get("rounds", 0) if kept else 0, "candidates_tried": 0,
                   "time_ms": kept.get("time_ms") if kept else None, "from_cache": False,
                   "elapsed_s": 0.0, "verification": kept["verification"] if kept else None,
                   "message": outcome.error + ("; the kernel it verified before is kept, "
                                               "untuned" if kept else
                                               "; the region runs its reference")}
        else:
            row = outcome.result.to_json()
        row["worker"] = outcome.record.to_json() if outcome.record else None
        rows[h] = _region_row(package.specs[h], row)
        sink.done(h, row)
    sink.stop()
    for h, why in raised.items():
        if h in rows:
            rows[h].update(precision=region_opts[h].precision, precision_reason=why)
    report.regions = [rows[h] for h in hashes if h in rows]
    report.workers = {**executor.describe(), "attempts": attempts}
    report.stages["synth"] = round(time.monotonic() - t0, 3)
    t1 = time.monotonic()
    report.linked, report.link_note = link_package(pkg)
    report.stages["link"] = round(time.monotonic() - t1, 3)
    report.elapsed_s = time.monotonic() - started
    return report


def _record_entry(pkg: Path, manifest: dict, h: str, result, options) -> None:
    manifest["kernels"][h] = manifest_entry(pkg, result, options)
    write_manifest(pkg, manifest)


def link_package(pkg: Path) -> tuple[bool, str]:
    """kforge-opt --kforge-link-kernels: model.linked.mlir from regions/outlined.mlir."""
    outlined = pkg / "regions" / "outlined.mlir"
    if not outlined.is_file():
        return False, "no regions/outlined.mlir (regions were not formed by kforge-opt)"
    try:
        from kforge.tools import kforge_opt, run_tool
        tool = kforge_opt()
        help_text = run_tool([tool, "--help"]).stdout
    except UserError as exc:
        return False, f"kforge-opt unavailable: {exc}"
    if "--kforge-link-kernels" not in help_text:
        return False, f"{tool} has no --kforge-link-kernels pass yet"
    target = json.loads((pkg / META).read_text()).get("target", "") if (pkg / META).is_file() \
        else ""
    run_tool([tool, outlined, f"--kforge-link-kernels=manifest={pkg / MANIFEST} "
              f"target={target} host-plan={pkg / LINKED_PLAN}",
              "-o", pkg / "model.linked.mlir"], what=str(outlined))
    write_meta(pkg, linked_ir={"file": "model.linked.mlir", "plan": LINKED_PLAN,
                               "by": "kforge-opt", "stale": False, "at": _now()})
    return True, ""


def relink(pkg: Path) -> str:
    """After `kforge tune` verified kernels: link again, so that the linked IR and its plan (what
    the runtime executes) carry them. With kforge-opt here (the compile host) that is
    `--kforge-link-kernels`; without it (a GPU host has no MLIR) the linked plan is updated
    in Python — region calls whose kernel is now verified become kernel steps — and the IR file
    is marked stale until `kforge link PKG` runs where kforge-opt is. Returns what was done."""
    pkg = Path(pkg)
    try:
        ok, note = link_package(pkg)
    except UserError as exc:
        ok, note = False, str(exc)
    if ok:
        return "re-linked with kforge-opt"
    plan_path = pkg / LINKED_PLAN
    if not plan_path.is_file():
        return f"not re-linked ({note}); the runtime uses the manifest's verified kernels"
    from kforge.spec import CallStep, KernelStep, load_host_plan, to_json
    plan = load_host_plan(plan_path)
    meta = json.loads((pkg / META).read_text())
    target = meta.get("target", "")
    kernels = read_manifest(pkg).get("kernels", {})
    steps, changed = [], 0
    for step in plan.steps:
        entry = kernels.get(getattr(step, "call", ""), {})
        ok_here = (entry.get("verification") or {}).get("status") == "verified" and \
            entry.get("target") == target
        if isinstance(step, CallStep) and ok_here:
            steps.append(KernelStep(step.call, step.operands, step.results,
                                    entry.get("symbol", ""), target))
            changed += 1
        elif isinstance(step, KernelStep) and not ok_here:
            steps.append(CallStep(step.kernel, step.operands, step.results))
            changed += 1
        else:
            steps.append(step)
    # atomically: a run killed here leaves the old plan whole
    atomic_write_text(plan_path, to_json(replace(plan, steps=tuple(steps))) + "\n")
    write_meta(pkg, linked_ir={"file": "model.linked.mlir", "plan": LINKED_PLAN,
                               "by": "kforge (Python)", "stale": bool(changed), "at": _now(),
                               "note": f"kforge-opt unavailable ({note[:200]}); run `kforge "
                                       "link PKG` where it is to re-link model.linked.mlir"})
    return f"linked plan updated in Python ({changed} steps); model.linked.mlir is stale"


# ---------------------------------------------------------------------------------------------
# Progress and reports
# ---------------------------------------------------------------------------------------------
class ProgressSink:
    """Receives progress events; the default prints nothing."""

    def start(self, total: int) -> None: ...

    def region(self, h: str, spec) -> None: ...

    def note(self, h: str, message: str) -> None: ...

    def started(self, h: str, record) -> None:
        """An attempt at the region began (a kforge.workers.TaskRecord: where it runs)."""

    def done(self, h: str, row: dict) -> None: ...

    def stop(self) -> None: ...


class RichProgress(ProgressSink):
    """A rich progress bar over regions, with the loop's current step."""

    def __init__(self, console=None):
        from rich.console import Console
        self.console = console or Console(stderr=True)
        self.progress = None
        self.task = None
        self.current = ""

    def start(self, total: int) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn)
        self.progress = Progress(SpinnerColumn(), TextColumn("[bold]synth[/]"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.description}"), console=self.console,
                                 transient=True)
        self.progress.start()
        self.task = self.progress.add_task("", total=total)

    def region(self, h: str, spec) -> None:
        self.current = f"{h} ({getattr(spec, 'root_kind', '')}: " \
            f"{'+'.join(getattr(spec, 'fused', ()) or ())})"
        self.progress.update(self.task, description=self.current)

    def note(self, h: str, message: str) -> None:
        self.progress.update(self.task, description=f"{self.current} — {message}")

    def done(self, h: str, row: dict) -> None:
        how = "resumed" if row.get("resumed") else "cache" if row.get("from_cache") else \
            f"{row.get('rounds', 0)} rounds"
        style = {"verified": "green", "candidate": "yellow"}.get(row["status"], "red")
        self.progress.console.print(f"  region {h}: [{style}]{row['status']}[/] "
                                    f"({row['provider']}, {how}, {row['elapsed_s']:.1f} s)")
        self.progress.advance(self.task)

    def stop(self) -> None:
        if self.progress:
            self.progress.stop()


def _fmt_err(v) -> str:
    return "—" if v is None else f"{v:.1e}"


def _fmt_ms(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def report_rows(report: dict) -> list[list[str]]:
    rows = []
    for r in report["regions"]:
        how = str(r.get("rounds", 0)) + (" (resumed)" if r.get("resumed") else
                                          " (cache)" if r.get("from_cache") else "")
        rows.append([r["hash"], r.get("root_kind", ""), "+".join(r.get("fused", [])),
                     r.get("provider", ""), how, r["status"], _fmt_err(r.get("max_abs_err")),
                     _fmt_ms(r.get("time_ms")), f"{r.get('elapsed_s', 0):.1f}"])
    return rows


REPORT_COLUMNS = ["region", "kind", "fused", "provider", "rounds", "verification",
                  "max abs err", "kernel ms", "synth s"]


def report_markdown(report: dict) -> str:
    s = report["summary"]
    lines = [f"# KForge compile report: {report['package']}", "",
             f"target `{report['target']}`, precision `{report['precision']}`, provider "
             f"`{report['provider']}`; {s['regions']} regions: {s['verified']} verified, "
             f"{s['candidate']} candidate (unverified: device absent), {s['reference']} run "
             f"by the reference; {s['from_cache']} from the cache, {s['resumed']} resumed; "
             f"{report['elapsed_s']:.1f} s.", "",
             "| " + " | ".join(REPORT_COLUMNS) + " |",
             "|" + "---|" * len(REPORT_COLUMNS)]
    for row in report_rows(report):
        lines.append("| " + " | ".join(row) + " |")
    notes = [f"- `{r['hash']}`: {r['message']}" for r in report["regions"] if r.get("message")]
    raised = [r for r in report["regions"] if r.get("precision_reason")]
    if raised:
        notes.append(f"- {len(raised)} regions compiled `strict` "
                     f"({', '.join('`' + r['hash'] + '`' for r in raised)}): "
                     f"{raised[0]['precision_reason']}")
    notes += [f"- import: {n}" for n in report.get("import_notes", ())]
    if notes:
        lines += ["", "Notes:", *notes]
    if not report.get("linked"):
        lines += ["", f"Linked IR not written: {report.get('link_note')}"]
    from kforge.coverage import coverage_markdown
    lines += coverage_markdown(report.get("coverage") or {})
    from kforge.profiling.report import profile_markdown
    lines += profile_markdown(report.get("profile"))
    return "\n".join(lines) + "\n"


def print_report(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=150)     # logs and pipes: do not squeeze the table
    s = report["summary"]
    table = Table(title=f"KForge regions — target {report['target']}, precision "
                        f"{report['precision']}, provider {report['provider']}")
    for col in REPORT_COLUMNS:
        table.add_column(col, justify="right" if col in ("rounds", "max abs err", "kernel ms",
                                                         "synth s") else "left")
    style = {"verified": "green", "candidate": "yellow", "reference": "red"}
    for row, r in zip(report_rows(report), report["regions"]):
        table.add_row(*row, style=None if r["status"] == "verified" else style.get(r["status"]))
    console.print(table)
    console.print(f"{s['verified']}/{s['regions']} regions verified, {s['candidate']} "
                  f"candidate, {s['reference']} on the reference; {s['from_cache']} from the "
                  f"cache, {s['resumed']} resumed; {report['elapsed_s']:.1f} s")
    for r in report["regions"]:
        if r.get("message"):
            console.print(f"  {r['hash']}: {r['message'][:300]}")
    raised = [r for r in report["regions"] if r.get("precision_reason")]
    if raised:
        console.print(f"  {len(raised)} regions compiled strict: "
                      f"{raised[0]['precision_reason']}", markup=False)
    for note in report.get("import_notes", ()):
        console.print(f"  import: {note}", markup=False)
    cov = report.get("coverage")
    if cov:
        from kforge.coverage import coverage_markdown
        console.print("\n".join(coverage_markdown(cov)[1:]), markup=False)


def write_report(pkg: Path, report: CompileReport) -> dict:
    doc = report.to_json()
    atomic_write_text(Path(pkg) / "report.json", json.dumps(doc, indent=2))
    atomic_write_text(Path(pkg) / "report.md", report_markdown(doc))
    return doc


def copy_regions(src: Path, pkg: Path) -> None:
    """Put an exported regions directory into the package (kept if it is already there)."""
    dst = Path(pkg) / "regions"
    if Path(src).resolve() == dst.resolve():
        return
    dst.mkdir(parents=True, exist_ok=True)
    for p in Path(src).iterdir():
        if p.is_file():
            shutil.copy2(p, dst / p.name)


def compile_regions(regions_dir: str | os.PathLike, pkg: str | os.PathLike, options, *,
                    cache: KernelCache | None = None, weights_path: str | os.PathLike | None = None,
                    model_path: str | os.PathLike | None = None,
                    progress: ProgressSink | None = None,
                    dynamic_size: int | None = None, extra_meta: dict | None = None,
                    provider=None, executor=None) -> dict:
    """Build a package from an exported regions directory (kforge-opt's export) and weights.
    The second half of `kforge compile`; needs no MLIR. `executor`: where regions run
    (kforge.workers; default: the one `use_workers` set, else this process)."""
    pkg = Path(pkg)
    pkg.mkdir(parents=True, exist_ok=True)
    copy_regions(Path(regions_dir), pkg)
    from kforge.targets import get_target
    meta = {"target": options.target, "arch": get_target(options.target).arch,   # cuda: sm_90
            "precision": options.precision, "provider": options.provider, **(extra_meta or {})}
    if model_path:
        model_path = Path(model_path)
        if model_path.resolve() != (pkg / "model.py").resolve():
            shutil.copy2(model_path, pkg / "model.py")
        meta["model"] = {"origin": str(model_path.resolve()), "copy": "model.py",
                         "sha256": sha256_file(model_path)}
    if weights_path:
        weights_path = Path(weights_path)
        inside = weights_path.resolve().parent == pkg.resolve()
        if not inside:
            shutil.copy2(weights_path, pkg / weights_path.name)
        meta["weights"] = {"path": weights_path.name, "sha256": sha256_file(weights_path),
                           "bytes": weights_path.stat().st_size, "format": "safetensors"}
    write_meta(pkg, **meta)
    report = synthesize_package(pkg, options, cache=cache, progress=progress,
                                dynamic_size=dynamic_size, provider=provider,
                                executor=executor)
    return write_report(pkg, report)
