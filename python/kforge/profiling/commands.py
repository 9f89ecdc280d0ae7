"""`kforge profile PKG [REGION]`: each kernel's profile and the analyst's recommendations as a
table, the profiles as JSON under PKG/profile/, a roofline plot of all the package's kernels
(PKG/profile/roofline.png, with matplotlib) and a section in PKG/report.md."""
from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

from kforge.errors import UserError


def profile_package(pkg, region: str | None = None, counters: str = "auto",
                    progress=None) -> dict:
    from kforge.package import open_package, read_manifest
    from kforge.profiling.collect import collect_profile
    from kforge.profiling.report import profile_row, roofline_png
    from kforge.profiling.schema import save_profile
    from kforge.providers.base import Candidate, GenerationRequest
    from kforge.providers.builtin import BuiltinProvider
    from kforge.verify import VerificationRecord, target_available, verify_candidate
    say = progress or (lambda m: None)
    package = open_package(pkg)
    manifest = read_manifest(package.root)
    kernels = {h: e for h, e in manifest.get("kernels", {}).items()
               if e.get("target") == package.target and h in package.specs}
    if region:
        kernels = {h: e for h, e in kernels.items() if h.startswith(region)}
        if not kernels:
            raise UserError(f"{package.root} has no {package.target} kernel for region "
                            f"{region!r}; its kernels: {', '.join(sorted(manifest.get('kernels', {}))) or 'none'}")
    if not kernels:
        raise UserError(f"{package.root} has no {package.target} kernel to profile")
    out_dir = package.root / "profile"
    out_dir.mkdir(exist_ok=True)
    rows = []
    for h, entry in sorted(kernels.items()):
        say(f"profiling region {h}")
        spec = package.specs[h]
        cand = Candidate(id=entry.get("candidate_id", f"pkg-{h}"),
                         provider=entry.get("provider", "?"),
                         source=(package.root / entry["source"]).read_text(),
                         config=entry.get("launch", {}).get("config", {}))
        ver = entry.get("verification") or {}
        rec = VerificationRecord.from_json(ver) if ver.get("status") else None
        precision = entry.get("precision", package.precision)   # strict: kforge.selection
        if (rec is None or rec.time_ms is None) and target_available(package.target):
            # verified without a timing (a compile times candidates only where a time picks
            # one): the profile's roofline needs one, so verify and time it here
            say(f"timing region {h}")
            sizes = {"dynamic_sizes": tuple(rec.dynamic_sizes)} \
                if rec is not None and rec.dynamic_sizes else {}
            timed = verify_candidate(spec, cand, package.target, precision, measure=True,
                                     **sizes)
            if timed.status == "verified" and timed.time_ms is not None:
                rec = timed
        prof = collect_profile(spec, cand, rec, package.target, precision,
                               counters=counters)
        save_profile(prof, out_dir / f"{h}.json")
        request = GenerationRequest(spec=spec, region_mlir="", reference_source="",
                                    precision=precision, target=package.target,
                                    phase="optimize", round=0, best=cand)
        recs = BuiltinProvider().analyze(request, prof.to_json())
        rows.append(profile_row(h, prof, tuple(recs)))
    plot = out_dir / "roofline.png"
    note = roofline_png(rows, plot, f"{package.root.name}: {package.target}, "
                                    f"{package.precision}")
    section = {"when": _dt.datetime.now(_dt.timezone.utc).strftime("profiled %Y-%m-%d %H:%M UTC"),
               "plot": "profile/roofline.png" if plot.exists() and note.startswith("roofline")
               else None, "plot_note": note, "rows": rows}
    (out_dir / "profiles.json").write_text(json.dumps(section, indent=1) + "\n")
    _update_report(package.root, section)
    return section


def _update_report(root: Path, section: dict) -> None:
    """report.json gets the section; report.md is written again from it."""
    from kforge.package import report_markdown
    path = root / "report.json"
    if not path.exists():
        return
    doc = json.loads(path.read_text())
    doc["profile"] = section
    path.write_text(json.dumps(doc, indent=2))
    (root / "report.md").write_text(report_markdown(doc))


def cmd_profile(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from kforge.profiling.report import TABLE_COLUMNS, table_cells
    section = profile_package(args.package, args.region, args.counters,
                              progress=lambda m: print(f"  {m}", file=sys.stderr))
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    table = Table(title=f"kforge profile {args.package}")
    for col in TABLE_COLUMNS:
        table.add_column(col)
    for row in section["rows"]:
        table.add_row(*(escape(c) for c in table_cells(row)))   # "[spills]" is no markup
    console.print(table)
    for row in section["rows"]:
        console.print(f"[bold]{row['region']}[/bold] ({row['candidate']}):", highlight=False)
        for rec in row["recommendations"]:
            console.print(f"  {rec}", markup=False, highlight=False)
        for name, why in row["absent"].items():
            console.print(f"  absent: {name}: {why}", markup=False, highlight=False)
    console.print(section["plot_note"], markup=False)
    console.print(f"profiles: {Path(args.package) / 'profile'}/<region>.json", markup=False)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "profile", help="profile a package's kernels and recommend what to change",
        description="Profile each kernel of a package on this machine (timing from its "
                    "verification record, roofline position, Triton compile metadata and code "
                    "facts, Nsight Compute counters where ncu and the GPU are here, else Proton; "
                    "a cuda package on a machine without the GPU is cross-compiled for sm_90) "
                    "and print the profiles and the builtin analyst's ranked recommendations as "
                    "a table. Writes PKG/profile/<region>.json, PKG/profile/roofline.png "
                    "(matplotlib) and a section of PKG/report.md.")
    p.add_argument("package", metavar="PKG")
    p.add_argument("region", metavar="REGION", nargs="?", default=None,
                   help="one region (its hash or a prefix of it)")
    p.add_argument("--counters", default="auto", choices=("auto", "ncu", "proton", "none"),
                   help="hardware counter source (default auto: ncu where it is on the PATH, "
                        "else Proton)")
    p.set_defaults(func=cmd_profile)
