"""How far a decode step's logits move when its GEMM operands are rounded as a kernel scheme
rounds them: on the CPU, at the workload's real size, against the fp32 model (issue 12).

The zoo LLM workload runs in fp32 twice: once as it is, once with the operands of every
nn.Linear product (and of the MoE experts' products, gpt-oss) rounded first. Schemes:

    bf16     operands rounded to bf16 (the bf16 policy's own GEMMs)
    fp16x1   each operand row (A) / weight column scaled by a power of two, rounded to fp16:
             KForge's fp16x1 products (8x finer than bf16, the same bytes)
    fp16x2   A (the activation) as fp32, the weight as fp16x1 rounds it: what a kernel of A's
             two fp16 planes against the weight's one plane (two products) would compute
    f64      the product in float64, rounded back: more accurate than fp32
    none     as fp32

and for attention (the `attn` part: torch's scaled_dot_product_attention, which the zoo's
models call), the attention kernel's schemes: bf16 (q, k, v and p rounded to bf16), fp16x1
(q per row and k per key over the head dim, v per column over the keys, scaled by powers of
two and rounded to fp16; p in fp16), fp16x3 (exact scores; v and p as fp16x1 rounds them),
none (fp32).

The report is the bf16 policy's check of `kforge bench`: |out - ref| against
1e-2 x max(1, RMS(ref)) + 1e-2 x |ref|, its worst ratio and the rows (sequences, tokens) over
it; for gpt-oss also, per router, the tokens that chose other experts than the fp32 run and the
fp32 run's top-k margin there (a near-tie flipped by rounding has a margin near the change of
the router's logits).

    python benchmarks/llm/emulate_rounding.py llama3_8b --modes bf16,fp16x1
    python benchmarks/llm/emulate_rounding.py llama3_8b --phase prefill --batch 1 \\
        --modes fp16x1,linear=fp16x1:head=none,linear=none:head=fp16x1
    python benchmarks/llm/emulate_rounding.py gpt_oss_20b --layers 2 --vocab 32000 \\
        --modes linear=fp16x1:moe=bf16,linear=f64:moe=f64:router=f64
    python benchmarks/llm/emulate_rounding.py llama3_8b --phase prefill --layers 2 \\
        --batch 4 --seq 1024 --modes linear=fp16x1:attn=fp16x1,linear=fp16x1:attn=fp16x3

A mode is one scheme for everything, or `part=scheme` items joined by ':' (parts: linear, the
projections; head, the LM head (the projections' scheme where not named); router, gpt-oss's
expert router; moe, the experts' products; moelast, the last layer's experts (moe's scheme where
not named); attn, attention; qk, the attention's query and key
projections (the projections' scheme where not named); unnamed parts stay fp32). Results of 2026-12-02: benchmarks/results/2026-12-02-h200-llm/.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("linear", "head", "qk", "router", "moe", "moelast", "attn")
QK_WEIGHTS: set[int] = set()        # ids of the attention's q and k projection weights (main)
ATTN_LAYERS: set[int] = set()       # --attn-layers: the layers whose attention takes `attn`
CURRENT_LAYER = [None]              # the decoder layer running now (a pre-hook sets it)
LAST_EXPERTS: list = []             # the last layer's experts module (main; gpt-oss)
LINEAR = torch.nn.functional.linear          # the originals, whatever install() puts in their place
SDPA = torch.nn.functional.scaled_dot_product_attention


def rounded(x: torch.Tensor, scheme: str, dim: int) -> torch.Tensor:
    if scheme in ("none", "f64"):
        return x
    if scheme == "bf16":
        return x.to(torch.bfloat16).float()
    if scheme == "fp16x1":
        amax = x.abs().amax(dim=dim, keepdim=True)
        scale = torch.ldexp(torch.ones_like(amax), 15 - torch.frexp(amax)[1])
        return (x * scale).to(torch.float16).float() / scale
    raise ValueError(f"unknown scheme {scheme!r}")


def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False, scheme="none"):
    """scaled_dot_product_attention with the attention kernel's rounding (`scheme`), in fp32
    (the kernel's softmax and accumulators), one batch row at a time (prefill's scores are GBs)."""
    if scheme == "none" or dropout_p:
        return SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)
    if k.shape[-3] != q.shape[-3]:          # grouped-query attention: each KV head's queries
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    if scheme == "bf16":
        q, k, v = (t.to(torch.bfloat16).float() for t in (q, k, v))
    else:
        v = rounded(v, "fp16x1", -2)
        if scheme == "fp16x1":
            q, k = rounded(q, "fp16x1", -1), rounded(k, "fp16x1", -1)
        elif scheme != "fp16x3":
            raise ValueError(f"unknown attention scheme {scheme!r}")
    out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    for b in range(q.shape[0]):
        s = (q[b] @ k[b].transpose(-1, -2)) * scale
        if is_causal:
            n, m = s.shape[-2:]
            s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(m - n), float("-inf"))
        if attn_mask is not None:
            mask = attn_mask[b] if attn_mask.dim() == 4 else attn_mask
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        p = torch.exp(s - s.amax(-1, keepdim=True))
        total = p.sum(-1, keepdim=True)
        p = p.to(torch.bfloat16 if scheme == "bf16" else torch.float16).float()
        out[b] = (p @ v[b]) / total
    return out


def product(a: torch.Tensor, b: torch.Tensor, scheme: str) -> torch.Tensor:
    """a @ b (b: [K, N]) with the scheme's operand rounding."""
    if scheme == "f64":
        return (a.double() @ b.double()).float()
    if scheme == "fp16x2":
        return a @ rounded(b, "fp16x1", 0)
    return rounded(a, scheme, -1) @ rounded(b, scheme, 0)


def parse_mode(text: str) -> dict:
    if "=" not in text:
        return {p: text for p in PARTS}
    mode = {p: "none" for p in PARTS}
    named = set()
    for item in text.split(":"):
        part, _, scheme = item.partition("=")
        if part not in PARTS:
            raise SystemExit(f"unknown part {part!r} in {text!r} (parts: {', '.join(PARTS)})")
        mode[part] = scheme
        named.add(part)
    if "head" not in named:
        mode["head"] = mode["linear"]
    if "qk" not in named:
        mode["qk"] = mode["linear"]
    if "moelast" not in named:
        mode["moelast"] = mode["moe"]
    return mode


def install(mode: dict, router_rows: int | None, vocab: int) -> None:
    """Route nn.Linear and the gpt-oss experts through the mode's rounding."""
    linear = LINEAR

    def rounded_linear(x, w, b=None):
        scheme = mode["router"] if router_rows is not None and w.shape[0] == router_rows \
            else mode["head"] if w.shape[0] == vocab else mode["qk"] if id(w) in QK_WEIGHTS \
            else mode["linear"]
        if scheme == "none":
            return linear(x, w, b)
        out = product(x.reshape(-1, x.shape[-1]), w.t(), scheme).reshape(*x.shape[:-1], -1)
        return out if b is None else out + b

    torch.nn.functional.linear = rounded_linear if any(v != "none" for v in mode.values()) \
        else linear
    def attn_scheme():
        # --attn-layers: the other layers' attention takes the projections' scheme
        if ATTN_LAYERS and CURRENT_LAYER[0] not in ATTN_LAYERS:
            return mode["linear"]
        return mode["attn"]

    def rounded_attention(*a, **kw):
        scheme = attn_scheme()
        return SDPA(*a, **kw) if scheme == "none" else attention(*a, **kw, scheme=scheme)

    torch.nn.functional.scaled_dot_product_attention = rounded_attention \
        if mode["attn"] != "none" or ATTN_LAYERS else SDPA
    try:
        from transformers.models.gpt_oss import modeling_gpt_oss as oss
    except ImportError:
        return

    def experts(self, hidden_states, router_indices=None, routing_weights=None):
        # the last layer's experts: no router after them (kforge.selection keeps them at the
        # package's policy only if its regions are told apart from the other layers')
        scheme = mode["moelast"] if LAST_EXPERTS and self is LAST_EXPERTS[0] else mode["moe"]
        out = torch.zeros_like(hidden_states)
        mask = torch.nn.functional.one_hot(router_indices, num_classes=self.num_experts)
        mask = mask.permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            e = e[0]
            pos, tokens = torch.where(mask[e])
            gate_up = product(hidden_states[tokens], self.gate_up_proj[e], scheme) \
                + self.gate_up_proj_bias[e]
            down = product(self._apply_gate(gate_up), self.down_proj[e], scheme) \
                + self.down_proj_bias[e]
            out.index_add_(0, tokens, down * routing_weights[tokens, pos, None])
        return out

    oss.GptOssExperts.forward = experts


class RouterLog:
    """Every gpt-oss router's logits and top-k choice in one forward pass (forward hooks)."""

    def __init__(self, model):
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.handles = [m.register_forward_hook(self._hook) for m in model.modules()
                        if type(m).__name__.endswith("TopKRouter")]

    def _hook(self, module, args, out):
        logits, _, indices = out
        self.calls.append((logits.detach().clone(), indices.detach().clone()))

    def take(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        calls, self.calls = self.calls, []
        return calls


def route_flips(ref_calls, calls, top_k: int) -> list[str]:
    """Per router (layer): tokens whose set of experts differs from the reference run's, and
    the reference's margin there (its k-th minus its (k+1)-th router logit) against the
    median margin over all tokens and the largest change of a router logit between the runs."""
    lines = []
    for layer, ((ref_logits, ref_idx), (logits, idx)) in enumerate(zip(ref_calls, calls)):
        same = torch.sort(ref_idx, -1).values.eq(torch.sort(idx, -1).values).all(-1)
        top = torch.topk(ref_logits, top_k + 1, dim=-1).values
        margin = top[:, top_k - 1] - top[:, top_k]
        flipped = (~same).nonzero().flatten()
        moved = (logits - ref_logits).abs().max().item()
        text = ", ".join(f"{margin[t].item():.2e}" for t in flipped[:8])
        lines.append(f"  router {layer}: {len(flipped)} of {len(same)} tokens chose other "
                     f"experts (their margins {text or '-'}); median margin "
                     f"{margin.median().item():.2e}, smallest {margin.min().item():.2e}; "
                     f"router logits moved by up to {moved:.2e}")
    return lines


def _layer_of(name: str) -> int | None:
    """The decoder layer index in a module name such as model.layers.3.self_attn.q_proj."""
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == "layers" and b.isdigit():
            return int(b)
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a zoo LLM file of benchmarks/models (llama3_8b, gpt_oss_20b)")
    p.add_argument("--modes", default="bf16,fp16x1", help="comma-separated modes (see above)")
    p.add_argument("--layers", type=int, default=None, help="KFORGE_LLM_LAYERS (default: row's)")
    p.add_argument("--vocab", type=int, default=None,
                   help="a smaller vocabulary, to fit the CPU's memory (the error of a logit "
                        "does not depend on how many there are)")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    p.add_argument("--batch", type=int, default=None, help="KFORGE_LLM_BATCH (default: row's)")
    p.add_argument("--seq", type=int, default=None, help="KFORGE_LLM_SEQ (default: row's)")
    p.add_argument("--qk-layers", default=None, metavar="I,J",
                   help="only these decoder layers' (0-based) Q and K projections take the qk "
                        "part's scheme; the others take linear's (default: every layer's)")
    p.add_argument("--attn-layers", default=None, metavar="I,J",
                   help="only these decoder layers' attention takes the attn part's scheme; "
                        "the others take linear's (default: every layer's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    os.environ.update(KFORGE_ZOO_SIZE="real", KFORGE_LLM_PHASE=args.phase)
    if args.layers:
        os.environ["KFORGE_LLM_LAYERS"] = str(args.layers)
    if args.batch:
        os.environ["KFORGE_LLM_BATCH"] = str(args.batch)
    if args.seq:
        os.environ["KFORGE_LLM_SEQ"] = str(args.seq)
    sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmarks" / "models")]
    torch.set_num_threads(args.threads)
    module = __import__(args.model)
    if args.vocab:
        module.SIZES["real"]["vocab_size"] = args.vocab
    torch.manual_seed(args.seed)
    model = module.Model("real").eval()
    inputs = module.get_inputs()
    experts = getattr(model.config, "num_local_experts", None)
    qk_layers = {int(i) for i in args.qk_layers.split(",")} if args.qk_layers else None
    QK_WEIGHTS.update(id(m.weight) for name, m in model.named_modules()
                      if name.endswith((".q_proj", ".k_proj")) and
                      (qk_layers is None or _layer_of(name) in qk_layers))
    if args.attn_layers:
        ATTN_LAYERS.update(int(i) for i in args.attn_layers.split(","))
    for name, m in model.named_modules():
        if name.endswith(".self_attn") and _layer_of(name) is not None:
            m.register_forward_pre_hook(
                lambda mod, a, i=_layer_of(name): CURRENT_LAYER.__setitem__(0, i))
    LAST_EXPERTS[:] = [m for m in model.modules() if type(m).__name__ == "GptOssExperts"][-1:]
    modes = [parse_mode(m) for m in args.modes.split(",") if m]
    routers = RouterLog(model) if experts is not None else None
    with torch.no_grad():
        install(parse_mode("none"), experts, model.config.vocab_size)
        t0 = time.perf_counter()
        ref = model(*inputs)
        ref_routes = routers.take() if routers else []
        rms = ref.pow(2).mean().sqrt().item()
        print(f"{args.model} {args.phase}, {model.config.num_hidden_layers} layers, inputs "
              f"{[tuple(x.shape) for x in inputs][:1]}: fp32 in "
              f"{time.perf_counter() - t0:.1f} s; logits RMS {rms:.3f}, max |ref| "
              f"{ref.abs().max().item():.3f}", flush=True)
        tol = 0.01 * max(1.0, rms) + 0.01 * ref.abs()
        for mode in modes:
            install(mode, experts, model.config.vocab_size)
            err = (model(*inputs) - ref).abs()
            rows = int((err > tol).flatten(1).any(-1).sum())
            tokens = int((err > tol).reshape(-1, err.shape[-1]).any(-1).sum())
            name = ", ".join(f"{k} {v}" for k, v in mode.items()
                             if experts is not None or k in ("linear", "head", "qk", "attn"))
            print(f"{name}: max abs {err.max().item():.4f}, worst / tolerance "
                  f"{(err / tol).max().item():.2f}, sequences over it {rows} of "
                  f"{err.shape[0]}, tokens {tokens} of {err[..., 0].numel()}", flush=True)
            if routers:
                print("\n".join(route_flips(ref_routes, routers.take(),
                                             model.config.num_experts_per_tok)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
