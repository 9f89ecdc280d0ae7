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


def zoo_model_on_gpu(name: str):
    """A zoo model (weights under seed 0, as `kforge bench` builds them) and its inputs (seed 1),
    on the GPU."""
    from kforge.runtime import load_model_file
    path = ROOT / "benchmarks" / "models" / f"{name}.py"
    model, _ = load_model_file(path, with_model=True, seed=0)
    _, inputs = load_model_file(path, with_model=False, seed=1)
    return model.cuda().eval(), [t.cuda() for t in inputs]


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


# KForge routes: environment each package is loaded under. "kforge" is the runtime's default
# (verified kernels, CUDA graphs); the no-kernel routes are issue 11's goal 2: every region on
# its aten program (compiled by torch.compile, or op by op as eager runs them) or on its linalg
# reference compiled (the path before aten programs).
ROUTES = {
    "kforge": ({}, True),
    "kforge_no_graphs": ({"KFORGE_CUDA_GRAPHS": "0"}, True),
    "kforge_aten_compiled": ({}, False),
    "kforge_aten_eager": ({"KFORGE_COMPILE_REFERENCES": "0"}, False),
    "kforge_aten_eager_no_graphs": ({"KFORGE_COMPILE_REFERENCES": "0",
                                     "KFORGE_CUDA_GRAPHS": "0"}, False),
    "kforge_linalg_reference_compiled": ({"KFORGE_ATEN_REGIONS": "0"}, False),
}


def _load(pkg, model, env: dict, use_kernels: bool):
    from kforge.bench.workloads import scoped_environ
    from kforge.runtime import load_package
    with scoped_environ(env):
        return load_package(pkg, module=model, target="cuda", tune=False,
                            use_kernels=use_kernels)


def measure(name: str, pkg: Path, policy: str) -> dict:
    from kforge.coverage import merge_profile, plan_coverage, profile_plan
    from kforge.verify.policy import get_policy
    model, inputs = zoo_model_on_gpu(name)
    row = {"model": name, "policy": policy, "inputs": [list(t.shape) for t in inputs]}
    pol = get_policy(policy)
    with torch.no_grad():
        row["eager"] = cuda_time_ms(lambda: model(*inputs))
        ref = model(*inputs)
        for label, mode in (("torch_compile", None), ("torch_compile_cudagraphs",
                                                      "reduce-overhead")):
            try:
                torch._dynamo.reset()
                t0 = time.monotonic()
                tc = torch.compile(model, mode=mode)
                tc(*inputs)
                row[f"{label}_compile_s"] = round(time.monotonic() - t0, 1)
                row[label] = cuda_time_ms(lambda: tc(*inputs))
            except Exception as exc:  # noqa: BLE001 - a baseline that fails is recorded
                row[label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        torch._dynamo.reset()
    scale = max(1.0, float(ref.double().pow(2).mean().sqrt()))
    wanted = os.environ.get("ZOO_ROUTES")          # a comma-separated subset, to save time
    routes = {r: v for r, v in ROUTES.items() if not wanted or r in wanted.split(",")}
    fast = None
    for route, (env, use_kernels) in routes.items():
        try:
            compiled = _load(pkg, model, env, use_kernels)
            with torch.no_grad():
                t0 = time.monotonic()
                got = compiled(*inputs)
                torch.cuda.synchronize()
                row[f"{route}_first_call_s"] = round(time.monotonic() - t0, 1)
                row[route] = cuda_time_ms(lambda: compiled(*inputs))
            err = (got.double() - ref.double()).abs()
            row[f"{route}_max_abs_err"] = float(err.max())
            row[f"{route}_correct"] = bool(torch.allclose(
                got.double(), ref.double(), atol=pol.atol * scale, rtol=pol.rtol))
            if compiled.graphs is not None:
                row[f"{route}_graphs"] = {"captured": len(compiled.graphs.captured),
                                          "skipped": list(compiled.graphs.skipped.values())}
            if not use_kernels:
                row["aten_regions"] = len(compiled.aten_regions)
            if route == "kforge":
                fast = compiled
        except Exception as exc:  # noqa: BLE001 - one route's failure is recorded
            row[route] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}",
                          "traceback": traceback.format_exc()[-1500:]}
    if fast is not None:
        row["correct"] = row.get("kforge_correct")
        row["max_abs_err"] = row.get("kforge_max_abs_err")
        verified = set(fast.kernels)
        cov = plan_coverage(fast.package.plan, fast.package.specs, verified)
        row["coverage"] = merge_profile(cov, profile_plan(fast, inputs, repeats=2))
        row["regions"] = len(fast.package.region_hashes())
        row["regions_on_kernels"] = len(verified)
    e = row["eager"]["median_ms"]
    best_tc = min((row[k]["median_ms"] for k in ("torch_compile", "torch_compile_cudagraphs")
                   if "median_ms" in row.get(k, {})), default=None)
    for route in routes:
        if "median_ms" in row.get(route, {}):
            row[f"{route}_vs_eager"] = e / row[route]["median_ms"]
            if best_tc:
                row[f"{route}_vs_best_torch_compile"] = best_tc / row[route]["median_ms"]
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
