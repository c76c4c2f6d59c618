"""Shared helpers for the model/LoRA/HF/TP tests: a tiny resolved-recipe Config."""
from __future__ import annotations

import copy

from trainer.config import Config

BASE = {
    "experiment": {"name": "t", "workspace": "./runs", "seed": 1234, "description": ""},
    "trainer": {
        "model": {
            "preset": "tiny_llama", "family": "llama", "num_layers": 2, "hidden_size": 64,
            "ffn_hidden_size": 160, "num_attention_heads": 4, "num_query_groups": 2,
            "kv_channels": None, "vocab_size": 128, "max_position_embeddings": 256,
            "rotary_base": 10000, "rope_scaling": None, "norm_epsilon": 1.0e-5,
            "untie_embeddings": True, "qk_layernorm": False, "num_moe_experts": None,
            "moe_router_topk": None, "moe_ffn_hidden_size": None,
            "moe_shared_expert_intermediate_size": None, "moe_layer_freq": 1,
            "moe_first_k_dense": 0, "multi_latent_attention": False, "q_lora_rank": None,
            "kv_lora_rank": None, "qk_head_dim": None, "qk_pos_emb_head_dim": None,
            "v_head_dim": None,
        },
        "parallelism": {"tensor": 1, "pipeline": 1, "context": 1, "expert": 1,
                        "sequence_parallel": False},
        "precision": {"bf16": False, "fp8": None, "fp8_recipe": "delayed", "fp4": None,
                      "fp4_recipe": "nvfp4", "fp4_param": False, "fp4_param_gather": False,
                      "fp4_emulation": False, "fp4_stochastic_rounding": False,
                      "fp4_random_hadamard": False, "first_last_layers_bf16": False,
                      "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1},
        "lora": {"enabled": True, "dim": 4, "alpha": 8, "dropout": 0.0, "dropout_position": "pre",
                 "a_init": "xavier", "b_init": "zero",
                 "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
                 "exclude_modules": []},
        "recompute": {"granularity": None, "method": "uniform", "num_layers": 1},
        "checkpoint": {"save_interval": None, "keep_last": 2, "resume": "auto", "pretrained": None,
                       "disable_last_saving": False, "export_peft": True},
        "distributed": {"device": "cpu", "backend": "auto", "timeout_minutes": 5},
    },
}


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


def tiny_cfg(**overrides) -> Config:
    """Tiny model recipe; overrides are nested dicts, e.g. tiny_cfg(trainer={"lora": {"dim": 8}})."""
    data = copy.deepcopy(BASE)
    _merge(data, overrides)
    return Config(data)
