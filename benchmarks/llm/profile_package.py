"""Where a package's step goes, kernel by kernel, beside the bf16 user's route (issue 12's
"profile-based explanation"): the package under CompiledModel and its model cast to bf16 under
torch.compile (default mode), each run under torch.profiler in the same process.

    PYTHONPATH=python python3 benchmarks/llm/profile_package.py PKG [--runs 3] [--json OUT.json]
        [--no-compiled]

(on the device). For each route: the CUDA time of every kernel name summed over the profiled
runs and divided by their number (ms a step), grouped by kind (the names tell: KForge's own
GEMM and rows kernels, the split / cast passes, attention and its k / v preparation, cuBLAS,
Inductor's fused Triton kernels, flash attention, copies), then the twenty largest names. The
step's wall time (CUDA events, no profiler) is printed beside the kernel sum: their difference
is the launch gaps.
"""
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from kforge.modelcheck import bound_model  # noqa: E402
from kforge.package import open_package  # noqa: E402
from kforge.runtime import CompiledModel  # noqa: E402

# (kind, pattern on the kernel's name), first match wins
KINDS = [
    ("split/cast pass", r"_split_[ab]\b|_cast_[ab]\b|_split_[ab]$|_cast_[ab]$"),
    ("attention prep", r"_prep_k16|_prep_v16"),
    ("attention", r"_attn_fwd|flash|fmha|attention|sdpa|cudnn.*mha"),
    ("kforge moe", r"^_moe_"),
    ("kforge gemm", r"^kforge_region_.*_gemm"),
    ("kforge rows", r"^kforge_region_.*_rows"),
    ("kforge other", r"^kforge_|^_kforge|^kforge"),
    ("cublas gemm", r"^(sm\d+_xmma|nvjet|cutlass|gemm|ampere|sm90|.*cublas)"),
    ("inductor fused", r"^triton_(poi|red|per|tem)_"),
    ("copy/fill", r"^(void at::native::|Memcpy|Memset|.*elementwise_kernel|.*vectorized)"),
]


def kind_of(name: str) -> str:
    for kind, pat in KINDS:
        if re.search(pat, name):
            return kind
    return "other"


def _wall_ms(fn, runs: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / runs


def profile_route(label: str, fn, runs: int) -> dict:
    with torch.no_grad():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        wall = _wall_ms(fn)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                fn()
            torch.cuda.synchronize()
    per_name: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        per_name[ev.name] += ev.device_time_total / 1000.0 / runs
        calls[ev.name] += 1
    kinds: dict[str, float] = defaultdict(float)
    for name, ms in per_name.items():
        kinds[kind_of(name)] += ms
    total = sum(per_name.values())
    print(f"\n== {label}: {wall:.3f} ms a step (CUDA events), kernels {total:.3f} ms "
          f"(launch gaps and idle {wall - total:.3f} ms)", flush=True)
    for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<18} {ms:9.3f} ms  {100 * ms / total:5.1f} %")
    print("  largest kernels (ms a step, calls a step):")
    for name, ms in sorted(per_name.items(), key=lambda kv: -kv[1])[:20]:
        print(f"    {ms:8.3f}  {calls[name] // runs:3d}x  {name[:110]}")
    return {"label": label, "wall_ms": wall, "kernel_ms": total, "kinds": dict(kinds),
            "kernels": {n: {"ms": ms, "calls": calls[n] // runs} for n, ms in per_name.items()}}


def main(argv: list[str]) -> int:
    runs, out, compiled, pkgs = 3, None, True, []
    it = iter(argv)
    for a in it:
        if a == "--runs":
            runs = int(next(it))
        elif a == "--json":
            out = next(it)
        elif a == "--no-compiled":
            compiled = False
        else:
            pkgs.append(a)
    if not pkgs:
        print(__doc__)
        return 2
    results = []
    for pkg in pkgs:
        package = open_package(pkg)
        _, weights, inputs = bound_model(package, package.target)
        model = CompiledModel(package, weights, package.target)
        results.append(profile_route(f"kforge {pkg}", lambda: model.run(inputs), runs))
        served, ran = getattr(model, "shared_passes", (0, 0))
        print(f"  operand passes a run: {ran} run, {served} served from another region's")
        results[-1]["shared_passes"] = {"run": ran, "served": served}
        del model, weights
        torch.cuda.empty_cache()
    if compiled:
        package = open_package(pkgs[0])
        module, _, inputs = bound_model(package, package.target)
        module = module.bfloat16().eval()
        inputs = [t.bfloat16() if t.is_floating_point() else t for t in inputs]
        torch._dynamo.reset()
        fn = torch.compile(module)
        results.append(profile_route("torch.compile, bf16 model (default mode)",
                                     lambda: fn(*inputs), runs))
    if out:
        Path(out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
