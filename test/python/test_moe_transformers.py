"""A transformers MoE's experts as `torch.ops.kforge.moe_experts` (kforge.moe_op): the common
SwiGLU layout of `use_experts_implementation` (Mixtral, Qwen-MoE, ...) against transformers' own
grouped implementation, what is refused and why, the import's switch and its restore, and a
real Mixtral built from a config compiled end to end with its experts on the grouped kernel,
their weights prepared once."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import MixtralConfig, MixtralForCausalLM  # noqa: E402
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralExperts  # noqa: E402

from kforge.moe_op import (TRANSFORMERS_EXPERTS, experts_as_kforge_op,  # noqa: E402
                           register_transformers_experts, unsupported_experts)


def _config(**kw) -> MixtralConfig:
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                num_local_experts=4, num_experts_per_tok=2, use_cache=False,
                attn_implementation="sdpa", tie_word_embeddings=False)
    return MixtralConfig(**{**base, **kw})


def _experts(seed=0, **kw) -> MixtralExperts:
    torch.manual_seed(seed)
    experts = MixtralExperts(_config(**kw))
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.3)
    return experts


def _routed(seed=1, tokens=10, experts=4, top_k=2, hidden=32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    index = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    index[0] = torch.tensor([3, 1])             # expert 0 and 2 need not be hit by every token
    weight = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1)
    return x, index, weight


def _run(experts, implementation, *args):
    experts.config._experts_implementation = implementation
    with torch.no_grad():
        return experts(*args)


@pytest.mark.parametrize("transposed", [False, True])
def test_common_layout_matches_transformers_grouped_experts(transposed):
    """nn.Linear-oriented weights ([E, 2I, H], read through a transposed view) and the
    transposed orientation ([E, H, 2I]) give transformers' grouped_mm result."""
    experts = _experts()
    if transposed:
        experts.is_transposed = True
        experts.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.transpose(1, 2).clone())
        experts.down_proj = torch.nn.Parameter(experts.down_proj.transpose(1, 2).clone())
    assert unsupported_experts(experts) is None
    register_transformers_experts()
    args = _routed()
    want = _run(experts, "grouped_mm", *args)
    got = _run(experts, TRANSFORMERS_EXPERTS, *args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_what_the_op_does_not_express_is_refused_with_its_reason():
    assert "activation GELUActivation, not SiLU" in unsupported_experts(
        _experts(hidden_act="gelu"))
    normed = _experts()
    normed.has_post_expert_norm = True
    assert "a norm after each expert" in unsupported_experts(normed)
    ungated = _experts()
    ungated.has_gate = False
    assert "not a gated expert" in unsupported_experts(ungated)
    assert "no [experts, ., .]" in unsupported_experts(torch.nn.Linear(4, 4))

    # and the forward refuses them rather than computing something else
    register_transformers_experts()
    gelu = _experts(hidden_act="gelu")
    with pytest.raises(NotImplementedError, match="not SiLU"):
        _run(gelu, TRANSFORMERS_EXPERTS, *_routed())


def test_import_switch_is_scoped_and_keeps_the_users_choice(monkeypatch):
    torch.manual_seed(0)
    model = MixtralForCausalLM(_config()).eval()
    config = model.config
    assert config._experts_implementation == "grouped_mm"        # transformers' default
    with experts_as_kforge_op(model) as notes:
        assert config._experts_implementation == TRANSFORMERS_EXPERTS
        assert len(notes) == 1 and "MixtralExperts" in notes[0] and "'grouped_mm'" in notes[0]
    assert config._experts_implementation == "grouped_mm"

    # the switch can be turned off
    with monkeypatch.context() as env:
        env.setenv("KFORGE_TRANSFORMERS_EXPERTS", "0")
        with experts_as_kforge_op(model) as notes:
            assert config._experts_implementation == "grouped_mm" and notes == []

    # an implementation the user registered is theirs to keep
    ALL_EXPERTS_FUNCTIONS["my_experts"] = ALL_EXPERTS_FUNCTIONS["grouped_mm"]
    config._experts_implementation = "my_experts"
    with experts_as_kforge_op(model) as notes:
        assert config._experts_implementation == "my_experts"
        assert "keep experts_implementation='my_experts'" in notes[0]

    # experts the op cannot express stay transformers', with the reason
    gelu = MixtralForCausalLM(_config(hidden_act="gelu")).eval()
    with experts_as_kforge_op(gelu) as notes:
        assert gelu.config._experts_implementation == "grouped_mm"
        assert "run as PyTorch fallback ops" in notes[0] and "not SiLU" in notes[0]


def test_a_dense_model_gets_no_experts_note():
    """Phi-3's MLP has a gate_up_proj (an nn.Linear) but no experts: nothing to switch or say."""
    from transformers import Phi3Config, Phi3ForCausalLM
    model = Phi3ForCausalLM(Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2, pad_token_id=0)).eval()
    assert any(hasattr(m, "gate_up_proj") for m in model.modules())
    with experts_as_kforge_op(model) as notes:
        assert notes == []


class _Mixtral(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.m = MixtralForCausalLM(_config(num_hidden_layers=2)).eval()

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits


def test_mixtral_compiles_with_its_experts_on_the_grouped_kernel(tmp_path, kforge_opt):
    """Without the import's switch transformers' grouped_mm runs the experts as a PyTorch
    fallback op; with it they are one MoE region per layer shape, verified, its expert weights
    tagged (through the transposed views) and prepared once for each layer."""
    from kforge.build import compile_model
    from kforge.runtime import load_package
    from kforge.synth import SynthOptions

    model = _Mixtral()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    doc = compile_model(model, tmp_path / "pkg", SynthOptions(target="cpu", rounds=0),
                        example_inputs=(ids,))
    assert model.m.config._experts_implementation == "grouped_mm"       # restored
    assert any("kforge.moe_experts" in n for n in doc["import_notes"])
    moe = [r for r in doc["regions"] if r.get("root_kind") == "moe"]
    assert len(moe) == 1 and moe[0]["status"] == "verified", doc["regions"]
    plan = json.loads((tmp_path / "pkg" / "regions" / "host_plan.json").read_text())
    names = [s.get("name", "") for s in plan["steps"]]
    assert not [n for n in names if "grouped_mm" in n], names
    calls = [s for s in plan["steps"] if s.get("call") == moe[0]["hash"]]
    assert len(calls) == 2                                                    # both layers
    # 2I = H here: the two zero biases are one constant after export, passed twice; the
    # region still reads one argument a position (it verified above against its reference)
    assert calls[0]["operands"][4] == calls[0]["operands"][6]
    spec = json.loads((tmp_path / "pkg" / "regions" / f"{moe[0]['hash']}.json").read_text())
    tagged = [i for i, a in enumerate(spec["args"]) if a.get("weight")]
    assert tagged == [3, 5], spec["args"]                 # w1, w2; the zero biases are not
    assert spec["args"][3]["weight"].endswith("experts.gate_up_proj")
    assert "import: experts of 2 layers (MixtralExperts)" in \
        (tmp_path / "pkg" / "report.md").read_text()

    compiled = load_package(tmp_path / "pkg")
    kernel = compiled.kernels[moe[0]["hash"]]
    assert kernel.weight_indices == (3, 5)
    with torch.no_grad():
        want = model(ids)
        for _ in range(2):
            torch.testing.assert_close(compiled(ids), want, atol=1e-4, rtol=1e-4)
    assert len(kernel._prepared) == 2 and kernel.calls == 4     # once per layer's weights


class _DeepseekV3(torch.nn.Module):
    """DeepSeek-V3 in small: a dense first layer, then routed experts with group-limited top-k
    and a shared expert; multi-head latent attention (queries and keys 16 wide, values 8), whose
    keys are assembled by slice writes."""

    def __init__(self):
        super().__init__()
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
        torch.manual_seed(0)
        config = DeepseekV3Config(
            vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
            num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
            num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
            topk_group=1, n_shared_experts=1, q_lora_rank=16, kv_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=32,
            use_cache=False, attn_implementation="sdpa", tie_word_embeddings=False)
        self.m = DeepseekV3ForCausalLM(config).eval()

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits


def test_deepseek_v3_compiles_and_matches_eager(tmp_path, kforge_opt):
    from kforge.build import compile_model
    from kforge.package import read_manifest
    from kforge.runtime import load_package
    from kforge.synth import SynthOptions

    model = _DeepseekV3()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(5))
    doc = compile_model(model, tmp_path / "pkg", SynthOptions(target="cpu", rounds=0),
                        example_inputs=(ids,))
    moe = [r for r in doc["regions"] if r.get("root_kind") == "moe"]
    assert len(moe) == 1 and moe[0]["status"] == "verified", moe
    # multi-head latent attention (values narrower than queries and keys) on the builtin's
    # flash-attention kernel, verified against torch's SDPA
    attention = [r for r in doc["regions"] if r.get("root_kind") == "attention"]
    assert attention and all(r["status"] == "verified" for r in attention), attention
    kernels = read_manifest(tmp_path / "pkg")["kernels"]
    for r in attention:
        source = (tmp_path / "pkg" / kernels[r["hash"]]["source"]).read_text()
        assert "HEAD_DIM = 16" in source and "HEAD_DIM_V = 8" in source
    with torch.no_grad():
        torch.testing.assert_close(load_package(tmp_path / "pkg")(ids), model(ids),
                                   atol=1e-4, rtol=1e-4)
