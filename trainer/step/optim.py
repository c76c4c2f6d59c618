"""AdamW over the trainable (adapter) parameters, data-parallel gradient reduction and
tensor-parallel-aware global-norm clipping.

Gradient scaling convention (see trainer/step/loss.py): every micro-batch's backward already divides by the
number of loss tokens in the WHOLE global batch, so the data-parallel reduction is a plain SUM.

Global grad norm: parameters split across tensor-parallel ranks carry megatron's
`tensor_model_parallel = True` attribute; each rank adds the squares of those plus, on tp_rank 0 only,
the squares of replicated parameters, then the partial sums are all-reduced over the model-parallel
group. After the DP SUM every DP rank holds identical gradients, so no DP reduction of the norm.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    modules = model if isinstance(model, (list, tuple)) else [model]
    return [p for m in modules for p in m.parameters() if p.requires_grad]


def build_optimizer(params: Iterable[torch.nn.Parameter], schedule) -> torch.optim.AdamW:
    """AdamW with betas/eps/weight decay from the recipe; no decay on 1-D params (biases, norms)."""
    params = list(params)
    if not params:
        raise ValueError("the model has no trainable parameters (is lora.enabled false with a frozen base?)")
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": float(schedule.weight_decay or 0.0)}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=float(schedule.lr), betas=(float(schedule.adam_beta1), float(schedule.adam_beta2)),
                             eps=float(schedule.adam_eps), foreach=None)


def _world(group) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group=group)


def _expert_split(params):
    """(dense, expert) params: MoE expert adapters are marked `allreduce = False` (megatron's mark for
    expert-parallel weights; trainer.model.lora.layers sets it on every expert adapter)."""
    dense = [p for p in params if getattr(p, "allreduce", True)]
    return dense, [p for p in params if not getattr(p, "allreduce", True)]


def reduce_gradients(params: list[torch.nn.Parameter], dp_group=None) -> None:
    """SUM gradients over the data-parallel group in one coalesced all-reduce (missing grads count as 0).
    Expert params are summed over the expert data-parallel group instead: the ranks holding the same
    experts (expert-parallel ranks hold different ones; with experts not tensor-parallel, TP peers
    hold the same experts but feed them different tokens)."""
    dense, expert = _expert_split(params)
    if expert:
        from megatron.core import parallel_state as ps

        _sum_gradients(expert, ps.get_expert_data_parallel_group())
    _sum_gradients(dense, dp_group)


def _sum_gradients(params: list[torch.nn.Parameter], dp_group) -> None:
    if _world(dp_group) == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=dp_group)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n


def _is_tp_duplicate(p: torch.nn.Parameter, tp_rank: int) -> bool:
    return not getattr(p, "tensor_model_parallel", False) and tp_rank != 0


def global_grad_norm(params: list[torch.nn.Parameter], tp_rank: int = 0, mp_group=None) -> torch.Tensor:
    """L2 norm of all gradients of the model (sharded params counted once per shard, replicated once).

    Returns a 0-dim fp32 tensor on the params' device (no host sync)."""
    device = params[0].device if params else torch.device("cpu")
    dense, expert = _expert_split(params)
    total = _sum_squares(dense, tp_rank, device)
    if _world(mp_group) > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=mp_group)
    group = _expert_model_group()
    if group is not None:  # every rank calls it (a pipeline stage may hold no MoE layer)
        experts = _sum_squares(expert, 0, device)  # distinct experts on the ranks of this group
        if _world(group) > 1:
            dist.all_reduce(experts, op=dist.ReduceOp.SUM, group=group)
        total = total + experts
    return total.sqrt()


def _expert_model_group():
    """megatron's expert tensor x expert x pipeline group, or None without megatron parallel state."""
    from megatron.core import parallel_state as ps

    return ps.get_expert_tensor_model_pipeline_parallel_group() if ps.model_parallel_is_initialized() else None


def _sum_squares(params, tp_rank: int, device) -> torch.Tensor:
    """Sum of the squared gradient entries (fp32, 0-dim): per-tensor norms in torch's multi-tensor kernels (a few
    launches for every adapter; three tiny kernels a parameter, ~770 a step at the 8B's 256 adapters, left the GPU
    waiting on the host), then the squares of those norms summed in fp32."""
    grads = [p.grad for p in params if p.grad is not None and not _is_tp_duplicate(p, tp_rank)]
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        by_kind.setdefault((g.device, g.dtype), []).append(g)
    with torch.no_grad():
        norms = [n for group in by_kind.values() for n in torch._foreach_norm(group, 2.0, dtype=torch.float32)]
        return torch.stack(norms).pow(2).sum().to(device)


def clip_gradients(params: list[torch.nn.Parameter], max_norm: Optional[float], tp_rank: int = 0,
                   mp_group=None) -> torch.Tensor:
    """Compute the global norm and scale grads so it is at most max_norm (<= 0 / None: no clipping).

    Works on device tensors only, so it does not synchronise with the host."""
    norm = global_grad_norm(params, tp_rank, mp_group)
    if max_norm and max_norm > 0:
        coef = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, coef.to(grads[0].device))
    return norm
