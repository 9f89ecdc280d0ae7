"""Where a bf16 GEMM package's time goes on the GPU, and what the builtin kernel's variants buy.

    PYTHONPATH=python python3 benchmarks/gemm/diag_package.py PKG_ROOT WORKLOAD...   (device)

PKG_ROOT is a folder of packages built by benchmarks/build_packages.sh (PKG_ROOT/<workload>),
each WORKLOAD a name under benchmarks/workloads/. For each: the package is verified here
(`tune_package`, no tuning rounds), bound to the workload's model (full size, seed 0) and timed
as `kforge bench` times it (do_bench: CUDA events, 256 MB L2 flush, median) with the runtime's
CUDA graphs on and off; its kernels' device times are read from the torch profiler (L2 flushed
between calls); the kernel module's `launch` is timed alone; then source variants of the
package's GEMM kernel, each checked against the package kernel's own output (max |diff|) and
timed the same way:

* stages4: 4 pipeline stages instead of the configuration's;
* tmastore: the epilogue's result stored by TMA in four column slices (tma2's epilogue) instead
  of tl.store; tmastore_s4: that with 4 stages;
* bf16out: the output written in bf16 (what the fp32 output's bytes cost; not a KForge option);
* tmastore_flat: tmastore with the tile loop flattened into the K loop's pipeline (tma2's
  FLATTEN: the next tile's loads in flight during this tile's epilogue);
* bn128: 128x128 tiles, 4 stages; bm256: 256x128 tiles in place of 128x256; group8: GROUP_M 8;
* fastmath: the epilogue's libdevice tanh and log1p replaced by exp-based formulas, where the
  package has libdevice's (KFORGE_BUILTIN_FASTMATH=0, or older packages); libdevice: the bf16
  policy's tanh.approx / lg2.approx (the default since 2026-12-06) replaced by libdevice's,
  which is what the fast math buys.

VARIANTS=libdevice,fastmath (comma-separated) times only those beside the package's own kernel.
The matched route is timed beside: the model cast to bf16 on bf16 inputs (cuBLAS), eager.
Writes $OUT/diag_package.json and prints a table. A diagnostic, not a benchmark of record.
"""
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
import triton  # noqa: E402

OUT = Path(os.environ.get("OUT", "."))
FLUSH = torch.empty(256 << 20, dtype=torch.int8, device="cuda") if torch.cuda.is_available() else None


def bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def kernel_times(fn, calls: int = 10) -> dict:
    """Mean device time per call of each kernel fn launches (L2 flushed before each call)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            FLUSH.zero_()
            fn()
        torch.cuda.synchronize()
    out: dict = {}
    for ev in prof.key_averages():
        name = ev.key
        if "elementwise_kernel" in name and "FillFunctor" in name:
            continue            # the flush
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t:
            out[name[:80]] = round(t / calls / 1000.0, 4)   # us -> ms per call
    return out


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def variant_sources(src: str) -> dict:
    """name -> edited source of a builtin persistent TMA GEMM kernel module."""
    out = {"base": src}
    out["stages4"] = re.sub(r"num_stages=3\)\n", "num_stages=4)\n", src)
    out["bf16out"] = re.sub(r"(v\d+ = torch\.empty\(\([^)]*\), device=device, dtype=)torch\.float32\)"
                            r"(\n\s*# tl\.make_tensor_descriptor)",
                            r"\1torch.bfloat16)\2", src)
    out["bn128"] = re.sub(r"BLOCK_N=256", "BLOCK_N=128", out["stages4"])
    out["bm256"] = src.replace("BLOCK_M=128, BLOCK_N=256", "BLOCK_M=256, BLOCK_N=128")
    out["group8"] = re.sub(r"GROUP_M=16", "GROUP_M=8", src)
    # fastmath / libdevice: the epilogue's tanh and log1p the other way from the package's
    # (KFORGE_BUILTIN_FASTMATH: the bf16 policy's tanh.approx and lg2.approx by default)
    out["fastmath"] = re.sub(r"libdevice\.log1p\((\w+)\)", r"tl.log(1.0 + \1)", re.sub(
        r"libdevice\.tanh\((\w+)\)", r"(1.0 - 2.0 / (tl.exp(2.0 * \1) + 1.0))", src))
    slow = re.sub(r"\(_fast_log2\(1\.0 \+ (\w+)\) \* 0\.6931471805599453\)",
                  r"libdevice.log1p(\1)", src.replace("= _fast_tanh(", "= libdevice.tanh("))
    if slow != src and "import libdevice" not in slow:
        slow = slow.replace("import triton.language as tl\n", "import triton.language as tl\n"
                            "from triton.language.extra import libdevice\n", 1)
    out["libdevice"] = slow
    m = re.search(r"\n(\s+)tl\.store\((\w+) \+ \(\(rm \* (\d+)\) \+ rn\), (\w+)\)\n", src)
    dims = re.search(r"M=(\d+) N=(\d+) K=(\d+)", src)
    if m and dims:
        ind, ptr, n, val = m.group(1), m.group(2), m.group(3), m.group(4)
        M, N = dims.group(1), dims.group(2)
        store = (f"\n{ind}h0, h1 = tl.split(tl.permute(tl.reshape({val}, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))"
                 f"\n{ind}q0, q1 = tl.split(tl.permute(tl.reshape(h0, (BLOCK_M, 2, BLOCK_N // 4)), (0, 2, 1)))"
                 f"\n{ind}q2, q3 = tl.split(tl.permute(tl.reshape(h1, (BLOCK_M, 2, BLOCK_N // 4)), (0, 2, 1)))"
                 f"\n{ind}c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], q0)"
                 f"\n{ind}c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 4], q1)"
                 f"\n{ind}c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], q2)"
                 f"\n{ind}c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + 3 * (BLOCK_N // 4)], q3)\n")
        t = src[:m.start()] + store + src[m.end():]
        t = re.sub(r"(\n(\s+)w_desc = tl\.make_tensor_descriptor\([^\n]*\n)",
                   lambda mm: mm.group(1) + f"{mm.group(2)}c_desc = tl.make_tensor_descriptor({ptr}, "
                   f"shape=[{M}, {N}], strides=[{N}, 1], block_shape=[BLOCK_M, BLOCK_N // 4])\n", t, count=1)
        out["tmastore"] = t
        out["tmastore_s4"] = re.sub(r"num_stages=3\)\n", "num_stages=4)\n", t)
        out["tmastore_flat"] = t.replace("NUM_SMS, num_stages=1):", "NUM_SMS, flatten=True):")
    return {k: v for k, v in out.items() if k == "base" or v != src}


def run_workload(pkg_root: Path, name: str) -> dict:
    from kforge import load
    from kforge.package import open_package
    from kforge.runtime import pending_candidates, tune_package

    rec: dict = {"workload": name}
    pkg = pkg_root / name
    t0 = time.time()
    if pending_candidates(open_package(pkg), "cuda"):
        tune_package(pkg)
    rec["verify_s"] = round(time.time() - t0, 1)
    wl = load_module(ROOT / "benchmarks" / "workloads" / f"{name}.py", f"wl_{name}")
    torch.manual_seed(0)
    model = wl.Model(*wl.get_init_inputs()).cuda().eval()
    inputs = [t.cuda() for t in wl.get_inputs()]
    with torch.no_grad():
        ref = model(*inputs)
        m16 = wl.Model(*wl.get_init_inputs()).cuda().eval()
        m16.load_state_dict(model.state_dict())
        m16 = m16.bfloat16()
        in16 = [t.bfloat16() for t in inputs]
        rec["cublas_bf16_model_ms"] = bench(lambda: m16(*in16))
        rec["cublas_bf16_model_kernels"] = kernel_times(lambda: m16(*in16))
    for graphs in ("1", "0"):
        os.environ["KFORGE_CUDA_GRAPHS"] = graphs
        compiled = load(str(pkg), model, target="cuda")
        with torch.no_grad():
            out = compiled(*inputs)
            out = out[0] if isinstance(out, (tuple, list)) else out
            rec[f"package_max_abs_err_graphs{graphs}"] = float((out - ref).abs().max())
            rec[f"package_ms_graphs{graphs}"] = bench(lambda: compiled(*inputs))
            if graphs == "0":
                rec["package_kernels"] = kernel_times(lambda: compiled(*inputs))
        del compiled
    os.environ.pop("KFORGE_CUDA_GRAPHS")
    # the kernel module alone, and its variants
    manifest = json.loads((pkg / "manifest.json").read_text())
    entry = next(iter(manifest["kernels"].values()))
    src_path = pkg / entry["source"]
    src = src_path.read_text()
    sd = model.state_dict()
    plan = json.loads((pkg / "linked_plan.json").read_text())
    names = {i["name"]: i["weight"] for i in plan["inputs"]}
    # the launch takes the plan step's operands in their order (not the model inputs')
    operands = [names[o] for o in plan["steps"][0]["operands"]]
    rec["variants"] = {}
    base_out = None
    tmp = Path(tempfile.mkdtemp())
    only = [v for v in os.environ.get("VARIANTS", "").split(",") if v]
    for vname, vsrc in variant_sources(src).items():
        if only and vname != "base" and vname not in only:
            continue
        v: dict = {}
        try:
            p = tmp / f"{name}_{vname}.py"
            p.write_text(vsrc)
            mod = load_module(p, f"kv_{name}_{vname}")
            args = [sd[w].contiguous() if w else inputs[0] for w in operands]
            prep = mod.prepare_weights({i: a for i, (a, w) in enumerate(zip(args, operands)) if w}) \
                if hasattr(mod, "prepare_weights") else {}
            args = [prep.get(i, a) for i, a in enumerate(args)]
            with torch.no_grad():
                o = mod.launch(*args)[0]
                torch.cuda.synchronize()
                if base_out is None:
                    base_out = o.float().clone()
                    v["max_abs_err_vs_model"] = float((o - ref).abs().max())
                v["max_abs_diff_vs_base"] = float((o.float() - base_out).abs().max())
                v["ms"] = bench(lambda: mod.launch(*args))
                v["kernels"] = kernel_times(lambda: mod.launch(*args))
        except Exception as exc:  # a variant that does not compile is a result too
            v["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        rec["variants"][vname] = v
        print(name, vname, json.dumps(v)[:400], flush=True)
    return rec


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("diag_package.py needs a CUDA GPU")
    pkg_root = Path(sys.argv[1])
    OUT.mkdir(parents=True, exist_ok=True)
    if os.environ.get("KF_DIAG_ONE"):           # the child: one workload, its record to a file
        try:
            rec = run_workload(pkg_root, sys.argv[2])
        except Exception as exc:
            traceback.print_exc()
            rec = {"workload": sys.argv[2], "error": f"{type(exc).__name__}: {exc}"}
        Path(os.environ["KF_DIAG_ONE"]).write_text(json.dumps(rec))
        return
    import subprocess
    recs = []
    for name in sys.argv[2:]:       # one process each: a faulting variant ends only its own
        one = OUT / f"diag_{name}.json"
        subprocess.run([sys.executable, __file__, str(pkg_root), name],
                       env=dict(os.environ, KF_DIAG_ONE=str(one)), timeout=300)
        recs.append(json.loads(one.read_text()) if one.exists()
                    else {"workload": name, "error": "the child process wrote no record"})
        (OUT / "diag_package.json").write_text(json.dumps(recs, indent=1))
    for r in recs:
        print(f"\n== {r['workload']}: bf16 model (cuBLAS) {r.get('cublas_bf16_model_ms', 0):.4f} ms, "
              f"package graphs on {r.get('package_ms_graphs1', 0):.4f} / off "
              f"{r.get('package_ms_graphs0', 0):.4f} ms")
        print("   package kernels:", r.get("package_kernels"))
        for k, v in r.get("variants", {}).items():
            print(f"   {k:12s} {v.get('ms', float('nan')):.4f} ms  diff {v.get('max_abs_diff_vs_base')}"
                  f"  {v.get('error', '')[:120]}  {v.get('kernels')}")


if __name__ == "__main__":
    main()
