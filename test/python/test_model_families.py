"""Hugging Face model families beyond the zoo: each built from a tiny `transformers` config with
random weights (nothing downloaded), compiled by `kforge.compile` for the Triton interpreter
(torch-mlir export, its IR parsed and verified by MLIR 22.1.8 in kforge-opt, builtin kernels
verified), run on fresh inputs and checked against eager PyTorch at strict's tolerance. Every
region must end on a verified kernel: a region left on its reference is a gap in the builtin
that this test names.

The zoo (benchmarks/models/, test_zoo.py) covers Llama, GPT-2, BERT, T5, ViT, ResNet, ConvNeXt,
Mixtral and gpt-oss; test_moe_transformers.py covers DeepSeek-V3. Each family here brings
something those do not: per-head q/k norms (Qwen3, Gemma-3), soft-capped logits and sliding
windows (Gemma-2), partial rotary and parallel residuals (Phi, GPT-NeoX), ALiBi (BLOOM),
learned positions (OPT), disentangled attention (DeBERTa-v2), alternating local attention
(ModernBERT), shifted windows (Swin), an encoder-decoder with cross-attention (BART), a
convolutional audio front end (Whisper), a shared expert beside routed ones (Qwen2-MoE).
The decoders also run one decode step against a KV cache."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

# width 32, 2 heads of 16, one layer: the smallest shapes the builtin's kernels take whole
TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=32)
DECODER = "lm"          # forward(input_ids) -> logits
ENCODER = "enc"         # forward(input_ids, attention_mask) -> last_hidden_state (a padded row)
IMAGE = "img"           # forward(pixel_values) -> last_hidden_state
SEQ2SEQ = "s2s"         # forward(input_ids, decoder_input_ids) -> last_hidden_state
AUDIO = "audio"         # forward(input_features, decoder_input_ids) -> last_hidden_state

# name -> (model_type, kind, config fields; TINY's too unless `own` is set)
FAMILIES = {
    "qwen2": ("qwen2", DECODER, dict(num_key_value_heads=1)),
    "qwen3": ("qwen3", DECODER, dict(num_key_value_heads=1, head_dim=16)),
    "qwen2_moe": ("qwen2_moe", DECODER, dict(num_key_value_heads=1, num_experts=4,
                                             num_experts_per_tok=2, moe_intermediate_size=16,
                                             shared_expert_intermediate_size=16)),
    "gemma2": ("gemma2", DECODER, dict(num_key_value_heads=1, head_dim=16, sliding_window=4,
                                       num_hidden_layers=2)),
    "gemma3_text": ("gemma3_text", DECODER, dict(num_key_value_heads=1, head_dim=16,
                                                 sliding_window=4, num_hidden_layers=2)),
    "phi": ("phi", DECODER, dict()),
    "gpt_neox": ("gpt_neox", DECODER, dict()),
    "bloom": ("bloom", DECODER, dict()),
    "opt": ("opt", DECODER, dict(ffn_dim=64, word_embed_proj_dim=32)),
    "deberta_v2": ("deberta-v2", ENCODER, dict()),
    "modernbert": ("modernbert", ENCODER, dict(num_hidden_layers=2, global_attn_every_n_layers=2,
                                               local_attention=4, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    "swin": ("swin", IMAGE, dict(own=True, image_size=16, patch_size=2, embed_dim=32,
                                 depths=[1], num_heads=[2], window_size=4)),
    "bart": ("bart", SEQ2SEQ, dict(own=True, vocab_size=64, d_model=32, encoder_layers=1,
                                   decoder_layers=1, encoder_attention_heads=2,
                                   decoder_attention_heads=2, encoder_ffn_dim=64,
                                   decoder_ffn_dim=64, max_position_embeddings=32)),
    "whisper": ("whisper", AUDIO, dict(own=True, vocab_size=64, d_model=32, encoder_layers=1,
                                       decoder_layers=1, encoder_attention_heads=2,
                                       decoder_attention_heads=2, encoder_ffn_dim=64,
                                       decoder_ffn_dim=64, num_mel_bins=16,
                                       max_source_positions=8, max_target_positions=16,
                                       pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                       decoder_start_token_id=1)),
}
BATCH, SEQ, TARGET_SEQ = 2, 8, 4


class _Wrapped(torch.nn.Module):
    """The family's model with a plain tensor interface, as a user would export it."""

    def __init__(self, model, kind):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, *args):
        m = self.model
        if self.kind == DECODER:
            return m(input_ids=args[0], use_cache=False).logits
        if self.kind == ENCODER:
            return m(input_ids=args[0], attention_mask=args[1]).last_hidden_state
        if self.kind == IMAGE:
            return m(pixel_values=args[0]).last_hidden_state
        if self.kind == SEQ2SEQ:
            return m(input_ids=args[0], decoder_input_ids=args[1],
                     use_cache=False).last_hidden_state
        return m(input_features=args[0], decoder_input_ids=args[1],
                 use_cache=False).last_hidden_state


def build(name: str) -> tuple[torch.nn.Module, str]:
    model_type, kind, fields = FAMILIES[name]
    fields = dict(fields)
    own = fields.pop("own", False)
    config = transformers.AutoConfig.for_model(model_type, **(fields if own else
                                                               {**TINY, **fields}))
    config.use_cache = False
    for field in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout",
                  "attention_dropout", "activation_dropout"):
        if hasattr(config, field):
            setattr(config, field, 0.0)
    torch.manual_seed(0)
    auto = transformers.AutoModelForCausalLM if kind == DECODER else transformers.AutoModel
    return _Wrapped(auto.from_config(config).eval(), kind).eval(), kind


def inputs(kind: str, seed: int, vocab: int = 64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (BATCH, SEQ), generator=g)
    if kind == DECODER:
        return [ids]
    if kind == ENCODER:
        mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
        mask[-1, SEQ - 3:] = 0                  # the last row ends in padding
        return [ids, mask]
    if kind == IMAGE:
        return [torch.randn(BATCH, 3, 16, 16, generator=g)]
    target = torch.randint(3, vocab, (BATCH, TARGET_SEQ), generator=g)
    if kind == SEQ2SEQ:
        return [ids, target]
    return [torch.randn(BATCH, 16, 16, generator=g), target]   # 16 mel bins x 16 frames


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_compiles_runs_and_matches_eager(name, tmp_path, kforge_opt):
    import kforge
    model, kind = build(name)
    fast = kforge.compile(model, inputs(kind, seed=1), target="cpu", rounds=0,
                          out=tmp_path / "pkg", cache_mode="off")
    report = json.loads((fast.package.root / "report.json").read_text())
    left = [(r["name"], r.get("fused"), r.get("message")) for r in report["regions"]
            if r["status"] != "verified"]
    assert not left, f"{name}: regions without a verified kernel: {left}"
    fresh = inputs(kind, seed=7)                 # not the compile's inputs
    got = fast(*fresh)
    with torch.no_grad():
        want = model(*fresh)
    scale = max(1.0, float(want.double().pow(2).mean().sqrt()))    # strict's RMS-scaled atol
    torch.testing.assert_close(got.double(), want.double(), atol=1e-4 * scale, rtol=1e-4)


CONTEXT = 8             # cached tokens per sequence in a decode step


@pytest.mark.parametrize("name", sorted(n for n, f in FAMILIES.items() if f[1] == DECODER))
def test_decoder_family_decode_step_against_a_kv_cache(name, tmp_path, kforge_opt):
    """One generated token per sequence against a KV cache given as tensors (kforge.bench.llm's
    decode step: transformers' DynamicCache, the step's key and value appended inside), every
    region on a verified kernel, against eager."""
    import kforge
    from kforge.bench.llm import decode_step
    wrapped, _ = build(name)
    model, config = wrapped.model, wrapped.model.config

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, *past):
            return decode_step(self.model, config, input_ids, past)

    step = Decode().eval()
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or \
        config.hidden_size // config.num_attention_heads

    def step_inputs(seed):
        g = torch.Generator().manual_seed(seed)
        cache = [torch.randn(BATCH, kv_heads, CONTEXT, head_dim, generator=g)
                 for _ in range(2 * config.num_hidden_layers)]
        return [torch.randint(3, 64, (BATCH, 1), generator=g), *cache]

    fast = kforge.compile(step, step_inputs(1), target="cpu", rounds=0, out=tmp_path / "pkg",
                          cache_mode="off")
    report = json.loads((fast.package.root / "report.json").read_text())
    left = [(r["name"], r.get("fused"), r.get("message")) for r in report["regions"]
            if r["status"] != "verified"]
    assert not left, f"{name} decode: regions without a verified kernel: {left}"
    fresh = step_inputs(7)
    got = fast(*fresh)
    with torch.no_grad():
        want = step(*fresh)
    scale = max(1.0, float(want.double().pow(2).mean().sqrt()))
    torch.testing.assert_close(got.double(), want.double(), atol=1e-4 * scale, rtol=1e-4)
