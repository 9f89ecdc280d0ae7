"""The A/B partner of a package that `kforge tune --check` changed by splitting calls off (the
manifest's "site_regions"): a copy where each split's move applies to the whole region it was
split from, in every layer, as the check did before it could split. Run `kforge tune` on the copy
(it generates and verifies the moved regions' kernels), then time both with time_package.py.

    python benchmarks/llm/unsplit_package.py CHECKED_PKG OUT_PKG
"""
import json
import shutil
import sys
from pathlib import Path


def unsplit(src: Path, dst: Path) -> list[str]:
    if dst.exists():
        raise SystemExit(f"{dst} exists; remove it first")
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    sites = manifest.pop("site_regions", None) or {}
    strict = manifest.setdefault("strict_regions", {})
    finer = manifest.setdefault("finer_schemes", {})
    moved = []
    for h2, rec in sorted(sites.items()):
        h = rec["region"]
        manifest["kernels"].pop(h2, None)
        shutil.rmtree(dst / "kernels" / h2, ignore_errors=True)
        (dst / "regions" / f"{h2}.json").unlink(missing_ok=True)
        if h2 in strict:
            strict[h] = f"every call, as the check moved call {rec['call'] + 1} alone"
            moved.append(f"{h} strict")
        if h2 in finer:
            finer[h] = dict(finer[h2], why=f"every call, as the check moved call "
                                          f"{rec['call'] + 1} alone")
            moved.append(f"{h} finer than {finer[h]['finer_than']} bits")
        strict.pop(h2, None)
        finer.pop(h2, None)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return moved


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    for line in unsplit(Path(sys.argv[1]), Path(sys.argv[2])):
        print(line)
