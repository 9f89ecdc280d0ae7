"""gpt-oss-20b architecture (hidden 2880, 64 query / 8 KV heads of 64, attention sinks,
alternating 128-token sliding-window and full attention, 32 experts top-4 with the clamped
SwiGLU, YaRN RoPE), prefill or one decode step against a KV cache — KForge model zoo, LLM
inference workloads (issue 12).

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.GptOssForCausalLM` built from a `GptOssConfig` with random weights (nothing is
downloaded), cut to a few layers. Its experts run as `torch.ops.kforge.moe_experts` over the
routed tokens only (kforge.moe_op; KForge gives it a grouped-GEMM kernel, kforge.kernels.moe);
attention is transformers' eager path, the only one with sinks. The phase and its shapes come
from the environment (kforge.bench.llm: KFORGE_LLM_PHASE=prefill|decode, KFORGE_LLM_LAYERS,
_BATCH, _SEQ, _CONTEXT).

`kforge bench` runs it as two workloads, FILE.prefill and FILE.decode (VARIANTS), and reports
tokens/s (`tokens_per_call`); its --smoke is the small size, otherwise KFORGE_ZOO_SIZE or real.

Sizes (KFORGE_ZOO_SIZE): "small" (CI, the Triton interpreter: 2 layers, 8 experts top-4,
window 8) and "real" (the GPU: the 20b geometry and vocabulary, 4 layers; prefill batch 8 x 2048
tokens, decode batch 64 against 2048 cached tokens).
"""
from transformers import GptOssConfig, GptOssForCausalLM

from kforge.bench.llm import VARIANTS, LLMWorkload, file_functions, llm_shape  # noqa: F401
from kforge.moe_op import register_transformers_experts

SIZES = {
    "small": dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_local_experts=8, num_experts_per_tok=4, sliding_window=8,
                  prefill=(2, 32), decode=(4, 24)),
    "real": dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                 num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=8,
                 head_dim=64, num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
                 prefill=(8, 2048), decode=(64, 2048)),
}


class Model(LLMWorkload):
    def __init__(self, size=None):
        shape = llm_shape(SIZES, size)
        super().__init__(shape.phase)
        self.config = GptOssConfig(
            **shape.config, attention_bias=True, attention_dropout=0.0, rms_norm_eps=1e-5,
            swiglu_limit=7.0, tie_word_embeddings=False, output_router_logits=False,
            use_cache=self.phase == "decode", attn_implementation="eager",
            experts_implementation=register_transformers_experts())
        self.model = GptOssForCausalLM(self.config).eval()


get_inputs, get_init_inputs, tokens_per_call = file_functions(SIZES)
