"""FP8 GEMM shapes refused at validate (primus_contract/rules_shapes.py), and the shape table checked against the
linears megatron-core really builds for the same recipe (dense GQA, MLA with and without q_lora_rank, MoE with
shared experts), so the rule cannot drift from the model."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from primus_contract.errors import ContractError
from primus_contract.rules_shapes import fp8_shape_rules, linear_dims
from primus_slurm.config.recipe import load_recipe
from tests.conftest import cli
from tests.model_helpers import DEEPSEEK_MLA, QWEN3_MOE, arch_sections, dist_session, tiny_cfg
from trainer.model import build_model

ARCHS = {"dense": {}, "qwen3_moe": QWEN3_MOE, "mla": DEEPSEEK_MLA, "mla_q_lora": {**DEEPSEEK_MLA, "q_lora_rank": 32}}


def _built_shapes(cfg) -> dict:
    """(out, in) of every linear of layer 1 (a MoE layer where there are experts), by the table's names."""
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
    shapes = {}
    for name, p in model.named_parameters():
        m = re.match(r".*layers\.1\.((?:self_attention|mlp)\.(?:(?:shared_experts|experts)\.(?:local_experts\.0\.)?)?"
                     r"linear_\w+?)(?:\.base)?\.weight$", name)
        if m:
            shapes[m.group(1).replace("local_experts.0.", "")] = tuple(p.shape)
    return shapes


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_table_matches_the_built_model(arch):
    cfg = tiny_cfg(trainer=arch_sections(ARCHS[arch]))
    model = cfg.to_dict()["trainer"]["model"]
    table = {name: (o, i) for name, o, i in linear_dims(model, 1)}
    built = _built_shapes(cfg)
    if model["num_moe_experts"]:  # layer 1 is a MoE layer: its dense MLP row is not built there
        table = {k: v for k, v in table.items() if not k.startswith("mlp.linear_fc")}
    assert built == table


def _validate(tmp_path, model: dict, *sets):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"experiment": {"name": "fp8shape"}, "cluster": {"env_profile": "h200"},
                                      "trainer": {"model": model, "precision": {"fp8": "hybrid", "bf16": True}}}))
    return cli(dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state")), "validate", str(recipe), *sets)


def test_q_lora_rank_24_is_refused_at_validate(tmp_path):
    """The H200's refusal (q_lora_rank 24 under FP8), now one line at validate, exit 2."""
    model = {**DEEPSEEK_MLA, "q_lora_rank": 24, "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 160,
             "num_attention_heads": 4, "vocab_size": 128, "max_position_embeddings": 256}
    r = _validate(tmp_path, model, "--set", "trainer.lora.target_modules=[linear_proj]")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "linear_q_down_proj is 24×64" in r.stderr and "multiple of 16" in r.stderr


def test_tensor_shard_is_what_counts():
    """ffn 176 is a multiple of 16; its TP=2 shard (88) is not."""
    t = tiny_cfg(trainer={"model": {"ffn_hidden_size": 176}}).to_dict()["trainer"]
    t["precision"]["fp8"] = "hybrid"
    fp8_shape_rules(t)  # TP=1: accepted
    t["parallelism"]["tensor"] = 2
    with pytest.raises(ContractError, match=r"linear_fc2 is 64×88 per tensor-parallel shard \(tensor 2\)"):
        fp8_shape_rules(t)


@pytest.mark.parametrize("recipe", ["recipes/llama2_70b_fp4.yaml", "recipes/qwen3_30b_a3b_bf16.yaml",
                                    "recipes/qwen3_235b_a22b_bf16.yaml", "recipes/deepseek_v2_lite_bf16.yaml"])
def test_shipped_models_pass_under_fp8(recipe):
    t = load_recipe(recipe, []).resolved["trainer"]
    t["precision"].update(fp8="hybrid", fp4=None)
    fp8_shape_rules(t)
    assert all(o % 16 == 0 and i % 16 == 0 for _, o, i in linear_dims(t["model"], t["parallelism"]["tensor"]))


def test_no_rule_without_fp8():
    t = tiny_cfg(trainer={"model": {"ffn_hidden_size": 170}}).to_dict()["trainer"]
    fp8_shape_rules(t)  # BF16: any width
    t["precision"]["fp8"] = "hybrid"
    with pytest.raises(ContractError, match="linear_fc1 is 340×64"):
        fp8_shape_rules(t)


def test_lora_targets_are_the_linears_this_model_builds():
    """The same table names LoRA's targets: with q_lora_rank set there is no linear_q_proj, so a recipe naming it
    is refused (before, the launcher accepted it and the trainer wrapped nothing there); without, it is accepted."""
    from primus_contract.rules_model import lora_rules

    mla = tiny_cfg(trainer=arch_sections(DEEPSEEK_MLA)).to_dict()["trainer"]
    lora_rules({**mla["lora"], "target_modules": ["linear_q_proj"]}, mla["model"])
    mla["model"]["q_lora_rank"] = 32
    with pytest.raises(ContractError, match=r"target_modules\[0\]` \('linear_q_proj'\) matches no linear layer"):
        lora_rules({**mla["lora"], "target_modules": ["linear_q_proj"]}, mla["model"])
    lora_rules({**mla["lora"], "target_modules": ["linear_q_up_proj"]}, mla["model"])


def test_lora_patterns_match_as_the_trainer_matches():
    """The contract checks a pattern against every layer's full megatron name, as the trainer matches
    (primus_contract/targets.py): dotted tails and layer-scoped patterns are accepted; a layer the model does not
    have, the LM head and a router are refused (the trainer never wraps them)."""
    from primus_contract.rules_model import lora_rules, targeted_linears

    t = tiny_cfg().to_dict()["trainer"]
    for ok in (["self_attention.linear_qkv"], ["decoder.layers.1.*"], ["layers.0.mlp.linear_fc2"], ["*"]):
        lora_rules({**t["lora"], "target_modules": ok}, t["model"])
    assert targeted_linears(t["model"], {"target_modules": ["layers.1.self_attention.*"],
                                         "exclude_modules": ["linear_proj"]}) == ["self_attention.linear_qkv"]
    for bad in ("decoder.layers.2.*", "output_layer", "linear_fc3"):
        with pytest.raises(ContractError, match=r"target_modules\[0\]` \('%s'\) matches no linear layer of this "
                                                r"model; available: linear_qkv, linear_proj, linear_fc1, linear_fc2"
                                                % bad.replace("*", r"\*")):
            lora_rules({**t["lora"], "target_modules": [bad]}, t["model"])
    moe = tiny_cfg(trainer=arch_sections(QWEN3_MOE)).to_dict()["trainer"]
    with pytest.raises(ContractError, match=r"\('router'\) matches no linear layer"):
        lora_rules({**moe["lora"], "target_modules": ["router"]}, moe["model"])
