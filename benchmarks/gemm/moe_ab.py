"""The MoE grouped GEMM (kernels/moe.py) on the GPU at gpt-oss-20b's prefill shape: where its
time goes, beside dense fp16x3 GEMMs of the same work.

    OUT=$OUT python3 benchmarks/gemm/moe_ab.py           (on the device machine)

Shape: T tokens (MOE_T, default 4096 = batch 4 x 1,024), 32 experts, top-4, hidden 2880,
intermediate 2880, gpt-oss's clamped SwiGLU; fp32 weights ~ U(-1, 1) / sqrt(fan-in), routing
from the top-4 of random logits (as a random-weight router gives). Products fp16x3 (strict,
and the bf16 policy's scheme for router-feeding layers) unless MOE_SCHEME=fp16x1, tf32x3 (fp32
operands, Triton's 3xTF32) or tf32 (one TF32 product: the tf32 policy's).

1. The launch timed whole (triton.testing.do_bench, L2 flushed, median) for each tile
   configuration of kernels.moe.moe_configs and other GROUP_M values.
2. The first configuration profiled kernel by kernel (torch.profiler, CUDA time per kernel
   name, averaged over 10 calls).
3. Dense fp16x3 GEMMs of the same products (benchmarks/gemm/fp16x3_ab.py's base kernel:
   [T * top-k, 2880] x [2880, 5760] and [T * top-k, 2880] x [2880, 2880]), and cuBLAS bf16 on
   them: what the grouped kernels would take at the dense kernel's pace.
Every variant's output is compared with the first's (max |diff| / max |out|).
MOE_DTYPE=bf16 runs the operands in bf16 (a model cast to bf16: kernels.moe's 16-bit path,
`_moe_up` / `_moe_down`); MOE_MODULE=PATH takes kernels/moe.py from PATH instead (an A/B
against an earlier version); MOE_VARIANTS=first times the first configuration alone.
Writes $OUT/moe_ab.json and prints a table.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

if os.environ.get("MOE_MODULE"):     # another version of kernels/moe.py (an A/B)
    import importlib.util
    _spec = importlib.util.spec_from_file_location("kforge_moe_other", os.environ["MOE_MODULE"])
    _moe = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_moe)
    load_source, moe_configs, moe_source = _moe.load_source, _moe.moe_configs, _moe.moe_source
else:
    from kforge.kernels.moe import load_source, moe_configs, moe_source  # noqa: E402

T = int(os.environ.get("MOE_T", "4096"))
E, TOPK, HID, INTER = 32, 4, 2880, 2880
SCHEME = os.environ.get("MOE_SCHEME", "fp16x3")
DTYPE = os.environ.get("MOE_DTYPE", "fp32")          # bf16: a model cast to bf16


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=300)


def main() -> int:
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[DTYPE]
    x = torch.randn(T, HID, device=dev, generator=g)
    logits = torch.randn(T, E, device=dev, generator=g)
    top, index = torch.topk(logits, TOPK, dim=-1)
    weight = torch.softmax(top, dim=-1)
    w1 = (torch.rand(E, HID, 2 * INTER, device=dev, generator=g) * 2 - 1) / HID ** 0.5
    b1 = (torch.rand(E, 2 * INTER, device=dev, generator=g) * 2 - 1) / HID ** 0.5
    w2 = (torch.rand(E, INTER, HID, device=dev, generator=g) * 2 - 1) / INTER ** 0.5
    b2 = (torch.rand(E, HID, device=dev, generator=g) * 2 - 1) / INTER ** 0.5
    x, weight, w1, b1, w2, b2 = (t.to(dt) for t in (x, weight, w1, b1, w2, b2))
    counts = torch.bincount(index.reshape(-1), minlength=E)
    flop = 2 * T * TOPK * HID * 2 * INTER + 2 * T * TOPK * INTER * HID
    result = {"T": T, "experts": E, "top_k": TOPK, "hidden": HID, "inter": INTER,
              "scheme": SCHEME if DTYPE == "fp32" else DTYPE, "flop": flop, "rows_per_expert_min_max":
              [int(counts.min()), int(counts.max())], "variants": []}
    planes = DTYPE == "fp32" and SCHEME.startswith("fp16")
    products = 3 if DTYPE == "fp32" and SCHEME in ("fp16x3", "tf32x3") else 1
    configs = moe_configs(DTYPE, "cuda", rows=T * TOPK // E, split=planes)
    variants = [dict(c) for c in configs]
    for gm in (4, 16, 32):
        variants.append(dict(configs[0], group_m=gm))
    if os.environ.get("MOE_VARIANTS") == "first":          # the first configuration alone
        variants = variants[:1]
    ref = None
    first_mod = None
    for i, cfg in enumerate(variants):
        row = {"config": cfg}
        try:
            src = moe_source(num_experts=E, top_k=TOPK, activation="gpt_oss", alpha=1.702,
                             limit=7.0, dtype=DTYPE,
                             dot_precision="tf32" if SCHEME == "tf32" else "ieee",
                             fp32_dot="tf32x3" if SCHEME == "tf32" else SCHEME, **cfg)
            mod = load_source(src, f"kforge_moe_ab_{i}")
            prepared = mod.prepare_weights({3: w1, 5: w2})
            args = (x, index, weight, prepared[3], b1, prepared[5], b2)
            (y,) = mod.launch(*args)
            torch.cuda.synchronize()
            if ref is None:
                ref, first_mod, first_args = y, mod, args
            row["diff"] = ((y - ref).abs().max() / ref.abs().max()).item()
            row["ms"] = bench(lambda: mod.launch(*args))
            row["tflops_3x"] = products * flop / row["ms"] / 1e9
            del prepared, args, y
        except Exception as e:                      # noqa: BLE001 - a variant that fails
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(row), flush=True)
        result["variants"].append(row)
        torch.cuda.empty_cache()
    # 2. the first configuration kernel by kernel
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        first_mod.launch(*first_args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            first_mod.launch(*first_args)
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" or getattr(ev, "device_time_total", 0):
            t = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
            if t:
                kernels[ev.key] = round(t / 10 / 1000, 4)      # ms a call
    result["profile_ms"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1]))
    print(json.dumps(result["profile_ms"], indent=1), flush=True)
    del first_args, ref
    torch.cuda.empty_cache()
    # 3. dense fp16x3 of the same products (and cuBLAS bf16: a bf16 model's route)
    import fp16x3_ab as fa
    dense = {}
    for name, (M, N, K) in {"up": (T * TOPK, 2 * INTER, HID),
                            "down": (T * TOPK, HID, INTER)}.items():
        a = torch.randn(M, K, device=dev, generator=g)
        b = torch.randn(N, K, device=dev, generator=g) / K ** 0.5
        a2, sa = fa.planes(a)
        b2, sb = fa.planes(b)
        c = torch.empty(M, N, device=dev)
        cfg = fa.VARIANTS["base"]
        dense[f"{name}_fp16x3_ms"] = bench(
            lambda: fa.launch(cfg, a2[0], a2[1], b2[0], b2[1], sa, sb, c, a2, b2))
        a16, b16 = a.bfloat16(), b.bfloat16()
        dense[f"{name}_cublas_bf16_ms"] = bench(lambda: a16 @ b16.T)
        del a, b, a2, b2, c, a16, b16
        torch.cuda.empty_cache()
    result["dense"] = dense
    print(json.dumps(dense), flush=True)
    (out / "moe_ab.json").write_text(json.dumps(result, indent=1))
    print("| config | ms | 3-product TFLOP/s | diff |")
    for r in result["variants"]:
        print(f"| {r['config']} | {r.get('ms', float('nan')):.3f} | "
              f"{r.get('tflops_3x', 0):.0f} | {r.get('diff', r.get('error'))} |")
    d = dense
    print(f"dense fp16x3: up {d['up_fp16x3_ms']:.3f} + down {d['down_fp16x3_ms']:.3f} = "
          f"{d['up_fp16x3_ms'] + d['down_fp16x3_ms']:.3f} ms; cuBLAS bf16 "
          f"{d['up_cublas_bf16_ms'] + d['down_cublas_bf16_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
