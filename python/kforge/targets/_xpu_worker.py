"""Compile Triton kernels for an Intel GPU inside the xpu environment (kforge.targets.xpu_env).

Runs under the Python of that environment, whose `triton` is `triton-xpu`, never the main
one: it must not import kforge. It reads one JSON request on stdin and writes one JSON answer
to the file named by its argument:

    {"torch_path": DIR, "arch": "bmg", "properties": {...}, "warp_size": 16,
     "jobs": [{"name": ..., "source": ..., "args": [[shape, torch dtype name], ...],
               "weights": [argument indices]}]}
 -> {"triton_version": ..., "results": [[kernel report dicts] per job]}

Each job's `launch` runs on meta tensors (torch comes from the main environment's site-packages,
appended to sys.path so that this environment's triton stays first) with `JITFunction.run`
replaced by a compile for GPUTarget("xpu", properties, warp_size): Triton's own binder and
specialization, then `triton.compile`. A report holds the SPIR-V size and what the generated
LLVM IR calls: DPAS (`*_matrix_mad_*` sub-group builtins) and 2D block loads.
"""
import json
import os
import re
import sys
import tempfile
import time
import traceback
import types


def _stand_in_arch_parser(arch: str) -> None:
    """triton-xpu 3.3's XPUBackend compiles `arch_parser.c` (a switch from SYCL's architecture
    enum to a name) at construction, which needs the SYCL headers and libsycl/ze_loader of a
    oneAPI install. Its answer is used only to query `ocloc` and is empty without one; here it
    is the requested architecture's name, from Python."""
    from triton.backends import backends
    globs = backends["intel"].compiler.__init__.__globals__
    original = globs["compile_module_from_src"]

    def compile_module_from_src(src, name, *args, **kwargs):
        if name == "arch_utils":
            return types.SimpleNamespace(parse_device_arch=lambda _value: arch)
        return original(src, name, *args, **kwargs)
    globs["compile_module_from_src"] = compile_module_from_src


def _clip(message: str, keep: int = 2000) -> str:
    """Triton's CompilationError puts the source first and the cause last: keep both ends."""
    if len(message) <= keep:
        return message
    return message[:keep // 4] + "\n...\n" + message[-(3 * keep) // 4:]


def _report(name, kwargs):
    return {"name": name, "ok": False, "error": "", "mma": "", "spirv_bytes": None,
            "block_io": False, "registers": None, "spill_stores": None, "spill_loads": None,
            "shared_bytes": None, "num_warps": kwargs.get("num_warps"),
            "num_stages": kwargs.get("num_stages"), "threads_per_warp": None,
            "grf_mode": kwargs.get("grf_mode"), "compile_s": 0.0, "notes": []}


def main() -> int:
    request = json.load(sys.stdin)
    os.environ.pop("TRITON_INTERPRET", None)
    if request.get("torch_path"):
        sys.path.append(request["torch_path"])
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature
    from triton._utils import find_paths_if, get_iterable_path

    _stand_in_arch_parser(request["arch"])
    target = GPUTarget("xpu", request["properties"], request["warp_size"])
    backend = make_backend(target)
    results = []
    for job in request["jobs"]:
        reports = []

        def compile_launch(fn, *args, grid=None, warmup=False, **kwargs):
            t0 = time.perf_counter()
            rep = _report(fn.__name__, kwargs)
            reports.append(rep)
            try:
                kwargs.setdefault("debug", False)
                binder = create_function_from_signature(fn.signature, fn.params, backend)
                bound, specialization, _ = binder(*args, **kwargs)
                options = backend.parse_options(kwargs)
                sigvals = [x[0] for x in specialization]
                signature = {p.name: v for p, v in zip(fn.params, sigvals)}
                constexprs = find_paths_if(sigvals, lambda _, v: v == "constexpr")
                constexprs = {p: get_iterable_path(list(bound.values()), p) for p in constexprs}
                attrvals = [x[1] for x in specialization]
                attrs = find_paths_if(attrvals, lambda _, x: isinstance(x, str))
                attrs = {k: backend.parse_attr(get_iterable_path(attrvals, k)) for k in attrs}
                kernel = triton_compile(ASTSource(fn, signature, constexprs, attrs),
                                        target=target, options=options.__dict__)
                llir = kernel.asm.get("llir", "")
                rep["spirv_bytes"] = len(kernel.asm.get("spv", b""))
                rep["mma"] = "dpas" if re.search(r"matrix_mad", llir) else ""
                rep["block_io"] = bool(re.search(r"2d_block_read", llir))
                rep["shared_bytes"] = int(getattr(kernel.metadata, "shared", 0) or 0)
                rep["threads_per_warp"] = getattr(kernel.metadata, "threads_per_warp", None)
                rep["grf_mode"] = getattr(kernel.metadata, "grf_mode", rep["grf_mode"])
                rep["notes"].append("registers and spills: reported by IGC when the SPIR-V is "
                                    "finalized on the device (or by ocloc), not here")
                rep["ok"] = True
            except Exception as exc:   # noqa: BLE001 - reported per kernel
                cause = f"\ncaused by {type(exc.__cause__).__name__}: {exc.__cause__}" \
                    if exc.__cause__ is not None else ""
                rep["error"] = f"{type(exc).__name__}: {_clip(str(exc).strip() + cause)}"
            rep["compile_s"] = round(time.perf_counter() - t0, 2)
            return None

        with tempfile.TemporaryDirectory(prefix="kforge-xpu-") as tmp:
            path = os.path.join(tmp, f"{job['name']}.py")   # @triton.jit reads its source file
            with open(path, "w") as f:
                f.write(job["source"])
            try:
                import importlib.util
                spec = importlib.util.spec_from_file_location(f"kforge_xpu_{job['name']}", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            except Exception as exc:   # noqa: BLE001
                results.append([dict(_report(job["name"], {}), error=(
                    f"the source does not load: {type(exc).__name__}: {exc}"))])
                continue
            if not callable(module.__dict__.get("launch")):
                results.append([dict(_report(job["name"], {}),
                                     error="the source defines no launch()")])
                continue
            args = [torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
                    for shape, dtype in job["args"]]
            original = JITFunction.run
            JITFunction.run = compile_launch
            try:
                prepare = module.__dict__.get("prepare_weights")
                if callable(prepare) and job.get("weights"):
                    prepared = prepare({i: args[i] for i in job["weights"]})
                    args = [prepared.get(i, a) for i, a in enumerate(args)]
                module.launch(*args)
            except Exception as exc:   # noqa: BLE001 - launch itself failed on meta tensors
                reports.append(dict(_report(job["name"], {}), error=(
                    f"launch() failed on meta tensors: {type(exc).__name__}: {str(exc)[:500]}")))
            finally:
                JITFunction.run = original
        if not reports:
            reports.append(dict(_report(job["name"], {}),
                                error="launch() launched no Triton kernel"))
        results.append(reports)
    with open(sys.argv[1], "w") as f:
        json.dump({"triton_version": triton.__version__, "results": results}, f)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:   # noqa: BLE001 - the caller shows this
        traceback.print_exc()
        sys.exit(2)
