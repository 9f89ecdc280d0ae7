"""Time packages on the GPU as `kforge bench` times KForge (triton.testing.do_bench: CUDA
events, L2 flushed before each run, median), each bound to the weights of its model file's
module, and print one line each: what raising regions to strict (`kforge tune --check`) costs.

    PYTHONPATH=python python3 benchmarks/llm/time_package.py PKG [PKG ...]   (on the device)
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
    return (f"{pkg}: {ms:.3f} ms a call, {len(model.kernels)} kernel regions, "
            f"{len(raised)} raised to strict, {len(finer)} taken to a finer scheme")


for pkg in sys.argv[1:]:
    print(time_package(pkg), flush=True)
    torch.cuda.empty_cache()
