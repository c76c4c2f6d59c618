"""The communicators a lazily initialised trainer uses, made up front (trainer.distributed.nccl_eager_init false).

Lazily, torch makes a group's NCCL communicator at the group's first collective. The first data-parallel gradient
reduction comes after the first backward, at the step's peak, where NCCL's own cudaMalloc (~0.4-0.7 GiB a
communicator on an H100, bench/results/2026-12-05c_h100_levers) could find the card held by PyTorch's cache.
`make_used_communicators` runs one one-element all-reduce on every group the trainer's collectives use, right after
megatron's groups exist and before the model is built, so that memory is taken while the card is empty; megatron's
groups nothing uses (~20 at world size 1, 8.9 GiB eagerly) are still never made. Every rank walks the same list in
the same order, so each group's ranks reach its first collective together. primus_contract/plan/memory.py
(lazy_communicators) counts the same groups."""
from __future__ import annotations

import torch
import torch.distributed as dist

# (megatron parallel_state getter, its kwargs, when): the groups of the trainer's and megatron's collectives
USED = (
    ("get_data_parallel_group", {"with_context_parallel": True}, "always"),  # gradients, the loss mean
    ("get_model_parallel_group", {}, "always"),  # the gradient norm (trainer/step/optim.py)
    ("get_tensor_model_parallel_group", {}, "always"),  # TP's all-gathers and reduce-scatters
    ("get_context_parallel_group", {}, "always"),
    ("get_expert_tensor_model_pipeline_parallel_group", {}, "always"),  # the experts' gradient norm
    ("get_pipeline_model_parallel_group", {}, "always"),  # the pipeline's loss all-reduce (trainer/step/pipeline.py)
    ("get_expert_model_parallel_group", {}, "moe"),  # token dispatch
    ("get_expert_data_parallel_group", {}, "moe"),  # the experts' gradient sums (trainer/step/optim.py)
    ("get_amax_reduction_group", {"with_context_parallel": True}, "fp8"),  # delayed scaling's amax
)


def used_groups(ps, moe: bool, fp8: bool) -> list:
    """(getter name, group) of the distinct groups of more than one rank, in USED's order (a getter this megatron
    lacks is skipped)."""
    out, seen = [], set()
    for name, kwargs, when in USED:
        if (when == "moe" and not moe) or (when == "fp8" and not fp8) or not hasattr(ps, name):
            continue
        try:
            group = getattr(ps, name)(**kwargs)
        except (AssertionError, RuntimeError, TypeError):  # not made in this layout
            continue
        if group is None or id(group) in seen or dist.get_world_size(group) < 2:
            continue
        seen.add(id(group))
        out.append((name, group))
    return out


def make_used_communicators(device: torch.device, moe: bool, fp8: bool) -> list[str]:
    """One all-reduce on the world group, then on each used group; returns the groups' names, the world's first."""
    from megatron.core import parallel_state as ps

    one = torch.zeros(1, device=device)
    groups = [("world", None), *used_groups(ps, moe, fp8)]
    for _, group in groups:
        dist.all_reduce(one, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return [name for name, _ in groups]
