"""Llama-3-8B architecture (GQA 32/8, RoPE theta 500000, RMSNorm, SwiGLU 14336), prefill or one
decode step against a KV cache — KForge model zoo, LLM inference workloads (issue 12).

KernelBench format: `Model`, `get_inputs()`, `get_init_inputs()`. The model is
`transformers.LlamaForCausalLM` built from a `LlamaConfig` with random weights (nothing is
downloaded), cut to a few layers. The phase and its shapes come from the environment
(kforge.bench.llm: KFORGE_LLM_PHASE=prefill|decode, KFORGE_LLM_LAYERS, _BATCH, _SEQ, _CONTEXT):
prefill takes input_ids [B, S]; decode takes input_ids [B, 1] and each layer's cached keys and
values [B, 8, C, 128].

`kforge bench` runs it as two workloads, FILE.prefill and FILE.decode (VARIANTS), and reports
tokens/s (`tokens_per_call`); its --smoke is the small size, otherwise KFORGE_ZOO_SIZE or real.

Sizes (KFORGE_ZOO_SIZE): "small" (CI, the Triton interpreter) and "real" (the GPU: the 8B
geometry with Llama-3's vocabulary of 128256, 4 layers; prefill batch 8 x 2048 tokens, decode
batch 64 against 2048 cached tokens).
"""
from transformers import LlamaConfig, LlamaForCausalLM

from kforge.bench.llm import VARIANTS, LLMWorkload, file_functions, llm_shape  # noqa: F401

SIZES = {
    "small": dict(vocab_size=256, hidden_size=64, intermediate_size=224, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  prefill=(2, 32), decode=(4, 24)),
    "real": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, prefill=(8, 2048), decode=(64, 2048)),
}


class Model(LLMWorkload):
    def __init__(self, size=None):
        shape = llm_shape(SIZES, size)
        super().__init__(shape.phase)
        self.config = LlamaConfig(
            **shape.config, hidden_act="silu", rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
            use_cache=self.phase == "decode", attn_implementation="sdpa")
        self.model = LlamaForCausalLM(self.config).eval()


get_inputs, get_init_inputs, tokens_per_call = file_functions(SIZES)
