"""The micro-batch loop of one optimizer step, with or without pipeline parallelism.

    loss_sum = accumulate_gradients(model, forward_losses, micro_batches, n, device)

Every micro-batch backpropagates sum(ce * loss_mask) / N, N = loss tokens of the WHOLE global batch
(trainer/step/loss.py), so the accumulated gradient is d(global token-mean loss)/d(theta) whatever the
pipeline split. Returns this data-parallel rank's masked CE sum (fp32, 0-dim) on every rank.

* PP = 1: forward_losses + backward per micro-batch (plain gradient accumulation).
* PP > 1: megatron-core's get_forward_backward_func (1F1B, not interleaved) over the same
  micro-batches. Every stage gets the whole collated batch: stage 0 embeds the tokens, every stage's
  attention uses cu_seqlens (THD: no attention across documents or rows on any stage), the last stage
  computes the per-token CE. Activations travel as [B*S, 1, hidden] (the THD-flattened batch; with
  sequence parallelism megatron divides the sequence dim by TP itself), or [S, B, hidden] when every row is one
  document (trainer.data.packing false: trainer.model.inputs). The loss function returns the
  3-tuple form with `config.calculate_per_token_loss` set, so megatron does not rescale our objective.
  The masked sum lives on the last stage; one all-reduce over the pipeline group hands it to all.

`pipelined_losses(model, batch)` is the forward-only counterpart for evaluation: per-token losses
[B, S] of one batch, broadcast from the last stage to every stage.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from trainer.step.evaluate import move_batch
from trainer.step.loss import masked_sum, micro_batch_objective


def _pp_size() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_pipeline_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1


def _p2p_shape(micro_batches, layout: str) -> tuple[int, int]:
    """(seq_length, micro_batch_size) of the schedule's p2p buffers, one fixed activation shape: [B*S, 1] in the
    THD layout, [S, B] in the one-document-a-row layout (trainer.model.inputs)."""
    shapes = {tuple(mb["tokens"].shape) for mb in micro_batches}
    if len(shapes) != 1:
        raise ValueError(f"pipeline parallelism needs equal-size micro-batches, got [B, S] in {sorted(shapes)}")
    b, s = shapes.pop()
    if layout not in ("thd", "sbhd"):  # 'auto' picks per micro-batch: never with pipeline parallelism
        raise ValueError(f"pipeline parallelism needs one attention layout for all micro-batches, got {layout!r}")
    return (s, b) if layout == "sbhd" else (b * s, 1)


def run_schedule(model, micro_batches, device, on_losses, forward_only: bool) -> None:
    """Run megatron's pipeline schedule; on the last stage on_losses(batch, per_token [B, S]) returns
    the objective to backpropagate for that micro-batch (ignored when forward_only)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from trainer.model.inputs import layout_of, model_inputs

    config = model.config
    if not getattr(config, "calculate_per_token_loss", False):
        raise ValueError("pipeline schedule needs config.calculate_per_token_loss=True "
                         "(trainer.model.build sets it): the objective is already token-normalised")

    def loss_func(batch, output):
        objective = on_losses(batch, output.float().reshape(batch["tokens"].shape))
        return objective, torch.ones((), dtype=torch.int), {}

    def forward_step(data_iterator, chunk):
        batch = move_batch(next(data_iterator), device)
        return chunk(**model_inputs(chunk, batch)), functools.partial(loss_func, batch)

    seq_length, micro_batch_size = _p2p_shape(micro_batches, layout_of(model))
    get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[model],
        num_microbatches=len(micro_batches), seq_length=seq_length, micro_batch_size=micro_batch_size,
        forward_only=forward_only)


def accumulate_gradients(model, forward_losses, micro_batches, n: torch.Tensor, device,
                         after_backward=None) -> torch.Tensor:
    """Forward + backward of every micro-batch of one step (grads accumulate in .grad). after_backward()
    runs after each micro-batch's backward, or with pipeline parallelism (whose schedule interleaves the
    micro-batches) once after the schedule."""
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    if _pp_size() == 1:
        for mb in micro_batches:
            batch = move_batch(mb, device)
            objective, s = micro_batch_objective(forward_losses(model, batch), batch["loss_mask"], n)
            objective.backward()
            if after_backward is not None:
                after_backward()
            loss_sum += s
        return loss_sum
    sums: list[torch.Tensor] = []

    def on_losses(batch, per_token):
        objective, s = micro_batch_objective(per_token, batch["loss_mask"], n)
        sums.append(s)
        return objective

    run_schedule(model, micro_batches, device, on_losses, forward_only=False)
    if after_backward is not None:
        after_backward()
    return _sum_over_pipeline(sums, loss_sum)


def _sum_over_pipeline(sums: list[torch.Tensor], into: torch.Tensor) -> torch.Tensor:
    from megatron.core import parallel_state as ps

    for s in sums:  # non-empty on the last stage only
        into += s
    dist.all_reduce(into, group=ps.get_pipeline_model_parallel_group())
    return into


@torch.no_grad()
def pipelined_losses(model, batch) -> torch.Tensor:
    """Per-token CE [B, S] of one batch through every stage (forward only), on every PP rank."""
    from megatron.core import parallel_state as ps

    device = next(model.parameters()).device
    out = torch.zeros(batch["tokens"].shape, dtype=torch.float32, device=device)

    def on_losses(_batch, per_token):
        out.copy_(per_token)
        return masked_sum(per_token, _batch["loss_mask"])

    run_schedule(model, [batch], device, on_losses, forward_only=True)
    dist.broadcast(out, src=ps.get_pipeline_model_parallel_last_rank(),
                   group=ps.get_pipeline_model_parallel_group())
    return out
