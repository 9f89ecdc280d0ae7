"""`kforge compile` from a model: import -> regions -> synth -> link -> report.

The one stage that needs the compile half (the frontend: torch-mlir, MLIR 22.1.8, kforge-opt);
everything after it (kforge.package, kforge.runtime, kforge.tune) needs only torch and triton.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from kforge.cache import KernelCache, atomic_write_text
from kforge.package import ProgressSink, compile_regions, open_package, report_markdown


def compile_model(model, pkg: str | os.PathLike, options, *, cache: KernelCache | None = None,
                  dynamic_batch: bool = False, example_inputs=None,
                  progress: ProgressSink | None = None,
                  on_stage: Callable[[str], None] | None = None) -> dict:
    """`kforge compile`: import -> regions (kforge.frontend, kforge-opt) -> synth -> link.

    `model`: a KernelBench-format .py file, "pkg.module:Class", or an nn.Module instance (then
    `example_inputs` is required)."""
    from kforge.frontend import form_regions, import_model
    say = on_stage or (lambda s: None)
    pkg = Path(pkg)
    pkg.mkdir(parents=True, exist_ok=True)
    timings = {}
    t = time.monotonic()
    say("import")
    imported = import_model(model, pkg / "model.mlir", dynamic_batch=dynamic_batch,
                            example_inputs=example_inputs)
    timings["import"] = round(time.monotonic() - t, 3)
    t = time.monotonic()
    say("regions")
    regions_dir = pkg / "regions"
    form_regions(imported.mlir_path, regions_dir)
    timings["regions"] = round(time.monotonic() - t, 3)
    t = time.monotonic()
    say("aten programs")
    from kforge.aten_regions import build_programs
    build_programs(regions_dir, imported.fx_graph_path)   # before the plan is rewritten below
    timings["aten_programs"] = round(time.monotonic() - t, 3)
    t = time.monotonic()
    from kforge.kernel_fallbacks import promote_regions_dir
    promote_regions_dir(regions_dir)          # attention: one-op regions that get kernels
    from kforge.coverage import check_runnable
    from kforge.spec import load_host_plan
    check_runnable(load_host_plan(regions_dir / "host_plan.json"), str(model))
    timings["regions"] += round(time.monotonic() - t, 3)
    model_path = None
    if not hasattr(model, "forward"):
        text = str(model)
        if text.endswith(".py") or Path(text).is_file():
            model_path = Path(text)
    batch = None
    if dynamic_batch and imported.input_shapes:
        if example_inputs is not None:
            batch = int(example_inputs[0].shape[0])
        elif model_path is not None:
            batch = _example_batch(model_path)
    extra = {"inputs": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in
                        zip(imported.input_names, imported.input_shapes, imported.input_dtypes)],
             "outputs": [{"shape": list(s), "dtype": d} for s, d in
                         zip(imported.output_shapes, imported.output_dtypes)],
             "dynamic_batch": dynamic_batch,
             "ir": {"model": "model.mlir", "outlined": "regions/outlined.mlir",
                    "linked": "model.linked.mlir"}}
    if model_path is None and model is not None and hasattr(model, "forward"):
        extra["model"] = {"origin": f"{type(model).__module__}.{type(model).__qualname__}"}
    say("synth")
    doc = compile_regions(regions_dir, pkg, options, cache=cache,
                          weights_path=imported.weights_path, model_path=model_path,
                          progress=progress, dynamic_size=batch, extra_meta=extra)
    doc["stages"] = {**timings, **doc.get("stages", {})}
    if imported.notes:
        doc["import_notes"] = list(imported.notes)
    say("coverage")
    t = time.monotonic()
    doc["coverage"] = model_coverage(pkg, options.target, example_inputs=example_inputs,
                                     model_path=model_path)
    doc["stages"]["coverage"] = round(time.monotonic() - t, 3)
    if doc["coverage"].get("run_error"):
        print(f"warning: the package's run on the example inputs failed: "
              f"{doc['coverage']['run_error']} (the package is kept; `kforge run "
              f"{pkg} --reference-only` runs it without kernels)", file=sys.stderr)
    atomic_write_text(pkg / "report.json", json.dumps(doc, indent=2))
    atomic_write_text(pkg / "report.md", report_markdown(doc))
    return doc


def model_coverage(pkg: Path, target: str, *, example_inputs=None, model_path=None) -> dict:
    """Ops and FLOPs by home (verified kernel, reference, fallback op, host step), and, where
    the target's device is here, each home's share of one timed run on the example inputs."""
    from kforge.coverage import merge_profile, plan_coverage, profile_plan
    from kforge.verify import target_available
    from kforge.runtime import usable_kernels
    package = open_package(pkg)
    # the kernels the runtime would use here: verified, linked, not slower than PyTorch's op
    verified = set(usable_kernels(package, target)) & package.kernel_hashes()
    cov = plan_coverage(package.plan, package.specs, verified)
    profile = None
    if target_available(target):
        inputs = list(example_inputs) if example_inputs is not None else None
        if inputs is None and model_path is not None:
            from kforge.modelfile import load_model_file
            _, inputs = load_model_file(model_path, with_model=False)
        if inputs is not None:
            from kforge.runtime import load_package
            compiled = load_package(pkg, target=target, tune=False)
            # on a GPU the first run compiles the kernels; the interpreter compiles nothing
            try:
                profile = profile_plan(compiled, inputs, repeats=1 if target == "cpu" else 2)
            except Exception as exc:  # noqa: BLE001 - reported; the package stays as built
                # a kernel that passed its region's checks and fails on the model's own
                # tensors (their addresses, their weights as loaded): said, not a traceback
                out = merge_profile(cov, None)
                out["run_error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
                return out
    return merge_profile(cov, profile)


def _example_batch(model_path: Path) -> int | None:
    try:
        from kforge.modelfile import load_model_file
        _, inputs = load_model_file(model_path, with_model=False)
        return int(inputs[0].shape[0]) if inputs else None
    except Exception:  # noqa: BLE001 - only a size hint for verification
        return None
