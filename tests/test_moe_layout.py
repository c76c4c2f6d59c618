"""Which layers are MoE: the trainer builds (trainer.model.arch.moe_layer_pattern), the planner and the FLOPs count
(primus_contract.flops.is_moe_layer) and the HF export writes (hf_config.to_hf_config) the same layers, and the HF
import reads them back (hf_config.moe_pattern). Before, the trainer dropped moe_layer_freq when moe_first_k_dense was
set (6 layers, freq 2, first 1: built [0,1,1,1,1,1], counted [0,0,1,0,1,0]) and the Qwen3-MoE export wrote every
layer MoE."""
from __future__ import annotations

import pytest

from primus_contract.flops import is_moe_layer
from primus_contract.hf_config import HFConfigError, mismatches, model_fields, to_hf_config
from tests.model_helpers import tiny_cfg
from trainer.model.arch import moe_layer_pattern

MOE = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32}


def _model(**kw):
    return tiny_cfg(trainer={"model": {**MOE, "num_layers": 6, **kw}}).trainer.model


@pytest.mark.parametrize("first,freq,want", [(0, 1, 1), (1, 1, [0, 1, 1, 1, 1, 1]), (0, 2, [1, 0, 1, 0, 1, 0]),
                                             (1, 2, [0, 0, 1, 0, 1, 0]), (2, 3, [0, 0, 0, 1, 0, 0])])
def test_the_trainer_builds_the_layers_the_contract_counts(first, freq, want):
    m = _model(moe_first_k_dense=first, moe_layer_freq=freq)
    assert moe_layer_pattern(m) == want  # (built from flops.is_moe_layer: the planner's and the FLOPs' layers)


def test_qwen3_moe_export_lists_the_dense_layers_and_reads_back_the_same_layers():
    m = {**dict(_model(moe_first_k_dense=1, moe_layer_freq=2)), "family": "qwen3"}
    hf = to_hf_config(m)
    assert hf["model_type"] == "qwen3_moe" and hf["decoder_sparse_step"] == 1 and hf["mlp_only_layers"] == [0, 1, 3, 5]
    back = model_fields(hf)
    assert [is_moe_layer(back, i) for i in range(6)] == [is_moe_layer(m, i) for i in range(6)]
    assert not [k for k, _, _ in mismatches(m, back) if k.startswith("moe_")]


def test_qwen3_moe_import_refuses_a_layout_the_trainer_cannot_build():
    hf = to_hf_config({**dict(_model()), "family": "qwen3"})
    with pytest.raises(HFConfigError, match="mlp_only_layers"):
        model_fields({**hf, "mlp_only_layers": [5]})  # MoE 0-4, dense 5: no first-k / every-n-th layout


def test_deepseek_first_k_dense_reads_back_as_it_is_and_no_moe_layer_is_refused():
    hf = to_hf_config({**dict(_model(moe_first_k_dense=2)), "family": "deepseek", "multi_latent_attention": True,
                       "kv_lora_rank": 16, "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16,
                       "moe_shared_expert_intermediate_size": 64, "norm_epsilon": 1e-6})
    back = model_fields(hf)
    assert (back["moe_first_k_dense"], back["moe_layer_freq"]) == (2, 1)  # (not the equivalent-looking (1, 2))
    with pytest.raises(HFConfigError, match="first_k_dense_replace"):
        model_fields({**hf, "first_k_dense_replace": 6})
    qwen = to_hf_config({**dict(_model()), "family": "qwen3"})
    with pytest.raises(HFConfigError, match="no MoE layer"):
        model_fields({**qwen, "mlp_only_layers": list(range(6))})
