"""Host time of one package kernel's `launch`, piece by piece (a diagnostic; device machine).

    PYTHONPATH=python python3 benchmarks/gemm/host_overhead.py PKG...

For each package (benchmarks/build_packages.sh output, one region), its kernel module's
`launch` is called N times without waiting for the GPU and the host time per call is taken
(perf_counter; the GPU work of N calls is far longer, so the queue never blocks for N=100);
then through kforge.fastlaunch (the runtime's path), checked equal to it; then the same
for its pieces: the output and scratch allocations, `triton.set_allocator`, and
each Triton launch alone (the arguments of the last real call). Prints and writes
$OUT/host_overhead.json.
"""
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

N = 100


def per_call_us(fn, n=N) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return round(host, 1)


def main() -> None:
    out = {}
    for pkg in map(Path, sys.argv[1:]):
        manifest = json.loads((pkg / "manifest.json").read_text())
        entry = next(iter(manifest["kernels"].values()))
        path = pkg / entry["source"]
        spec = importlib.util.spec_from_file_location(f"ho_{pkg.name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        src = path.read_text()
        sig = re.search(r"\ndef launch\(([^)]*)\)", src).group(1).split(", ")
        plan = json.loads((pkg / "linked_plan.json").read_text())
        # the launch takes the plan step's operands in their order (not the inputs')
        by_name = {i["name"]: (torch.randn(i["shape"], device="cuda"), i["weight"])
                   for i in plan["inputs"]}
        operands = [by_name[o] for o in plan["steps"][0]["operands"]]
        args = [t for t, _ in operands]
        weights = {i: t for i, (t, w) in enumerate(operands) if w}
        if hasattr(mod, "prepare_weights"):
            weights = mod.prepare_weights(weights)
        args = [weights.get(i, a) for i, a in enumerate(args)]
        rec = {"args": len(sig), "launch_us": per_call_us(lambda: mod.launch(*args))}
        from kforge import fastlaunch
        fast = fastlaunch.fast_module(mod)
        rec["fast_launch_us"] = per_call_us(lambda: fast.launch(*args))
        out_a, out_b = mod.launch(*args), fast.launch(*args)
        rec["fast_equal"] = all(torch.equal(a, b) for a, b in zip(out_a, out_b))
        rec["empty_us"] = per_call_us(lambda: torch.empty((4096, 4096), device="cuda"))
        import triton
        rec["set_allocator_us"] = per_call_us(lambda: triton.set_allocator(
            lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8)))
        # each Triton launch of `launch`, with its own arguments: trace them once
        calls = []
        for name in dir(mod):
            fn = getattr(mod, name)
            if hasattr(fn, "run") and hasattr(fn, "__getitem__") and name.startswith("kforge_"):
                def wrap(grid, fn=fn, name=name):
                    def go(*a, **k):
                        calls.append((name, fn, grid, a, k))
                        return fn[grid](*a, **k)
                    return go

                class Hook:
                    def __init__(self, fn, name):
                        self.fn, self.name = fn, name

                    def __getitem__(self, grid):
                        return wrap(grid, self.fn, self.name)
                setattr(mod, name, Hook(fn, name))
        mod.launch(*args)
        for name, fn, grid, a, k in calls:
            rec[f"{name}_us"] = per_call_us(lambda: fn[grid](*a, **k))
        out[pkg.name] = rec
        print(pkg.name, rec, flush=True)
    od = Path(os.environ.get("OUT", "."))
    od.mkdir(parents=True, exist_ok=True)
    (od / "host_overhead.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
