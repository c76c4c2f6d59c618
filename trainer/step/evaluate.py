"""Validation loss and token accuracy over `eval_iters` global batches of the validation packs.

The loss is the global token mean of the trainer's own per-token loss (forward_losses); the token accuracy is
the share of supervised positions whose argmax prediction is the label (`token_hits`: one more forward pass with
the logits kept, vocab-parallel under TP; not computed with pipeline parallelism, where only the last stage has
logits: None there).

The batches are the first eval_iters global batches of the unshuffled validation stream (the same
every evaluation, so eval losses are comparable across iterations and across restarts), split over
data-parallel ranks and micro-batches exactly like training batches. eval_iters is capped at the
number of whole global batches in the split (at least 1; a split smaller than one global batch wraps).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from trainer.step.loss import all_reduce_sum, masked_sum
from trainer.model.tp_overlap import check_tokens


HOST_KEYS = ("cu_seqlens",)  # read on the host (trainer.model.inputs.packed_seq_params): a device copy would cost a
                             # device-to-host sync every micro-batch


def move_batch(batch: dict, device: torch.device) -> dict:
    """Tensors of a collated batch onto `device` (non-blocking: pinned, trainer.model.inputs.to_device), but HOST_KEYS;
    python scalars unchanged."""
    from trainer.model.inputs import to_device

    return {k: to_device(v, device) if isinstance(v, torch.Tensor) and k not in HOST_KEYS else v
            for k, v in batch.items()}


def num_eval_batches(num_val_packs: int, global_batch_size: int, eval_iters: int) -> int:
    return max(1, min(int(eval_iters), num_val_packs // int(global_batch_size)))


class EvalResult(NamedTuple):
    loss: float
    token_accuracy: Optional[float]  # None: not computed (accuracy=False, or pipeline parallelism)


@torch.no_grad()
def token_hits(model, batch) -> torch.Tensor:
    """[argmax hits, supervised positions] (fp64) of one batch: the logits' argmax over the whole vocabulary
    (under TP each rank has a vocab shard: the largest logit is agreed over the TP group, ties to the lowest id,
    as torch.argmax) compared with the labels where loss_mask is set."""
    from megatron.core import parallel_state as ps

    from trainer.model.inputs import model_inputs

    inputs = model_inputs(model, batch)
    inputs["labels"] = None
    b, s = batch["tokens"].shape
    logits = model(**inputs)
    best, index = logits.reshape(b, s, -1).float().max(dim=-1)
    if ps.model_parallel_is_initialized() and ps.get_tensor_model_parallel_world_size() > 1:
        group = ps.get_tensor_model_parallel_group()
        index = index + ps.get_tensor_model_parallel_rank() * logits.shape[-1]
        top = best.clone()
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        index = torch.where(best == top, index, torch.full_like(index, torch.iinfo(index.dtype).max))
        dist.all_reduce(index, op=dist.ReduceOp.MIN, group=group)
    mask = batch["loss_mask"].to(index.device) > 0
    hits = ((index == batch["labels"].to(index.device)) & mask).sum()
    return torch.stack([hits, mask.sum()]).double()


@torch.no_grad()
def evaluate(model, forward_losses, val_packs, *, global_batch_size: int, micro_batch_size: int, eval_iters: int,
             seed: int, dp_rank: int, dp_size: int, device: torch.device, dp_group=None,
             ub_tokens: Optional[int] = None, accuracy: bool = True) -> EvalResult:
    """`ub_tokens`: the TE userbuffers' token count, which every micro-batch must have (None: no check)."""
    from megatron.core import parallel_state as ps

    from trainer.data.batching import rank_micro_batches

    accuracy = accuracy and not (ps.model_parallel_is_initialized()
                                 and ps.get_pipeline_model_parallel_world_size() > 1)
    was_training = model.training
    model.eval()
    total = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, loss tokens, hits, positions
    try:
        for k in range(num_eval_batches(len(val_packs), global_batch_size, eval_iters)):
            for mb in rank_micro_batches(val_packs, global_batch_size, micro_batch_size, k, seed,
                                         dp_rank=dp_rank, dp_size=dp_size, shuffle=False):
                check_tokens(int(mb["tokens"].numel()), ub_tokens)
                batch = move_batch(mb, device)
                per_token = forward_losses(model, batch)
                total[0] += masked_sum(per_token, batch["loss_mask"]).double()
                total[1] += float(mb["num_loss_tokens"])
                if accuracy:
                    total[2:] += token_hits(model, batch)
    finally:
        model.train(was_training)
    all_reduce_sum(total, dp_group)
    s, n, hits, positions = total.tolist()
    return EvalResult(s / max(n, 1.0), hits / max(positions, 1.0) if accuracy else None)
