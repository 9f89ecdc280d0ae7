"""Zoo models on the GPU: PyTorch eager, torch.compile, KForge, and KForge with every region on
its reference (the fallback path), timed in one process; KForge checked against eager.

Runs where only torch and triton are installed (the H200 machine), on packages compiled
elsewhere (`benchmarks/build_packages.sh benchmarks/models/*.py` with KFORGE_ZOO_SIZE) and
verified here first (`python -m kforge.bench.packages --tune`). Each package is bound to the live
module built from the zoo file (weights under seed 0, as `kforge bench` does), so weights need
not travel.

    KFORGE_ZOO_SIZE=real python benchmarks/zoo/measure_zoo.py --packages .carry/zoo/strict \
        --out $OUT/zoo.json [llama bert ...]

Per model: median milliseconds of each route (CUDA events, warm-up first) — eager, torch.compile,
KForge, and KForge with no kernels: every region on its aten program compiled (the runtime's
fallback path), the aten programs run op by op (KFORGE_COMPILE_REFERENCES=0), and the linalg
references compiled (KFORGE_ATEN_REGIONS=0) — the KForge error
against eager at the policy's tolerance, and one profiled KForge run (a timer around every
host-plan step) giving the share of time in verified kernels, region references, fallback ops
and host steps, and the time of each fallback op.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))


def cuda_time_ms(fn, warmup: int = 3, reps: int = 10) -> dict:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "reps": reps}


def measure(name: str, pkg: Path, policy: str) -> dict:
    from kforge.coverage import merge_profile, plan_coverage, profile_plan
    from kforge.runtime import load_model_file, load_package
    from kforge.verify.policy import get_policy
    path = ROOT / "benchmarks" / "models" / f"{name}.py"
    model, _ = load_model_file(path, with_model=True, seed=0)
    _, inputs = load_model_file(path, with_model=False, seed=1)
    model = model.cuda().eval()
    inputs = [t.cuda() for t in inputs]
    row = {"model": name, "policy": policy, "inputs": [list(t.shape) for t in inputs]}
    with torch.no_grad():
        row["eager"] = cuda_time_ms(lambda: model(*inputs))
        ref = model(*inputs)
        t0 = time.monotonic()
        compiled_tc = torch.compile(model)
        compiled_tc(*inputs)
        row["compile_s"] = round(time.monotonic() - t0, 1)
        row["torch_compile"] = cuda_time_ms(lambda: compiled_tc(*inputs))
    fast = load_package(pkg, module=model, target="cuda", tune=False)
    # the routes of a package whose regions have no kernel (issue 11's goal 2): the regions'
    # aten programs compiled (the runtime's default), the same run op by op as eager runs them,
    # and the older path, the linalg references compiled
    routes = {"kforge_aten_compiled": {},
              "kforge_aten_eager": {"KFORGE_COMPILE_REFERENCES": "0"},
              "kforge_linalg_reference_compiled": {"KFORGE_ATEN_REGIONS": "0"}}
    wanted = os.environ.get("ZOO_ROUTES")          # a comma-separated subset, to save time
    if wanted:
        routes = {r: env for r, env in routes.items() if r in wanted.split(",")}
    without = {}
    for route, env in routes.items():
        os.environ.update(env)
        try:
            without[route] = load_package(pkg, module=model, target="cuda", tune=False,
                                          use_kernels=False)
        finally:
            for k in env:
                os.environ.pop(k)
    row["aten_regions"] = max((len(c.aten_regions) for c in without.values()), default=0)
    with torch.no_grad():
        t0 = time.monotonic()
        out = fast(*inputs)
        row["kforge_first_call_s"] = round(time.monotonic() - t0, 1)
        row["kforge"] = cuda_time_ms(lambda: fast(*inputs))
        for route, compiled in without.items():
            t0 = time.monotonic()
            got = compiled(*inputs)
            row[f"{route}_first_call_s"] = round(time.monotonic() - t0, 1)
            row[route] = cuda_time_ms(lambda: compiled(*inputs))
            row[f"{route}_max_abs_err"] = float((got.double() - ref.double()).abs().max())
    pol = get_policy(policy)
    scale = max(1.0, float(ref.double().pow(2).mean().sqrt()))
    err = (out.double() - ref.double()).abs()
    row["max_abs_err"] = float(err.max())
    row["correct"] = bool(torch.allclose(out.double(), ref.double(), atol=pol.atol * scale,
                                         rtol=pol.rtol))
    verified = set(fast.kernels)
    cov = plan_coverage(fast.package.plan, fast.package.specs, verified)
    prof = profile_plan(fast, inputs, repeats=2)
    row["coverage"] = merge_profile(cov, prof)
    row["regions"] = len(fast.package.region_hashes())
    row["regions_on_kernels"] = len(verified)
    e = row["eager"]["median_ms"]
    row["speedup_vs_eager"] = e / row["kforge"]["median_ms"]
    row["speedup_vs_compile"] = row["torch_compile"]["median_ms"] / row["kforge"]["median_ms"]
    for route in routes:
        row[f"{route}_vs_eager"] = e / row[route]["median_ms"]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="zoo model names (default: every package)")
    p.add_argument("--packages", type=Path, required=True, help="DIR/<model>/ packages")
    p.add_argument("--policy", default="strict")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    names = args.models or sorted(d.name for d in args.packages.iterdir() if d.is_dir())
    rows = []
    for name in names:
        pkg = args.packages / name
        print(f"== {name}", flush=True)
        try:
            row = measure(name, pkg, args.policy)
        except Exception as exc:      # noqa: BLE001 - one model's failure is a recorded row
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-2000:]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("coverage", "traceback")}),
              flush=True)
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                        "torch": torch.__version__,
                                        "date": time.strftime("%Y-%m-%d"),
                                        "size": os.environ.get("KFORGE_ZOO_SIZE", "small"),
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
