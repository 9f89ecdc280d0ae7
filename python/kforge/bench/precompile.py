"""Warm Inductor's caches in parallel before a timed run, and record cold compile times.

torch.compile spends most of its first call on the CPU (tracing, lowering, compiling Triton
kernels). On a GPU machine with many cores, compiling every workload in parallel processes
first, then timing them one at a time, saves most of that wall time: the timed run's compile
hits the shared caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR). The cold compile time of
each workload is written to DIR/<workload>.json, and `kforge bench --compile-times DIR`
reports it instead of the warm one (the report says so).

`--routes bf16,tf32` also warms the compiled matched routes of those policies (kforge.bench.routes:
the model cast to bf16 under Inductor's default mode and max-autotune-no-cudagraphs, the
tf32 compile). max-autotune compiled each candidate kernel of every GEMM in the timed run, 8-38 s
a workload on the H100 (2026-12-07), most of a bf16 run's time. The warm-up processes run
side by side on one GPU, so what they measure is not kept: their autotuning choices (Inductor's
autotune cache) and, for max-autotune, the compiled graph (its FX graph cache, which holds the
chosen GEMM) are not written. The timed run chooses again with the GPU to itself, from
candidate kernels that Triton's and Inductor's code caches already hold. Each route's cold
compile time is recorded under `routes`.

    python -m kforge.bench.precompile --out /tmp/compile-times --jobs 8 [WORKLOADS] [--shard I/N]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import time
from pathlib import Path

from kforge.bench import workloads as wl_mod
from kforge.bench.backends import kforge_env


def compile_one(wl: wl_mod.Workload, out: Path, scale: str, mode: str | None,
                routes: tuple[str, ...] = ()) -> dict:
    """In this process: build the workload on the GPU and time torch.compile's first call;
    then warm the compiled matched routes of the policies `routes` (warm_route)."""
    import torch

    from kforge.targets import local_target
    name = wl.name
    target = local_target()
    model, inputs = wl.instantiate(scale, target.device)
    t0 = time.perf_counter()
    status, reason = "ok", ""
    try:
        compiled = torch.compile(model, mode=mode)
        with torch.no_grad():
            compiled(*inputs)
        target.synchronize()
    except Exception as exc:  # recorded; the timed run reports its own failure
        status, reason = "failed", f"{type(exc).__name__}: {exc}"[:400]
    record = {"workload": name, "status": status, "reason": reason, "scale": scale,
              "compile_s": round(time.perf_counter() - t0, 3), "mode": mode or "default",
              "device": "cpu" if target.interpreter else target.device_name()}
    (out / f"{name}.json").write_text(json.dumps(record) + "\n")
    if routes:      # (the record above stands if this process is stopped at its time limit)
        record["routes"] = {}
        for r in route_warmups(routes):
            record["routes"][r.name] = warm_route(r, model, inputs, target)
            (out / f"{name}.json").write_text(json.dumps(record) + "\n")
    return record


def route_warmups(policies) -> list:
    """The compiled matched routes of `policies` (kforge.bench.routes) that the fp32 compile
    above does not already warm: strict's torch.compile is that compile."""
    from kforge.bench.routes import matched_routes
    out = []
    for policy in policies:
        for r in matched_routes(policy):
            if r.compiled and (r.cast or r.numerics != "fp32" or r.compile_mode):
                out.append(r)
    return out


def warm_route(route, model, inputs, target) -> dict:
    """torch.compile the route's model (as the runner prepares it) and call it once under its
    numerics, without keeping what this process measured: Inductor's autotune cache is not
    written, and under max-autotune neither is the FX graph cache (the compiled graph holds
    the GEMM it chose). The code caches keep the compiled kernels."""
    import torch
    import torch._inductor.config as inductor_config

    from kforge.bench.routes import cast_inputs, numerics, prepare_model
    t0 = time.perf_counter()
    try:
        torch._dynamo.reset()
        prepared = prepare_model(route, model)
        args = cast_inputs(route, inputs)
        with inductor_config.patch(autotune_local_cache=False,
                                   fx_graph_cache=route.compile_mode is None):
            compiled = torch.compile(prepared, mode=route.compile_mode)
            with torch.no_grad(), numerics(route.numerics, target.device):
                compiled(*args)
        target.synchronize()
        status = "ok"
    except Exception as exc:  # noqa: BLE001 - recorded; the timed run reports its own failure
        status = f"failed: {type(exc).__name__}: {exc}"[:400]
    return {"status": status, "compile_s": round(time.perf_counter() - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kforge.bench.precompile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workloads", nargs="*")
    p.add_argument("--out", type=Path, required=True, help="folder for <workload>.json records")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--compile-mode", default=None)
    p.add_argument("--routes", default="", metavar="POLICIES",
                   help="also warm these policies' compiled matched routes (comma-separated: "
                        "bf16, tf32; strict's is the fp32 compile)")
    p.add_argument("--shard", action="append", default=[], metavar="I/N")
    p.add_argument("--timeout", type=float, default=300.0, help="limit per workload, seconds")
    p.add_argument("--deadline", type=float, default=None, metavar="EPOCH",
                   help="start no workload after this time (seconds since the epoch)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # internal: one workload
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    scale = "smoke" if args.smoke else "full"
    routes = tuple(p for p in args.routes.split(",") if p)
    try:
        route_warmups(routes)
    except ValueError as exc:
        p.error(str(exc))
    selected = wl_mod.discover(args.workloads)
    if args.one:
        wl = next(w for w in selected if w.name == args.one)
        return 0 if compile_one(wl, args.out, scale, args.compile_mode,
                                routes)["status"] == "ok" else 1
    if args.shard:
        selected = wl_mod.shards(selected, args.shard)

    def run(w):
        if args.deadline is not None and time.time() > args.deadline:
            return w.name, "not started (deadline)", 0.0
        cmd = [sys.executable, "-m", "kforge.bench.precompile", str(w.path), "--one", w.name,
               "--out", str(args.out)] + (["--smoke"] if args.smoke else []) + \
              (["--compile-mode", args.compile_mode] if args.compile_mode else []) + \
              (["--routes", ",".join(routes)] if routes else [])
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=kforge_env())
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        return w.name, rc, time.perf_counter() - t0

    print(f"precompiling {len(selected)} workloads with torch.compile, {args.jobs} at a time", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for name, rc, wall in pool.map(run, selected):
            print(f"  {name:42s} rc={rc} {wall:6.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
