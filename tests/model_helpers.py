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
                      "fp4_random_hadamard": False, "fp8_weight_cache": True, "first_last_layers_bf16": False,
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


# ---------------------------------------------------------------------------------------------
import contextlib
import os
import socket

import torch


@contextlib.contextmanager
def dist_session(cfg):
    """init_distributed/destroy_distributed around a block (single process unless RANK is set)."""
    from trainer.distributed import destroy_distributed, init_distributed

    preset = "RANK" in os.environ
    info = init_distributed(cfg)
    try:
        yield info
    finally:
        destroy_distributed()
        if not preset:  # init_distributed filled a one-rank env; don't leak it into later tests
            for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
                os.environ.pop(key, None)


def packed_batch(rows: int, seq: int, doc_lens: list[int], vocab: int, seed: int = 0) -> dict:
    """A collate-shaped packed batch: documents of `doc_lens` laid out over rows*seq tokens
    (any remainder is padding with label -100 and loss_mask 0)."""
    g = torch.Generator().manual_seed(seed)
    total = rows * seq
    assert sum(doc_lens) <= total
    tokens = torch.randint(0, vocab, (total,), generator=g)
    labels = torch.full((total,), -100, dtype=torch.long)
    loss_mask = torch.zeros(total)
    position_ids = torch.zeros(total, dtype=torch.long)
    cu = [0]
    for n in doc_lens:
        s = cu[-1]
        labels[s:s + n - 1] = tokens[s + 1:s + n]
        loss_mask[s:s + n - 1] = 1.0
        position_ids[s:s + n] = torch.arange(n)
        cu.append(s + n)
    return {
        "tokens": tokens.view(rows, seq), "labels": labels.view(rows, seq),
        "loss_mask": loss_mask.view(rows, seq), "position_ids": position_ids.view(rows, seq),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32), "max_seqlen": max(doc_lens),
    }


def perturb_adapters(model, seed: int = 0, std: float = 0.05) -> None:
    """Give every LoRA factor random values (B starts at zero, which would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith((".lora_a", ".lora_b")):
                p.copy_(torch.randn(p.shape, generator=g) * std)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Tiny MoE / MLA architectures (model-section overrides for tiny_cfg / parallel_helpers.layout_cfg).
QWEN3_MOE = {"family": "qwen3", "qk_layernorm": True, "kv_channels": 16, "num_moe_experts": 4,
             "moe_router_topk": 2, "moe_ffn_hidden_size": 32}
DEEPSEEK_MLA = {"family": "deepseek", "num_query_groups": None, "multi_latent_attention": True,
                "kv_lora_rank": 16, "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16,
                "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
                "moe_shared_expert_intermediate_size": 64, "moe_first_k_dense": 1}
MLA_TARGETS = ["linear_q_proj", "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj", "linear_fc1", "linear_fc2"]


def arch_sections(arch: dict) -> dict:
    """trainer sections for a tiny MoE/MLA model: the model overrides and, for MLA, its LoRA targets."""
    out = {"model": dict(arch)}
    if arch.get("multi_latent_attention"):
        out["lora"] = {**BASE["trainer"]["lora"], "target_modules": MLA_TARGETS}
    return out
