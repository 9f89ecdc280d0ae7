"""The builtin's persistent TMA GEMM, compiled for sm_90 here (no GPU needed): for every GEMM
region of a folder of packages whose first configuration is a TMA one, registers, spilled bytes
and shared memory of (a) the tile as it was before the epilogue went into column slices (whole-
tile epilogue, 3 stages at 128x256 / 4 at 128x128, only the K loop pipelined), (b) the first
configuration now and (c) the same not flattened. A spilling configuration is what the
provider's cross-compile screen passes over (kforge.providers.builtin._screened).

    python benchmarks/gemm/xcompile_tma_survey.py PACKAGES POLICY [--json F]

PACKAGES: a folder built by benchmarks/build_packages.sh (PACKAGES/POLICY/<workload>/regions/).
"""
import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("KFORGE_XCOMPILE", "0")

from kforge.crosscompile import compile_candidate  # noqa: E402
from kforge.providers.builtin import candidates, config_space  # noqa: E402
from kforge.spec import load_spec  # noqa: E402


def before(space: list[dict], first: dict) -> dict:
    """The tile as it was before the slices: the TMA configuration of `first`'s scheme and
    tile with a whole-tile epilogue (tma_configs keeps it third, for the tuner)."""
    return next(c for c in space if c.get("TMA") and not c.get("EPI_SPLIT")
                and c.get("input_precision") == first.get("input_precision")
                and (c["BLOCK_M"], c["BLOCK_N"]) == (first["BLOCK_M"], first["BLOCK_N"]))


def label(c: dict) -> str:
    return (f"{c['BLOCK_M']}x{c['BLOCK_N']} s{c['num_stages']} slices {c.get('EPI_SPLIT', 1)}"
            + (" flat" if c.get("FLATTEN") else ""))


def compile_gemm(spec, policy: str, config: dict) -> dict:
    cand = candidates(spec, "cuda", policy, [config])
    if not cand:
        return {"config": label(config), "error": "no candidate"}
    reports = [r for r in compile_candidate(cand[0].source, spec, 90, name="s")
               if r.name.endswith("_gemm")]
    if not reports:
        return {"config": label(config), "error": "no GEMM kernel"}
    r = reports[0]
    return {"config": label(config), "ok": r.ok, "error": r.error, "mma": r.mma,
            "registers": r.registers, "spill_bytes": r.spill_stores,
            "shared_bytes": r.shared_bytes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("packages")
    ap.add_argument("policy", choices=("strict", "tf32", "bf16"))
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, seen = [], set()
    files = sorted(Path(args.packages, args.policy).glob("*/regions/*.json"))
    if not files:
        sys.exit(f"no region specs under {args.packages}/{args.policy}/*/regions/")
    for f in files:
        if f.name.endswith(".aten.json") or f.name in ("aten.json", "host_plan.json"):
            continue
        spec = load_spec(f)
        if spec.hash in seen:
            continue
        seen.add(spec.hash)
        # the policy the package compiled the region under (kforge.selection keeps a region
        # upstream of an MoE router strict under bf16)
        manifest = f.parent.parent / "manifest.json"
        kernel = json.loads(manifest.read_text()).get("kernels", {}).get(spec.hash, {}) \
            if manifest.exists() else {}
        policy = kernel.get("precision", args.policy)
        space = config_space(spec, "cuda", policy)
        if not space or not space[0].get("TMA"):
            continue
        first = space[0]
        row = {"workload": f.parent.parent.name, "region": spec.hash, "policy": policy,
               "before": compile_gemm(spec, policy, before(space, first)),
               "now": compile_gemm(spec, policy, first)}
        if first.get("FLATTEN"):
            row["not_flattened"] = compile_gemm(spec, policy, dict(first, FLATTEN=False))
        rows.append(row)
        cells = [f"{row[k]['config']}: r{row[k].get('registers')} spill "
                 f"{row[k].get('spill_bytes')} smem {row[k].get('shared_bytes')}"
                 for k in ("before", "now", "not_flattened") if k in row]
        print(f"{row['workload']} {spec.hash[:8]} | " + " | ".join(cells), flush=True)
    spilled = [r for r in rows if r["before"].get("spill_bytes")]
    now = [r for r in rows if r["now"].get("spill_bytes")]
    print(f"\n{len(rows)} TMA GEMM regions: {len(spilled)} spilled before, {len(now)} now")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
