"""recipes/proxies/: each MoE preset at reduced depth. The launcher accepts them (`validate` rules), the
architecture is the preset's except num_layers, and the trainer turns them into the intended megatron
config (experts, top-k, MoE layer pattern, MLA ranks) without building the weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from primus_slurm.config.recipe import load_recipe
from tests.model_helpers import dist_session
from trainer.config import Config

ROOT = Path(__file__).resolve().parent.parent
PROXIES = {"qwen3_30b_a3b": (128, 8, 1), "qwen3_235b_a22b": (128, 8, 2), "deepseek_v2_lite": (64, 6, 1)}
CPU = ["trainer.distributed.device=cpu", "trainer.distributed.backend=gloo", "trainer.parallelism.expert=1",
       "cluster.gpus_per_node=1", "cluster.nproc_per_node=1"]


@pytest.mark.parametrize("preset", sorted(PROXIES))
def test_proxy_is_the_preset_at_reduced_depth(preset):
    from trainer.model.build import make_transformer_config

    experts, topk, ep = PROXIES[preset]
    recipe = load_recipe(ROOT / "recipes" / "proxies" / f"{preset}_proxy.yaml", env={})  # validates
    t = recipe.resolved["trainer"]
    full = yaml.safe_load((ROOT / "recipes" / "models" / f"{preset}.yaml").read_text())
    assert t["model"]["preset"] == preset and t["model"]["num_layers"] == 4 < full["num_layers"]
    for key, value in full.items():
        if key != "num_layers":
            assert t["model"][key] == value, key
    assert (t["parallelism"]["expert"], t["data"]["seq_length"], t["data"]["format"]) == (ep, 4096, "mlperf_npy")
    assert recipe.resolved["cluster"]["nproc_per_node"] == ep and recipe.resolved["cluster"]["executor"] == "local"
    cfg = Config.from_dict(load_recipe(ROOT / "recipes" / "proxies" / f"{preset}_proxy.yaml", CPU, env={}).resolved)
    with dist_session(cfg):
        c = make_transformer_config(cfg, torch.device("cpu"), use_te=False)
    assert (c.num_moe_experts, c.moe_router_topk, c.num_layers) == (experts, topk, 4)
    assert c.expert_tensor_parallel_size == 1 and c.moe_aux_loss_coeff == 0.0
    if preset == "deepseek_v2_lite":
        assert type(c).__name__ == "MLATransformerConfig" and c.kv_lora_rank == 512 and c.q_lora_rank is None
        assert c.moe_layer_freq == [0, 1, 1, 1] and c.moe_shared_expert_intermediate_size == 2816
        assert c.moe_router_pre_softmax  # DeepSeek-V2: softmax over all experts, top-k not renormalised
    else:
        assert c.qk_layernorm and c.moe_layer_freq == 1 and not c.moe_router_pre_softmax
