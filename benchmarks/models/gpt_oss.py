"""gpt-oss decoder LM (MoE SwiGLU experts, attention sinks, alternating sliding-window / full
attention, GQA, YaRN RoPE, RMSNorm) — KForge model zoo.

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.GptOssForCausalLM` built from a `GptOssConfig` with random weights (torch default
init under whatever seed is active; nothing is downloaded). forward(input_ids) -> logits.

Two implementation choices are set explicitly (see NOTES.md for the measurements; the experts
default to "kforge_grouped", below — a grouped GEMM over the routed tokens):
* attention: "eager". Only eager_attention_forward in modeling_gpt_oss adds the per-head sink
  logit; transformers 5 marks GptOss as not supporting SDPA (`_supports_sdpa = False`), so eager
  is also what a user gets by default.
* experts: "dense_all_experts", a forward registered below. transformers 5 defaults to
  "grouped_mm", which on fp32 under torch.export becomes the opaque custom op
  `transformers.grouped_mm_fallback` (plus aten.sort / aten.histc) that torch-mlir cannot lower;
  "eager" loops over `nonzero()` experts and does not export (data-dependent guard);
  "batched_mm" exports to plain aten but gathers one weight matrix per (token, expert) pair —
  fine small, ~270 GB at the real size. The dense forward runs every expert on every token with
  two bmm's and weights the results by the router's top-k scores spread over a dense
  [tokens, experts] matrix (unselected experts get weight 0): static shapes, plain aten, and
  the same maths — it is the inference path GptOssExperts itself had in transformers 4.55.
  The cost is num_experts / top_k (= 2x here) more expert FLOPs than a sparse kernel.

Size: the environment variable KFORGE_ZOO_SIZE picks a row of SIZES ("small" by default).
"""
import os

import torch
from torch import nn
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from kforge.moe_op import register_transformers_experts

# Size table, selected by KFORGE_ZOO_SIZE:
#   "small" (default) — CI on a 2-core CPU under the Triton interpreter: 2 layers (sliding,
#                       full), hidden 64, 4 query heads / 2 KV heads of 16, 4 experts top-2,
#                       sliding window 8, seq 32, batch 2.
#   "real"            — GPU-sized: gpt-oss-20b layer geometry (hidden 2880, expert FFN 2880,
#                       64 query heads / 8 KV heads of 64, sliding window 128) with 4 layers,
#                       4 experts top-2 and the vocab cut to 32000 (the real 201088 would make
#                       the LM head + embedding 1.16B of 1.66B parameters), seq 512, batch 4.
# batch/seq are input shapes; every other key is a GptOssConfig field. layer_types alternate
# sliding_attention / full_attention (the GptOssConfig default).
SIZES = {
    "small": dict(batch=2, seq=32, vocab_size=256, hidden_size=64, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    "real": dict(batch=4, seq=512, vocab_size=32000, hidden_size=2880, intermediate_size=2880,
                 num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                 num_local_experts=4, num_experts_per_tok=2, sliding_window=128),
}

# "kforge_grouped" (the default): the experts as one op over the routed tokens only,
# torch.ops.kforge.moe_experts — a fallback op KForge gives a grouped-GEMM kernel
# (kforge.kernels.moe); its PyTorch implementation groups the tokens by expert (kforge.moe_op).
# KFORGE_ZOO_EXPERTS=dense_all_experts picks the dense forward below instead.
EXPERTS_IMPLEMENTATION = os.environ.get("KFORGE_ZOO_EXPERTS", "kforge_grouped")


def _dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """GptOssExperts forward over all experts. hidden_states [T, H]; top_k_index / top_k_weights
    [T, K]. Weights are stored transposed: gate_up_proj [E, H, 2I] (gate/up interleaved),
    down_proj [E, I, H]."""
    num_tokens, hidden = hidden_states.shape
    num_experts = self.num_experts
    # Dense routing weights [T, E]: top_k_weights placed at top_k_index, 0 elsewhere. Written as
    # a compare with arange + sum over k (a one-hot) rather than a scatter, so it stays
    # elementwise + reduction (a scatter would be a fallback op in KForge).
    experts = torch.arange(num_experts, device=hidden_states.device)
    one_hot = (top_k_index.unsqueeze(-1) == experts).to(top_k_weights.dtype)    # [T, K, E]
    routing = (one_hot * top_k_weights.unsqueeze(-1)).sum(dim=1)                 # [T, E]
    x = hidden_states.unsqueeze(0).expand(num_experts, num_tokens, hidden)       # [E, T, H]
    gate_up = torch.bmm(x, self.gate_up_proj) + self.gate_up_proj_bias.unsqueeze(1)
    glu = self._apply_gate(gate_up)                                              # [E, T, I]
    out = torch.bmm(glu, self.down_proj) + self.down_proj_bias.unsqueeze(1)      # [E, T, H]
    out = out * routing.transpose(0, 1).unsqueeze(-1)
    return out.sum(dim=0)


ALL_EXPERTS_FUNCTIONS["dense_all_experts"] = _dense_experts_forward
register_transformers_experts()          # "kforge_grouped"


def _size(size=None):
    size = size or os.environ.get("KFORGE_ZOO_SIZE", "small")
    if size not in SIZES:
        raise ValueError(f"KFORGE_ZOO_SIZE={size!r}: expected one of {sorted(SIZES)}")
    return dict(SIZES[size])


class Model(nn.Module):
    def __init__(self, size=None):
        super().__init__()
        cfg = _size(size)
        cfg.pop("batch"), cfg.pop("seq")
        config = GptOssConfig(
            **cfg,
            attention_bias=True,
            attention_dropout=0.0,
            rms_norm_eps=1e-5,
            swiglu_limit=7.0,
            tie_word_embeddings=False,
            output_router_logits=False,
            # rope_parameters: GptOssConfig default (YaRN, factor 32, theta 150000).
            use_cache=False,
            # Sinks are only implemented by the eager attention path (GptOss has no SDPA support
            # in transformers 5, so this is also the default).
            attn_implementation="eager",
            experts_implementation=EXPERTS_IMPLEMENTATION,
        )
        self.model = GptOssForCausalLM(config).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def get_inputs():
    cfg = _size()
    return [torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq"]), dtype=torch.int64)]


def get_init_inputs():
    return []
