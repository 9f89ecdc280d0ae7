"""`kforge tune PKG`: verify a package's candidate kernels on this machine's device (and, with
rounds, tune them), record the results in the manifest, and link again so that the linked IR
and its host plan — what the runtime executes — carry the newly verified kernels. Tuning is
its own step: loading a package never does it. Needs only torch and triton.
"""
from __future__ import annotations

import os
from typing import Callable

from kforge.errors import UserError
from kforge.package import Package, open_package, read_manifest, relink, write_manifest


def pending_candidates(package: Package, target: str) -> list[str]:
    return [h for h, e in package.manifest.get("kernels", {}).items()
            if e.get("target") == target and
            (e.get("verification") or {}).get("status") == "candidate"]


def tune_package(pkg: str | os.PathLike, *, rounds: int = 0, provider: str | None = None,
                 cache=None, progress: Callable[[str], None] | None = None,
                 repair: int = 2) -> dict:
    """Verify the package's candidate kernels on this machine's device (and, with rounds > 0,
    run optimization passes on its verified kernels); record the results in the manifest.
    A builtin kernel that fails here is replaced by the next one the builtin generates that
    verifies, within `repair` generate/verify rounds (0: leave it rejected)."""
    from kforge.kernel_fallbacks import compare_with_pytorch
    from kforge.providers.base import Candidate
    from kforge.synth import SynthOptions, synthesize_region
    from kforge.verify import target_available, verify_candidate
    package = open_package(pkg)
    target = package.target
    if not target_available(target):
        raise UserError(f"{package.root} targets {target}, and this machine has no {target} "
                        "device; run `kforge tune` where the device is")
    manifest = read_manifest(package.root)
    say = progress or (lambda m: None)
    sizes = tuple(package.meta.get("dynamic_sizes") or SynthOptions().dynamic_sizes)
    results = {}
    for h, entry in list(manifest["kernels"].items()):
        if entry.get("target") != target or h not in package.specs:
            continue
        spec = package.specs[h]
        source = (package.root / entry["source"]).read_text()
        # the provider's own id, so that a provider asked again knows this one was tried
        cand = Candidate(id=entry.get("candidate_id", f"pkg-{h}"),
                         provider=entry.get("provider", "?"), source=source,
                         config=entry.get("launch", {}).get("config", {}))
        status = (entry.get("verification") or {}).get("status")
        if rounds > 0 and status in ("verified", "candidate"):
            say(f"tuning region {h}")
            opts = SynthOptions(target=target, precision=package.precision,
                                provider=provider or entry.get("provider", "builtin"),
                                rounds=rounds, dynamic_sizes=sizes)
            res = synthesize_region(spec, opts, cache=cache, incumbent=cand,
                                    log_dir=package.root / "regions")
            if res.candidate is not None and res.status == "verified":
                from kforge.package import manifest_entry
                new = manifest_entry(package.root, res, opts)
                new["requested_provider"] = entry.get("requested_provider", new["provider"])
                manifest["kernels"][h] = new
            else:
                entry["verification"] = res.record.to_json() if res.record else entry.get(
                    "verification")
                entry["status"] = "rejected"
                entry.setdefault("verification", {})["status"] = "rejected"
        elif status == "candidate":
            say(f"verifying region {h}")
            rec = verify_candidate(spec, cand, target, package.precision, measure=True,
                                   dynamic_sizes=sizes)
            entry["verification"] = rec.to_json()
            entry["status"] = rec.status
            entry["time_ms"] = rec.time_ms
            if not rec.verified and repair > 0 and entry.get("provider") == "builtin":
                # the kernel compiled elsewhere failed here: the loop takes this verdict and
                # generates the next ones in the builtin's order, verify only
                say(f"region {h}: {rec.reason}; repairing ({repair} rounds)")
                from kforge.package import manifest_entry
                opts = SynthOptions(target=target, precision=package.precision,
                                    provider="builtin", rounds=0, functional_rounds=repair,
                                    dynamic_sizes=sizes)
                res = synthesize_region(spec, opts, cache=cache, incumbent=cand,
                                        incumbent_record=rec, log_dir=package.root / "regions")
                if res.candidate is not None and res.status == "verified":
                    new = manifest_entry(package.root, res, opts)
                    new["requested_provider"] = entry.get("requested_provider", new["provider"])
                    new["repaired_from"] = {"config": cand.config, "reason": rec.reason,
                                            "message": rec.message[:500]}
                    manifest["kernels"][h] = new
        else:
            continue
        compare_with_pytorch(manifest["kernels"][h], spec, target)
        results[h] = manifest["kernels"][h]["verification"]["status"]
        write_manifest(package.root, manifest)
    if results:
        say(relink(package.root))
    return results


__all__ = ["pending_candidates", "tune_package"]
