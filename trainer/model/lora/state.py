"""The adapters' state: this rank's LoRA factors by global name (checkpoints, exports), loading them back, and the
tensor-parallel sum of the gradients that come from a sequence shard."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn


def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """This rank's LoRA factors keyed by global name (trainer.model.layout), in parameter order."""
    from trainer.model.layout import namer

    rename = namer(model)
    return {rename(n): p for n, p in model.named_parameters() if n.endswith((".lora_a", ".lora_b"))}


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the LoRA parameters (this rank's TP shards), detached, in parameter order, keyed by global
    name (trainer.model.layout: the same name for the same layer/expert under any PP/EP layout)."""
    return {n: p.detach() for n, p in adapter_parameters(model).items()}


def load_adapter_state_dict(model: nn.Module, sd: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Inverse of adapter_state_dict for the same TP size (trainer.checkpointing.reshard handles a TP change)."""
    own = adapter_parameters(model)
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if strict and (missing or unexpected):
        raise KeyError(f"adapter state mismatch: missing {missing[:4]} unexpected {unexpected[:4]}")
    with torch.no_grad():
        for n, p in own.items():
            if n in sd:
                if sd[n].shape != p.shape:
                    raise ValueError(f"{n}: shape {tuple(sd[n].shape)} != model {tuple(p.shape)}")
                p.copy_(sd[n])


def allreduce_sequence_parallel_grads(model: nn.Module, group: Optional[object] = None) -> None:
    """Sum grads of params marked sequence_parallel across TP (when not using megatron's DDP)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    grads = [p.grad for p in model.parameters()
             if p.requires_grad and getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not grads:
        return
    group = group or ps.get_tensor_model_parallel_group()
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
