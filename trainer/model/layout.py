"""Layout-independent ("global") parameter names across pipeline and expert parallelism.

A pipeline stage numbers its layers from 0 (`decoder.layers.<local>`) and an expert-parallel rank
numbers its experts from 0 (`...experts.local_experts.<local>`). The global name replaces both by the
index the layer / expert has in the whole model, so the same weight has the same name on every layout:

    decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.lora_a    (PP rank 1 of 2, EP rank 1 of 2)
 -> decoder.layers.3.mlp.experts.local_experts.2.linear_fc1.lora_a    (4 layers, 4 experts)

(the per-expert adapters of TE grouped linears, `...experts.linear_fc1.lora.<local>.lora_a`, alike).

Tensor-parallel shards keep their names (trainer.model.sharding gathers / slices them). Names are
canonical (LoRA's ".base." hop removed, trainer.model.sharding.canonical).
"""
from __future__ import annotations

import re
from typing import Callable

import torch

from trainer.model.sharding import canonical, canonical_params, full_state_dict, load_full_state_dict

_LAYER = re.compile(r"^((?:module\.)*decoder\.layers\.)(\d+)(\.|$)")
# SequentialMLP experts, and the per-expert adapters of TE grouped expert linears (lora.grouped)
_EXPERT = re.compile(r"(\.experts\.(?:local_experts|linear_fc[12]\.lora)\.)(\d+)(\.|$)")


def _layer_map(model) -> list[int]:
    """Global index of each local decoder layer."""
    decoder = getattr(model, "decoder", None)
    if decoder is None:
        return []
    return [int(layer.layer_number) - 1 for layer in decoder.layers]


def _expert_offset() -> int:
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0
    return ps.get_expert_model_parallel_rank()


def namer(model) -> Callable[[str], str]:
    """name -> global name for this rank's model (module or parameter names)."""
    layers = _layer_map(model)
    ep_rank = _expert_offset()
    local_experts = _local_expert_counts(model)

    def rename(name: str) -> str:
        name = canonical(name)
        m = _LAYER.match(name)
        if m is None:
            return name
        local = int(m.group(2))
        name = f"{m.group(1)}{layers[local]}{m.group(3)}{name[m.end():]}"
        per = local_experts.get(local)
        if per:
            name = _EXPERT.sub(lambda e: f"{e.group(1)}{ep_rank * per + int(e.group(2))}{e.group(3)}", name)
        return name

    return rename


def _local_expert_counts(model) -> dict[int, int]:
    """Local layer index -> number of local experts (MoE layers)."""
    out = {}
    decoder = getattr(model, "decoder", None)
    for i, layer in enumerate(getattr(decoder, "layers", [])):
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        count = getattr(experts, "num_local_experts", None)
        if count is None and getattr(experts, "local_experts", None) is not None:
            count = len(experts.local_experts)
        if count:
            out[i] = int(count)
    return out


def global_params(model) -> dict[str, torch.nn.Parameter]:
    """canonical_params keyed by global name."""
    rename = namer(model)
    return {rename(n): p for n, p in canonical_params(model).items()}


def full_global_state_dict(model, only_lora: bool = False) -> dict[str, torch.Tensor]:
    """This rank's parameters gathered over TP (collective over TP), keyed by global name."""
    rename = namer(model)
    return {rename(n): t for n, t in full_state_dict(model, only_lora=only_lora).items()}


def is_lora(name: str) -> bool:
    return name.endswith((".lora_a", ".lora_b"))


def load_full_global_state_dict(model, full: dict[str, torch.Tensor], only_lora: bool = False) -> list[str]:
    """Load the entries of a global full state dict that live on this rank (its layers, its experts,
    its TP shard); returns their global names. Raises KeyError when one of this rank's parameters
    (LoRA factors only, with only_lora) is missing from `full`."""
    rename = namer(model)
    local = {rename(n): n for n in canonical_params(model) if not only_lora or is_lora(n)}
    missing = sorted(set(local) - set(full))
    if missing:
        raise KeyError(f"state dict lacks {len(missing)} of this rank's parameters, e.g. {missing[:4]}")
    load_full_state_dict(model, {local[g]: full[g] for g in local}, strict=not only_lora)
    return sorted(local)
