"""Profile-driven against blind search, on the GEMM suite, on the H200 (issue 14, item 3).

    PYTHONUNBUFFERED=1 python3 benchmarks/profile/bench_tuner.py        (on the device machine)

For each GEMM region of benchmarks/profile/specs/ (kernel specs exported here from the suite's
workloads at full size) and each policy (KF_POLICIES, default "bf16,strict"):
 1. every configuration of the builtin's space is compiled (a process pool fills Triton's
    cache), checked once against the fp64 reference at the policy's tolerance, timed with
    triton.testing.do_bench (median of all samples, L2 flushed per run), and profiled
    (compile metadata and code facts of its kernels, roofline position);
 2. the two searches are replayed over those measurements:
    blind    the space in the builtin's fixed order (what the builtin measured before);
    profile  start at the space's first configuration; then always measure the configuration
             that kforge.providers.builtin.analyst.rank_configs puts first, given the profile
             of the best kernel so far (the loop's incumbent) and the configurations tried;
    each counts the configurations it measured until its best is within TOL (2 %, the loop's
    MIN_GAIN) of the best of the whole space.
Writes $OUT/tuner.json (every measurement, both sequences) and prints a table last.
Env: KF_BUDGET_S (soft budget for the measurements, default 200), KF_POLICIES, KF_SPECS.
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


def replay(spec, space, rows, policy):
    from kforge.providers.builtin.analyst import rank_configs
    from kforge.providers.builtin.kernels import analyze_region
    shape = analyze_region(spec)
    ok = {json.dumps(r["config"], sort_keys=True): r for r in rows
          if r.get("correct") and r.get("time_ms")}
    if not ok:
        return None
    best = min(r["time_ms"] for r in ok.values())
    goal = best * (1 + TOL)

    def curve(order_fn):
        tried, seq, inc = [], [], None
        while len(tried) < len(space):
            c = order_fn(tried, inc)
            if c is None:
                break
            tried.append(c)
            r = ok.get(json.dumps(c, sort_keys=True))
            if r and (inc is None or r["time_ms"] < inc["time_ms"]):
                inc = r
            seq.append(inc["time_ms"] if inc else None)
        reach = next((n + 1 for n, t in enumerate(seq) if t is not None and t <= goal), None)
        return seq, reach, [c for c in tried]

    def blind(tried, inc):
        return space[len(tried)] if len(tried) < len(space) else None

    def guided(tried, inc):
        if not tried:
            return space[0]
        base = inc["profile"] if inc else {"config": tried[-1]}
        ranked = rank_configs(shape, space, base, tried)
        return ranked[0][0] if ranked else None

    b_seq, b_reach, _ = curve(blind)
    p_seq, p_reach, p_order = curve(guided)
    return {"space": len(space), "valid": len(ok), "best_ms": best,
            "best_config": min(ok.values(), key=lambda r: r["time_ms"])["config"],
            "blind": {"reach": b_reach, "curve": b_seq},
            "profile": {"reach": p_reach, "curve": p_seq,
                        "order": [space.index(c) for c in p_order]},
            "half_of_space": p_reach is not None and p_reach <= len(space) / 2,
            "half_of_blind_reach": p_reach is not None and b_reach is not None
            and p_reach <= max(1, b_reach / 2)}


def main():
    import torch
    specs = sorted(glob.glob(os.path.join(ROOT, "benchmarks/profile/specs/*.json")))
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
        if time.time() > deadline:
            res["results"].append({"workload": name, "policy": p, "skipped": "budget"})
            continue
        t = time.time()
        spec, space, rows = measure(s, p, deadline)
        rep = replay(spec, space, rows, p)
        res["results"].append({"workload": name, "policy": p, "measure_s": round(time.time() - t, 1),
                               "rows": rows, "search": rep})
        if rep:
            print(f"{name:24s} {p:6s} space {rep['space']:3d} valid {rep['valid']:3d} best "
                  f"{rep['best_ms']:.4f} ms  blind reach {rep['blind']['reach']}  profile reach "
                  f"{rep['profile']['reach']}", flush=True)
        with open(os.path.join(OUT, "tuner.json"), "w") as f:
            json.dump(res, f)
    print("\n| workload | policy | space | valid | best ms | blind reaches at | profile-driven reaches at | <= half space | <= half blind |")
    for r in res["results"]:
        rep = r.get("search")
        if not rep:
            print(f"| {r['workload']} | {r['policy']} | {r.get('skipped', 'no valid kernel')} |")
            continue
        print(f"| {r['workload']} | {r['policy']} | {rep['space']} | {rep['valid']} | {rep['best_ms']:.4f} | "
              f"{rep['blind']['reach']} | {rep['profile']['reach']} | {rep['half_of_space']} | "
              f"{rep['half_of_blind_reach']} |")
    print(f"total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
