"""Where a package's no-kernel route spends its time on the GPU, against eager PyTorch.

For each zoo model: the package loaded without kernels (every region on its aten program, run op
by op, or its reference where it has none), timed step by step (a synchronization around every
host-plan step), and torch.profiler's CUDA-kernel table for that route and for eager PyTorch on
the same inputs. Used to explain issue 11's goal-2 measurement (benchmarks/results/).

    KFORGE_ZOO_SIZE=real python benchmarks/zoo/profile_aten.py --packages .carry/zoo/strict \
        --out $OUT/aten_profile.json gpt2 llama
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))


def step_profile(compiled, inputs) -> list[dict]:
    from kforge.spec import CallStep, FallbackOp, KernelStep
    agg, count = collections.defaultdict(float), collections.Counter()

    def timer(step, run):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = run()
        torch.cuda.synchronize()
        if isinstance(step, (CallStep, KernelStep)):
            home = "aten program" if step.call in compiled.aten_regions else "reference"
            key = (home, step.call)
        elif isinstance(step, FallbackOp):
            key = ("fallback", step.name)
        else:
            key = ("host", getattr(step, "name", type(step).__name__))
        agg[key] += time.perf_counter() - t0
        count[key] += 1
        return out

    with torch.no_grad():
        compiled.run(inputs)
        compiled.run(inputs, step_timer=timer)
    rows = [{"home": k[0], "what": k[1], "count": count[k], "ms": round(v * 1e3, 3)}
            for k, v in agg.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def kernel_table(fn, top: int = 20) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t:
            rows.append({"kernel": e.key[:120], "calls": e.count // 3,
                         "ms_per_run": round(t / 3 / 1e3, 4)})
    return sorted(rows, key=lambda r: -r["ms_per_run"])[:top]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--packages", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from kforge.runtime import load_package
    from measure_zoo import zoo_model_on_gpu
    os.environ["KFORGE_COMPILE_REFERENCES"] = "0"
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "models": {}}
    for name in args.models:
        model, inputs = zoo_model_on_gpu(name)
        compiled = load_package(args.packages / name, module=model, target="cuda", tune=False,
                                use_kernels=False)
        steps = step_profile(compiled, inputs)
        entry = {"steps": steps[:25], "steps_total_ms": round(sum(r["ms"] for r in steps), 3),
                 "eager_kernels": kernel_table(lambda: model(*inputs)),
                 "aten_kernels": kernel_table(lambda: compiled(*inputs))}
        doc["models"][name] = entry
        print(f"== {name}: steps total {entry['steps_total_ms']} ms")
        for r in steps[:12]:
            print(f"  {r['ms']:9.3f} ms x{r['count']:<3} {r['home']:13} {r['what']}")
        for label in ("eager_kernels", "aten_kernels"):
            print(f"  -- {label}")
            for r in entry[label][:10]:
                print(f"  {r['ms_per_run']:9.4f} ms x{r['calls']:<4} {r['kernel']}")
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
