"""H200 benchmark of kforge.kernels.gemm: every precision variant x config x shape, in one process.

    PYTHONUNBUFFERED=1 python3 benchmarks/gemm/bench_gemm.py            (on the device machine)

Workload: out = relu(x @ W^T + b), x [M, K] fp32, W [N, K] fp32 (nn.Linear layout), b [N].
Prints a compact table last and writes JSON to $OUT/gemm_results.json (or ./gemm_results.json).
Env: KF_RUN (2, 3 or 4: the variant set of that run in NOTES.md; default 4), KF_BUDGET_S (soft
time budget, default 330), KF_SHAPES ("M,N,K;..."), KF_VARIANTS (names), KF_COMPILE=0 to skip
torch.compile, KF_QUICK=1 for the first config only. Without CUDA it runs a tiny smoke version
under TRITON_INTERPRET=1 (set it yourself).
"""
import json
import math
import os
import sys
import time
import traceback

T0 = time.time()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from kforge.kernels.gemm import load_source, render_gemm  # noqa: E402

BUDGET = float(os.environ.get("KF_BUDGET_S", "330"))
OUT = os.environ.get("OUT", ".")
RES = {"date": "2026-11-30", "env": {}, "ceilings": {}, "accuracy": [], "perf": [], "baselines": [],
       "errors": [], "skipped": []}
ATOL = RTOL = 1e-4

SHAPES = [(1024, 8192, 8192), (4096, 4096, 4096), (256, 8192, 8192), (8192, 8192, 1024),
          (32768, 4096, 4096)]
if os.environ.get("KF_SHAPES"):
    SHAPES = [tuple(int(v) for v in s.split(",")) for s in os.environ["KF_SHAPES"].split(";")]

def C(bm, bn, bk, w, st, sk=1, g=8):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g, "SPLIT_K": sk,
            "num_warps": w, "num_stages": st}


# name: render options + configs to measure (refined from run 1, see NOTES.md)
_3X = [C(128, 128, 16, 8, 4), C(128, 256, 16, 8, 3), C(128, 128, 32, 8, 3), C(128, 128, 32, 4, 3)]
_BX3 = [C(128, 128, 32, 8, 4), C(128, 256, 32, 8, 3), C(128, 128, 64, 8, 3)]
RUN2 = {
    "strict-3xtf32": dict(precision="strict", impl="3xtf32", a_prep="kernel",
                          cfgs=_3X + [C(128, 128, 64, 8, 2), C(128, 256, 32, 8, 2)]),
    "strict-3xtf32-pass": dict(precision="strict", impl="3xtf32", a_prep="pass", cfgs=_3X),
    "strict-3xtf32-tma": dict(precision="strict", impl="3xtf32", a_prep="kernel", tma=True, cfgs=_3X[:3]),
    "strict-3xtf32-tma-pass": dict(precision="strict", impl="3xtf32", a_prep="pass", tma=True, cfgs=_3X),
    "strict-tf32x3": dict(precision="strict", impl="tf32x3", cfgs=[C(128, 64, 32, 4, 4), C(128, 128, 32, 8, 3)]),
    "strict-tri-bf16x3": dict(precision="strict", impl="tri-bf16x3", cfgs=[C(128, 128, 32, 8, 3), C(128, 64, 32, 4, 4)]),
    "strict-tri-bf16x6": dict(precision="strict", impl="tri-bf16x6", cfgs=[C(128, 128, 32, 8, 3), C(128, 64, 32, 4, 4)]),
    "strict-bf16x3": dict(precision="strict", impl="bf16x3", a_prep="kernel", cfgs=_BX3),
    "strict-bf16x3-pass": dict(precision="strict", impl="bf16x3", a_prep="pass", cfgs=_BX3),
    "strict-bf16x3-tma-pass": dict(precision="strict", impl="bf16x3", a_prep="pass", tma=True,
                                   cfgs=_BX3 + [C(128, 256, 64, 8, 2)]),
    "tf32": dict(precision="tf32", impl="tf32", cfgs=[C(128, 256, 32, 8, 3), C(128, 128, 32, 8, 3)]),
    "tf32-tma": dict(precision="tf32", impl="tf32", tma=True,
                     cfgs=[C(128, 256, 32, 8, 3), C(128, 256, 32, 8, 4), C(128, 128, 32, 8, 4)]),
    "bf16": dict(precision="bf16", impl="bf16", a_prep="kernel", cfgs=[C(128, 256, 64, 8, 3)]),
    "bf16-pass": dict(precision="bf16", impl="bf16", a_prep="pass",
                      cfgs=[C(128, 256, 64, 8, 3), C(128, 128, 64, 4, 4)]),
    "bf16-tma": dict(precision="bf16", impl="bf16", a_prep="kernel", tma=True,
                     cfgs=[C(128, 256, 64, 8, 3), C(128, 128, 64, 8, 4)]),
    "bf16-tma-pass": dict(precision="bf16", impl="bf16", a_prep="pass", tma=True,
                          cfgs=[C(128, 256, 64, 8, 3), C(128, 256, 64, 8, 4), C(128, 128, 64, 8, 4),
                                C(256, 128, 64, 8, 3)]),
}
# run 3: fp16x3 (per-row/column power-of-two scaled fp16 hi/lo), best earlier variants as references
RUN3 = {
    "strict-fp16x3": dict(precision="strict", impl="fp16x3", a_prep="pass",
                          cfgs=[C(128, 128, 64, 8, 3), C(128, 256, 32, 8, 3), C(128, 128, 32, 8, 4),
                                C(128, 256, 64, 8, 2)]),
    "strict-fp16x3-tma": dict(precision="strict", impl="fp16x3", a_prep="pass", tma=True,
                              cfgs=[C(128, 128, 64, 8, 3), C(128, 128, 32, 8, 4), C(256, 128, 32, 8, 3),
                                    C(128, 128, 64, 8, 4, g=16)]),
    "strict-3xtf32-tma": dict(precision="strict", impl="3xtf32", a_prep="kernel", tma=True,
                              cfgs=[C(128, 128, 32, 8, 3)]),
    "strict-bf16x3-pass": dict(precision="strict", impl="bf16x3", a_prep="pass", cfgs=[C(128, 128, 64, 8, 3)]),
    "tf32-tma": dict(precision="tf32", impl="tf32", tma=True, cfgs=[C(128, 128, 32, 8, 4), C(256, 128, 32, 8, 3)]),
    "bf16-tma-pass": dict(precision="bf16", impl="bf16", a_prep="pass", tma=True,
                          cfgs=[C(256, 128, 64, 8, 3), C(256, 128, 64, 8, 4), C(256, 128, 64, 8, 3, g=16),
                                C(128, 128, 64, 8, 3)]),
}
# run 4: fp16x3 pointer kernel with the weight row stride padded to 16 elements (run 3's K+8 pad
# defeated vectorized loads), final configs of the others in the same process
RUN4 = {
    "strict-fp16x3": dict(precision="strict", impl="fp16x3", a_prep="pass",
                          cfgs=[C(128, 128, 64, 8, 3), C(128, 128, 32, 8, 4), C(128, 256, 32, 8, 3)]),
    "strict-fp16x3-tma": dict(precision="strict", impl="fp16x3", a_prep="pass", tma=True,
                              cfgs=[C(128, 128, 32, 8, 4)]),
    "strict-bf16x3-pass": dict(precision="strict", impl="bf16x3", a_prep="pass", cfgs=[C(128, 128, 64, 8, 3)]),
    "strict-3xtf32-tma": dict(precision="strict", impl="3xtf32", a_prep="kernel", tma=True,
                              cfgs=[C(128, 128, 32, 8, 3)]),
    "tf32-tma": dict(precision="tf32", impl="tf32", tma=True, cfgs=[C(128, 128, 32, 8, 4), C(256, 128, 32, 8, 3)]),
    "bf16-tma-pass": dict(precision="bf16", impl="bf16", a_prep="pass", tma=True,
                          cfgs=[C(256, 128, 64, 8, 3, g=16)]),
}
VARIANTS = {"2": RUN2, "3": RUN3, "4": RUN4}[os.environ.get("KF_RUN", "4")]
SMALL_M_EXTRA = {  # M <= 512: split-K for the pointer kernels, narrower tiles for the persistent ones
    "ptr": lambda cfgs: [dict(c, SPLIT_K=2) for c in cfgs[:2]],
    "tma": lambda cfgs: [dict(c, BLOCK_M=64, num_warps=4) for c in cfgs[:2] if c["BLOCK_M"] == 128]
    + [dict(c, BLOCK_M=128) for c in cfgs[:1] if c["BLOCK_M"] == 256],
}
if os.environ.get("KF_VARIANTS"):
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in os.environ["KF_VARIANTS"].split(",")}


def vcfgs(vname, M):
    v = VARIANTS[vname]
    cfgs = list(v["cfgs"])
    if M <= 512:
        cfgs += SMALL_M_EXTRA["tma" if v.get("tma") else "ptr"](v["cfgs"])
    return cfgs


def left():
    return BUDGET - (time.time() - T0)


def save():
    RES["elapsed_s"] = round(time.time() - T0, 1)
    with open(os.path.join(OUT, "gemm_results.json"), "w") as f:
        json.dump(RES, f, indent=1)


DEV = "cuda" if torch.cuda.is_available() else "cpu"   # cpu: TRITON_INTERPRET=1 smoke run of the script


def bench(fn):
    if DEV == "cpu":
        t = time.time()
        fn()
        return (time.time() - t) * 1e3
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def tflops(M, N, K, ms):
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


def errors(out, ref64, ref32=None):
    """norm-relative error, max-abs / max|ref|, and the 1e-4 tolerance ratio (<= 1 passes)."""
    o = out.double()
    d = (o - ref64).abs()
    r = {"rel_norm": (torch.linalg.vector_norm(o - ref64) / torch.linalg.vector_norm(ref64)).item(),
         "rel_max": (d.max() / ref64.abs().max()).item(),
         "tol_ratio_fp64": (d / (ATOL + RTOL * ref64.abs())).max().item(),
         "finite": bool(torch.isfinite(out).all().item())}
    if ref32 is not None:
        r["tol_ratio_fp32ref"] = ((o - ref32.double()).abs() / (ATOL + RTOL * ref32.double().abs())).max().item()
    return r


def make_inputs(M, N, K, scale="linear", seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.rand(M, K, device=DEV, generator=g) * 2 - 1
    s = 1.0 if scale == "unit" else 1.0 / math.sqrt(K)
    w = (torch.rand(N, K, device=DEV, generator=g) * 2 - 1) * s
    b = (torch.rand(N, device=DEV, generator=g) * 2 - 1) * s
    if scale == "mixed":   # magnitudes spread over 4 decades, element by element
        x = x * 10 ** (torch.rand(M, K, device=DEV, generator=g) * 4 - 2)
        w = w * 10 ** (torch.rand(N, K, device=DEV, generator=g) * 4 - 2)
    return x, w, b


def ref_fp64(x, w, b):
    return torch.relu(x.double() @ w.double().t() + b.double())


def ref_fp32(x, w, b):
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch.relu(F.linear(x, w, b))


MODS = {}


def module(vname):
    if vname not in MODS:
        v = VARIANTS[vname]
        src = render_gemm("gemm_bias_relu", precision=v["precision"], impl=v["impl"], a_prep=v.get("a_prep"),
                          tma=v.get("tma", False), has_bias=True, epilogue="acc = tl.maximum(acc, 0.0)",
                          b_layout="nk")
        MODS[vname] = load_source(src, "kf_" + vname.replace("-", "_"))
    return MODS[vname]


def kernel_info(kernels):
    if DEV == "cpu":
        return {"wgmma": None, "shared": None}
    try:
        ks = [kk for kk in kernels if "prep" not in str(getattr(kk, "name", ""))] or kernels
        k = ks[0]
        ptx = k.asm["ptx"]
        info = {"wgmma": "wgmma" in ptx, "tma_ptx": "cp.async.bulk.tensor" in ptx, "shared": k.metadata.shared,
                "kernel": str(getattr(k, "name", ""))}
    except Exception as e:  # noqa: BLE001
        return {"wgmma": None, "shared": None, "info_error": repr(e)[:200]}
    for attr in ("n_regs", "n_spills"):
        try:
            info[attr] = getattr(k, attr)
        except Exception:  # noqa: BLE001
            pass
    return info


def cfg_key(c):
    return f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}/w{c['num_warps']}s{c['num_stages']}" \
           f"g{c['GROUP_M']}k{c['SPLIT_K']}"


def main():
    if DEV == "cpu":
        global SHAPES
        SHAPES = [(64, 96, 128), (32, 64, 256)]
        RES["env"] = {"gpu": "cpu-interpreter"}
    else:
        p = torch.cuda.get_device_properties(0)
        RES["env"] = {"gpu": p.name, "sms": p.multi_processor_count}
    RES["env"].update({"torch": torch.__version__,
                  "triton": triton.__version__, "python": sys.version.split()[0],
                  "has_make_tensor_descriptor": hasattr(triton.language, "make_tensor_descriptor")})
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        RES["env"]["dot_precisions"] = list(CUDAOptions.allowed_dot_input_precisions)
    except Exception as e:  # noqa: BLE001
        RES["env"]["dot_precisions"] = repr(e)[:100]
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
        RES["env"]["host_tensor_descriptor"] = True
    except Exception:  # noqa: BLE001
        RES["env"]["host_tensor_descriptor"] = False
    print("env", RES["env"], flush=True)

    # ---- ceilings: cuBLAS at 8192^3 --------------------------------------------------------
    n = 8192 if DEV == "cuda" else 64
    a = torch.randn(n, n, device=DEV)
    bb = torch.randn(n, n, device=DEV)
    torch.backends.cuda.matmul.allow_tf32 = False
    RES["ceilings"]["cublas_fp32"] = tflops(n, n, n, bench(lambda: a @ bb))
    torch.backends.cuda.matmul.allow_tf32 = True
    RES["ceilings"]["cublas_tf32"] = tflops(n, n, n, bench(lambda: a @ bb))
    torch.backends.cuda.matmul.allow_tf32 = False
    a16, b16 = a.bfloat16(), bb.bfloat16()
    RES["ceilings"]["cublas_bf16"] = tflops(n, n, n, bench(lambda: a16 @ b16))
    del a, bb, a16, b16
    print("ceilings TFLOP/s", {k: round(v, 1) for k, v in RES["ceilings"].items()}, flush=True)
    save()

    # ---- accuracy of every variant at large K, two input scalings ---------------------------
    for K in ((8192, 32768) if DEV == "cuda" else (256,)):
        for scale in ("linear", "unit", "mixed"):
            M, N = (256, 1024) if DEV == "cuda" else (32, 64)
            x, w, b = make_inputs(M, N, K, scale, seed=K + (scale == "unit"))
            r64 = ref_fp64(x, w, b)
            r32 = ref_fp32(x, w, b)
            row = {"M": M, "N": N, "K": K, "scale": scale, "eager_fp32": errors(r32, r64)}
            torch.backends.cuda.matmul.allow_tf32 = True
            row["eager_tf32"] = errors(torch.relu(F.linear(x, w, b)), r64, r32)
            torch.backends.cuda.matmul.allow_tf32 = False
            for vname in VARIANTS:
                try:
                    mod = module(vname)
                    pw = mod.prepare_weights({1: w})[1]
                    out, _ = mod._run((x, pw, b), VARIANTS[vname]["cfgs"][0])
                    row[vname] = errors(out, r64, r32)
                except Exception as e:  # noqa: BLE001
                    RES["errors"].append({"where": f"acc {vname} K={K}", "err": traceback.format_exc()[-1500:]})
                    print("ERROR", vname, repr(e)[:300], flush=True)
            RES["accuracy"].append(row)
            print(f"acc K={K} {scale}: " + " ".join(
                f"{k}={v['tol_ratio_fp64']:.2g}" for k, v in row.items() if isinstance(v, dict)), flush=True)
            del x, w, b, r64, r32
    save()

    # ---- performance ------------------------------------------------------------------------
    quick = os.environ.get("KF_QUICK") == "1"
    for (M, N, K) in SHAPES:
        x, w, b = make_inputs(M, N, K, "linear", seed=1)
        r64 = ref_fp64(x, w, b)
        torch.backends.cuda.matmul.allow_tf32 = False
        t_eager = bench(lambda: torch.relu(F.linear(x, w, b)))
        r32 = torch.relu(F.linear(x, w, b))
        base = {"M": M, "N": N, "K": K, "eager_fp32_ms": t_eager, "eager_fp32_tflops": tflops(M, N, K, t_eager),
                "eager_fp32_err": errors(r32, r64)}
        torch.backends.cuda.matmul.allow_tf32 = True
        base["eager_tf32_ms"] = bench(lambda: torch.relu(F.linear(x, w, b)))
        torch.backends.cuda.matmul.allow_tf32 = False
        xb, wb, bb16 = x.bfloat16(), w.bfloat16(), b.bfloat16()
        base["cublas_bf16_bf16in_ms"] = bench(lambda: torch.relu(F.linear(xb, wb, bb16)))
        del xb, wb, bb16
        RES["baselines"].append(base)
        print(f"\nshape {M}x{N}x{K}: eager fp32 {t_eager:.3f} ms ({base['eager_fp32_tflops']:.1f} TFLOP/s)", flush=True)
        for vname, v in VARIANTS.items():
            prec, impl, ap = v["precision"], v["impl"], v.get("a_prep", "kernel")
            if left() < 30:
                RES["skipped"].append(f"{vname} {M}x{N}x{K}")
                continue
            try:
                mod = module(vname)
                pw = mod.prepare_weights({1: w})[1]
            except Exception:  # noqa: BLE001
                RES["errors"].append({"where": f"prep {vname}", "err": traceback.format_exc()[-1500:]})
                continue
            cfgs = vcfgs(vname, M)[:1] if quick else vcfgs(vname, M)
            for cfg in cfgs:
                if left() < 30:
                    break
                rec = {"variant": vname, "precision": prec, "impl": impl, "a_prep": ap, "tma": v.get("tma", False),
                       "M": M, "N": N, "K": K,
                       "cfg": cfg, "cfg_key": cfg_key(cfg)}
                try:
                    t = time.time()
                    out, kernels = mod._run((x, pw, b), cfg)
                    if DEV == "cuda":
                        torch.cuda.synchronize()
                    rec["first_call_s"] = round(time.time() - t, 2)
                    rec.update(kernel_info(kernels))
                    rec.update(errors(out, r64, r32))
                    del out
                    ms = bench(lambda: mod._run((x, pw, b), cfg))
                    rec["ms"] = ms
                    rec["tflops"] = tflops(M, N, K, ms)
                    rec["speedup_vs_eager_fp32"] = t_eager / ms
                except Exception as e:  # noqa: BLE001
                    rec["error"] = repr(e)[:400]
                RES["perf"].append(rec)
                print(f"  {vname:22s} {rec['cfg_key']:26s} " + (
                    f"{rec['ms']:.3f} ms {rec['tflops']:6.1f} TF/s x{rec['speedup_vs_eager_fp32']:.2f} "
                    f"tol64={rec['tol_ratio_fp64']:.2g} tol32={rec['tol_ratio_fp32ref']:.2g} wgmma={rec['wgmma']} "
                    f"tma={rec.get('tma_ptx')} regs={rec.get('n_regs')} spills={rec.get('n_spills')} first={rec['first_call_s']}s"
                    if "ms" in rec else "ERROR " + rec["error"][:200]), flush=True)
            del pw
            torch.cuda.empty_cache()
        save()
        del x, w, b, r64, r32
        torch.cuda.empty_cache()

    # ---- torch.compile baseline (optional, last) --------------------------------------------
    if os.environ.get("KF_COMPILE", "1") == "1" and DEV == "cuda":
        for (M, N, K) in SHAPES:
            if left() < 45:
                RES["skipped"].append(f"torch.compile {M}x{N}x{K}")
                continue
            try:
                torch._dynamo.reset()
                x, w, b = make_inputs(M, N, K, "linear", seed=1)
                torch.backends.cuda.matmul.allow_tf32 = False
                f = torch.compile(lambda x, w, b: torch.relu(F.linear(x, w, b)))
                t = time.time()
                f(x, w, b)
                torch.cuda.synchronize()
                ct = time.time() - t
                ms = bench(lambda: f(x, w, b))
                for base in RES["baselines"]:
                    if (base["M"], base["N"], base["K"]) == (M, N, K):
                        base["compile_fp32_ms"] = ms
                        base["compile_time_s"] = ct
                print(f"torch.compile {M}x{N}x{K}: {ms:.3f} ms (compile {ct:.1f}s)", flush=True)
                del x, w, b
            except Exception as e:  # noqa: BLE001
                RES["errors"].append({"where": f"torch.compile {M}x{N}x{K}", "err": repr(e)[:500]})
        save()

    summary()
    save()


def summary():
    print("\n== best config per variant and shape (median ms, TFLOP/s, speedup vs eager fp32, tol ratio at 1e-4 vs fp64) ==")
    best = {}
    for r in RES["perf"]:
        if "ms" not in r:
            continue
        k = (r["variant"], r["M"], r["N"], r["K"])
        if k not in best or r["ms"] < best[k]["ms"]:
            best[k] = r
    RES["best"] = [dict(v, key=list(k)) for k, v in best.items()]
    for base in RES["baselines"]:
        M, N, K = base["M"], base["N"], base["K"]
        line = f"{M}x{N}x{K} eager {base['eager_fp32_tflops']:.0f}TF"
        if "compile_fp32_ms" in base:
            line += f" compile x{base['eager_fp32_ms'] / base['compile_fp32_ms']:.2f}"
        print(line)
        for v in VARIANTS:
            r = best.get((v, M, N, K))
            if r:
                print(f"   {v:22s} {r['cfg_key']:26s} {r['tflops']:6.1f} TF x{r['speedup_vs_eager_fp32']:5.2f} "
                      f"tol64={r['tol_ratio_fp64']:.2g} relmax={r['rel_max']:.1e} wgmma={r['wgmma']}")
    print("errors:", len(RES["errors"]), "skipped:", len(RES["skipped"]), f"elapsed {time.time() - T0:.0f}s")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        RES["errors"].append({"where": "main", "err": traceback.format_exc()[-3000:]})
        traceback.print_exc()
        save()
        summary()
