"""Time packages on the GPU as `kforge bench` times KForge (triton.testing.do_bench: CUDA
events, L2 flushed before each run, median), each bound to the weights of its model file's
module, and print one line each: what raising regions to strict (`kforge tune --check`) costs.

    PYTHONPATH=python python3 benchmarks/llm/time_package.py [--compiled] PKG [PKG ...]

(on the device). --compiled: then also the first package's model cast to bf16 under both
torch.compile modes, timed the same way in the same process.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402
import triton  # noqa: E402

from kforge.modelcheck import bound_model  # noqa: E402
from kforge.package import open_package  # noqa: E402
from kforge.runtime import CompiledModel  # noqa: E402


def time_package(pkg: str) -> str:
    package = open_package(pkg)
    _, weights, inputs = bound_model(package, package.target)
    model = CompiledModel(package, weights, package.target)
    with torch.no_grad():
        ms = triton.testing.do_bench(lambda: model.run(inputs), warmup=200, rep=1000)
    raised = package.manifest.get("strict_regions") or {}
    finer = package.manifest.get("finer_schemes") or {}
    served, ran = getattr(model, "shared_passes", (0, 0))
    return (f"{pkg}: {ms:.3f} ms a call, {len(model.kernels)} kernel regions, "
            f"{len(raised)} raised to strict, {len(finer)} taken to a finer scheme, "
            f"operand passes {ran} run + {served} served from another region's")


def time_compiled(pkg: str) -> None:
    """The route a bf16 user takes: the package's model cast to bf16 (float inputs too) under
    torch.compile, Inductor's default mode and max-autotune-no-cudagraphs, timed alike."""
    package = open_package(pkg)
    module, _, inputs = bound_model(package, package.target)
    module = module.bfloat16().eval()
    inputs = [t.bfloat16() if t.is_floating_point() else t for t in inputs]
    for mode in ("default", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        fn = torch.compile(module, mode=None if mode == "default" else mode)
        with torch.no_grad():
            fn(*inputs)
            ms = triton.testing.do_bench(lambda: fn(*inputs), warmup=200, rep=1000)
        print(f"torch.compile[bf16 model, {mode}]: {ms:.3f} ms a call", flush=True)
        del fn
        torch.cuda.empty_cache()


args = [a for a in sys.argv[1:] if a != "--compiled"]
for pkg in args:
    try:
        print(time_package(pkg), flush=True)
    except Exception as exc:  # one package that cannot run must not cost the others' timings
        print(f"{pkg}: not timed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
              flush=True)
    torch.cuda.empty_cache()
if "--compiled" in sys.argv[1:] and args:
    time_compiled(args[0])
