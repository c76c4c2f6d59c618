"""Global token-mean loss across micro-batches and data-parallel ranks.

For one optimizer step with micro-batches m = 1..M on data-parallel ranks d = 1..D:

    N      = sum_{d,m} sum(loss_mask[d,m])                    (all-reduced BEFORE any backward)
    loss   = sum_{d,m} sum(ce[d,m] * loss_mask[d,m]) / N      (the logged `lm loss`)

Each micro-batch backpropagates `sum(ce * mask) / N`; summing the gradients over micro-batches
(autograd accumulation) and over DP ranks (all-reduce SUM, trainer.step.optim.reduce_gradients) gives
exactly d(loss)/d(theta). Tensor-parallel ranks see the same tokens, so N is reduced over the
data-parallel(+context-parallel) group only. A step whose global batch has no loss token would
divide by zero: N is clamped to >= 1 (every loss term is then 0 as well).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _world(group) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group=group)


def masked_sum(per_token: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Sum of per-token losses where loss_mask is 1 (fp32, 0-dim)."""
    if per_token.shape != loss_mask.shape:
        raise ValueError(f"per-token loss {tuple(per_token.shape)} and loss_mask {tuple(loss_mask.shape)} differ")
    return (per_token.float() * loss_mask.to(per_token.device, torch.float32)).sum()


def local_token_count(batches) -> float:
    """Unmasked tokens over this rank's micro-batches (collated `num_loss_tokens`, else `loss_mask`)."""
    total = 0.0
    for b in batches:
        n = b.get("num_loss_tokens") if hasattr(b, "get") else None
        total += float(n) if n is not None else float(b["loss_mask"].sum())
    return total


def all_reduce_sum(values: torch.Tensor, group=None) -> torch.Tensor:
    """In-place SUM all-reduce of a small tensor over `group` (no-op for a world of one)."""
    if _world(group) > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
    return values


def global_token_count(local_count: float, device, group=None) -> torch.Tensor:
    """N for the whole global batch as a 0-dim fp32 tensor (clamped to >= 1)."""
    n = all_reduce_sum(torch.tensor([float(local_count)], dtype=torch.float64, device=device), group)
    return n.clamp(min=1.0).to(torch.float32).reshape(())


def step_header(local_count: float, flag: bool, counts_once: bool, device, extras=(), group=None):
    """One all-reduce over the whole world at the start of a step: (N tensor, any-rank flag, totals).

    Ranks that see the same tokens (tensor/pipeline-parallel peers) must pass counts_once=True on
    exactly one of them (tp_rank == 0 and pp_rank == 0) so every data/context-parallel shard is
    counted once. `extras` are further per-shard counts (e.g. tokens) summed the same way; totals is
    [N, *extras] as python floats. `flag` (e.g. "a stop signal arrived here") is true afterwards if
    any rank set it, so all ranks take the same decision at the same iteration."""
    own = [float(local_count), *map(float, extras)]
    values = [v if counts_once else 0.0 for v in own] + [1.0 if flag else 0.0]
    if _world(group) == 1:  # nothing to agree on: no device round trip, so the host queues this step's compute
        out = values        # while the GPU still runs the last one (no idle GPU at the step boundary)
    else:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        all_reduce_sum(t, group)
        out = t.tolist()  # one host sync per step, taken before this step's compute is queued
    # (a fill kernel, not a copy from pageable host memory, which would wait for the queued kernels)
    n = torch.full((), max(out[0], 1.0), dtype=torch.float32, device=device)
    return n, out[-1] > 0, out[:-1]


def micro_batch_objective(per_token: torch.Tensor, loss_mask: torch.Tensor, global_count: torch.Tensor):
    """(objective to backpropagate, detached masked loss sum) for one micro-batch."""
    s = masked_sum(per_token, loss_mask)
    return s / global_count, s.detach()
