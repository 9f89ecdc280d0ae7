"""H200 benchmark of the builtin generator's bf16-policy GEMM kernels against cuBLAS, one process.

    PYTHONUNBUFFERED=1 python3 benchmarks/gemm/bench_builtin.py       (on the device machine)

Question: does the persistent TMA kernel (kernels.tma_configs, KFORGE_BUILTIN_TMA) beat the
pointer kernel the builtin takes first today, for each of the bf16 policy's two product
schemes (bf16 operands; fp16x1: the split pass's power-of-two-scaled fp16 planes)?

Workloads: the test fixtures' region specs (test/python/fixtures/specs/make_fixtures.py, built
here at the shapes below): `matmul_bias_relu` (relu(x @ W^T + b)) and
`linear_gelu_layer_norm_softmax` (a fused row epilogue over the whole of N). Inputs fp32 like
the models': x ~ N(0, 1), W ~ N(0, 1) / sqrt(K). Variants: the first configuration of each
(kernel, scheme) in the builtin's configuration space with the TMA kernel offered, plus the
TMA kernel's second tile. Every output checked against float64 under the bf16 rule
|out - ref| <= 1e-2 max(1, rms(ref)) + 1e-2 |ref| (the ratio is printed; <= 1 passes).
Timing: CUDA events around one `launch` (its passes and allocations included), the L2 flushed
(256 MB written) before each, 5 warm-up calls, median of 30. Baselines: the matched route a
user takes with a bf16 model (bf16 x, W, b already cast: `relu(F.linear)`), and the same with x
cast per call from fp32 (what an fp32 activation costs that route).

KF_POLICY=strict times the strict policy's fp16x3 instead, KF_POLICY=tf32 the tf32 policy's
tf32: the pointer kernel's first configuration against the TMA kernel's two (offered under
these policies only with KFORGE_BUILTIN_TMA=1, which this script sets), each checked under the
policy's rule (1e-4, 1e-2), against PyTorch's fp32 Linear (TF32 off for strict, on for tf32)
and the bf16 model's.

KF_TMA_VARIANTS (a JSON list of dicts) adds, per scheme, the TMA kernel's first configuration
with each dict's keys overridden (e.g. '[{"EPI_SPLIT": 4, "num_stages": 4, "FLATTEN": true}]'),
labelled tma-<scheme>-v<i>; KF_PASSES (default 1) times every variant that many times, the
order reversed on each pass (clocks fall under sustained load: the interleaving evens it out),
and the table takes each variant's best pass.

Env: KF_SHAPES ("M,N,K;..."; defaults below), KF_BUDGET_S (default 240), KF_POLICY. Writes
$OUT/builtin_gemm.json (or ./builtin_gemm.json) and prints a table.
"""
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

T0 = time.time()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "test" / "python" / "fixtures" / "specs"))
os.environ.setdefault("KFORGE_BUILTIN_TMA", "1")
os.environ.setdefault("KFORGE_XCOMPILE", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import make_fixtures as mf  # noqa: E402
from kforge.providers.builtin import candidates, config_space  # noqa: E402
from kforge.spec import load_spec  # noqa: E402

BUDGET = float(os.environ.get("KF_BUDGET_S", "240"))
POLICY = os.environ.get("KF_POLICY", "bf16")
SCHEMES = {"strict": ("fp16x3",), "tf32": ("tf32",)}.get(POLICY, ("bf16", "fp16x1"))
if os.environ.get("KF_SCHEMES"):        # e.g. "fp16x1" (tf32's first scheme on GPUs)
    SCHEMES = tuple(os.environ["KF_SCHEMES"].split(","))
TOL = 1e-4 if POLICY == "strict" else 1e-2
OUT = Path(os.environ.get("OUT", "."))
PASSES = int(os.environ.get("KF_PASSES", "1"))
SHAPES = [("matmul_bias_relu", 8192, 8192, 8192), ("matmul_bias_relu", 4096, 4096, 4096),
          ("matmul_bias_relu", 16384, 4096, 4096), ("matmul_bias_relu", 4096, 14336, 4096),
          ("matmul_bias_relu", 4096, 4096, 14336), ("matmul_bias_relu", 512, 8192, 8192),
          ("matmul_bias_relu", 256, 4096, 4096),
          ("linear_gelu_layer_norm_softmax", 8192, 128, 4096)]
if os.environ.get("KF_SHAPES"):
    SHAPES = [("matmul_bias_relu",) + tuple(int(v) for v in s.split(","))
              for s in os.environ["KF_SHAPES"].split(";")]

FLUSH = None


def timed(fn, reps=30, warm=5):
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        FLUSH.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def tol_ratio(out, ref):
    out, ref = out.double(), ref.double()
    rms = ref.pow(2).mean().sqrt().item()
    bound = TOL * max(1.0, rms) + TOL * ref.abs()
    return ((out - ref).abs() / bound).max().item()


def make_spec(builder, M, N, K, tmp):
    d = Path(tmp) / f"{builder}_{M}_{N}_{K}"
    d.mkdir(parents=True)
    old, mf.HERE = mf.HERE, d
    try:
        getattr(mf, builder)(M=M, K=K, N=N)
    finally:
        mf.HERE = old
    return load_spec(next(d.glob("*.json")))


def variants(spec):
    """(label, config): the first config of each (kernel, scheme), the TMA kernel's second."""
    out, seen = [], {}
    extra = json.loads(os.environ.get("KF_TMA_VARIANTS") or "[]")
    for c in config_space(spec, "cuda", POLICY):
        key = ("tma" if c.get("TMA") else "ptr", c.get("input_precision") or "bf16")
        if key[1] not in SCHEMES:
            continue
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= (2 if key[0] == "tma" else 1):
            out.append((f"{key[0]}-{key[1]}-{seen[key]}", c))
        if key[0] == "tma" and seen[key] == 1:
            out += [(f"tma-{key[1]}-v{i}", dict(c, **o)) for i, o in enumerate(extra)]
    return out


def reference(builder, x, w, b):
    y = x.double() @ w.double().T
    if builder == "matmul_bias_relu":
        return torch.relu(y + b.double())
    return None


def main():
    if not torch.cuda.is_available():
        sys.exit("bench_builtin.py times kernels on a CUDA GPU (sm_90 for the TMA kernel); none is "
                 "visible here. The kernels' correctness runs on the CPU in "
                 "test/python/test_builtin_tma.py.")
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    rows = []
    tmp = tempfile.mkdtemp()
    for builder, M, N, K in SHAPES:
        if time.time() - T0 > BUDGET:
            print(f"budget: skipped {builder} {M}x{N}x{K}", flush=True)
            continue
        spec = make_spec(builder, M, N, K, tmp)
        g = torch.Generator(device="cuda").manual_seed(0)
        args = []
        for a in spec.args:
            t = torch.randn(a.shape, generator=g, device="cuda")
            if a.weight and len(a.shape) >= 2:
                t /= math.sqrt(math.prod(a.shape[1:]))
            args.append(t)
        # the fixture's reference (float64) for the fused-rows region; matmul_bias_relu by hand
        ref = reference(builder, *args[:3]) if builder == "matmul_bias_relu" else None
        if ref is None:
            from kforge.reference import reference_fn
            ref = reference_fn(spec)(*[a.double() for a in args])[0]
        flops = 2 * M * N * K
        row = {"region": builder, "M": M, "N": N, "K": K, "variants": {}}
        xb = args[0].to(torch.bfloat16)
        wb = args[1].to(torch.bfloat16)
        if builder == "matmul_bias_relu":
            bb = args[2].to(torch.bfloat16)
            row["cublas_bf16_model_ms"] = timed(lambda: torch.relu(F.linear(xb, wb, bb)))
            row["cublas_cast_x_ms"] = timed(
                lambda: torch.relu(F.linear(args[0].to(torch.bfloat16), wb, bb)))
            if POLICY in ("strict", "tf32"):     # PyTorch's fp32 Linear, TF32 off / on
                torch.backends.cuda.matmul.allow_tf32 = POLICY == "tf32"
                row["cublas_fp32_ms"] = timed(lambda: torch.relu(F.linear(*args[:3])))
        else:
            row["cublas_bf16_mm_ms"] = timed(lambda: xb @ wb.T)
        loaded = []
        for label, config in variants(spec):
            if time.time() - T0 > BUDGET:
                break
            v = {"config": config}
            try:
                cand = candidates(spec, "cuda", POLICY, [config])[0]
                path = Path(tmp) / f"c_{builder}_{M}_{N}_{K}_{label.replace('-', '_')}.py"
                path.write_text(cand.source)
                import importlib.util
                ms = importlib.util.spec_from_file_location(path.stem, path)
                mod = importlib.util.module_from_spec(ms)
                ms.loader.exec_module(mod)
                run_args = list(args)
                if hasattr(mod, "prepare_weights"):
                    for i, t in mod.prepare_weights({i: args[i] for i, a in
                                                     enumerate(spec.args) if a.weight}).items():
                        run_args[i] = t
                t0 = time.time()
                out = mod.launch(*run_args)[0]
                torch.cuda.synchronize()
                v["first_call_s"] = round(time.time() - t0, 2)
                v["tol_ratio"] = round(tol_ratio(out, ref), 4)
                del out
                loaded.append((label, v, mod, run_args))
            except Exception as e:  # noqa: BLE001 - a variant's failure is a result
                v["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
            row["variants"][label] = v
        for p in range(PASSES):
            if p and time.time() - T0 > BUDGET:
                break
            for label, v, mod, run_args in (loaded if p % 2 == 0 else loaded[::-1]):
                try:
                    v.setdefault("ms_passes", []).append(
                        timed(lambda: mod.launch(*run_args)))
                except Exception as e:  # noqa: BLE001
                    v["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        for label, v in row["variants"].items():
            if v.get("ms_passes"):
                v["ms"] = min(v["ms_passes"])
                v["tflops"] = round(flops / v["ms"] / 1e9, 1)
            keys = ("BLOCK_M", "BLOCK_N", "num_stages", "EPI_SPLIT", "FLATTEN", "N_PARTS",
                    "SPLIT_K")
            tile = {k: v["config"][k] for k in keys if k in v["config"]}
            print(f"{builder} {M}x{N}x{K} {label}: {v.get('ms', v.get('error'))} "
                  f"passes {v.get('ms_passes')} tol {v.get('tol_ratio')} {tile}", flush=True)
        del loaded
        rows.append(row)
        del args, xb, wb
        torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "rows": rows}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "builtin_gemm.json").write_text(json.dumps(out, indent=1))
    kinds = [f"{k}-{sc}" for k in ("ptr", "tma") for sc in SCHEMES]
    yardstick = "cublas_fp32_ms" if POLICY in ("strict", "tf32") else "cublas_bf16_model_ms"
    print(f"\n| region | M,N,K | {yardstick} | " + " | ".join(kinds) + " |")
    for r in rows:
        base = r.get(yardstick) or r.get("cublas_bf16_mm_ms")
        cells = []
        for k in kinds:
            vs = [v for lab, v in r["variants"].items() if lab.startswith(k) and "ms" in v]
            best = min(vs, key=lambda v: v["ms"]) if vs else None
            cells.append(f"{best['ms']:.4f} (x{base / best['ms']:.2f}, tol {best['tol_ratio']})"
                         if best else "-")
        print(f"| {r['region']} | {r['M']},{r['N']},{r['K']} | {base:.4f} | "
              + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
