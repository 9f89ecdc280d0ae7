"""How long verification takes and how much device memory it holds, at the sizes of issue 13's
item 4 (a region with 8192x8192 weights verifies in <= 15 s; a 32768x32768 fp32 layer verifies,
within about 3x the region's inputs + weights + outputs of device memory).

    PYTHONPATH=python python3 benchmarks/verify/bench_verify.py [--policies strict,bf16]
        [--out DIR] [SPEC.json ...]          (default: every spec in benchmarks/verify/specs)

For each region spec (exported here from benchmarks/verify/models/ with `kforge import` and
`kforge regions`: the GPU host needs no MLIR) and each policy, the builtin's first kernel is
verified on the GPU exactly as `kforge tune` verifies it (kforge.verify.verify_candidate: fresh
inputs per seed, the float64 reference, the sandboxed worker, the strict contract, timing). It
records the wall time, where it went (`stage_s`), the device memory peaks of the parent and the
worker against the region's bytes, and the verdict; out of memory is a recorded row, not a
traceback. Writes DIR/verify.json (every record) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "python"))

GOAL_S = 15.0          # issue 13: 8192x8192 weights
GOAL_MEMORY = 3.0      # peak device memory over the region's least bytes


def _row(spec, policy: str) -> dict:
    from kforge.providers.builtin import candidates, config_space
    from kforge.verify import VerificationOutOfMemory, verify_candidate
    space = config_space(spec, "cuda", policy)
    cand = candidates(spec, "cuda", policy, space[:1])[0]
    row = {"region": spec.hash, "policy": policy, "config": space[0],
           "weights_shape": [list(a.shape) for a in spec.args if a.weight]}
    t0 = time.perf_counter()
    try:
        rec = verify_candidate(spec, cand, target="cuda", precision=policy, measure=True)
    except VerificationOutOfMemory as exc:
        row.update(status="out_of_memory", message=str(exc),
                   wall_s=round(time.perf_counter() - t0, 2))
        return row
    row.update(status=rec.status, reason=rec.reason, message=rec.message[:400],
               wall_s=round(time.perf_counter() - t0, 2), elapsed_s=rec.elapsed_s,
               stage_s=rec.stage_s, memory=rec.memory, time_ms=rec.time_ms,
               max_abs_err=rec.max_abs_err, fp32_error_ratio=rec.fp32_error_ratio)
    return row


def _table(rows: list[dict]) -> str:
    out = ["| region | weights | policy | verdict | wall s | reference s | worker start s (idle) "
           "| worker s (inputs, launch, save, check, wait, timing) | compare s (during worker) "
           "| region GB | parent peak x | worker peak x (candidate's) | goals |",
           "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        st = r.get("stage_s") or {}
        mem = r.get("memory") or {}
        region = mem.get("region_bytes") or 0

        def times(key):
            b = mem.get(key)
            return f"{b / region:.2f}" if b and region else "–"

        big = max((max(s) for s in r["weights_shape"] if s), default=0)
        goals = []
        if big <= 8192 and r.get("wall_s") is not None:
            goals.append(f"<= {GOAL_S:.0f} s: {'met' if r['wall_s'] <= GOAL_S else 'missed'}")
        peak = max(mem.get("parent_peak_bytes", 0), mem.get("worker_peak_bytes", 0))
        if region and peak:
            goals.append(f"<= {GOAL_MEMORY:.0f}x: "
                         f"{'met' if peak <= GOAL_MEMORY * region else 'missed'}")
        parts = ", ".join(str(st.get(f"worker_{k}", "–"))
                          for k in ("inputs", "launch", "save", "check", "wait", "timing"))
        out.append(f"| {r['region']} | {'x'.join(map(str, r['weights_shape'][0]))} | "
                   f"{r['policy']} | {r['status']} {r.get('reason', '')} | {r.get('wall_s')} | "
                   f"{st.get('reference', '–')} | {st.get('worker_startup', '–')} "
                   f"({st.get('worker_idle', '–')}) | {st.get('worker', '–')} ({parts}) | "
                   f"{st.get('compare', '–')} ({st.get('compare_during_worker', '–')}) | "
                   f"{region / 1e9:.2f} | {times('parent_peak_bytes')} | "
                   f"{times('worker_peak_bytes')} ({times('worker_candidate_peak_bytes')}) | "
                   f"{'; '.join(goals)} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="*", type=Path)
    ap.add_argument("--policies", default="strict,bf16")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args(argv)
    import torch
    from kforge.spec import load_spec
    if not torch.cuda.is_available():
        print("bench_verify: no CUDA device here; it measures GPU verification only",
              file=sys.stderr)
        return 2
    paths = args.specs or sorted((HERE / "specs").glob("*.json"))
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        spec = load_spec(path)
        for policy in args.policies.split(","):
            row = _row(spec, policy)
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in ("region", "policy", "status", "reason",
                                                       "wall_s", "stage_s", "memory")}),
                  flush=True)
            (args.out / "verify.json").write_text(json.dumps(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "rows": rows}, indent=1))
    print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
