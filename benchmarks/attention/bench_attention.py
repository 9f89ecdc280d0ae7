"""H200 benchmark of kforge.kernels.attention against torch's scaled_dot_product_attention.

    PYTHONUNBUFFERED=1 python3 benchmarks/attention/bench_attention.py --out $OUT/attention.json
    python3 benchmarks/attention/bench_attention.py --smoke     # tiny shapes, Triton interpreter

For every case: each configuration of attention_configs() is rendered, checked against a float64
reference (reference_attention, on the first and last batch element: KForge's comparison
|out - ref| <= tol * max(1, RMS(ref)) + tol * |ref|; tol 1e-4 for fp32 "ieee", 1e-2 otherwise),
then timed with triton.testing.do_bench (median). The baseline is F.scaled_dot_product_attention on
the same tensors (flash / efficient / cuDNN, whichever torch picks; for fp32 under
torch.backends.cuda.matmul.allow_tf32 = False). Prints a table and writes JSON to --out.

Cases (--cases, comma-separated names; default all):
  mha_causal_bf16    B=8  Hq=Hkv=32 S=2048 D=128 causal bf16, dot bf16
  gqa_causal_bf16    B=8  Hq=32 Hkv=8  S=2048 D=128 causal bf16, dot bf16
  decode_gqa_bf16    B=64 Hq=32 Hkv=8  Sq=1 Skv=2048 D=128 (bottom-right causal = all keys) bf16
  mha_causal_fp32    B=8  Hq=Hkv=32 S=2048 D=128 causal fp32, dot "ieee" (tf32x3)
  mha_causal_fp32_tf32   the same, dot "tf32"
  gptoss_swa_sinks_bf16  B=4 Hq=64 Hkv=8 S=2048 D=64 causal window=128 + sinks, bf16 (baseline:
                     SDPA with the band as a bool mask, no sinks: a timing reference only)
  mla_causal_bf16    B=4  Hq=Hkv=32 S=2048 D=192 Dv=128 causal bf16 (DeepSeek-V3's head dims)
  mla_causal_fp32    B=2  Hq=Hkv=32 S=2048 D=192 Dv=128 causal fp32, dot "ieee" (tf32x3)
  llama_fp32in_bf16  B=4  Hq=32 Hkv=8 S=1024 D=128 causal, fp32 tensors, dot bf16 (what the bf16
                     policy's Llama-3-8B prefill package runs: its activations stay fp32)
  llama_bf16in_bf16  the same shape with bf16 tensors
  llama_fp32in_fp16x1  fp32 tensors, dot "fp16x1" (the bf16 policy's second scheme: the first
                     missed 1e-2 on the verification's wide-magnitude inputs, CPU emulation)
A case's value head dim (Dv) defaults to D; cases with Dv = D run against sources that predate
value_head_dim (a regression check of one source against another: --cases of those alone).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

CASES = {
    # name: B, Hq, Hkv, Sq, Skv, D, dtype, dot, causal, window, sinks[, Dv]
    "mha_causal_bf16": (8, 32, 32, 2048, 2048, 128, "bf16", "bf16", True, None, False),
    "gqa_causal_bf16": (8, 32, 8, 2048, 2048, 128, "bf16", "bf16", True, None, False),
    "decode_gqa_bf16": (64, 32, 8, 1, 2048, 128, "bf16", "bf16", True, None, False),
    "mha_causal_fp32": (8, 32, 32, 2048, 2048, 128, "fp32", "ieee", True, None, False),
    "mha_causal_fp32_tf32": (8, 32, 32, 2048, 2048, 128, "fp32", "tf32", True, None, False),
    "gptoss_swa_sinks_bf16": (4, 64, 8, 2048, 2048, 64, "bf16", "bf16", True, 128, True),
    "mla_causal_bf16": (4, 32, 32, 2048, 2048, 192, "bf16", "bf16", True, None, False, 128),
    "mla_causal_fp32": (2, 32, 32, 2048, 2048, 192, "fp32", "ieee", True, None, False, 128),
    "llama_fp32in_bf16": (4, 32, 8, 1024, 1024, 128, "fp32", "bf16", True, None, False),
    "llama_bf16in_bf16": (4, 32, 8, 1024, 1024, 128, "bf16", "bf16", True, None, False),
    "llama_fp32in_fp16x1": (4, 32, 8, 1024, 1024, 128, "fp32", "fp16x1", True, None, False),
}
SMOKE = {
    "mha_causal_bf16": (1, 2, 2, 40, 40, 64, "bf16", "bf16", True, None, False),
    "decode_gqa_bf16": (2, 8, 2, 1, 50, 64, "bf16", "bf16", True, None, False),
    "mha_causal_fp32": (1, 2, 2, 33, 33, 32, "fp32", "ieee", True, None, False),
    "gptoss_swa_sinks_bf16": (1, 4, 2, 40, 40, 32, "bf16", "bf16", True, 8, True),
    "mla_causal_bf16": (1, 2, 2, 40, 40, 48, "bf16", "bf16", True, None, False, 32),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[1:]))
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "attention.json"),
                   help="JSON results path (default: $OUT/attention.json or ./attention.json)")
    p.add_argument("--cases", default="", help=f"comma-separated subset of {', '.join(CASES)}")
    p.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd",
                   help="q/k/v memory order: contiguous [B, H, S, D], or [B, S, H, D] viewed as "
                        "[B, H, S, D] (what a projection's output reshaped into heads gives)")
    p.add_argument("--quick", action="store_true", help="first configuration of each case only")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="soft wall-time budget: later configurations are skipped past it")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warmup (ms)")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetitions (ms)")
    p.add_argument("--no-check", action="store_true", help="skip the float64 correctness check")
    p.add_argument("--fp32-fma", action="store_true",
                   help="also time fp32_dot='ieee' (plain FMA, no tensor cores) on the fp32 case")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes under the Triton interpreter (no GPU needed)")
    return p.parse_args(argv)


def kept_pairs(Sq, Skv, causal, window):
    """Number of (query, key) pairs the band keeps (for FLOP counts)."""
    off = Skv - Sq
    n = 0
    for i in range(Sq):
        hi = min(Skv, i + off + 1) if causal else Skv
        lo = max(0, i + off - window + 1) if window else 0
        n += max(0, hi - lo)
    return n


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
    import torch
    import torch.nn.functional as F
    import triton

    from kforge.kernels.attention import (attention_configs, attention_source, load_source,
                                          reference_attention)

    t_start = time.time()
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        sys.exit("bench_attention.py: no CUDA device; run it on the H200 (or use --smoke)")
    dev = "cuda" if cuda else "cpu"
    if cuda:
        from triton.testing import do_bench
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    table = CASES if not args.smoke else SMOKE
    names = [n for n in (args.cases.split(",") if args.cases else table) if n]
    for n in names:
        if n not in table:
            sys.exit(f"unknown case {n!r}; choose from {', '.join(table)}")
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": args.smoke,
           "env": {"torch": torch.__version__, "triton": triton.__version__,
                   "device": torch.cuda.get_device_name() if cuda else "cpu (interpreter)"},
           "cases": []}
    dts = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def timeit(fn):
        if cuda:
            return float(do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median"))
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def check(out, q, k, v, causal, window, sinks, tol):
        """Worst ratio err / allowed over batch elements 0 and B-1 (<= 1 passes)."""
        worst = 0.0
        for b in sorted({0, q.shape[0] - 1}):
            ref = reference_attention(q[b:b + 1].double(), k[b:b + 1].double(),
                                      v[b:b + 1].double(), causal=causal, window=window,
                                      sinks=None if sinks is None else sinks.double())
            o = out[b:b + 1].double()
            scale = max(1.0, ref.pow(2).mean().sqrt().item())
            ratio = ((o - ref).abs() / (tol * scale + tol * ref.abs())).max().item()
            if math.isnan(ratio):
                ratio = float("inf")
            worst = max(worst, ratio)
            del ref, o
        return worst

    for name in names:
        B, Hq, Hkv, Sq, Skv, D, dtype, dot, causal, window, has_sinks = table[name][:11]
        Dv = table[name][11] if len(table[name]) > 11 else D
        # sources before value_head_dim take no such argument: pass it only where it differs
        dv_kw = {} if Dv == D else {"value_head_dim": Dv}
        g = torch.Generator(device=dev).manual_seed(0)
        dt = dts[dtype]
        if args.layout == "bshd":
            q = torch.randn(B, Sq, Hq, D, device=dev, dtype=dt, generator=g).transpose(1, 2)
            k = torch.randn(B, Skv, Hkv, D, device=dev, dtype=dt, generator=g).transpose(1, 2)
            v = torch.randn(B, Skv, Hkv, Dv, device=dev, dtype=dt, generator=g).transpose(1, 2)
        else:
            q = torch.randn(B, Hq, Sq, D, device=dev, dtype=dt, generator=g)
            k = torch.randn(B, Hkv, Skv, D, device=dev, dtype=dt, generator=g)
            v = torch.randn(B, Hkv, Skv, Dv, device=dev, dtype=dt, generator=g)
        sinks = torch.randn(Hq, device=dev, dtype=torch.float32, generator=g) if has_sinks else None
        tol = 1e-4 if (dtype == "fp32" and dot == "ieee") else 1e-2
        pairs = kept_pairs(Sq, Skv, causal, window)
        flops = 2.0 * (D + Dv) * pairs * B * Hq
        kv_bytes = 1.0 * B * Hkv * Skv * (D + Dv) * q.element_size()
        case = {"name": name, "B": B, "Hq": Hq, "Hkv": Hkv, "Sq": Sq, "Skv": Skv, "D": D, "Dv": Dv,
                "dtype": dtype, "dot_precision": dot, "causal": causal, "window": window,
                "sinks": has_sinks, "tol": tol, "gflop": flops / 1e9, "configs": []}
        variants = [dict(fp32_dot="tf32x3")]
        if args.fp32_fma and dtype == "fp32" and dot == "ieee":
            variants.append(dict(fp32_dot="ieee"))
        cfgs = attention_configs(D, dtype, "cuda" if cuda else "cpu",
                                 seq_q=Sq, dot_precision=dot, **dv_kw)
        if args.quick:
            cfgs = cfgs[:1]
        for var in variants:
            vcfgs = cfgs
            if var["fp32_dot"] == "ieee":
                vcfgs = attention_configs(D, dtype, "cuda" if cuda else "cpu", seq_q=Sq,
                                          dot_precision=dot, fp32_dot="ieee", **dv_kw)
            for cfg in vcfgs:
                row = {"config": dict(cfg, **var)}
                case["configs"].append(row)
                if time.time() - t_start > args.budget_s:
                    row["skipped"] = "budget"
                    continue
                try:
                    src = attention_source(head_dim=D, causal=causal, window=window,
                                           sinks=has_sinks, gqa_group=Hq // Hkv, dtype=dtype,
                                           dot_precision=dot, interpret=not cuda, **cfg, **var,
                                           **dv_kw)
                    mod = load_source(src, f"bench_attn_{name}")
                    call = (lambda m=mod: m.launch(q, k, v, sinks)) if has_sinks else \
                        (lambda m=mod: m.launch(q, k, v))
                    t0 = time.time()
                    (out,) = call()
                    if cuda:
                        torch.cuda.synchronize()
                    row["first_call_s"] = round(time.time() - t0, 2)
                    if not args.no_check:
                        row["err_ratio"] = check(out, q, k, v, causal, window, sinks, tol)
                        row["ok"] = row["err_ratio"] <= 1.0
                    del out
                    ms = timeit(call)
                    row.update(ms=ms, tflops=flops / ms / 1e9, kv_gbps=kv_bytes / ms / 1e6)
                except Exception as exc:     # noqa: BLE001 - recorded per configuration
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:800]}"
                    traceback.print_exc()
                print(f"  {name} {row['config']}: " + ", ".join(
                    f"{k_}={v_:.4g}" if isinstance(v_, float) else f"{k_}={v_}"
                    for k_, v_ in row.items() if k_ != "config"), flush=True)
        timed = [r for r in case["configs"] if "ms" in r and r.get("ok", True)]
        case["best"] = min(timed, key=lambda r: r["ms"]) if timed else None

        # baseline: torch SDPA on the same tensors (bottom-right causal == is_causal when Sq == Skv;
        # for Sq = 1 bottom-right causal keeps every key: no mask)
        try:
            kw = {"enable_gqa": Hq != Hkv}
            label = "F.scaled_dot_product_attention"
            if window:
                i = torch.arange(Sq, device=dev)[:, None]
                j = torch.arange(Skv, device=dev)[None, :]
                kw["attn_mask"] = (j <= i + Skv - Sq) & (j > i + Skv - Sq - window)
                label += " (band as bool mask, no sinks)"
            elif causal and Sq == Skv:
                kw["is_causal"] = True
            elif causal and Sq != 1:
                from torch.nn.attention.bias import causal_lower_right
                kw["attn_mask"] = causal_lower_right(Sq, Skv)
            base = lambda: F.scaled_dot_product_attention(q, k, v, **kw)  # noqa: E731
            bms = timeit(base)
            case["baseline"] = {"name": label, "ms": bms, "tflops": flops / bms / 1e9}
            if case["best"]:
                case["speedup"] = bms / case["best"]["ms"]
        except Exception as exc:     # noqa: BLE001
            case["baseline"] = {"name": "F.scaled_dot_product_attention",
                                "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        res["cases"].append(case)
        del q, k, v
        if cuda:
            torch.cuda.empty_cache()

    res["wall_s"] = round(time.time() - t_start, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)

    print(f"\n{'case':24s} {'best config':26s} {'ms':>9s} {'TFLOP/s':>8s} {'GB/s kv':>8s} "
          f"{'err/tol':>8s} {'sdpa ms':>9s} {'speedup':>8s}")
    nan = float("nan")
    for c in res["cases"]:
        b = c["best"]
        bl = c.get("baseline", {})
        cfg = "-"
        if b:
            x = b["config"]
            cfg = f"{x['block_m']}x{x['block_n']} w{x['num_warps']} s{x['num_stages']}"
            cfg += " pack" if x.get("pack_gqa") else ""
            cfg += f" {x['fp32_dot']}" if c["dot_precision"] == "ieee" else ""
        print(f"{c['name']:24s} {cfg:26s} "
              f"{(b['ms'] if b else nan):9.4f} {(b['tflops'] if b else nan):8.1f} "
              f"{(b['kv_gbps'] if b else nan):8.0f} "
              f"{(b.get('err_ratio', nan) if b else nan):8.3f} "
              f"{bl.get('ms', nan):9.4f} {c.get('speedup', nan):8.2f}")
    failed = [f"{c['name']} {r['config']}" for c in res["cases"] for r in c["configs"]
              if r.get("ok") is False or "error" in r]
    if failed:
        print("\nfailed (wrong or did not run):\n  " + "\n  ".join(failed))
    print(f"\nwrote {args.out} ({res['wall_s']} s)")


if __name__ == "__main__":
    main()
