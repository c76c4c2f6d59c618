"""The HF name table without building a model: TE's fused-norm and grouped-expert spellings map to the same HF
tensors as the local spec's (the TE spec cannot be built on CPU; its names are megatron-core's own
sharded_state_dict_keys_map: input_layernorm. -> self_attention.linear_qkv.layer_norm_, pre_mlp_layernorm. ->
mlp.linear_fc1.layer_norm_, and TEGroupedMLP's weight<i>), and every shipped model preset agrees with its Hub
checkpoint's config.json (tests/data/hub_configs), so a shipped recipe is not refused when its job starts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from primus_contract.fields import MODEL
from primus_contract.hf_config import mismatches, model_fields
from trainer.model.hf.names import hf_source, logical_name

HUB = Path(__file__).parent / "data" / "hub_configs"
MODELS = Path(__file__).resolve().parent.parent / "recipes" / "models"
PRESETS = {"qwen3_30b_a3b": "qwen3_30b_a3b", "qwen3_235b_a22b": "qwen3_235b_a22b",
           "deepseek_v2_lite": "deepseek_v2_lite", "llama3_8b": "meta_llama_3_8b", "llama3_70b": "meta_llama_3_70b",
           "llama2_70b": "llama_2_70b_hf"}
TE_EQUIVALENT = {  # TE spelling -> local spelling (same HF tensor)
    "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight": "decoder.layers.2.input_layernorm.weight",
    "decoder.layers.2.mlp.linear_fc1.layer_norm_weight": "decoder.layers.2.pre_mlp_layernorm.weight",
    "decoder.layers.2.self_attention.linear_kv_up_proj.layer_norm_weight":
        "decoder.layers.2.self_attention.kv_layernorm.weight",
}


@pytest.mark.parametrize("te, local", sorted(TE_EQUIVALENT.items()))
def test_te_fused_norms_map_like_the_local_spec(te, local):
    assert hf_source(te, 4, 2, mla=True)[0] == hf_source(local, 4, 2, mla=True)[0]


def test_mla_q_latent_norm_both_spellings():
    te = hf_source("decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight", 4, 4, mla=True)
    local = hf_source("decoder.layers.0.self_attention.q_layernorm.weight", 4, 4, mla=True)
    assert te[0] == local[0] == ("model.layers.0.self_attn.q_a_layernorm.weight",)
    assert hf_source("decoder.layers.0.self_attention.q_layernorm.weight", 4, 2)[0] == \
        ("model.layers.0.self_attn.q_norm.weight",)  # Qwen3's per-head norm


def test_grouped_expert_weights_use_the_global_expert_index():
    """EP rank 1 of 2 with 64 local experts: TE's weight5 of layer 3 is global expert 69."""
    name = logical_name("decoder.layers.3.mlp.experts.linear_fc1.weight5", ep_rank=1, local_experts=64)
    assert name == "decoder.layers.3.mlp.experts.local_experts.69.linear_fc1.weight"
    assert hf_source(name, 4, 2)[0] == ("model.layers.3.mlp.experts.69.gate_proj.weight",
                                        "model.layers.3.mlp.experts.69.up_proj.weight")
    down = logical_name("decoder.layers.3.mlp.experts.linear_fc2.weight0", ep_rank=1, local_experts=64)
    assert hf_source(down, 4, 2)[0] == ("model.layers.3.mlp.experts.64.down_proj.weight",)


def test_unknown_parameter_has_no_source():
    assert hf_source("decoder.layers.0.mlp.router.expert_bias", 4, 2) is None


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_shipped_preset_agrees_with_its_hub_config(preset):
    defaults = {k: f.default for k, f in MODEL.items()}
    model = {**defaults, **yaml.safe_load((MODELS / f"{preset}.yaml").read_text())}
    hub = json.loads((HUB / f"{PRESETS[preset]}.json").read_text())
    assert mismatches(model, model_fields(hub)) == []
    wrong = {**model, "rotary_base": 1234.0}
    assert [k for k, _, _ in mismatches(wrong, model_fields(hub))] == ["rotary_base"]


@pytest.mark.parametrize("preset", sorted(p.stem for p in MODELS.glob("*.yaml")))
def test_to_hf_config_round_trips_every_preset(preset):
    """scripts/make_hf_checkpoint.py writes config.json with to_hf_config: the import's check accepts it."""
    from primus_contract.hf_config import to_hf_config

    model = {**{k: f.default for k, f in MODEL.items()}, **yaml.safe_load((MODELS / f"{preset}.yaml").read_text())}
    assert mismatches(model, model_fields(to_hf_config(model))) == []
