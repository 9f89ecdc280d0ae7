"""`kforge tune PKG`: verify a package's candidate kernels on this machine's device (and, with
rounds, tune them), record the results in the manifest, and link again so that the linked IR
and its host plan — what the runtime executes — carry the newly verified kernels. Tuning is
its own step: loading a package never does it. Needs only torch and triton.
"""
from __future__ import annotations

import contextlib
import os
from typing import Sequence, Callable

from kforge.errors import UserError
from kforge.verify.verifier import (VerificationOutOfMemory, VerificationRecord,
                                    is_out_of_memory)
from kforge.package import (Package, entry_config, launch_of, open_package, read_manifest,
                            relink, write_manifest)
from kforge.selection import (above_floor, meets, raised_regions, region_precision,
                              scheme_floors, selection_feeders)


def pending_candidates(package: Package, target: str) -> list[str]:
    return [h for h, e in package.manifest.get("kernels", {}).items()
            if e.get("target") == target and
            (e.get("verification") or {}).get("status") == "candidate"]


def tune_package(pkg: str | os.PathLike, *, rounds: int = 0, provider: str | None = None,
                 cache=None, progress: Callable[[str], None] | None = None,
                 repair: int = 2, executor=None, retry_rejected: bool = False,
                 regenerate: Sequence[str] = ()) -> dict:
    """Verify the package's candidate kernels on the target's device (and, with rounds > 0,
    run optimization passes on its verified kernels); record the results in the manifest.
    A builtin kernel that fails here is replaced by the next one the builtin generates that
    verifies, within `repair` generate/verify rounds (0: leave it rejected). With
    `retry_rejected`, a rejected builtin kernel whose source this KForge generates differently
    for the same configuration (a fixed generator) becomes a candidate again, with that source.
    With `regenerate` (region hashes or kinds, e.g. "moe"; "KIND=SCHEME" takes the first kernel
    of that precision scheme, e.g. "attention=fp16x3"), a verified builtin kernel of those
    regions whose first choice this KForge generates differently (a new scheme, a fixed
    generator) is verified again with the new source; the new kernel replaces the old one only
    where it verifies and is faster, else the old one is restored (and kept meanwhile beside it
    as kernel.previous.py, should the run be stopped part-way).
    Regions run on `executor` (kforge.workers; default: this process), the device being the
    workers': a driver without a GPU can tune on a cluster's GPUs."""
    from kforge.cache import atomic_write_text
    from kforge.synth import SynthOptions
    from kforge.workers import (RegionTask, TuneJob, absorb, cache_location,
                                current_executor, find_attempt)
    package = open_package(pkg)
    target = package.target
    executor = executor or current_executor()
    if not executor.has_device(target):
        where = "this machine has" if not executor.remote() else "the workers have"
        raise UserError(f"{package.root} targets {target}, and {where} no {target} "
                        "device; run `kforge tune` where the device is")
    manifest = read_manifest(package.root)
    say = progress or (lambda m: None)
    sizes = tuple(package.meta.get("dynamic_sizes") or SynthOptions().dynamic_sizes)
    cache_root, cache_mode = cache_location(cache)
    tasks, renewed = [], False
    backups: dict[str, dict] = {}
    feeders = selection_feeders(package.plan)
    raised, floors = raised_regions(manifest), scheme_floors(manifest)
    for h, entry in list(manifest["kernels"].items()):
        if entry.get("target") != target or h not in package.specs:
            continue
        status = (entry.get("verification") or {}).get("status")
        precision, why = region_precision(package.precision, feeders, h, raised)
        floor = floors.get(h, 0) if precision != "strict" else 0
        held = entry.get("precision", package.precision)
        if held != precision and status == "verified" and meets(held, precision):
            # a kernel verified under a stricter policy than the region needs (a strict one
            # copied into a bf16 package): the policy's own kernel is tried beside it, and
            # replaces it only where it verifies and is faster
            fresh = upgraded(package, h, entry, precision, say, finer_than=floor)
            if fresh is not None:
                backups[h] = entry
                manifest["kernels"][h] = entry = fresh
                status, renewed = "candidate", True
        elif held != precision:
            # a package built before kforge.selection: this region feeds a selection op
            fresh = requalified(package, h, entry, precision, why, say, finer_than=floor)
            if fresh is not None:
                manifest["kernels"][h] = entry = fresh
                status, renewed = "candidate", True
        elif not above_floor(entry_config(entry), precision, floor):
            # the whole-model check took the region above its kernel's scheme: the first
            # builtin kernel above it replaces that one (repaired within the floor if rejected)
            fresh = requalified(package, h, entry, precision,
                                f"the whole-model check asks for a scheme finer than {floor} "
                                "bits", say, finer_than=floor)
            if fresh is not None:
                manifest["kernels"][h] = entry = fresh
                status, renewed = "candidate", True
        wanted = _regenerate_request(regenerate, h, getattr(package.specs[h], "root_kind", ""))
        if wanted and status == "verified" and h not in backups:
            fresh = upgraded(package, h, entry, precision, say, scheme=wanted[1],
                             finer_than=floor)
            if fresh is not None:
                backups[h] = entry
                manifest["kernels"][h] = entry = fresh
                status, renewed = "candidate", True
        if retry_rejected and status == "rejected":
            fresh = regenerated(package, h, entry, say)
            if fresh is not None:
                manifest["kernels"][h] = entry = fresh
                status, renewed = "candidate", True
            elif not repairable(entry, repair):
                continue
            else:
                say(f"region {h}: repairing again from its recorded verdict")
        if not (status == "candidate" or (rounds > 0 and status == "verified") or
                (retry_rejected and status == "rejected")):
            continue
        opts = SynthOptions(target=target, precision=entry.get("precision", precision),
                            provider=provider or entry.get("provider", "builtin"),
                            rounds=rounds, dynamic_sizes=sizes,
                            finer_than=floor if entry.get("precision", precision) == precision
                            else 0)
        job = TuneJob(entry, (package.root / entry["source"]).read_text(), rounds, provider,
                      repair, sizes)
        tasks.append(RegionTask("tune", h, package.specs[h], opts, cache_root=cache_root,
                                cache_mode=cache_mode, tune=job,
                                log_dir=None if executor.remote() else
                                str(package.root / "regions")))
    if renewed:         # the new kernel files and their entries agree before any region runs
        write_manifest(package.root, manifest)
    results, attempts, note = {}, [], ""

    def on_event(ev) -> None:
        if ev.kind == "started":
            if find_attempt(attempts, ev.data) is None:       # not after its outcome
                attempts.append(ev.data.to_json())
        elif ev.kind == "note":
            say(ev.data)

    for outcome in executor.run(tasks, on_event):
        absorb(outcome, cache, package.root / "regions", attempts)
        h = outcome.hash
        if h in backups and kept_previous(package, h, backups[h], outcome, say):
            manifest["kernels"][h] = backups[h]
            results[h] = "verified"
            write_manifest(package.root, manifest)
            note = relink(package.root)
            continue
        if outcome.error:
            say(f"region {h}: not tuned: {outcome.error}")
            results[h] = "failed"
            continue
        if outcome.entry is None:
            continue
        if outcome.kernel_source is not None:
            atomic_write_text(package.root / outcome.entry["source"], outcome.kernel_source)
        manifest["kernels"][h] = outcome.entry
        results[h] = outcome.entry["verification"]["status"]
        write_manifest(package.root, manifest)
        # link after every region, so that a run stopped part-way (a time limit, a lost
        # machine) leaves a package whose runtime uses what was verified so far
        note = relink(package.root)
    if results:
        say(note or relink(package.root))     # (every region failed: nothing was linked yet)
    return results


def repairable(entry: dict, repair: int) -> bool:
    """A rejected builtin entry whose recorded verdict the repair loop can start from again (a
    KForge whose repair has changed since may find another kernel): once per entry, since the
    same code would repeat the same repair."""
    verification = entry.get("verification") or {}
    return (repair > 0 and entry.get("provider") == "builtin" and
            verification.get("status") == "rejected" and bool(verification.get("reason")) and
            not entry.get("repair_retried"))


def regenerated(package: Package, h: str, entry: dict,
                say: Callable[[str], None]) -> dict | None:
    """A rejected builtin entry as a candidate again, its kernel generated anew for the same
    configuration and written into the package; None where the source is unchanged (the same
    code would get the same verdict) or the builtin cannot generate it any more."""
    from kforge.providers.builtin import candidates
    config = entry_config(entry)
    if entry.get("provider") != "builtin" or config is None:
        return None
    fresh = candidates(package.specs[h], package.target,
                       entry.get("precision", package.precision), [config])
    path = package.root / entry["source"]
    old = path.read_text() if path.is_file() else ""
    if not fresh or fresh[0].source == old:
        say(f"region {h}: rejected, and this KForge generates the same kernel for it")
        return None
    say(f"region {h}: rejected before; generated again, to verify")
    return _as_candidate(package, entry, fresh[0].source, {"reason": "regenerated"})


def _regenerate_request(regenerate: Sequence[str], h: str, kind: str) -> tuple | None:
    """(name, scheme or None) of the `regenerate` item naming region `h` or its kind: "moe",
    "22113f6eb8f67a25", or with the precision scheme to take, "attention=fp16x3"."""
    for item in regenerate:
        name, _, scheme = item.partition("=")
        if name in (h, kind):
            return name, scheme or None
    return None


def scheme_of(config: dict) -> set[str]:
    """The precision scheme names a builtin configuration answers to (a GEMM's or MoE's
    input_precision, an attention's dot_precision and fp32_dot)."""
    return {str(config[k]) for k in ("input_precision", "dot_precision", "fp32_dot")
            if config.get(k) is not None}


def _first_builtin(package: Package, h: str, precision: str, scheme: str | None = None,
                   finer_than: int = 0):
    """The first kernel of the builtin's space for region `h` under `precision` (a Candidate;
    with `scheme`, the first of that precision scheme; with `finer_than`, the first above that
    floor), or None where the builtin cannot generate one."""
    from kforge.providers.builtin import candidates, config_space
    from kforge.providers.builtin.emitter import CannotGenerate
    spec = package.specs[h]
    try:
        space = config_space(spec, package.target, precision)
        if scheme:
            space = [c for c in space if scheme in scheme_of(c)]
        space = [c for c in space if above_floor(c, precision, finer_than)]
        fresh = candidates(spec, package.target, precision, space[:1]) if space else []
    except CannotGenerate:
        return None
    return fresh[0] if fresh else None


def upgraded(package: Package, h: str, entry: dict, precision: str,
             say: Callable[[str], None], scheme: str | None = None,
             finer_than: int = 0) -> dict | None:
    """A verified builtin entry as a candidate with the first kernel of this KForge's space for
    the region (`tune_package(regenerate=...)`; with `scheme`, the first of that precision
    scheme), the old source kept as kernel.previous.py; None where that kernel is the one the
    package has, or the builtin cannot generate one."""
    from kforge.cache import atomic_write_text
    if entry.get("provider") != "builtin":
        return None
    cand = _first_builtin(package, h, precision, scheme, finer_than)
    path = package.root / entry["source"]
    old = path.read_text() if path.is_file() else ""
    if cand is None and scheme:
        say(f"region {h}: the builtin has no {precision} kernel of scheme {scheme!r} for it; kept")
        return None
    if cand is None or cand.source == old:
        say(f"region {h}: this KForge generates the kernel it has; kept")
        return None
    atomic_write_text(path.with_name("kernel.previous.py"), old)
    say(f"region {h}: regenerated ({cand.id}); verified again beside the old kernel "
        f"({entry.get('time_ms')} ms)")
    return _as_candidate(package, entry, cand.source, {"reason": "regenerated"},
                         precision=precision, launch=launch_of(cand.config),
                         candidate_id=cand.id, notes=cand.notes, time_ms=None)


def kept_previous(package: Package, h: str, old: dict, outcome,
                  say: Callable[[str], None]) -> bool:
    """Whether a regenerated region goes back to its old verified kernel (restored into the
    package): the new one failed, was rejected, or is not faster."""
    from kforge.cache import atomic_write_text
    new = outcome.entry if not outcome.error else None
    status = ((new or {}).get("verification") or {}).get("status")
    new_ms, old_ms = (new or {}).get("time_ms"), old.get("time_ms")
    previous = package.root / old["source"]
    backup = previous.with_name("kernel.previous.py")
    if status == "verified" and (old_ms is None or (new_ms is not None and new_ms < old_ms)):
        say(f"region {h}: the regenerated kernel verified at {new_ms} ms "
            f"(was {old_ms} ms): it replaces the old one")
        backup.unlink(missing_ok=True)
        return False
    if status == "verified":
        why = f"{new_ms} ms, not faster than {old_ms} ms"
    else:
        why = outcome.error or status or "no result"
    say(f"region {h}: the regenerated kernel is not taken ({why}); the old one is restored")
    if backup.is_file():
        atomic_write_text(previous, backup.read_text())
    old["regenerated"] = {"status": status or "failed", "time_ms": new_ms,
                          "candidate_id": (new or {}).get("candidate_id"),
                          "reason": ((new or {}).get("verification") or {}).get("reason")
                          or (outcome.error or "")[:300]}
    return True


def requalified(package: Package, h: str, entry: dict, precision: str, why: str,
                say: Callable[[str], None], finer_than: int = 0) -> dict | None:
    """A builtin entry compiled under another policy than the region needs now (`why`:
    kforge.selection), as a candidate under `precision`: the first kernel of the builtin's space
    for it, written into the package; None for another provider's kernel or a region the
    builtin cannot generate."""
    if entry.get("provider") != "builtin":
        return None
    cand = _first_builtin(package, h, precision, finer_than=finer_than)
    if cand is None:
        say(f"region {h}: {why}; the builtin generates no {precision} kernel for it")
        return None
    say(f"region {h}: {why}; a {precision} kernel generated, to verify")
    return _as_candidate(package, entry, cand.source,
                         {"reason": "requalified", "precision_reason": why},
                         precision=precision, launch=launch_of(cand.config),
                         candidate_id=cand.id, notes=cand.notes, time_ms=None)


def _as_candidate(package: Package, entry: dict, source: str, why: dict, **fields) -> dict:
    """`entry` with the kernel `source` written into the package, as a candidate to verify
    (`why`: the verification record's reason; `fields`: other entry fields that change)."""
    import hashlib

    from kforge.cache import atomic_write_text
    atomic_write_text(package.root / entry["source"], source)
    return dict(entry, status="candidate", **fields,
                sha256=hashlib.sha256(source.encode()).hexdigest(),
                verification={"status": "candidate", **why,
                              "previous": entry.get("verification")})


def tune_entry(spec, entry: dict, source: str, *, target: str, precision: str,
               rounds: int = 0, provider: str | None = None, cache=None, repair: int = 2,
               dynamic_sizes: tuple = (), log_dir=None,
               say: Callable[[str], None] | None = None,
               finer_than: int = 0) -> tuple[dict | None, str | None]:
    """`kforge tune` for one manifest entry, on this machine's device (a worker's). Returns the
    entry to record (None: nothing to do for it) and, when the kernel changed, its new source
    (the entry's "source" file, for the caller to write). `finer_than`: the region's floor on
    precision schemes (kforge.selection), which the tuning and repair rounds keep to."""
    import copy

    from kforge.kernel_fallbacks import compare_with_pytorch
    from kforge.package import entry_fields
    from kforge.providers.base import Candidate
    from kforge.synth import SynthOptions, synthesize_region
    from kforge.verify import verify_candidate
    say = say or (lambda m: None)
    h = spec.hash
    entry = copy.deepcopy(entry)
    sizes = tuple(dynamic_sizes) or SynthOptions().dynamic_sizes
    new_source = None
    # the provider's own id, so that a provider asked again knows this one was tried
    cand = Candidate(id=entry.get("candidate_id", f"pkg-{h}"),
                     provider=entry.get("provider", "?"), source=source,
                     config=entry.get("launch", {}).get("config", {}))
    status = (entry.get("verification") or {}).get("status")
    if rounds > 0 and status in ("verified", "candidate"):
        say(f"tuning region {h}")
        opts = SynthOptions(target=target, precision=precision,
                            provider=provider or entry.get("provider", "builtin"),
                            rounds=rounds, dynamic_sizes=sizes, finer_than=finer_than)
        res = synthesize_region(spec, opts, cache=cache, incumbent=cand, log_dir=log_dir)
        if res.candidate is not None and res.status == "verified":
            new = entry_fields(res, opts)
            new["requested_provider"] = entry.get("requested_provider", new["provider"])
            entry, new_source = new, res.candidate.source
        else:
            entry["verification"] = res.record.to_json() if res.record else entry.get(
                "verification")
            entry["status"] = "rejected"
            entry.setdefault("verification", {})["status"] = "rejected"
    elif status in ("candidate", "rejected"):
        if status == "candidate":
            say(f"verifying region {h}")
            try:
                with device_admission(spec, target, say):
                    rec = verify_candidate(spec, cand, target, precision, measure=True,
                                           dynamic_sizes=sizes)
            except VerificationOutOfMemory as exc:
                # not the kernel's fault: it stays a candidate (unused until verified), and
                # the region's record says why, for `kforge tune` to be run again with fewer
                # jobs
                say(f"region {h}: not verified: {exc}")
                entry["verification"] = dict(entry.get("verification") or {},
                                             status="candidate", reason="out_of_memory",
                                             message=str(exc)[:1000])
                return entry, None
            entry["verification"] = rec.to_json()
            entry["status"] = rec.status
            entry["time_ms"] = rec.time_ms
        elif repairable(entry, repair):
            # `--retry-rejected`, the same kernel: its recorded verdict starts the repair
            rec = VerificationRecord.from_json(entry["verification"])
            entry["repair_retried"] = True
        else:
            return None, None
        if not rec.verified and repair > 0 and entry.get("provider") == "builtin":
            # the kernel compiled elsewhere failed here: the loop takes this verdict and
            # generates the next ones in the builtin's order, verify only
            say(f"region {h}: {rec.reason}; repairing ({repair} rounds)")
            opts = SynthOptions(target=target, precision=precision, provider="builtin",
                                rounds=0, functional_rounds=repair, dynamic_sizes=sizes,
                                finer_than=finer_than)
            res = synthesize_region(spec, opts, cache=cache, incumbent=cand,
                                    incumbent_record=rec, log_dir=log_dir)
            if res.candidate is not None and res.status == "verified":
                new = entry_fields(res, opts)
                new["requested_provider"] = entry.get("requested_provider", new["provider"])
                new["repaired_from"] = {"config": cand.config, "reason": rec.reason,
                                        "message": rec.message[:500]}
                entry, new_source = new, res.candidate.source
    else:
        return None, None
    try:
        return compare_with_pytorch(entry, spec, target), new_source
    except Exception as exc:  # noqa: BLE001 - only running out of memory is expected here
        if not is_out_of_memory(exc):
            raise
        say(f"region {h}: not timed against PyTorch: out of {target} memory")
        return entry, new_source


@contextlib.contextmanager
def device_admission(spec, target: str, say: Callable[[str], None] | None = None):
    """Verification of a region starts only when the device's free memory, less what other
    admitted verifications on it have reserved, covers its estimate (kforge.workers.admission:
    reservations are per host, so `kforge tune` processes started side by side, e.g. by
    `python -m kforge.bench.packages --tune --jobs N`, take turns instead of running out of
    memory). Inside a task the executor already admitted (KFORGE_GPU_LOCK set), or on the cpu
    target, nothing is waited for."""
    if target == "cpu" or os.environ.get("KFORGE_GPU_LOCK"):
        yield
        return
    from kforge.workers.admission import admitted, device_tag, estimate_bytes
    with admitted(estimate_bytes(spec), device_tag(target), probe=_free_device_bytes,
                  on_wait=say):
        yield


def _free_device_bytes(tag: str) -> int:
    """Free memory of this process's device, as the driver reports it."""
    import torch
    if tag.startswith("cuda"):
        return int(torch.cuda.mem_get_info()[0])
    from kforge.workers.admission import free_bytes
    return free_bytes(tag)


__all__ = ["device_admission", "pending_candidates", "regenerated", "tune_entry",
           "tune_package"]
