"""KForge's bf16-policy GEMM against cuBLAS on the same shapes, in one process (H200).

    PYTHONPATH=python PYTHONUNBUFFERED=1 python3 benchmarks/gemm/bench_cublas.py   (device machine)

Workload: out = relu(x @ W^T + b), x [M, K] fp32 (the activation KForge keeps in fp32 under the
bf16 policy), W [N, K] (nn.Linear layout; KForge casts it to bf16 once in prepare_weights), b [N].
Timed per shape (triton.testing.do_bench, median, L2 flushed between reps):
  cublas_bf16_mm        torch.mm on bf16 x and W^T, bf16 out: the bare cuBLAS GEMM a bf16 model
                        runs (the ratio's denominator: it has no epilogue and no cast)
  cublas_bf16_linear    relu(F.linear(x_bf16, W_bf16, b_bf16)): a bf16 model's Linear+ReLU (eager)
  cublas_cast_linear    relu(F.linear(x.to(bf16), W_bf16, b_bf16)): fp32 activation cast per call
  autocast_linear       relu(F.linear(x, W, b)) under torch.autocast(bf16): W cast per call too
  kf:<variant>          kforge.kernels.gemm bf16 scheme, bias+ReLU fused, fp32 out, every
                        launch included (the A cast pass where the variant has one)
  kf_pass_only          the A cast pass alone (its share of the pass variants)
Every output is checked against a float64 reference: |out - ref| <= 1e-2 * max(1, rms(ref)) +
1e-2 * |ref| (tol_ratio <= 1 passes). JSON + log under $OUT. Env: KF_BUDGET_S (default 250),
KF_SHAPES ("M,N,K;..."), KF_COMPILE=0 skips torch.compile (bf16, default mode) at the end,
KF_FINAL=1 times only the old and the new default config, interleaved, three times each.
Without CUDA it runs a tiny smoke version under TRITON_INTERPRET=1 (set it yourself).
"""
import json
import math
import os
import re
import sys
import time
import traceback

T0 = time.time()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from kforge.kernels.gemm import default_config, load_source, render_gemm  # noqa: E402

BUDGET = float(os.environ.get("KF_BUDGET_S", "250"))
OUT = os.environ.get("OUT", ".")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-2
SHAPES = [(8192, 8192, 8192), (16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336),
          (256, 8192, 8192), (64, 4096, 4096)]
if os.environ.get("KF_SHAPES"):
    SHAPES = [tuple(int(v) for v in s.split(",")) for s in os.environ["KF_SHAPES"].split(";")]
RES = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "env": {}, "rows": [],
       "errors": [], "skipped": []}


def C(bm, bn, bk, w, st, g=16, sk=1, es=None, a32=None, ws=None, fl=None):
    """A launch config; es/a32/ws/fl given = the tma2 kernel (EPI_SPLIT, A_FP32, WS, FLATTEN),
    else the first persistent kernel (cast pass + host descriptors)."""
    c = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g, "SPLIT_K": sk,
         "num_warps": w, "num_stages": st}
    if es is not None:
        c.update(EPI_SPLIT=es, A_FP32=bool(a32), WS=bool(ws))
        if fl is not None:
            c["FLATTEN"] = bool(fl)
    return c


# variant name -> config; "tma-pass" is the default before this work (NOTES.md run 4). Run 5
# (first call) measured the tma2 kernel without loop flattening and Hopper warp specialization
# (Triton 3.6: compile failures or wrong results); run 6 adds flattening, deeper/longer tiles.
# A name ending in "#2" repeats the measurement (the run-to-run noise in the same process).
BIG = {
    "tma-pass": C(256, 128, 64, 8, 3),
    "t2-pass-128x256-s4e4-nofl": C(128, 256, 64, 8, 4, es=4, fl=0),
    "t2-pass-128x256-s4e4": C(128, 256, 64, 8, 4, es=4),
    "t2-pass-128x256-s3e2": C(128, 256, 64, 8, 3, es=2),
    "t2-pass-256x128-s4e4": C(256, 128, 64, 8, 4, es=4),
    "t2-pass-128x256-s4e4-g8": C(128, 256, 64, 8, 4, g=8, es=4),
    "t2-pass-128x256x128-s2e4": C(128, 256, 128, 8, 2, es=4),
    "t2-a32-128x256x32-s4e2": C(128, 256, 32, 8, 4, es=2, a32=1),
    "t2-a32-128x256x32-s5e4": C(128, 256, 32, 8, 5, es=4, a32=1),
    "t2-pass-128x256-s4e4#2": C(128, 256, 64, 8, 4, es=4),
}
SMALL = {
    "tma-pass": C(128, 128, 64, 8, 3),
    "t2-pass-128x128-s4e2-nofl": C(128, 128, 64, 8, 4, es=2, fl=0),
    "t2-pass-128x128-s4e2": C(128, 128, 64, 8, 4, es=2),
    "t2-pass-128x128-s6e2": C(128, 128, 64, 8, 6, es=2),
    "t2-pass-128x128x128-s3e2": C(128, 128, 128, 8, 3, es=2),
    "t2-pass-64x128-s6": C(64, 128, 64, 4, 6, es=1),
    "t2-pass-128x128-s6e2-k2": C(128, 128, 64, 8, 6, sk=2, es=2),
    "t2-a32-64x128-s6-nofl": C(64, 128, 64, 4, 6, es=1, a32=1, fl=0),
    "t2-a32-64x128-s6": C(64, 128, 64, 4, 6, es=1, a32=1),
    "t2-a32-64x128-s6-k2": C(64, 128, 64, 4, 6, sk=2, es=1, a32=1),
    "t2-a32-64x64x128-s4": C(64, 64, 128, 4, 4, es=1, a32=1),
    "t2-a32-64x64x128-s4-k2": C(64, 64, 128, 4, 4, sk=2, es=1, a32=1),
    "t2-a32-64x64x64-s8": C(64, 64, 64, 4, 8, es=1, a32=1),
    "t2-a32-64x128x128-s3": C(64, 128, 128, 4, 3, es=1, a32=1),
    "t2-a32-128x128-s4e2": C(128, 128, 64, 8, 4, es=2, a32=1),
    "t2-pass-128x128-s6e2#2": C(128, 128, 64, 8, 6, es=2),
    "t2-a32-64x128-s6#2": C(64, 128, 64, 4, 6, es=1, a32=1),
}


def left():
    return BUDGET - (time.time() - T0)


def save():
    RES["elapsed_s"] = round(time.time() - T0, 1)
    with open(os.path.join(OUT, "cublas_results.json"), "w") as f:
        json.dump(RES, f, indent=1)


def bench(fn):
    if DEV == "cpu":
        t = time.time()
        fn()
        return (time.time() - t) * 1e3
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def tflops(M, N, K, ms):
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


def check(out, ref):
    """tol_ratio <= 1 passes: |out - ref| <= TOL * max(1, rms(ref)) + TOL * |ref|."""
    o = out.double().reshape(ref.shape)
    d = (o - ref).abs()
    scale = max(1.0, ref.pow(2).mean().sqrt().item())
    return {"tol_ratio": (d / (TOL * scale + TOL * ref.abs())).max().item(),
            "rel_norm": (torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref)).item(),
            "finite": bool(torch.isfinite(out).all().item())}


def kernel_info(kernels):
    info = {}
    if DEV == "cpu":
        return info
    try:
        ks = [k for k in kernels if "tma" in str(getattr(k, "name", ""))] or kernels
        k = ks[0]
        ptx = k.asm["ptx"]
        info = {"kernel": str(getattr(k, "name", "")), "wgmma": "wgmma" in ptx,
                "tma_ptx": "cp.async.bulk.tensor" in ptx, "setmaxnreg": "setmaxnreg" in ptx,
                "shared": k.metadata.shared, "n_regs": getattr(k, "n_regs", None),
                "n_spills": getattr(k, "n_spills", None),
                "n_kernels": len(kernels)}
    except Exception as e:  # noqa: BLE001
        info["info_error"] = repr(e)[:200]
    return info


def make_inputs(M, N, K, seed=1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.rand(M, K, device=DEV, generator=g) * 2 - 1
    w = (torch.rand(N, K, device=DEV, generator=g) * 2 - 1) / math.sqrt(K)
    b = (torch.rand(N, device=DEV, generator=g) * 2 - 1) / math.sqrt(K)
    return x, w, b


def precheck(mod):
    """Compile and check every variant once on a small shape, each name written to a file first:
    a compiler crash (Hopper's warp specialization pass is young) kills this process, not the
    timing run; the caller re-runs it and the crashed variant is excluded. Kernels compiled here
    stay in Triton's cache for the timing run."""
    cur, bad_path = os.path.join(OUT, "precheck_current"), os.path.join(OUT, "precheck.json")
    bad = json.load(open(bad_path)) if os.path.exists(bad_path) else {}
    if os.path.exists(cur):
        bad[open(cur).read()] = "crashed the process"
    groups = (((512, 512, 512), BIG), ((64, 512, 512), SMALL))
    if os.environ.get("KF_FINAL") == "1":
        groups = tuple(((M, 512, 512), {"default_config": default_config("bf16", "bf16", M, 512, 512, tma=True)})
                       for M in (4096, 256, 64))
    for shape, variants in groups:
        M, N, K = shape if DEV == "cuda" else (40, 64, 128)
        x, w, b = make_inputs(M, N, K)
        ref = torch.relu(x.double() @ w.double().t() + b.double())
        pw = mod.prepare_weights({1: w})[1]
        for vname, cfg in variants.items():
            key = f"{vname}@{M}"
            if key in bad:
                continue
            with open(cur, "w") as f:
                f.write(key)
            try:
                out, _ = mod._run((x, pw, b), cfg)
                r = check(out, ref)
                bad[key] = "ok" if r["tol_ratio"] <= 1 else f"wrong: {r}"
            except Exception as e:  # noqa: BLE001
                bad[key] = re.sub(r"\s+", " ", repr(e))[:300]
            with open(bad_path, "w") as f:
                json.dump(bad, f, indent=1)
            print("precheck", key, bad[key][:120], flush=True)
    os.remove(cur)


def usable(vname):
    """False for variants the precheck saw crash or fail (their error is kept in precheck.json)."""
    path = os.path.join(OUT, "precheck.json")
    if not os.path.exists(path):
        return True
    st = json.load(open(path))
    return not any(k.startswith(vname + "@") and v != "ok" for k, v in st.items())


def main():
    if DEV == "cpu":
        global SHAPES
        SHAPES = [(40, 64, 128), (16, 96, 256)]
        for d in (BIG, SMALL):
            for k, c in list(d.items()):
                d[k] = dict(c, BLOCK_M=min(c["BLOCK_M"], 32), BLOCK_N=min(c["BLOCK_N"], 32),
                            BLOCK_K=min(c["BLOCK_K"], 32), num_stages=2)
        RES["env"] = {"gpu": "cpu-interpreter"}
    else:
        p = torch.cuda.get_device_properties(0)
        RES["env"] = {"gpu": p.name, "sms": p.multi_processor_count}
    RES["env"].update(torch=torch.__version__, triton=triton.__version__,
                      python=sys.version.split()[0])
    print("env", RES["env"], flush=True)
    src = render_gemm("gemm_bias_relu", precision="bf16", impl="bf16", tma=True, a_prep="pass",
                      has_bias=True, epilogue="acc = tl.maximum(acc, 0.0)", b_layout="nk")
    mod = load_source(src, "kf_bench_cublas")
    if "--precheck" in sys.argv:
        precheck(mod)
        return

    for (M, N, K) in SHAPES:
        variants = dict(SMALL if M <= 512 else BIG)
        variants["default_config"] = default_config("bf16", "bf16", M, N, K, tma=True)
        if os.environ.get("KF_FINAL") == "1":   # the old and the new default, interleaved, 3 times
            old, new = variants["tma-pass"], variants["default_config"]
            variants = {}
            for r in ("", "#2", "#3"):
                variants["tma-pass" + r] = old
                variants["default_config" + r] = new
        x, w, b = make_inputs(M, N, K)
        ref = torch.relu(x.double() @ w.double().t() + b.double())
        xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
        base = {"M": M, "N": N, "K": K, "gflop": 2 * M * N * K / 1e9}
        RES["rows"].append(base)
        print(f"\nshape {M}x{N}x{K}", flush=True)

        def baseline(key, fn, out_check=True):
            try:
                out = fn()
                if DEV == "cuda":
                    torch.cuda.synchronize()
                ms = bench(fn)
                base[key] = {"ms": ms, "tflops": tflops(M, N, K, ms)}
                if out_check:
                    base[key].update(check(out, ref))
                print(f"  {key:34s} {ms:8.4f} ms {base[key]['tflops']:6.1f} TF/s"
                      + (f" tol={base[key]['tol_ratio']:.2g}" if out_check else ""), flush=True)
            except Exception as e:  # noqa: BLE001
                RES["errors"].append({"where": f"{key} {M}x{N}x{K}", "err": repr(e)[:400]})
                print("  ERROR", key, repr(e)[:200], flush=True)

        baseline("cublas_bf16_mm", lambda: torch.mm(xb, wb.t()), out_check=False)
        baseline("cublas_bf16_linear", lambda: torch.relu(F.linear(xb, wb, bb)))
        baseline("cublas_cast_linear", lambda: torch.relu(F.linear(x.to(torch.bfloat16), wb, bb)))

        def autocast_fn():
            with torch.autocast(DEV, dtype=torch.bfloat16):
                return torch.relu(F.linear(x, w, b))
        baseline("autocast_linear", autocast_fn)
        cub = base.get("cublas_bf16_mm", {}).get("ms")
        if M <= 512 and DEV == "cuda":
            try:
                base["cublas_bf16_mm"]["graph_ms"] = triton.testing.do_bench_cudagraph(
                    lambda: torch.mm(xb, wb.t()), rep=20, return_mode="median")
            except Exception as e:  # noqa: BLE001
                RES["errors"].append({"where": f"graph cublas {M}", "err": repr(e)[:200]})
            print(f"  cublas_bf16_mm graph replay {base['cublas_bf16_mm'].get('graph_ms', float('nan')):.4f} ms",
                  flush=True)

        pw = mod.prepare_weights({1: w})[1]
        a_bf = torch.empty((M, K), device=DEV, dtype=torch.bfloat16)
        baseline("kf_pass_only", lambda: mod.gemm_bias_relu_prep_a[(triton.cdiv(M * K, 2048),)](
            x, a_bf, M * K, BLOCK=2048, MODE=2, num_warps=8), out_check=False)
        dcfg = variants.get("default_config")
        if DEV == "cuda" and dcfg and "EPI_SPLIT" in dcfg and not dcfg["A_FP32"] and dcfg["SPLIT_K"] == 1:
            try:
                # the tma2 GEMM kernel alone on an already-cast A: the kernel against cuBLAS, no pass
                out_k = torch.empty((M, N), device=DEV, dtype=torch.float32)
                nsm = torch.cuda.get_device_properties(0).multi_processor_count
                grid = (min(nsm, triton.cdiv(M, dcfg["BLOCK_M"]) * triton.cdiv(N, dcfg["BLOCK_N"])),)
                mod._set_allocator()
                mod.gemm_bias_relu_prep_a[(triton.cdiv(M * K, 2048),)](x, a_bf, M * K, BLOCK=2048, MODE=2,
                                                                       num_warps=8)
                baseline("kf_default_kernel_only", lambda: mod.gemm_bias_relu_tma2_kernel[grid](
                    a_bf, pw, out_k, b, M, N, K, M, BLOCK_M=dcfg["BLOCK_M"], BLOCK_N=dcfg["BLOCK_N"],
                    BLOCK_K=dcfg["BLOCK_K"], GROUP_M=dcfg["GROUP_M"], SPLIT_K=1, EPI_SPLIT=dcfg["EPI_SPLIT"],
                    A_FP32=False, WS=False, FLATTEN=dcfg["FLATTEN"], NUM_SMS=nsm, DOT_F32=False,
                    num_warps=dcfg["num_warps"], num_stages=dcfg["num_stages"]) and out_k, out_check=False)
                base["kf_default_kernel_only"]["tol_ratio"] = check(out_k, ref)["tol_ratio"] \
                    if "kf_default_kernel_only" in base else None
                del out_k
            except Exception as e:  # noqa: BLE001
                RES["errors"].append({"where": f"kernel only {M}x{N}x{K}", "err": repr(e)[:400]})
        del a_bf
        base["kf"] = {}
        for vname, cfg in variants.items():
            if left() < 25 or not usable(vname):
                RES["skipped"].append(f"{vname} {M}x{N}x{K}")
                continue
            rec = {"cfg": cfg}
            try:
                t = time.time()
                out, kernels = mod._run((x, pw, b), cfg)
                if DEV == "cuda":
                    torch.cuda.synchronize()
                rec["first_call_s"] = round(time.time() - t, 2)
                rec.update(kernel_info(kernels))
                rec.update(check(out, ref))
                del out
                ms = bench(lambda: mod._run((x, pw, b), cfg))
                rec.update(ms=ms, tflops=tflops(M, N, K, ms))
                if cub:
                    rec["vs_cublas_bf16_mm"] = cub / ms
                if M <= 512 and DEV == "cuda":   # small M: how much of the time is host launch work
                    try:
                        rec["graph_ms"] = triton.testing.do_bench_cudagraph(
                            lambda: mod._run((x, pw, b), cfg), rep=20, return_mode="median")
                    except Exception as e:  # noqa: BLE001
                        rec["graph_error"] = repr(e)[:200]
            except Exception as e:  # noqa: BLE001
                rec["error"] = re.sub(r"\s+", " ", repr(e))[:400]
            base["kf"][vname] = rec
            save()
            print(f"  kf:{vname:31s} " + (
                f"{rec['ms']:8.4f} ms {rec['tflops']:6.1f} TF/s x{rec.get('vs_cublas_bf16_mm', 0):.3f} "
                f"tol={rec['tol_ratio']:.2g} ws={rec.get('setmaxnreg')} smem={rec.get('shared')} "
                f"regs={rec.get('n_regs')} spills={rec.get('n_spills')} first={rec['first_call_s']}s"
                + (f" graph={rec['graph_ms']:.4f}ms" if "graph_ms" in rec else "")
                if "ms" in rec else "ERROR " + rec["error"][:240]), flush=True)
        baseline("cublas_bf16_mm#2", lambda: torch.mm(xb, wb.t()), out_check=False)
        save()
        del x, w, b, ref, xb, wb, bb, pw
        if DEV == "cuda":
            torch.cuda.empty_cache()

    if os.environ.get("KF_COMPILE", "1") == "1" and DEV == "cuda":
        for row in RES["rows"]:
            M, N, K = row["M"], row["N"], row["K"]
            if left() < 20:
                RES["skipped"].append(f"torch.compile {M}x{N}x{K}")
                continue
            try:
                torch._dynamo.reset()
                x, w, b = make_inputs(M, N, K)
                xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
                f = torch.compile(lambda x, w, b: torch.relu(F.linear(x, w, b)))
                t = time.time()
                f(xb, wb, bb)
                torch.cuda.synchronize()
                ms = bench(lambda: f(xb, wb, bb))
                row["compile_bf16_linear"] = {"ms": ms, "tflops": tflops(M, N, K, ms),
                                              "compile_s": time.time() - t}
                print(f"torch.compile bf16 {M}x{N}x{K}: {ms:.4f} ms {tflops(M, N, K, ms):.1f} TF/s", flush=True)
                del x, w, b, xb, wb, bb
            except Exception as e:  # noqa: BLE001
                RES["errors"].append({"where": f"torch.compile {M}x{N}x{K}", "err": repr(e)[:400]})
        save()
    summary()
    save()


def summary():
    print("\n== per shape: TF/s; ratio = cuBLAS bf16 mm time / time (>1 = faster than cuBLAS) ==")
    for row in RES["rows"]:
        M, N, K = row["M"], row["N"], row["K"]
        cub = row.get("cublas_bf16_mm", {}).get("ms")
        ok = {k: r for k, r in row.get("kf", {}).items() if "ms" in r and r["tol_ratio"] <= 1}
        best = min(ok, key=lambda k: ok[k]["ms"]) if ok else None
        parts = [f"{M}x{N}x{K}:"]
        for key in ("cublas_bf16_mm", "cublas_bf16_linear", "cublas_cast_linear", "autocast_linear",
                    "compile_bf16_linear"):
            if key in row:
                parts.append(f"{key.replace('_linear', '')} {row[key]['tflops']:.0f}")
        if "ms" in row.get("kf", {}).get("tma-pass", {}):
            r = row["kf"]["tma-pass"]
            parts.append(f"| old {r['tflops']:.0f} (x{cub / r['ms']:.2f})" if cub else "")
        if best:
            parts.append(f"| best {best} {ok[best]['tflops']:.0f} (x{cub / ok[best]['ms']:.2f})" if cub
                         else f"| best {best}")
        print(" ".join(parts))
    print("errors:", len(RES["errors"]), "skipped:", len(RES["skipped"]), f"elapsed {time.time() - T0:.0f}s")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        RES["errors"].append({"where": "main", "err": traceback.format_exc()[-3000:]})
        traceback.print_exc()
        save()
        summary()
