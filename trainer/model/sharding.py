"""Full (TP=1) tensors <-> this rank's tensor-parallel shards, for base weights and LoRA factors.

Megatron marks sharded params with `tensor_model_parallel` and `partition_dim`. The one layout that
is not a plain contiguous chunk is SwiGLU's fused fc1 ([gate; up] rows): each rank holds
[gate_r; up_r]. LoRA's B of linear_fc1 follows the same layout. MoE experts are whole on every
TP rank (expert tensor parallelism is 1). Names are "canonical": the
module path without LoRA's ".base" hop (decoder.layers.0.mlp.linear_fc1.weight).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from trainer.precision.fp8_params import check_loaded, copy_own_scale, is_quantized


def canonical(name: str) -> str:
    return name.replace(".base.", ".")


def canonical_params(model) -> dict[str, torch.nn.Parameter]:
    """named_parameters keyed by canonical name (first occurrence wins for tied weights)."""
    out: dict[str, torch.nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=True):
        out.setdefault(canonical(name), p)
    return out


def shard_dim(name: str, param: torch.Tensor) -> Optional[int]:
    """Dim along which `param` is TP-sharded, or None when replicated. MoE expert weights are never
    TP-sharded here (expert_tensor_parallel_size 1, trainer.model.arch), whatever megatron marks."""
    if not getattr(param, "tensor_model_parallel", False) or ".experts." in f".{name}":
        return None
    return int(getattr(param, "partition_dim", 0))


def _is_swiglu_rows(name: str, dim: Optional[int]) -> bool:
    return dim == 0 and ".linear_fc1." in f".{name}" and name.endswith(("weight", "lora_b"))


def to_local(name: str, full: torch.Tensor, param: torch.Tensor, tp_rank: int, tp_size: int,
             gated: bool = True) -> torch.Tensor:
    """This rank's shard of the full tensor `full` for parameter `param`."""
    dim = shard_dim(name, param)
    if dim is None or tp_size == 1:
        local = full
    elif gated and _is_swiglu_rows(name, dim):
        gate, up = full.chunk(2, dim=0)
        local = torch.cat([gate.chunk(tp_size, 0)[tp_rank], up.chunk(tp_size, 0)[tp_rank]], 0)
    else:
        local = full.chunk(tp_size, dim=dim)[tp_rank]
    if local.shape != param.shape:
        raise ValueError(f"{name}: shard shape {tuple(local.shape)} != parameter {tuple(param.shape)}"
                         f" (full {tuple(full.shape)}, tp {tp_rank}/{tp_size})")
    return local


def to_full(name: str, local: torch.Tensor, param: torch.Tensor, tp_group=None,
            gated: bool = True) -> torch.Tensor:
    """All-gather this rank's shard into the full tensor (collective over the TP group)."""
    dim = shard_dim(name, param)
    tp_size = dist.get_world_size(tp_group) if dist.is_initialized() else 1
    if dim is None or tp_size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(tp_size)]
    dist.all_gather(parts, local.contiguous(), group=tp_group)
    return merge_shards(name, parts, dim, gated)


def merge_shards(name: str, parts: list[torch.Tensor], dim: Optional[int], gated: bool = True) -> torch.Tensor:
    """Full tensor from the TP-rank-ordered shards of a parameter sharded along `dim` (inverse of
    to_local; None = replicated, parts[0] is the tensor)."""
    if dim is None or len(parts) == 1:
        return parts[0]
    if gated and _is_swiglu_rows(name, dim):
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    return torch.cat(parts, dim=dim)


def load_full_state_dict(model, full: dict[str, torch.Tensor], strict: bool = True,
                         fp8_checks: Optional[list] = None) -> list[str]:
    """Copy full tensors (canonical names) into this rank's shards; returns the names loaded.
    fp8_checks, when given, collects (name, relative error, E4M3 reference) of each quantized weight."""
    from megatron.core import parallel_state as ps

    tp_rank, tp_size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    params = canonical_params(model)
    if strict:
        missing = sorted(set(params) - set(full))
        if missing:
            raise KeyError(f"full state dict lacks {len(missing)} parameters, e.g. {missing[:4]}")
    loaded = []
    with torch.no_grad():
        for name, tensor in full.items():
            p = params.get(name)
            if p is None:
                if strict:
                    raise KeyError(f"model has no parameter {name}")
                continue
            local = to_local(name, tensor, p, tp_rank, tp_size).to(device=p.device, dtype=p.dtype)
            copy_own_scale(p, local)
            if is_quantized(p):  # the copy quantized (trainer.precision.fp8_param): check it held the value
                errors = check_loaded(name, p.dequantize(), local)
                if fp8_checks is not None:
                    fp8_checks.append((name, *errors))
            loaded.append(name)
    return loaded


def full_state_dict(model, only_lora: bool = False) -> dict[str, torch.Tensor]:
    """Gather every parameter (or only LoRA factors) to full size, keyed by canonical name."""
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    out = {}
    for name, p in canonical_params(model).items():
        if only_lora and not name.endswith((".lora_a", ".lora_b")):
            continue
        out[name] = to_full(name, p.detach(), p, group)
    return out
