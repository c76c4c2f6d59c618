"""The planner's adapter activations for MLA's q_proj and kv_down_proj against what a real tiny MLA model keeps.

megatron's MLA layer spec norms the layer input with a separate input_layernorm and feeds its output to plain linears
(linear_q_proj, or linear_q_down_proj with a q_lora_rank, and linear_kv_down_proj); only the up-projections are fused
with their latent norms. So their adapters have no TE norm to fold (trainer.recompute.adapter_inputs scope norm wires
nothing there: LoRALinear.fused_norm is false), and both read the same tensor: the census of saved tensors
(trainer.observability.saved_census, once per storage) finds one [tokens, hidden] input a layer plus each adapter's
rank-sized h. The planner counted them as norm-fused: the input twice without the fold, not at all with it."""
from __future__ import annotations

import pytest

from primus_contract.plan.adapter_passes import passes
from primus_contract.plan.memory import layer_activation_bytes
from primus_contract.plan.shapes import Layout, layer_linears_local, moe_layer
from primus_slurm.config.recipe import deep_merge
from primus_slurm.config.schema import apply_schema
from tests.model_helpers import DEEPSEEK_MLA, TINY, adapter_census

TARGETS = ("linear_q_proj", "linear_kv_down_proj")
ROWS, SEQ = 2, 40  # 80 tokens: no other dimension of the tiny model is 80


def _recipe(fold: bool) -> dict:
    return apply_schema(deep_merge(TINY, {"trainer": {
        "model": DEEPSEEK_MLA, "precision": {"bf16": True}, "lora": {"target_modules": list(TARGETS)},
        "recompute": {"adapter_inputs": fold, "adapter_inputs_scope": "norm"}}}))


def _census(r: dict):
    """Per-token activation storages (leading dims = the tokens) the adapters on TARGETS keep, per layer."""
    return adapter_census(r, TARGETS, ROWS, SEQ)


@pytest.mark.parametrize("fold", [False, True])
def test_planner_adapter_bytes_match_the_census_of_a_tiny_mla_model(fold):
    r = _recipe(fold)
    t, m = r["trainer"], r["trainer"]["model"]
    assert m["multi_latent_attention"] and m["q_lora_rank"] is None
    layers, h, dim = m["num_layers"], m["hidden_size"], t["lora"]["dim"]
    kept = _census(r)
    # one shared input a layer (whichever adapter saved it first), and each adapter's rank-sized h
    inputs = [k for k in kept if k[1] == h]
    assert len(inputs) == layers, kept
    assert sorted(k[0] for k in kept if k[1] == dim) == sorted(TARGETS * layers), kept
    measured = sum(k[2] for k in kept) / layers
    assert measured == ROWS * SEQ * (h + 2 * dim) * 2
    lay = Layout(tp=1, pp=1, ep=1, dp=1, sp=False, world=1, mbs=ROWS, gbs=ROWS, seq=SEQ)
    for layer in range(layers):
        lins = layer_linears_local(m, t["lora"], lay, layer)
        assert {lin.short for lin in lins if lin.adapted} == set(TARGETS)
        assert layer_activation_bytes(m, t, lay, lins, moe_layer(m, layer))["adapter"] == measured


def test_mla_linears_take_the_path_the_trainer_runs():
    """q_proj and the down-projections read the base's own input (the fused path; the epilogue for q_proj only: the
    down-projections are duplicated over TP, LoRALinear.uses_epilogue refuses them); the up-projections are
    TE's LayerNormColumnParallelLinear (unfused)."""
    r = _recipe(False)
    m = {**r["trainer"]["model"], "q_lora_rank": 32}  # (layer 0: dense, moe_first_k_dense)
    lay = Layout(tp=1, pp=1, ep=1, dp=1, sp=False, world=1, mbs=1, gbs=1, seq=8)
    norm_fed = {lin.short: lin.norm_fed for lin in layer_linears_local(m, r["trainer"]["lora"], lay, 0)}
    assert not any(norm_fed[k] for k in ("linear_q_down_proj", "linear_kv_down_proj", "linear_proj"))
    assert norm_fed["linear_q_up_proj"] and norm_fed["linear_kv_up_proj"]
    assert passes("fused", False, "linear_kv_down_proj") == (4, 4)
    assert passes("epilogue", False, "linear_q_down_proj") == passes("epilogue", False, "linear_kv_down_proj") == (4, 4)
    assert passes("epilogue", False, "linear_q_proj") == (3, 3)
    assert passes("epilogue", True, "linear_kv_up_proj") == (6, 4)


def test_shared_input_counts_once_with_q_lora_rank_and_sequence_parallel():
    """With a q_lora_rank, q_down_proj and kv_down_proj read the same input-norm output (a sequence shard under SP)."""
    r = _recipe(False)
    t = r["trainer"]
    m = {**t["model"], "q_lora_rank": 32}
    lora = {**t["lora"], "target_modules": ["linear_q_down_proj", "linear_kv_down_proj"]}
    lay = Layout(tp=2, pp=1, ep=1, dp=1, sp=True, world=2, mbs=1, gbs=1, seq=8)
    lins = layer_linears_local(m, lora, lay, 0)
    got = layer_activation_bytes(m, {**t, "lora": lora}, lay, lins, False)["adapter"]
    assert got == 8 * (m["hidden_size"] / 2 * 2 + 2 * lora["dim"] * 2)  # the shard once, each adapter's h
