"""trainer.precision.fp8_swiglu_input: megatron's activation_func_fp8_input_store, the SwiGLU input (fc1's output)
kept in FP8 for its backward. It reaches the TransformerConfig, the planner counts 1 byte for it instead of 2, and a
run that would ignore it (CPU: megatron's unfused SwiGLU) is refused at submit and again at the trainer's start."""
from __future__ import annotations

import pytest
import torch

from primus_contract.plan.memory import layer_activation_bytes
from primus_contract.plan.shapes import Layout, layer_linears_local
from primus_slurm.config.schema import apply_schema
from tests.model_helpers import tiny_cfg
from trainer.config import ConfigError


def _resolved(store: bool) -> dict:
    return apply_schema({"experiment": {"name": "t"}, "cluster": {"env_profile": "h200"},
                         "trainer": {"model": {"num_layers": 80, "hidden_size": 8192, "ffn_hidden_size": 28672,
                                               "num_attention_heads": 64, "num_query_groups": 8}, "distributed": {"device": "cuda"},
                                     "precision": {"fp8": "hybrid", "fp8_swiglu_input": store}}})


def test_planner_keeps_the_swiglu_input_in_one_byte():
    per_token = {}
    for store in (False, True):
        r = _resolved(store)
        m, t = r["trainer"]["model"], r["trainer"]
        lay = Layout(tp=1, pp=1, ep=1, dp=1, sp=False, world=1, mbs=1, gbs=1, seq=8192)
        linears = layer_linears_local(m, t["lora"], lay, 0)
        per_token[store] = layer_activation_bytes(m, t, lay, linears, moe=False)["base"] / 8192
    # Llama2-70B's shape: fc1's output is 2 x 28672 wide; 2 bytes an element kept, or 1 in FP8
    assert per_token[False] - per_token[True] == pytest.approx(2 * 28672)


def test_trainer_refuses_it_on_cpu():
    from trainer.model.build import make_transformer_config

    cfg = tiny_cfg(trainer={"precision": {"fp8_swiglu_input": True}, "distributed": {"device": "auto"}})
    with pytest.raises(ConfigError, match="fp8_swiglu_input needs the GPU's fused SwiGLU"):
        make_transformer_config(cfg, torch.device("cpu"), use_te=False)


def test_it_reaches_megatrons_config():
    """Built as on a GPU node (only the device object says cuda: building a TransformerConfig allocates nothing)."""
    from trainer.model.build import make_transformer_config

    off = make_transformer_config(tiny_cfg(), torch.device("cpu"), use_te=False)
    assert off.activation_func_fp8_input_store is False
    cfg = tiny_cfg(trainer={"precision": {"fp8_swiglu_input": True}})
    on = make_transformer_config(cfg, torch.device("cuda"), use_te=False)
    assert on.activation_func_fp8_input_store is True and on.bias_activation_fusion is True
