"""What the builtin's cost model predicts for a directory of GEMM kernel specs, before any
measurement (issue 14, item 3: predictions are committed before the held-out run).

    python3 benchmarks/profile/predict.py benchmarks/profile/specs_holdout2    (CPU only)

For each region and policy (KF_POLICIES, default "bf16,strict"): the space, its first
configuration (the functional round measures it), the model's ranking of the rest from there
(`analyst.rank_configs`: the profile-driven order before any measured evidence changes it),
the predicted times of the first and of the model's pick, the model's floor, and whether the
stop rule (`analyst.stop_evidence`, asked with the first configuration measured at its predicted
time) could end the search after the first measurement: the confident stop only when the first
configuration is the model's own fastest by MIN_GAIN, its tiles cover every SM (or it is
memory-bound) and it then measures within analyst.EXPLAINED of its prediction; the older stop
when no untried configuration is predicted to gain even at the model's error.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def _short(c: dict) -> str:
    s = (f"{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')} w{c.get('num_warps')} "
         f"s{c.get('num_stages')}")
    if c.get("SPLIT_K", 1) > 1:
        s += f" sk{c['SPLIT_K']}"
    return s + (f" {c['input_precision']}" if c.get("input_precision") else "")


def predict(spec_dir: str, policies) -> list[dict]:
    from kforge.providers.builtin import analyst, config_space
    from kforge.providers.builtin.analysis import analyze_region
    from kforge.spec import load_spec
    out = []
    for path in sorted(glob.glob(os.path.join(spec_dir, "*.json"))):
        spec = load_spec(path)
        shape = analyze_region(spec)
        M, N, K, B = analyst._gemm_dims(shape)
        for policy in policies:
            space = config_space(spec, "cuda", policy)
            first = space[0]
            pred = [analyst.tile_model(shape, c, spec=spec)["time_ms"] for c in space]
            ranked = analyst.rank_configs(shape, space, {"config": first, "time_ms": pred[0]},
                                          [first], spec=spec)
            pick, ratio = ranked[0]
            m0 = analyst.tile_model(shape, first, spec=spec)
            out.append({
                "workload": os.path.basename(path)[:-5], "policy": policy,
                "dims": f"{M}x{N}x{K}" + (f", batch {B}" if B > 1 else ""),
                "space": len(space), "first": _short(first), "first_ms": pred[0],
                "pick": f"#{space.index(pick)} {_short(pick)}",
                "pick_ms": pred[space.index(pick)],
                "order": [0] + [space.index(c) for c, _ in ranked[:5]],
                "floor_ms": analyst.model_floor_ms(shape, space, spec=spec),
                # the stop rule on the first configuration, had it measured its prediction
                "may_stop_at_1": analyst.stop_evidence(
                    shape, space, {"config": first, "time_ms": pred[0]}, [first], spec=spec),
            })
    return out


def _stop(why: str) -> str:
    if not why:
        return "no"
    if "explains" in why:       # the confident stop: only if measured within EXPLAINED
        return "yes, if within 2x"
    return "yes (no untried configuration predicted to gain)"


def table(rows) -> str:
    lines = ["| region (M x N x K) | policy | space | first config | model's pick | predicted ms "
             "first / pick | model floor ms | predicted order (first 6) | may stop at 1 |",
             "|---|---|---:|---|---|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} ({r['dims']}) | {r['policy']} | {r['space']} | "
                     f"#0 {r['first']} | {r['pick']} | {r['first_ms']:.4f} / "
                     f"{r['pick_ms']:.4f} | {r['floor_ms']:.4f} | "
                     f"{', '.join(map(str, r['order']))} | "
                     f"{_stop(r['may_stop_at_1'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    rows = predict(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/profile/specs_holdout2",
                   os.environ.get("KF_POLICIES", "bf16,strict").split(","))
    print(table(rows))
