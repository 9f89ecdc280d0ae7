"""Summarize benchmarks/scaleout/run_h200.sh's output folder: one row per setting.

    python3 benchmarks/scaleout/summarize.py OUT share4 share8-admit share1

Per setting: wall time of the whole tune, packages and regions verified, GPU memory used (peak
and median while it ran) and utilization (mean) from nvidia-smi's samples, and the number of
tasks the memory admission held at once (max, and the share of samples at each count).
Writes OUT/scaleout.json and prints a Markdown table.
"""
from __future__ import annotations

import collections
import json
import re
import statistics
import sys
from pathlib import Path


def walls(out: Path) -> dict:
    found = {}
    path = out / "scaleout-walls.txt"
    for line in path.read_text().splitlines() if path.is_file() else []:
        m = re.match(r"(\S+) rc=(\d+) wall_s=([\d.]+)", line)
        if m:
            found[m.group(1)] = {"returncode": int(m.group(2)), "wall_s": float(m.group(3))}
    return found


def smi(path: Path) -> dict:
    mem, util = [], []
    for line in path.read_text().splitlines() if path.is_file() else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            try:
                mem.append(float(parts[1]))
                util.append(float(parts[2]))
            except ValueError:
                continue
    if not mem:
        return {}
    return {"memory_used_mib_peak": max(mem), "memory_used_mib_median": statistics.median(mem),
            "utilization_pct_mean": round(statistics.fmean(util), 1), "samples": len(mem)}


def admitted(path: Path) -> dict:
    counts = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts.append(int(parts[1]))
    if not counts:
        return {}
    hist = collections.Counter(counts)
    return {"max_at_once": max(counts),
            "share_of_samples": {str(k): round(v / len(counts), 3) for k, v in sorted(hist.items())}}


def records(folder: Path) -> dict:
    pkgs, states = {}, collections.Counter()
    for p in sorted(folder.glob("*.tune.json")):
        rec = json.loads(p.read_text())
        pkgs[p.name.split(".")[0]] = {"returncode": rec.get("returncode"), "tune_s": rec.get("tune_s")}
    # region statuses from the manifests, written per region (a setting cut by its time limit
    # still shows what it had verified)
    for p in sorted(folder.glob("*.manifest.json")):
        for entry in json.loads(p.read_text()).get("kernels", {}).values():
            states[(entry.get("verification") or {}).get("status", "?")] += 1
    if not states:       # a folder from before the manifests were kept: the tune logs' summaries
        for p in sorted(folder.glob("*.tune.json")):
            regions = json.loads(p.read_text()).get("regions", {})
            states.update(str(v).split()[0] for v in regions.values())
    return {"packages": pkgs, "regions": dict(states)}


def waits(log: Path) -> int:
    text = log.read_text() if log.is_file() else ""
    return len(re.findall(r"waiting for [\d.]+ GiB", text))


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    names = argv[1:]
    wall = walls(out)
    rows = {}
    for name in names:
        rows[name] = {**wall.get(name, {}), **smi(out / f"{name}.smi.csv"),
                      "admission": admitted(out / f"{name}.admitted.txt"),
                      "admission_waits_logged": waits(out / f"{name}.tune.log"),
                      **records(out / f"{name}.records")}
    (out / "scaleout.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("| setting | wall s | regions | GPU mem peak MiB | GPU util mean % | tasks admitted at once (max) | admission waits |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        regions = ", ".join(f"{k} {v}" for k, v in sorted(r.get("regions", {}).items())) or "-"
        print(f"| {name} | {r.get('wall_s', '-')} | {regions} | {r.get('memory_used_mib_peak', '-')} | "
              f"{r.get('utilization_pct_mean', '-')} | {r['admission'].get('max_at_once', '-')} | "
              f"{r['admission_waits_logged']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
