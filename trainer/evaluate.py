"""Validation loss: the global token mean over `eval_iters` global batches of the validation packs.

The batches are the first eval_iters global batches of the unshuffled validation stream (the same
every evaluation, so eval losses are comparable across iterations and across restarts), split over
data-parallel ranks and micro-batches exactly like training batches. eval_iters is capped at the
number of whole global batches in the split (at least 1; a split smaller than one global batch wraps).
"""
from __future__ import annotations

from typing import Optional

import torch

from trainer.loss import all_reduce_sum, masked_sum
from trainer.model.tp_overlap import check_tokens


def move_batch(batch: dict, device: torch.device) -> dict:
    """Tensors of a collated batch onto `device` (non-blocking); python scalars unchanged."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def num_eval_batches(num_val_packs: int, global_batch_size: int, eval_iters: int) -> int:
    return max(1, min(int(eval_iters), num_val_packs // int(global_batch_size)))


@torch.no_grad()
def evaluate(model, forward_losses, val_packs, *, global_batch_size: int, micro_batch_size: int, eval_iters: int,
             seed: int, dp_rank: int, dp_size: int, device: torch.device, dp_group=None,
             ub_tokens: Optional[int] = None) -> float:
    """`ub_tokens`: the TE userbuffers' token count, which every micro-batch must have (None: no check)."""
    from trainer.data.batching import rank_micro_batches

    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    try:
        for k in range(num_eval_batches(len(val_packs), global_batch_size, eval_iters)):
            for mb in rank_micro_batches(val_packs, global_batch_size, micro_batch_size, k, seed,
                                         dp_rank=dp_rank, dp_size=dp_size, shuffle=False):
                check_tokens(int(mb["tokens"].numel()), ub_tokens)
                batch = move_batch(mb, device)
                per_token = forward_losses(model, batch)
                total[0] += masked_sum(per_token, batch["loss_mask"]).double()
                total[1] += float(mb["num_loss_tokens"])
    finally:
        model.train(was_training)
    all_reduce_sum(total, dp_group)
    s, n = total.tolist()
    return s / max(n, 1.0)
