"""Load a local Hugging Face checkpoint (safetensors) into the megatron-core GPTModel of this rank.

    line = load_hf(model, "/models/Qwen3-30B-A3B", recipe_model)   # before LoRA, any TP/PP/EP layout

Families: Llama 2 / 3 / 3.1, Qwen3, Qwen3-MoE, DeepSeek-V2 / V2-Lite (trainer.model.hf.names has the table).
The checkpoint's config.json is the truth: primus_contract.hf_config refuses a recipe model that disagrees
with it, or a config.json field the trainer does not implement, before a tensor is read (validate/submit run
the same check).

Memory bound: a rank reads only the HF tensors of the parameters it keeps (its pipeline stage's layers, its
expert-parallel rank's experts, every TP rank the full tensor of its shards), one megatron tensor at a time:
files are memory-mapped, each tensor is converted when the loader reaches it, sliced to the rank's shard and
copied in, then dropped. Peak extra memory = the largest converted tensor (plus its sources: q, k and v for
linear_qkv). Nothing else is held, so a 470 GB Qwen3-235B checkpoint costs a rank its own share.

Completeness: every base parameter must get a tensor (the source names are checked before anything is
copied), and every tensor of the checkpoint must be taken by some rank (gathered across ranks, names only),
so a silently dropped lm_head or expert cannot happen.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from primus_contract.hf_config import check_pretrained, describe
from trainer.model.hf.names import IGNORED, fuse_qkv, hf_source, logical_name, split_qkv
from trainer.model.hf.read import LazyTensors, SafetensorsDir
from trainer.model.layout import namer
from trainer.model.sharding import canonical_params, load_full_state_dict
from trainer.precision.fp8_params import checks_summary

__all__ = ["load_hf", "hf_entries", "pretrained_summary", "fuse_qkv", "split_qkv"]


def _expert_layout(config) -> tuple[int, int]:
    """(this rank's expert-parallel rank, local experts per rank)."""
    from megatron.core import parallel_state as ps

    experts = int(config.num_moe_experts or 0)
    if not experts:
        return 0, 0
    size = ps.get_expert_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1
    rank = ps.get_expert_model_parallel_rank() if ps.model_parallel_is_initialized() else 0
    return rank, experts // size


def hf_entries(model, hf) -> tuple[LazyTensors, list[str]]:
    """This rank's base parameters (local canonical names) -> their HF sources, lazily converted; and the
    parameters no HF tensor makes."""
    config = model.config
    mla = bool(getattr(config, "multi_latent_attention", False))
    heads = config.num_attention_heads
    groups = config.num_query_groups or heads
    tied = bool(getattr(model, "share_embeddings_and_output_weights", False))
    ep_rank, per = _expert_layout(config)
    rename = namer(model)
    entries, missing = {}, []
    for name in canonical_params(model):
        if name.endswith((".lora_a", ".lora_b")):
            continue
        src = hf_source(logical_name(rename(name), ep_rank, per), heads, groups, mla=mla, tied=tied)
        if src is None:
            missing.append(name)
        else:
            entries[name] = src
    return LazyTensors(hf, entries), missing


def _gather_names(names: set[str]) -> set[str]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return names
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, sorted(names))
    return {n for part in every for n in part}


def _problems(full: LazyTensors, missing: list[str], hf_dir) -> list[str]:
    """This rank's reasons to refuse before copying anything."""
    out = []
    absent = full.absent_sources()
    if absent:
        out.append(f"HF checkpoint {hf_dir} lacks {len(absent)} tensors, e.g. {absent[:3]}")
    if missing:
        out.append(f"HF checkpoint {hf_dir} gives no weight for {missing[:4]}")
    return out


def load_hf(model, hf_dir, recipe_model: dict) -> str:
    """Copy an HF checkpoint's weights into this rank's (TP/PP/EP-sharded) base model; collective over all
    ranks. Returns the log line (what was loaded and, for FP8 parameters, how well they hold it)."""
    check_pretrained(recipe_model, hf_dir)
    hf = SafetensorsDir(hf_dir)
    full, missing = hf_entries(model, hf)
    problems = _problems(full, missing, hf_dir)
    used = _gather_names(full.sources() | ({"!" + p for p in problems}))
    errors = sorted(n[1:] for n in used if n.startswith("!"))
    if errors:  # every rank refuses alike, before any weight is copied: no half-loaded model
        raise KeyError(errors[0])
    unused = sorted(k for k in hf if k not in used and not IGNORED.search(k))
    if unused:
        raise KeyError(f"HF checkpoint {hf_dir} has {len(unused)} tensors the model would not load, e.g. "
                       f"{unused[:3]} (does config.json match the weights?)")
    checks: list = []
    loaded = load_full_state_dict(model, full, strict=False, fp8_checks=checks)
    return pretrained_summary(hf_dir, loaded, checks, hf)


def pretrained_summary(hf_dir, loaded: list, checks: list, hf=None) -> str:
    """The log line of an HF import: what was copied and, for FP8 parameters, how well they hold it."""
    line = f"pretrained | path {hf_dir} | tensors {len(loaded)}"
    if hf is not None:
        line += (f" | read {hf.reads} ({hf.read_bytes / 1e9:.2f} GB, largest {hf.largest / 1e6:.1f} MB) | "
                 f"{describe(hf_dir)}")
    return line + checks_summary(checks)
