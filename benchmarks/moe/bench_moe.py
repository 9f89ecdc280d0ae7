"""The builtin's grouped-GEMM MoE kernel (kforge.kernels.moe) against kforge.moe_op's PyTorch
implementation (tokens grouped by expert, one matmul per expert), on the GPU, at gpt-oss-20b's
layer shape: hidden 2880, expert FFN 2880, 32 experts top-4.

    python benchmarks/moe/bench_moe.py --out $OUT/moe.json [--tokens 16384 512 64]
        [--group-m 8 1000000]     # program orders: GROUP_M row tiles at a time (a number past
                                  # the row tiles' count is the rows-first order before GROUP_M)

Per token count and dtype: max error of each against a float64 evaluation (on a subset of
tokens), and the median time of each (triton.testing.do_bench).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 512, 64])
    p.add_argument("--dtypes", nargs="+", default=["bf16"])
    p.add_argument("--schemes", nargs="*", default=[],
                   help="dot/fp32_dot pairs to run (default all), e.g. ieee/fp16x3")
    p.add_argument("--group-m", type=int, nargs="*", default=[],
                   help="GROUP_M values to time for every configuration (default: the source's)")
    p.add_argument("--max-configs", type=int, default=0,
                   help="time only the first N tile configurations (0: all)")
    p.add_argument("--extra-configs", default="",
                   help="JSON list of further tile configurations (moe_source keywords) to time "
                        "after moe_configs' own")
    args = p.parse_args()
    import triton.testing

    from kforge.kernels.moe import load_source, moe_configs, moe_source
    from kforge.moe_op import moe_experts_reference
    H, I, E, K = 2880, 2880, 32, 4
    rows = []
    for dt in args.dtypes:
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
        g = torch.Generator(device="cuda").manual_seed(0)
        w1 = (torch.randn(E, H, 2 * I, device="cuda", generator=g) / H ** 0.5).to(dtype)
        b1 = torch.randn(E, 2 * I, device="cuda", generator=g).to(dtype) * 0.1
        w2 = (torch.randn(E, I, H, device="cuda", generator=g) / I ** 0.5).to(dtype)
        b2 = torch.randn(E, H, device="cuda", generator=g).to(dtype) * 0.1
        for T in args.tokens:
            x = torch.randn(T, H, device="cuda", generator=g).to(dtype)
            scores = torch.randn(T, E, device="cuda", generator=g)
            top, index = torch.topk(scores, K, dim=-1)
            weight = torch.softmax(top, dim=-1).to(dtype)
            ops = (x, index, weight, w1, b1, w2, b2)
            sub = slice(0, min(T, 256))
            want = moe_experts_reference(*(t[sub].double() if t.shape[0] == T else t.double()
                                           for t in (x,)), index[sub], weight[sub].double(),
                                         w1.double(), b1.double(), w2.double(), b2.double(),
                                         "gpt_oss", 1.702, 7.0)
            ref = lambda: moe_experts_reference(*ops, "gpt_oss", 1.702, 7.0)  # noqa: E731
            row = {"dtype": dt, "tokens": T, "experts": E, "top_k": K, "hidden": H, "inter": I,
                   "pytorch_ms": float(triton.testing.do_bench(ref)),
                   "pytorch_err": float((ref()[sub].double() - want).abs().max())}
            schemes = ([("ieee", "fp16x3"), ("ieee", "tf32x3"), ("bf16", "tf32x3")]
                       if dt == "fp32" else [("bf16", "tf32x3")])
            flops = 2 * T * K * H * 2 * I + 2 * T * K * I * H
            row["schemes"] = {}
            for dot, fp32_dot in schemes:
                if args.schemes and f"{dot}/{fp32_dot}" not in args.schemes:
                    continue
                best = None
                tried = []
                split = dt == "fp32" and dot == "ieee" and fp32_dot == "fp16x3"
                tiles = moe_configs(dt, "cuda", rows=T * K // E, split=split)
                tiles = tiles[:args.max_configs] if args.max_configs > 0 else tiles
                tiles = tiles + (json.loads(args.extra_configs) if args.extra_configs else [])
                for cfg in [dict(c, group_m=gm) for c in tiles for gm in args.group_m] or tiles:
                    src = moe_source(num_experts=E, top_k=K, dtype=dt, dot_precision=dot,
                                     fp32_dot=fp32_dot, **cfg)
                    mod = load_source(src, f"moe_bench_{dt}_{T}_{dot}_{fp32_dot}_{len(tried)}")
                    try:
                        prep = getattr(mod, "prepare_weights", None)
                        run = list(ops)
                        if prep is not None:      # once, as the runtime does at bind
                            t0 = time.perf_counter()
                            new = prep({3: w1, 4: b1, 5: w2, 6: b2})
                            torch.cuda.synchronize()
                            prep_s = time.perf_counter() - t0
                            run = [new.get(i, a) for i, a in enumerate(ops)]
                        (out,) = mod.launch(*run)
                        ms = float(triton.testing.do_bench(lambda: mod.launch(*run)))
                    except Exception as exc:  # noqa: BLE001 - a config that fails is recorded
                        tried.append({"config": cfg,
                                      "failed": f"{type(exc).__name__}: {exc}"[:300]})
                        continue
                    err = float((out[sub].double() - want).abs().max())
                    tried.append({"config": cfg, "ms": ms, "err": err,
                                  "tflops": flops / ms / 1e9,
                                  "prepare_s": prep_s if prep is not None else None})
                    del out, run
                    if best is None or ms < best["ms"]:
                        best = tried[-1]
                row["schemes"][f"{dot}/{fp32_dot}"] = {"best": best, "tried": tried}
                if best:
                    best["speedup"] = row["pytorch_ms"] / best["ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                            "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
