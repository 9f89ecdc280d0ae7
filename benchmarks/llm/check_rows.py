"""Where a package's whole-model error lies: its outputs against eager PyTorch, row by row.

    python benchmarks/llm/check_rows.py PACKAGE [--target cuda|cpu] [--seeds 0,1] [--exact-only]
                                                [--compile] [--by-kind]

For each input seed (the model's weights drawn under seed 0, as the frontend and
`kforge tune --check` do; the inputs under the seed: 0 is the check's, 1 the bench's), runs the
model file's eager module (the reference), the package's plan with every region on its fp32
reference (`exact`: the frontend's graph alone, no kernel), and (unless --exact-only; not on
cpu) the package with its kernels. For each, prints kforge.modelcheck.margin under the package's
policy and, for rows outside it, where they are: positions along the sequence (the output's
second-to-last dimension) in bins of 128, and the worst rows. An `exact` run outside the policy
puts the error in the frontend's graph or the fallback ops, not in any kernel. --compile adds
torch.compile (default mode) of the same fp32 module: how far PyTorch's own compiler lands from
eager on the same inputs. --by-kind runs the package once per region kind (attention, moe,
contraction, ...) with only that kind's kernels, the rest on references: which kind's kernels
carry the error.
"""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


def describe(name, out, ref, policy, seq_shape):
    from kforge.modelcheck import margin, row_ratios
    m = margin(out, ref, policy.atol, policy.rtol)
    print(f"  {name}: {m.text()}", flush=True)
    if m.ok:
        return
    w, _ = row_ratios(out, ref, policy.atol, policy.rtol)
    bad = (w > 1).nonzero().flatten()
    if len(seq_shape) >= 2:
        seq = seq_shape[-2]
        pos = bad % seq
        batch = bad // seq
        hist = torch.bincount(pos // 128, minlength=(seq + 127) // 128).tolist()
        print(f"    outside rows by position (bins of 128): {hist}; by batch: "
              f"{torch.bincount(batch).tolist()}")
    top = torch.argsort(w, descending=True)[:8]
    print("    worst rows: " + ", ".join(f"{int(i)} ({float(w[i]):.3g})" for i in top))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("package")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--exact-only", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--by-kind", action="store_true")
    args = ap.parse_args()
    from kforge.modelcheck import bound_model
    from kforge.modelfile import load_model_file
    from kforge.package import open_package
    from kforge.reference import run_host_plan
    from kforge.runtime import CompiledModel, use_interpreter
    from kforge.verify import get_policy
    package = open_package(args.package)
    policy = get_policy(package.precision)
    use_interpreter(args.target == "cpu")
    module, weights, inputs0 = bound_model(package, args.target)
    dev = inputs0[0].device
    print(f"matmul allow_tf32 {torch.backends.cuda.matmul.allow_tf32}, float32 matmul precision "
          f"{torch.get_float32_matmul_precision()}, cudnn allow_tf32 "
          f"{torch.backends.cudnn.allow_tf32}", flush=True)
    compiled = torch.compile(module) if args.compile else None
    exact = CompiledModel(package, weights, args.target, use_kernels=False,
                          compile_references=False)
    model = None if args.exact_only or args.target == "cpu" else \
        CompiledModel(package, weights, args.target)
    for seed in [int(s) for s in args.seeds.split(",")]:
        if seed == 0:
            inputs = inputs0
        else:
            _, drawn = load_model_file(package.model_path(), with_model=False, seed=seed)
            inputs = [t.to(dev) for t in drawn]
        print(f"inputs of seed {seed}: " + ", ".join(str(list(t.shape)) for t in inputs),
              flush=True)
        with torch.no_grad():
            ref = module(*inputs)
            ref = ref if isinstance(ref, torch.Tensor) else ref[0]
            out = run_host_plan(package.plan, package.specs, inputs, weights,
                                references=exact.references)[0]
            describe("exact (every region on its fp32 reference)", out, ref, policy, ref.shape)
            del out
            if compiled is not None:
                out = compiled(*inputs)
                out = out if isinstance(out, torch.Tensor) else out[0]
                describe("torch.compile of the fp32 model", out, ref, policy, ref.shape)
                del out
            if model is not None:
                for graphs in (False, True):
                    out = model.run(inputs, graphs=graphs)
                    out = out if isinstance(out, torch.Tensor) else out[0]
                    describe(f"kernels (graphs={graphs})", out, ref, policy, ref.shape)
                    del out
                if args.by_kind:
                    kinds = {}
                    for h in model.kernels:
                        kinds.setdefault(getattr(package.specs[h], "root_kind", "?"), []).append(h)
                    for kind, hs in sorted(kinds.items()):
                        refs = dict(exact.references)
                        for h in hs:
                            refs.pop(h, None)
                        out = run_host_plan(package.plan, package.specs, inputs, weights,
                                            kernels={h: model.kernels[h] for h in hs},
                                            references=refs)[0]
                        describe(f"only the {kind} kernels ({len(hs)})", out, ref, policy,
                                 ref.shape)
                        del out
        del ref
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
