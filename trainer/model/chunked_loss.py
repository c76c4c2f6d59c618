"""Output layer + cross-entropy in token chunks for a frozen output layer: the logits are never kept.

    install_chunked_loss(model)          # trainer.recompute.chunked_loss (default true)

megatron's GPTModel computes logits = output_layer(h) ([tokens, vocab/tp], bf16 on a GPU) and then the
per-token CE; autograd keeps those logits for backward (TE's fused CE writes its gradient into them):
2 GiB for 8192 tokens of a 128k vocabulary, at the very point of peak memory (end of forward). LoRA
never trains the output layer, so backward only needs dCE_t/dh_t = (softmax_t - onehot_t) W for each
token t. This module computes that in the forward pass, a chunk of tokens at a time (CHUNK_BYTES of
fp32 logits, plus their bf16 GEMM output and the bf16 copy for the gradient GEMM), keeps it ([tokens,
hidden], 64 MiB at the same shape), and backward scales each token's row by that token's incoming
gradient (its mask / N weight). Vocab-parallel (TP) exactly
like megatron: max, sum-of-exp and target logit are all-reduced over the TP group per chunk; the input
is gathered from the sequence-parallel region (or copied to the TP region) first, so its gradient is
reduce-scattered (all-reduced) across TP as ColumnParallelLinear's would be. With `kernel` (trainer.recompute.
chunked_loss_kernel) and where trainer/model/ce_kernel.py runs (an NVIDIA GPU), two Triton passes over each chunk's
bf16 logits replace the fp32 elementwise ops (same formula and collectives); elsewhere the torch ops below.

How it hooks in (both megatron-core 0.16 and 0.19 call `self.output_layer(hidden, weight=...)` and
then `self.compute_language_model_loss(labels, logits)` in GPTModel._postprocess): a forward
pre-hook notes whether this forward has labels; the output layer's forward, with labels and a frozen
weight, hands its input through instead of computing logits; the loss, given that very tensor,
runs the chunked CE. Anything else (no labels: logits wanted; a trainable output weight) takes
megatron's own path unchanged.
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer.model import ce_kernel

CHUNK_BYTES = 256 * 1024 ** 2


def _tp():
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return None, 1, 0
    return (ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size(),
            ps.get_tensor_model_parallel_rank())


class _FrozenOutputCE(torch.autograd.Function):
    """Per-token CE of logits = hidden @ weight.T (weight frozen; vocab shard [v0, v0 + V)), fp32 [T]."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk, group, tp, v0, want_grad, kernel):
        n, v = hidden.shape[0], weight.shape[0]
        loss = torch.empty(n, dtype=torch.float32, device=hidden.device)
        grad = torch.empty_like(hidden) if want_grad else None
        fused = kernel and ce_kernel.ce_kernel_usable(hidden.device, weight.dtype)
        reduce_max, reduce_sum = _reducers(group) if tp > 1 else (None, None)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            logits = F.linear(hidden[s:e], weight)                   # the output layer's own GEMM
            local = labels[s:e] - v0
            mine = (local >= 0) & (local < v)
            if fused:  # the Triton passes over the GEMM's own logits (trainer/model/ce_kernel.py)
                target = torch.where(mine, local, -1)
                top, total, loss[s:e] = ce_kernel.combine(*ce_kernel.row_stats(logits, target), mine,
                                                          reduce_max, reduce_sum)
                if grad is not None:
                    grad[s:e] = ce_kernel.softmax_grad_(logits, target, top, total) @ weight
                continue
            logits = logits.float()
            local = torch.where(mine, local, torch.zeros_like(local)).unsqueeze(1)
            top = logits.max(dim=1).values
            if tp > 1:
                dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            logits.sub_(top.unsqueeze(1))
            target = logits.gather(1, local).squeeze(1) * mine
            logits.exp_()
            sums = torch.stack([logits.sum(dim=1), target])
            if tp > 1:
                dist.all_reduce(sums, group=group)
            loss[s:e] = torch.log(sums[0]) - sums[1]
            if grad is not None:
                logits.div_(sums[0].unsqueeze(1))                      # softmax
                logits.scatter_add_(1, local, -mine.to(logits.dtype).unsqueeze(1))
                grad[s:e] = logits.to(weight.dtype) @ weight           # this rank's share of dCE/dh
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return (grad.float() * g.float().unsqueeze(1)).to(grad.dtype), None, None, None, None, None, None, None, None


def _reducers(group):
    """In-place all-reduces (MAX, SUM) over the TP group, for ce_kernel.combine."""
    return (lambda x: dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group),
            lambda x: dist.all_reduce(x, group=group))


def chunked_output_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                        sequence_parallel: bool, kernel: bool = False) -> torch.Tensor:
    """Per-token CE [s, b] of hidden [s(/tp with SP), b, h] against labels [s, b] through the frozen
    vocab-parallel weight [vocab/tp, h]; the same values megatron's output layer + CE give. kernel: the Triton
    passes where ce_kernel_usable."""
    from megatron.core.tensor_parallel import mappings as tpm

    group, tp, rank = _tp()
    if tp > 1:
        hidden = (tpm.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True)
                  if sequence_parallel else tpm.copy_to_tensor_model_parallel_region(hidden))
    s, b, h = hidden.shape
    chunk = max(1, CHUNK_BYTES // (4 * weight.shape[0]))
    want_grad = torch.is_grad_enabled() and hidden.requires_grad  # (evaluation: loss only)
    loss = _FrozenOutputCE.apply(hidden.reshape(s * b, h), weight, labels.reshape(s * b), chunk, group, tp,
                                 rank * weight.shape[0], want_grad, kernel)
    return loss.reshape(s, b)


def install_chunked_loss(model, kernel: bool = False) -> bool:
    """Route a labelled forward through chunked_output_loss. False (megatron's path stays): no output
    layer on this stage, not megatron's plain ColumnParallelLinear (e.g. a TE LM head), or logits that
    megatron transforms between output layer and loss (MuP scaling, multi-token prediction)."""
    layer = getattr(model, "output_layer", None)
    config = getattr(model, "config", None)
    if layer is None or not getattr(model, "post_process", True):
        return False
    if type(layer).__name__ != "ColumnParallelLinear":
        return False
    if getattr(config, "use_mup", False) or getattr(config, "mtp_num_layers", None):
        return False
    state = {"labels": False, "pending": None}
    layer_forward = layer.forward
    model_loss = model.compute_language_model_loss

    def note_labels(_module, _args, kwargs):
        state["labels"] = kwargs.get("labels") is not None
        state["pending"] = None

    def forget(*_args):  # after every forward, also one that raised: a later direct call gets logits
        state["labels"] = False
        state["pending"] = None

    def output_forward(self, hidden, weight=None, **kwargs):
        w = self.weight if weight is None else weight
        if state["labels"] and w is not None and not w.requires_grad:
            state["pending"] = (hidden, w)
            return hidden, None
        return layer_forward(hidden, weight=weight, **kwargs)

    def loss(self, labels, logits):
        pending, state["pending"] = state["pending"], None
        if pending is None:
            return model_loss(labels, logits)
        hidden, w = pending
        if hidden is not logits:  # something rewrote the hidden-for-logits stand-in: never guess
            raise RuntimeError("trainer.recompute.chunked_loss: the output layer's result was transformed "
                               "before the loss (an unsupported megatron feature); set "
                               "trainer.recompute.chunked_loss: false")
        per_token = chunked_output_loss(hidden, w, labels.transpose(0, 1).contiguous(),
                                        bool(getattr(layer, "sequence_parallel", False)), kernel)
        return per_token.transpose(0, 1).contiguous()

    model.register_forward_pre_hook(note_labels, with_kwargs=True)
    model.register_forward_hook(forget, always_call=True)
    layer.forward = types.MethodType(output_forward, layer)
    model.compute_language_model_loss = types.MethodType(loss, model)
    return True
