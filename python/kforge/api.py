"""The Python API: `kforge.compile(model, example_inputs, ...)` and `kforge.load(PKG, module)`."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

import torch


def compile(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], *,
            target: str = "cpu", provider: str = "builtin", precision: str = "strict",
            out: str | os.PathLike | None = None, dynamic_batch: bool = False,
            cache_mode: str = "use", cache_dir: str | os.PathLike | None = None,
            rounds: int = 2, time_budget: float | None = None,
            provider_options: dict | None = None, progress: bool = False,
            workers=None, gpu_share: int = 1):
    """Compile a live module into verified Triton kernels; returns a callable bound to the
    module's own weights (a kforge.runtime.CompiledModel; `.package` is the package on disk).

    `out`: the package directory (default: a directory in the kernel cache named after the
    model's class, target and policy).
    `workers`: where regions are synthesized, as `kforge compile --workers` takes it ("local",
    "local:4", "ray", "ray://head:10001", ...) or a kforge.workers.Executor; `gpu_share`: region
    tasks per GPU on a Ray cluster (docs/scale-out.md)."""
    from kforge.runtime import load_package, use_interpreter
    use_interpreter(target == "cpu")         # before anything imports triton
    from kforge.cache import KernelCache, default_root
    from kforge.build import compile_model
    from kforge.package import RichProgress
    from kforge.synth import SynthOptions
    from kforge.workers import use_workers
    if out is None:
        tag = hashlib.sha256(f"{type(model).__module__}.{type(model).__qualname__}|"
                             f"{[tuple(t.shape) for t in example_inputs]}|{target}|{precision}|"
                             f"{provider}".encode()).hexdigest()[:16]
        out = Path(cache_dir or default_root()) / "packages" / f"{type(model).__name__}-{tag}"
    options = SynthOptions(target=target, precision=precision, provider=provider,
                           provider_options=dict(provider_options or {}), rounds=rounds,
                           time_budget_s=time_budget)
    cache = KernelCache(cache_dir, cache_mode)
    was_training = model.training
    model.eval()
    try:
        with use_workers(workers, gpu_share=gpu_share):
            report = compile_model(model, out, options, cache=cache,
                                   dynamic_batch=dynamic_batch,
                                   example_inputs=tuple(example_inputs),
                                   progress=RichProgress() if progress else None)
    finally:
        model.train(was_training)
    compiled = load_package(out, module=model, target=target)
    compiled.report = report
    return compiled


def load(pkg: str | os.PathLike, module: torch.nn.Module | None = None, *,
         target: str | None = None):
    """Load a compiled package; with `module`, bind it to that live module's weights."""
    from kforge.runtime import load_package
    return load_package(pkg, module=module, target=target)
