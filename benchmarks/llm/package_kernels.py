"""One line per region of KForge packages: its kind, the candidate it runs (config, dot
precision), the verification's status, error and kernel time. For device calls that verify
packages and cannot bring the package folders back (benchmarks/llm/probe_prefill_h200.sh).

    python3 benchmarks/llm/package_kernels.py PKG [PKG ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> int:
    for p in paths:
        pkg = Path(p)
        try:
            kernels = json.loads((pkg / "manifest.json").read_text())["kernels"]
            report = json.loads((pkg / "report.json").read_text())
        except (OSError, ValueError, KeyError) as exc:
            print(f"== {pkg}: unreadable ({exc})")
            continue
        kinds = {r["hash"]: r.get("root_kind", "?") for r in report.get("regions", [])}
        print(f"== {pkg}")
        for h, e in kernels.items():
            v = e.get("verification") or {}
            cfg = (e.get("launch") or {}).get("config") or {}
            err = v.get("max_abs_err")
            print(f"{h} {kinds.get(h, '?'):12s} {e.get('status', '?'):10s} "
                  f"ms={e.get('time_ms')} err={err if err is None else f'{err:.3g}'} "
                  f"cand={e.get('candidate_id', '')[-4:]} {json.dumps(cfg, sort_keys=True)} "
                  f"{(v.get('message') or '')[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
