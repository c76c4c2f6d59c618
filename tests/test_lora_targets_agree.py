"""One rule names LoRA's targets (primus_contract/targets.py): the linears the trainer wraps in a real tiny
megatron-core model (trainer/model/lora/layers.py lora_targets) are the ones the planner counts as adapted
(primus_contract/flops.py is_adapted, through plan/shapes.py), for full-name, last-part and layer-scoped patterns,
with exclusions, on a dense, a Qwen3-MoE and a DeepSeek MLA model."""
from __future__ import annotations

import pytest

from primus_contract.flops import is_adapted, layer_linears
from primus_contract.targets import canonical
from trainer.config import Config
from tests.model_helpers import DEEPSEEK_MLA, QWEN3_MOE, arch_sections, dist_session, tiny_cfg

PATTERNS = [
    (["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], []),
    (["*"], ["linear_fc2"]),
    (["decoder.layers.1.*"], []),
    (["*.mlp.*"], ["*shared_experts*"]),
    (["self_attention.*", "linear_q_proj"], ["decoder.layers.0.*"]),
    (["*_proj"], ["linear_kv_*"]),
    # dotted tails: before primus_contract/targets.py the trainer matched only the full name or its last part, so
    # these (which the contract accepted) wrapped nothing
    (["self_attention.linear_proj", "mlp.experts.linear_fc2", "layers.1.mlp.linear_fc1"], []),
]


def _planned(m: dict, targets, excludes) -> set:
    """The full names of the linears the planner's FLOPs/shapes count as adapted."""
    return {f"decoder.layers.{layer}.{suffix}" for layer in range(int(m["num_layers"]))
            for short, suffix, *_ in layer_linears(m, layer)
            if is_adapted(short, f"decoder.layers.{layer}.{suffix}", targets, excludes)}


@pytest.mark.parametrize("arch", [None, QWEN3_MOE, DEEPSEEK_MLA], ids=["dense", "qwen3-moe", "mla"])
def test_trainer_wraps_what_the_planner_counts(arch):
    from trainer.model import build_model
    from trainer.model.lora.layers import lora_targets

    cfg = tiny_cfg(trainer={**(arch_sections(arch) if arch else {}), "lora": {"enabled": False}})
    m = cfg.to_dict()["trainer"]["model"]
    with dist_session(Config.from_dict(cfg.to_dict())) as info:
        model = build_model(cfg, info.device)
        for targets, excludes in PATTERNS:
            wrapped = {canonical(n) for n in lora_targets(model, targets, excludes)}
            planned = _planned(m, targets, excludes)
            assert wrapped and wrapped == planned, (targets, excludes, sorted(wrapped ^ planned))
    assert "decoder.layers.1.self_attention.linear_proj" in wrapped


PP_RUNS = {  # (model overrides, lora, what the contract checks first: load through the schema and check)
    "scoped": ({}, {"target_modules": ["linear_proj", "layers.3.mlp.linear_fc1"],
                    "exclude_modules": ["decoder.layers.0.*"]}),
    # a 4-layer MoE model whose first layer is dense: stage 1 (layers 2-3) holds no dense MLP
    "swiglu": ({**QWEN3_MOE, "moe_first_k_dense": 1}, {"target_modules": ["linear_qkv", "linear_fc1"],
                                                       "fused_swiglu": True}),
    "epilogue": ({**QWEN3_MOE, "moe_first_k_dense": 1}, {"target_modules": ["linear_fc2"], "epilogue": True}),
}


def _pp_cfg(run: str):
    from tests.parallel_helpers import layout_cfg

    model, lora = PP_RUNS[run]
    return layout_cfg({"pipeline": 2}, model=model, lora=lora)


def _contract(recipe: dict) -> None:
    """The launcher's rules on the recipe as two ranks of one node run it."""
    from primus_contract import check

    recipe["cluster"].update(nproc_per_node=2, gpus_per_node=None, nodes=1)
    recipe["trainer"]["data"]["train"]["hf_name"] = "tiny"  # (data and tokenizer are required; none is read here)
    recipe["trainer"]["tokenizer"]["path"] = "hf://org/tiny"
    check(recipe)


def _pp_build(run: str, _par):
    from trainer.model import build
    from trainer.model.layout import namer
    from trainer.model.lora.layers import lora_modules

    cfg = _pp_cfg(run)
    with dist_session(cfg) as info:
        built = build(cfg, info.device)
        rename = namer(built.model)
        return sorted(canonical(rename(n)) for n in lora_modules(built.model)), dict(built.lines)


def test_pipeline_stages_match_global_layer_names_and_strict_levers_ask_the_whole_model(tmp_path):
    """PP=2 on two gloo ranks (4 layers): a stage numbers its layers from 0, and patterns name the model's global
    layers (before, `decoder.layers.0.*` excluded layer 2 too on stage 1, and `layers.3.*` matched nothing).
    fused_swiglu / epilogue true with a stage of MoE layers only: that stage says so and runs; the rank refused
    before, in the queue, though the contract had accepted the recipe (audit, 2026-12-06)."""
    from tests.parallel_helpers import run_on_ranks

    for run in PP_RUNS:
        _contract(_pp_cfg(run).to_dict())  # the contract accepts each (so the trainer must run it)
    ranks = run_on_ranks(2, {run: None for run in PP_RUNS}, _pp_build, tmp_path / "out")
    m = _pp_cfg("scoped").to_dict()["trainer"]["model"]
    lora = PP_RUNS["scoped"][1]
    wrapped = ranks[0]["scoped"][0] + ranks[1]["scoped"][0]
    assert sorted(wrapped) == sorted(_planned(m, lora["target_modules"], lora["exclude_modules"])) == [
        "decoder.layers.1.self_attention.linear_proj", "decoder.layers.2.self_attention.linear_proj",
        "decoder.layers.3.mlp.linear_fc1", "decoder.layers.3.self_attention.linear_proj"]
    assert "| 1 MLPs |" in ranks[0]["swiglu"][1]["fused swiglu"]
    assert ranks[1]["swiglu"][1]["fused swiglu"].startswith("fused swiglu | no dense MLP with an fc1 adapter on")
    assert "| 1 of 5 linears |" in ranks[0]["epilogue"][1]["lora epilogue"]
    assert "no linear on this pipeline stage can own" in ranks[1]["epilogue"][1]["lora epilogue"]


def test_the_contract_refuses_a_pipeline_stage_without_adapters():
    from primus_contract.errors import ContractError

    cfg = _pp_cfg("scoped").to_dict()
    cfg["trainer"]["lora"]["target_modules"] = ["layers.3.*"]
    with pytest.raises(ContractError, match=r"adapts no linear of pipeline stage 0 \(layers 0-1 of "
                                            r"`trainer.parallelism.pipeline` 2\)"):
        _contract(cfg)
