"""The profiling worker: runs one (verified) candidate and writes what the profilers need.

Started by kforge.profiling.collect as `python _worker.py JOB_DIR` (a script: the `kforge`
package is not imported here, as in the verification sandbox). job.json names the candidate's
source, the region's signature, the input seed and size and the mode:

  meta    launch once (compiling), then dump every compiled kernel of the candidate's module:
          metadata (registers, spills, shared memory, warps, stages) to kernels.json and its
          PTX / TTGIR / LLIR to files beside it
  ncu     launch once outside the profiler range (compile, warm-up), then `reps` launches
          between cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off`
  proton  the same launches inside a Proton session (triton.profiler), written to proton.hatchet
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys

JOB = sys.argv[1] if len(sys.argv) > 1 else "."


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# the verifier's sandbox refuses the same imports (kforge/verify/_worker.py): a profiled kernel
# (verified, or an agent's source the compile tool was asked about) gets no more reach here
BLOCKED_IMPORTS = ("kforge", "torch_mlir", "mlir", "subprocess", "multiprocessing", "ctypes",
                   "socket", "pickle", "shutil")


class _ImportBlocker(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED_IMPORTS:
            raise ImportError(f"kforge profiler: a kernel may not import {fullname}")
        return None


def _jit_functions(module):
    import triton
    seen = []
    for obj in vars(module).values():
        while obj is not None and not isinstance(obj, triton.runtime.jit.JITFunction) and \
                hasattr(obj, "fn"):
            obj = obj.fn            # Autotuner / Heuristics wrap the JITFunction
        if isinstance(obj, triton.runtime.jit.JITFunction) and obj not in seen:
            seen.append(obj)
    return seen


def _scalar(v):
    return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)


def dump_kernels(module, out_dir: str) -> list[dict]:
    kernels = []
    for fn in _jit_functions(module):
        for caches in getattr(fn, "device_caches", {}).values():
            for i, compiled in enumerate(caches[0].values()):
                try:
                    compiled._init_handles()
                except Exception:   # noqa: BLE001 - metadata without registers
                    pass
                meta = getattr(compiled, "metadata", None)
                d = meta._asdict() if hasattr(meta, "_asdict") else dict(vars(meta) or {})
                entry = {k: _scalar(v) for k, v in d.items()
                         if k != "target" and not isinstance(v, (list, tuple, dict))}
                tgt = d.get("target")
                if tgt is not None:
                    entry["target"] = {k: _scalar(getattr(tgt, k, None))
                                       for k in ("backend", "arch", "warp_size")}
                entry["jit_name"] = fn.__name__
                entry["n_regs"] = getattr(compiled, "n_regs", None)
                entry["n_spills"] = getattr(compiled, "n_spills", None)
                stem = f"{fn.__name__}_{i}"
                entry["asm_files"] = {}
                for kind, text in (getattr(compiled, "asm", None) or {}).items():
                    if isinstance(text, str) and kind in ("ptx", "ttgir", "llir", "ttir", "spv"):
                        path = os.path.join(out_dir, f"{stem}.{kind}")
                        with open(path, "w") as f:
                            f.write(text)
                        entry["asm_files"][kind] = os.path.basename(path)
                kernels.append(entry)
    return kernels


def main() -> int:
    with open(os.path.join(JOB, "job.json")) as f:
        job = json.load(f)
    import torch
    inputs = _load(job["inputs_path"], "_kforge_profile_inputs")
    sig = inputs.Signature.from_json(job["signature"])
    device = job["device"]
    if job["mode"] == "proton":
        import triton.profiler  # noqa: F401  (before the blocker: it may need what it refuses)
    import triton  # noqa: F401
    sys.meta_path.insert(0, _ImportBlocker())
    module = _load(job["source_path"], "kforge_profiled_candidate")
    args = [t.to(device) for t in inputs.make_inputs(sig, job["seed"], job["size"],
                                                     job.get("domain", "mixed"))]
    prepare = getattr(module, "prepare_weights", None)
    weights = [i for i, a in enumerate(sig.args) if a.weight]
    if callable(prepare) and weights:
        for i, t in prepare({i: args[i] for i in weights}).items():
            args[int(i)] = t
    sync = getattr(torch, device).synchronize
    module.launch(*args)                    # compiles; outside every profiler range
    sync()
    mode, reps = job["mode"], int(job.get("reps", 1))
    result = {"mode": mode}
    if mode == "meta":
        result["kernels"] = dump_kernels(module, JOB)
    elif mode == "ncu":
        module.launch(*args)                # a warm launch, also outside the range
        sync()
        torch.cuda.cudart().cudaProfilerStart()
        for _ in range(reps):
            module.launch(*args)
        sync()
        torch.cuda.cudart().cudaProfilerStop()
    elif mode == "proton":
        import triton.profiler as proton
        proton.start(os.path.join(JOB, "proton"), hook="triton")
        for _ in range(reps):
            module.launch(*args)
        sync()
        proton.finalize()
    with open(os.path.join(JOB, "worker.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
