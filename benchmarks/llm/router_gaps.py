"""An MoE model's router near-ties: for one sequence of a model file's inputs, the gap between
each token's last chosen expert logit and the first one left out, layer by layer, in eager fp32;
and, for chosen (layer, position) pairs, which experts float64 picks there.

    KFORGE_ZOO_SIZE=real KFORGE_LLM_LAYERS=3 KFORGE_LLM_BATCH=2 KFORGE_LLM_SEQ=1200 \\
      python benchmarks/llm/router_gaps.py benchmarks/models/gpt_oss_20b.py --seed 0 --row 1 \\
      [--float64 1:180]

The model's weights are drawn under seed 0 and the inputs under --seed, as the frontend and
`kforge tune --check` draw them (kforge.modelfile.load_model_file). --row takes one sequence
(batch row) alone: in a causal model its tokens see only each other. Routers are the modules
named `*.mlp.router` (transformers' gpt-oss); their logits are recomputed from their input
(F.linear with the module's weight and bias), top-k from the model's config.

A token whose gap is within the fp32 rounding of its logits (a few 1e-6 for logits of order 1)
can pick another expert in any implementation that is not bit-identical to eager fp32. Its
output then differs by the experts' difference. In a later sliding-window layer, that change
reaches the next window's tokens too (benchmarks/results/2026-12-06j-h100-other-shapes/).

--float64 LAYER:POS[,LAYER:POS...] then runs the model's first LAYER + 1 decoder layers in
float64 (the rest and the LM head dropped, to fit host memory) and prints both precisions'
top-k + 1 experts at each position: which side of the tie the exact answer is on.
"""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


def _routers(model):
    return [m for n, m in model.named_modules() if n.endswith("mlp.router")]


def _base(model):
    """The decoder stack (a module with `layers`) inside a zoo wrapper or a transformers model."""
    for m in model.modules():
        if isinstance(getattr(m, "layers", None), torch.nn.ModuleList):
            return m
    raise SystemExit("no decoder stack (a module with a `layers` ModuleList) in the model")


def _record(routers):
    logits = []

    def hook(mod, args, out):
        x = args[0]
        logits.append(torch.nn.functional.linear(x.reshape(-1, x.shape[-1]), mod.weight,
                                                 mod.bias).detach())
    handles = [r.register_forward_hook(hook) for r in routers]
    return logits, handles


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row", type=int, default=0)
    ap.add_argument("--show", type=int, default=5, help="smallest gaps shown a layer")
    ap.add_argument("--float64", default="", help="LAYER:POS[,LAYER:POS...]")
    args = ap.parse_args()
    from kforge.modelfile import load_model_file
    model, _ = load_model_file(args.model_file, seed=0)
    _, inputs = load_model_file(args.model_file, with_model=False, seed=args.seed)
    model.eval()
    ids = inputs[0][args.row:args.row + 1]
    cfg = getattr(getattr(model, "config", None), "num_experts_per_tok", None) or \
        getattr(getattr(getattr(model, "model", None), "config", None), "num_experts_per_tok", 4)
    k = int(cfg)
    routers = _routers(model)
    if not routers:
        raise SystemExit("no `*.mlp.router` modules in this model")
    logits, handles = _record(routers)
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    print(f"{args.model_file}: seed {args.seed}, row {args.row}, {ids.shape[1]} tokens, "
          f"top-{k} of {logits[0].shape[-1]} experts", flush=True)
    for layer, lg in enumerate(logits):
        top = torch.topk(lg, k + 1, dim=-1).values
        gap = top[:, k - 1] - top[:, k]
        order = torch.argsort(gap)[:args.show]
        print(f"layer {layer}: logit std {float(lg.std()):.3f}; smallest gaps: "
              + ", ".join(f"pos {int(i)} {float(gap[i]):.2e}" for i in order), flush=True)
    if not args.float64:
        return 0
    wanted = [tuple(int(v) for v in item.split(":")) for item in args.float64.split(",")]
    fp32 = {(layer, pos): logits[layer][pos] for layer, pos in wanted}
    del logits
    base = _base(model)
    base.layers = base.layers[:max(layer for layer, _ in wanted) + 1]
    for m in model.modules():           # drop the LM head: only the routers' inputs matter
        if hasattr(m, "lm_head"):
            m.lm_head = torch.nn.Identity()
    gc.collect()
    base.double()
    logits, handles = _record(_routers(base))
    with torch.no_grad():
        base(ids)
    for layer, pos in wanted:
        l32, l64 = fp32[(layer, pos)], logits[layer][pos]
        t32, t64 = torch.topk(l32, k + 1), torch.topk(l64, k + 1)
        print(f"layer {layer} pos {pos}: fp32 top-{k + 1} {t32.indices.tolist()} (gap "
              f"{float(t32.values[k - 1] - t32.values[k]):.2e}); float64 {t64.indices.tolist()} "
              f"(gap {float(t64.values[k - 1] - t64.values[k]):.2e}); max |fp32 - float64| of "
              f"its logits {float((l32.double() - l64).abs().max()):.2e}; the chosen set "
              f"{'agrees' if set(t32.indices[:k].tolist()) == set(t64.indices[:k].tolist()) else 'DIFFERS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
