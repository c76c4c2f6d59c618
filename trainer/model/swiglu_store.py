"""megatron's own FP8 SwiGLU store, saturating (trainer.precision.fp8_swiglu_input, where the kernels do not reach).

megatron keeps fc1's output for the SwiGLU's backward as input.to(float8_e4m3fn) (activation_func_fp8_input_store) in
three autograd functions of megatron.core.fusions.fused_bias_swiglu: the dense MLP's SwiGLUFunction and
BiasSwiGLUFunction, and the token-weighted WeightedSwiGLUFunction of MoE experts (SequentialMLP's per-token scale,
TEGroupedMLP). torch 2.11's CUDA cast (the H100/H200 stack's) makes finite magnitudes past 448 NaN, so every fc1 output
past 464 in magnitude gets a NaN gradient there (bench/results/2026-12-07_h100_lifecycle). The store's Triton kernels
(trainer/model/swiglu_fp8.py) cover dense MLPs; experts, activation offload and the kernels switched off stay on
megatron's functions.

`install(device)` gives those the saturating copy where this torch's cast does not saturate: it replaces the names
`bias_swiglu_impl` and `weighted_bias_swiglu_impl` that megatron's MLP and experts modules call by functions with the
same signature. Without the store they call megatron's unchanged; with it they run megatron's own forward and backward
math (swiglu, bias_swiglu, weighted_swiglu and their backs) on `fp8_copy(input)` instead of the bare cast: the same
bytes wherever megatron's are finite, 448 with the sign where megatron's are NaN. Where torch saturates (2.13) nothing
is replaced. tests/test_swiglu_store.py holds the functions to megatron's, tests/gpu/test_swiglu_fp8.py to the GPU's.
"""
from __future__ import annotations

import torch
from megatron.core.fusions import fused_bias_swiglu as fbs

from trainer.model import swiglu_fp8

_TARGETS = ("megatron.core.transformer.mlp", "megatron.core.transformer.moe.experts")


class _Store(torch.autograd.Function):
    """megatron's SwiGLU / BiasSwiGLU / WeightedSwiGLU function with fp8_input_store, the copy saturated."""

    @staticmethod
    def forward(ctx, u, bias, weights, offload):
        q = swiglu_fp8.fp8_copy(u)
        if offload:  # (megatron marks the saved input for its activation offload)
            q.activation_offloading = True
            if bias is not None:
                bias.activation_offloading = True
        ctx.save_for_backward(q, bias, weights)
        ctx.dtype = u.dtype
        if weights is not None:
            return fbs.weighted_swiglu(u, weights)
        return fbs.swiglu(u) if bias is None else fbs.bias_swiglu(u, bias)

    @staticmethod
    def backward(ctx, g):
        q, bias, weights = ctx.saved_tensors
        u = q.to(ctx.dtype)
        if weights is not None:
            du, dw = fbs.weighted_swiglu_back(g, u, weights)
            return du, None, dw, None
        if bias is None:
            return fbs.swiglu_back(g, u), None, None, None
        du = fbs.bias_swiglu_back(g, u, bias)
        return du, du, None, None  # (autograd sums the bias's gradient over the tokens, as megatron's does)


def _rows(input, bias, weights, offload):
    """_Store over input's rows (2-D or 3-D [s, b, 2 ffn], as megatron's impls take it), in input's shape."""
    shape = input.shape
    assert len(shape) in (2, 3)
    out = _Store.apply(input.view(-1, shape[-1]), bias, weights, offload)
    return out if len(shape) == 2 else out.view(shape[0], shape[1], -1)


def bias_swiglu_impl(input, bias, fp8_input_store=False, cpu_offload_input=False):
    """megatron's bias_swiglu_impl, the FP8 copy saturated."""
    if not fp8_input_store:
        return _ORIGINAL["bias_swiglu_impl"](input, bias, fp8_input_store, cpu_offload_input)
    return _rows(input, bias, None, cpu_offload_input)


def weighted_bias_swiglu_impl(input, bias, weights, fp8_input_store=False):
    """megatron's weighted_bias_swiglu_impl (MoE's per-token scale), the FP8 copy saturated."""
    if not fp8_input_store or bias is not None:  # (megatron refuses a bias here itself)
        return _ORIGINAL["weighted_bias_swiglu_impl"](input, bias, weights, fp8_input_store)
    return _rows(input, None, weights, False)


_ORIGINAL = {"bias_swiglu_impl": fbs.bias_swiglu_impl, "weighted_bias_swiglu_impl": fbs.weighted_bias_swiglu_impl}
_OURS = {"bias_swiglu_impl": bias_swiglu_impl, "weighted_bias_swiglu_impl": weighted_bias_swiglu_impl}


def install(device: torch.device) -> bool:
    """Where this torch's cast on `device` does not saturate, point megatron's MLP and experts modules at the
    saturating functions (idempotent); returns whether they are in place."""
    if swiglu_fp8.saturates(device):
        return False
    import importlib

    for name in _TARGETS:
        module = importlib.import_module(name)
        for attr, fn in _OURS.items():
            if hasattr(module, attr):
                setattr(module, attr, fn)
    return True


def megatron_store_count(model) -> int:
    """The MLPs (dense or experts) whose SwiGLU megatron's functions run with the FP8 store: not rewired by the
    store's kernels or fused_swiglu's fold."""
    return sum(1 for module in model.modules()
               if hasattr(module, "activation_func") and not hasattr(module, "_primus_megatron_forward")
               and getattr(getattr(module, "config", None), "activation_func_fp8_input_store", False))
