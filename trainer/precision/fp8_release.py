"""FP8 weights (`trainer.precision.fp8_param`): each frozen weight's transpose lives only through its own backward.

On Hopper the FP8 GEMM of the input gradient (dgrad) needs the weight's transpose, TE's column-wise copy. For a
primary-FP8 weight TE makes it in the linear's backward (`update_usage(columnwise_usage=True)`) and keeps it on
the parameter, so by the end of a micro-batch's backward every layer holds one: 2 bytes a parameter instead of
1. Llama2-70B's 80 layers hold 64 GiB of FP8 weights, and their transposes another 64 GiB, which is why it ran
out of memory at TP=1 on one H200 in its first backward.

`release_after_backward(model)` arms every module that owns such weights with a forward pre-hook. When the
module runs with autograd recording and an input that requires grad, the hook registers a gradient hook on that
input; autograd calls it once the input's gradient is complete, which is after the module's dgrad GEMM, and it
drops the transposes there. At most the linears whose backward is running hold one, in any recompute setting:
without recompute, under full or partial recompute (the recomputed forward arms the hook again), and with
pipeline parallelism's interleaved micro-batches (a later backward makes the transpose again from the row-wise
data: one transpose kernel per weight and backward, a few ms a step for the 70B).

A module whose input needs no gradient (the first layer's QKV over frozen embeddings) computes no dgrad, so TE
never makes its transpose. Weights kept 1-D block-scaled cannot rebuild one and are left alone, as are trainable
weights. `fp8_params.release_transposes` after each micro-batch stays as the backstop for anything else.
"""
from __future__ import annotations

import torch

from trainer.precision.fp8_params import releasable


def drop_transposes(weights) -> None:
    """Drop the column-wise copy (the transpose) of each of these primary FP8 weights that holds one."""
    for p in weights:
        if p.get_usages().get("columnwise"):
            p.update_usage(rowwise_usage=True, columnwise_usage=False)


def _arm(weights):
    def pre_hook(module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
            x.register_hook(lambda grad: drop_transposes(weights))
    return pre_hook


def release_after_backward(model: torch.nn.Module) -> int:
    """Arm every module owning frozen quantized weights (see the module doc); returns how many were armed."""
    armed = 0
    for module in model.modules():
        weights = [p for p in module.parameters(recurse=False) if releasable(p)]
        if weights:
            module.register_forward_pre_hook(_arm(weights), with_kwargs=True)
            armed += 1
    return armed
