"""Profile-driven against blind search, on the GEMM suite, on the H200 (issue 14, item 3).

    PYTHONUNBUFFERED=1 python3 benchmarks/profile/bench_tuner.py        (on the device machine)
    python3 benchmarks/profile/bench_tuner.py --replay tuner.json       (anywhere: no GPU)

For each GEMM region of the spec directories (KF_SPEC_DIRS, comma-separated, default
benchmarks/profile/specs: kernel specs exported from our workloads at full size) and each
policy (KF_POLICIES, default "bf16,strict"):
 1. every configuration of the builtin's space is compiled (a process pool fills Triton's
    cache), checked once against the fp64 reference at the policy's tolerance, timed with
    triton.testing.do_bench (median of all samples, L2 flushed per run), and profiled
    (compile metadata and code facts of its kernels, roofline position);
 2. the searches are replayed over those measurements as synth._RegionLoop runs them: the
    functional round measures the space's first configuration, then one configuration a round;
    a configuration replaces the incumbent only when kforge.synth.beats says so (its p80 under
    the incumbent's p20 and a MIN_GAIN = 2 % better median); the search stops after
    `patience` = 2 rounds in a row without a gain (or at --rounds):
    blind      the space in the builtin's fixed order;
    profile    each round the builtin analyst (analyze_profile, on the incumbent's measured
               profile and the configurations tried) answers; its first untried `config:`
               line is measured next (else the fixed order's next), as BuiltinProvider.generate
               does, and a `stop:` line ends the search (the loop's stop rule);
    exhaustive every configuration (what tuning without a stop rule would need to know its best);
    first reach: the count at which the fixed order's best is first within 2 % of the space's.
    The goal (a row): profile ends within 2 % of blind's final time with at most half of blind's
    measured configurations, or ends faster than blind with no more measurements.
Writes $OUT/tuner.json (every measurement, all searches) and prints a table last; --replay
re-runs step 2 over a recorded tuner.json and prints the table (specs found by name in the
spec directories). Measurements are keyed by configuration; where the builtin's space has
changed since the recording, the replay searches the recorded space (configurations the
record lacks are skipped).
Env: KF_BUDGET_S (soft budget for the measurements, default 200), KF_POLICIES, KF_SPECS,
KF_SPEC_DIRS.
"""
import concurrent.futures as cf
import glob
import json
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
import importlib.util

T0 = time.time()
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
BUDGET = float(os.environ.get("KF_BUDGET_S", "200"))
OUT = os.environ.get("OUT", ".")
TOL = 0.02
POLICIES = os.environ.get("KF_POLICIES", "bf16,strict").split(",")
TOLERANCE = {"strict": 1e-4, "tf32": 1e-2, "bf16": 1e-2}


def _module(source: str, name: str):
    d = tempfile.mkdtemp(prefix="kf-tuner-")
    path = os.path.join(d, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_INPUTS = {}


def _args(spec, mod, device="cuda"):
    """The region's inputs (seed 1, made once per region: large weights take seconds on the
    CPU) and the candidate's prepared arguments."""
    from kforge.verify.inputs import make_inputs, signature_of
    sig = signature_of(spec)
    if spec.hash not in _INPUTS:
        _INPUTS.clear()
        _INPUTS[spec.hash] = [t.to(device) for t in make_inputs(sig, 1, 8, "mixed")]
    raw = _INPUTS[spec.hash]
    args = list(raw)
    prep = getattr(mod, "prepare_weights", None)
    if callable(prep) and sig.weight_indices:
        for i, t in prep({i: args[i] for i in sig.weight_indices}).items():
            args[int(i)] = t
    return raw, args


def _precompile(job):
    """Pool worker: compile one candidate by launching it once (fills TRITON_CACHE_DIR)."""
    import torch
    spec_path, source, name = job
    from kforge.spec import load_spec
    t = time.time()
    try:
        spec = load_spec(spec_path)
        mod = _module(source, name)
        _, args = _args(spec, mod)
        mod.launch(*args)
        torch.cuda.synchronize()
        return name, round(time.time() - t, 2), ""
    except Exception as exc:   # noqa: BLE001
        return name, round(time.time() - t, 2), f"{type(exc).__name__}: {str(exc)[:300]}"


def _facts(mod):
    import triton
    from kforge.profiling.triton_meta import facts_from_compiled
    out = []
    for name, fn in vars(mod).items():
        if isinstance(fn, triton.runtime.jit.JITFunction):
            for caches in fn.device_caches.values():
                for compiled in caches[0].values():
                    out.append(facts_from_compiled(compiled, name))
    return out


def measure(spec_path, policy, deadline):
    import torch
    import triton.testing
    from kforge.profiling import Profile, Timing, roofline_of
    from kforge.providers.builtin import candidates, config_space
    from kforge.reference import reference_fn
    from kforge.spec import load_spec
    from kforge.targets import get_target
    target = get_target("cuda")
    spec = load_spec(spec_path)
    space = config_space(spec, target, policy)
    cands = {json.dumps(c.config, sort_keys=True): c for c in candidates(spec, target, policy, space)}
    ref = reference_fn(spec, torch.float64)
    rows = []
    refs = None
    for i, config in enumerate(space):
        key = json.dumps(config, sort_keys=True)
        row = {"index": i, "config": config}
        rows.append(row)
        if time.time() > deadline:
            row["error"] = "not measured: budget"
            continue
        cand = cands.get(key)
        if cand is None:
            row["error"] = "the builtin generates no kernel for it"
            continue
        try:
            mod = _module(cand.source, f"c{i}")
            raw, args = _args(spec, mod)
            if refs is None:
                refs = [r.float() for r in ref(*raw)]
            outs = mod.launch(*args)
            torch.cuda.synchronize()
            tol = TOLERANCE[policy]
            err = max(float(((o.float() - r).abs() - tol * r.abs()).max()) for o, r in zip(outs, refs))
            row["max_excess_err"] = err
            row["correct"] = err <= tol
            samples = triton.testing.do_bench(lambda: mod.launch(*args), warmup=5, rep=25,
                                              return_mode="all")
            s = sorted(float(x) for x in samples)
            med, lo, hi = s[len(s) // 2], s[len(s) // 5], s[(4 * len(s)) // 5]
            row.update(time_ms=med, p20_ms=lo, p80_ms=hi, reps=len(s))
            facts = _facts(mod)
            roof = roofline_of(float(spec.flops), float(spec.min_bytes), med, target.peaks, policy)
            prof = Profile(candidate_id=cand.id, target="cuda", precision=policy,
                           config=config, timing=Timing(med, lo, hi, (hi - lo) / med),
                           roofline=roof, kernels=tuple(facts))
            row["profile"] = prof.to_json()
            del outs, args
        except Exception as exc:   # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return spec, space, rows


PATIENCE = 2


def _key(c: dict) -> str:
    return json.dumps(c, sort_keys=True)


def _beats(new: dict, old: dict) -> bool:
    """kforge.synth.beats on two measured rows."""
    return new["p80_ms"] < old["p20_ms"] and new["time_ms"] < old["time_ms"] * (1 - TOL)


def _search(space, ok, pick, stop=None, rounds=None):
    """One replayed search: the functional rounds (the space in order until one verifies),
    then one configuration a round from pick(incumbent, tried), ending on stop(incumbent,
    tried) (a reason), `patience` stale rounds, an exhausted space or `rounds`."""
    tried, inc = [], None
    for c in space:                         # the functional rounds
        tried.append(c)
        inc = ok.get(_key(c))
        if inc:
            break
    if inc is None:
        return {"measured": len(tried), "final_ms": None, "reason": "nothing verified",
                "order": [space.index(c) for c in tried]}
    stale, reason, r = 0, "", 0
    while True:
        if rounds is not None and r >= rounds:
            reason = f"{rounds} rounds"
            break
        why = stop(inc, tried) if stop else ""
        if why:
            reason = f"stop: {why}"
            break
        c = pick(inc, tried)
        if c is None:
            reason = "space exhausted"
            break
        tried.append(c)
        r += 1
        row = ok.get(_key(c))
        if row and _beats(row, inc):
            inc, stale = row, 0
        else:
            stale += 1
            if stale >= PATIENCE:
                reason = f"{PATIENCE} rounds without a gain"
                break
    return {"measured": len(tried), "final_ms": inc["time_ms"], "final_index": inc["index"],
            "reason": reason, "order": [space.index(c) for c in tried]}


def replay(spec, space, rows, policy, rounds=None):
    from kforge.providers.builtin.analyst import analyze_profile
    from kforge.providers.builtin.analysis import analyze_region
    from kforge.targets import get_target
    target = get_target("cuda")
    shape = analyze_region(spec)
    ok = {_key(r["config"]): r for r in rows if r.get("correct") and r.get("time_ms")}
    if not ok:
        return None
    best = min(r["time_ms"] for r in ok.values())
    memo = {}

    def analysis(inc, tried):
        """The builtin analyst's answer to the incumbent's profile, as the loop hands it."""
        k = (inc["index"], tuple(_key(c) for c in tried))
        if k not in memo:
            prof = dict(inc.get("profile") or {"config": inc["config"]},
                        time_ms=inc["time_ms"], tried_configs=list(tried))
            memo[k] = analyze_profile(spec, target, policy, shape, space, prof, tried)
        return memo[k]

    def fixed(inc, tried):
        seen = {_key(c) for c in tried}
        return next((c for c in space if _key(c) not in seen), None)

    def guided(inc, tried):
        seen = {_key(c) for c in tried}
        for rec in analysis(inc, tried):
            if rec.startswith("config: "):
                c = json.loads(rec[len("config: "):].split("  #")[0])
                if _key(c) not in seen and any(_key(c) == _key(s) for s in space):
                    return next(s for s in space if _key(s) == _key(c))
        return fixed(inc, tried)

    def stop(inc, tried):
        return next((rec[len("stop: "):] for rec in analysis(inc, tried)
                     if rec.startswith("stop: ")), "")

    blind = _search(space, ok, fixed, rounds=rounds)
    prof = _search(space, ok, guided, stop, rounds=rounds)
    curve, inc = [], None
    for c in space:
        r = ok.get(_key(c))
        if r and (inc is None or r["time_ms"] < inc):
            inc = r["time_ms"]
        curve.append(inc)
    reach = next((n + 1 for n, t in enumerate(curve) if t is not None and t <= best * (1 + TOL)),
                 None)
    for s in (blind, prof):
        s["ratio_to_best"] = None if s["final_ms"] is None else s["final_ms"] / best
    met = prof["final_ms"] is not None and blind["final_ms"] is not None and (
        (prof["final_ms"] <= blind["final_ms"] * (1 + TOL)
         and prof["measured"] <= blind["measured"] / 2)
        or (prof["final_ms"] < blind["final_ms"] * (1 - TOL)
            and prof["measured"] <= blind["measured"]))
    return {"space": len(space), "valid": len(ok), "best_ms": best,
            "best_config": min(ok.values(), key=lambda r: r["time_ms"])["config"],
            "blind": blind, "profile": prof, "exhaustive": {"measured": len(space),
                                                            "final_ms": best},
            "first_reach": reach, "goal_met": met}


def table(results) -> str:
    lines = ["| workload | policy | space | best ms | blind measured | blind final (x best) "
             "| profile measured | profile final (x best) | profile stop | first reach | goal |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    met = n = 0
    for r in results:
        rep = r.get("search")
        if not rep:
            lines.append(f"| {r['workload']} | {r['policy']} | "
                         f"{r.get('skipped', 'no valid kernel')} | | | | | | | | |")
            continue
        b, p = rep["blind"], rep["profile"]
        n += 1
        met += rep["goal_met"]
        why = p["reason"].split(":")[0] if p["reason"].startswith("stop") else p["reason"]
        if p["reason"].startswith("stop: the incumbent runs"):
            why = "stop (floor)"
        elif "the model explains the incumbent" in p["reason"]:
            why = "stop (model explains)"
        elif p["reason"].startswith("stop"):
            why = "stop (model)"
        lines.append(
            f"| {r['workload']} | {r['policy']} | {rep['space']} | {rep['best_ms']:.4f} | "
            f"{b['measured']} | {b['final_ms']:.4f} ({b['ratio_to_best']:.3f}) | "
            f"{p['measured']} | {p['final_ms']:.4f} ({p['ratio_to_best']:.3f}) | {why} | "
            f"{rep['first_reach']} | {'met' if rep['goal_met'] else 'not met'} |")
    lines.append(f"\ngoal met on {met} of {n} rows")
    suite = suite_summary(results)
    if suite:
        lines.append(
            f"suite: profile-driven measured {suite['profile_measured']} configurations where "
            f"blind measured {suite['blind_measured']} ({suite['measured_fraction']:.0%}); "
            f"final kernel time, blind's over the profile-driven's: geomean "
            f"{suite['final_geomean']:.3f}x; faster on {suite['faster']}, the same on "
            f"{suite['same']}, slower on {suite['slower']} (within {TOL:.0%} is the same)")
    return "\n".join(lines)


def suite_summary(results) -> dict | None:
    """The goal read over a whole set of regions: the configurations both searches measured,
    added up, and the geomean of blind's final kernel time over the profile-driven one's."""
    rows = [r["search"] for r in results if r.get("search")
            and r["search"]["blind"]["final_ms"] and r["search"]["profile"]["final_ms"]]
    if not rows:
        return None
    pairs = [(s["blind"]["final_ms"], s["profile"]["final_ms"]) for s in rows]
    faster = sum(p < b * (1 - TOL) for b, p in pairs)     # the rows' rule (replay's `met`)
    slower = sum(p > b * (1 + TOL) for b, p in pairs)
    pm = sum(s["profile"]["measured"] for s in rows)
    bm = sum(s["blind"]["measured"] for s in rows)
    return {"rows": len(rows), "profile_measured": pm, "blind_measured": bm,
            "measured_fraction": pm / bm,
            "final_geomean": math.exp(sum(math.log(b / p) for b, p in pairs) / len(pairs)),
            "faster": faster, "slower": slower, "same": len(pairs) - faster - slower}


def _spec_dirs():
    dirs = os.environ.get("KF_SPEC_DIRS", "benchmarks/profile/specs").split(",")
    return [d if os.path.isabs(d) else os.path.join(ROOT, d) for d in dirs if d]


def _find_spec(name):
    for d in _spec_dirs():
        path = os.path.join(d, f"{name}.json")
        if os.path.exists(path):
            return path
    raise SystemExit(f"bench_tuner: no spec {name}.json in {', '.join(_spec_dirs())} "
                     "(set KF_SPEC_DIRS)")


def replay_file(path, rounds=None):
    """The searches replayed over a recorded tuner.json (CPU only)."""
    from kforge.providers.builtin import config_space
    from kforge.spec import load_spec
    with open(path) as f:
        res = json.load(f)
    out = []
    for r in res["results"]:
        if "rows" not in r:
            out.append(r)
            continue
        spec = load_spec(_find_spec(r["workload"]))
        space = config_space(spec, "cuda", r["policy"])
        recorded = [row["config"] for row in r["rows"]]
        if [_key(c) for c in space] != [_key(c) for c in recorded]:
            # the builtin's space changed since the recording: replay the recorded order
            space = recorded
        out.append(dict(r, search=replay(spec, space, r["rows"], r["policy"], rounds)))
    return dict(res, results=out, replayed=time.strftime("%Y-%m-%d"))


def main():
    import torch
    specs = sorted(p for d in _spec_dirs() for p in glob.glob(os.path.join(d, "*.json")))
    if os.environ.get("KF_SPECS"):
        specs = [s for s in specs if os.path.basename(s)[:-5] in os.environ["KF_SPECS"].split(",")]
    from kforge.providers.builtin import candidates, config_space
    from kforge.spec import load_spec
    from kforge.targets import get_target
    work = [(s, p) for p in POLICIES for s in specs]
    jobs = []
    for s, p in work:
        spec = load_spec(s)
        for i, c in enumerate(candidates(spec, get_target("cuda"), p, config_space(spec, "cuda", p))):
            jobs.append((s, c.source, f"{os.path.basename(s)[:-5]}_{p}_{i}"))
    res = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "tol": TOL, "budget_s": BUDGET, "results": [],
           "precompile": []}
    import triton
    res["triton"] = triton.__version__
    t = time.time()
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=min(14, os.cpu_count() or 4), mp_context=ctx) as pool:
        futs = [pool.submit(_precompile, j) for j in jobs]
        done, pending = cf.wait(futs, timeout=max(10, 0.5 * BUDGET))
        for f in pending:
            f.cancel()
        for f in done:
            res["precompile"].append(f.result())
    print(f"precompiled {len(jobs)} candidates in {time.time() - t:.0f} s", flush=True)
    deadline = T0 + BUDGET
    for s, p in work:
        name = os.path.basename(s)[:-5]
        entry = {"workload": name, "policy": p, "spec_dir": os.path.basename(os.path.dirname(s))}
        if time.time() > deadline:
            res["results"].append(dict(entry, skipped="budget"))
            continue
        t = time.time()
        spec, space, rows = measure(s, p, deadline)
        try:
            rep = replay(spec, space, rows, p)
        except Exception as exc:   # noqa: BLE001 - the measurements are kept
            rep = None
            entry["replay_error"] = f"{type(exc).__name__}: {exc}"
        res["results"].append(dict(entry, measure_s=round(time.time() - t, 1), rows=rows,
                                   search=rep))
        if rep:
            print(f"{name:28s} {p:6s} space {rep['space']:3d} best {rep['best_ms']:.4f} ms  "
                  f"blind {rep['blind']['measured']} -> {rep['blind']['final_ms']:.4f}  "
                  f"profile {rep['profile']['measured']} -> {rep['profile']['final_ms']:.4f}",
                  flush=True)
        with open(os.path.join(OUT, "tuner.json"), "w") as f:
            json.dump(res, f)
    print()
    print(table(res["results"]))
    print(f"total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", metavar="TUNER_JSON",
                    help="replay the searches over a recorded tuner.json (no GPU)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="with --replay: an optimization-rounds limit (default: none)")
    ap.add_argument("--json", metavar="OUT_JSON", help="with --replay: write the replay here")
    args = ap.parse_args()
    if args.replay:
        rep = replay_file(args.replay, args.rounds)
        print(table(rep["results"]))
        if args.json:
            # the searches only: the measurements stay in the recorded file
            rep["results"] = [{k: v for k, v in r.items() if k != "rows"}
                              for r in rep["results"]]
            rep["replay_of"] = os.path.basename(args.replay)
            with open(args.json, "w") as f:
                json.dump(rep, f, indent=1)
    else:
        main()
