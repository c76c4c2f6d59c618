"""Adapter inputs recomputed in backward instead of kept: the fc2 adapter of a dense SwiGLU MLP.

A frozen base linear keeps nothing for its backward (no weight gradient: TE saves no input), but the
LoRA factor A of `linear_fc2` needs its input x = swiglu(u) for dA = dh^T x. Kept, x costs
ffn_hidden/tp x tokens x 2 bytes per layer (Llama-3-8B, 8192 tokens: 224 MiB a layer, 7 GiB over 32
layers). The activation's own backward keeps u (the fc1 output) anyway, so the adapter keeps u too
(the same storage: no extra memory) and recomputes x = swiglu(u) in backward -- one element-wise pass.

Applies only where x is exactly swiglu(u) as megatron's MLP.forward computes it: a dense `MLP` (not an
expert, not a shared expert), gated SiLU, no fc1 bias, no clamp or linear offset, no TE activation
module, no fp8 activation store; and only for an adapter without pre-dropout (dropout of x would need
its mask). The recompute uses the same function megatron used (its fused `swiglu`, or the same torch
ops), so the recomputed x is bit-identical. Anything else keeps x as before.

The same holds for adapters on TE's LayerNormColumnParallelLinear (linear_qkv, linear_fc1): TE keeps the
norm's input for its own backward, so the adapter recomputes the normed input from it (RMSNorm /
LayerNorm in fp32, as TE's kernel computes it) instead of asking TE to return and keep ln_out: hidden/tp
x tokens x 2 bytes less per wrapped linear (Llama-3-8B: 2 x 64 MiB a layer).

    wire_adapter_input_recompute(model)   # after apply_lora; {"fc2": n, "norm": m} wired
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class _AdapterAFromRecomputedInput(torch.autograd.Function):
    """h = x A^T where x = act(u): gradients flow to x as usual, but only u is saved."""

    @staticmethod
    def forward(ctx, x, u, a, act):
        ctx.act = act
        ctx.save_for_backward(u, a)
        return F.linear(x, a)

    @staticmethod
    def backward(ctx, dh):
        u, a = ctx.saved_tensors
        with torch.no_grad():
            x = ctx.act(u)
        dx = dh.matmul(a)
        da = dh.reshape(-1, dh.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
        return dx, None, da, None


class _AdapterAOfNorm(torch.autograd.Function):
    """h = norm(x) A^T for a fused-norm linear: x (kept by the base for its own norm backward) is
    saved; norm(x) is recomputed in backward and differentiated with autograd for dL/dx."""

    @staticmethod
    def forward(ctx, x, a, norm):
        ctx.norm = norm
        ctx.save_for_backward(x, a)
        with torch.no_grad():
            return F.linear(norm(x), a)

    @staticmethod
    def backward(ctx, dh):
        x, a = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            y = ctx.norm(xd)
        da = dh.reshape(-1, dh.shape[-1]).t().matmul(y.detach().reshape(-1, y.shape[-1]))
        (dx,) = torch.autograd.grad(y, xd, dh.matmul(a))
        return dx, da, None


def adapter_a_of_norm(x: torch.Tensor, a: torch.Tensor, norm) -> torch.Tensor:
    """norm(x) A^T, keeping x (not norm(x)) for the backward."""
    if not torch.is_grad_enabled() or not (x.requires_grad or a.requires_grad):
        return F.linear(norm(x), a)
    return _AdapterAOfNorm.apply(x, a, norm)


def norm_of(base):
    """The input norm of a TE LayerNormLinear as a function (fp32 math, output in the input dtype)."""
    eps, shift = float(base.eps), 1.0 if getattr(base, "zero_centered_gamma", False) else 0.0
    rms = base.normalization == "RMSNorm"

    def norm(x):
        bias = getattr(base, "layer_norm_bias", None)
        xf, w = x.float(), base.layer_norm_weight.float() + shift
        if rms:
            y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w
        else:
            y = F.layer_norm(xf, (xf.shape[-1],), w, None if bias is None else bias.float(), eps)
        return y.to(x.dtype)

    return norm


def adapter_a(x: torch.Tensor, a: torch.Tensor, u, act) -> torch.Tensor:
    """x A^T, keeping u instead of x for the backward when u (the pre-activation) is given."""
    if u is None or not torch.is_grad_enabled() or not (x.requires_grad or a.requires_grad):
        return F.linear(x, a)
    return _AdapterAFromRecomputedInput.apply(x, u, a, act)


def swiglu_of(config):
    """The exact function megatron's dense MLP applies to fc1's output under `config`, or None."""
    if not config.gated_linear_unit or config.activation_func is not F.silu or config.add_bias_linear:
        return None
    if getattr(config, "use_te_activation_func", False) or getattr(config, "activation_func_fp8_input_store", False):
        return None
    if getattr(config, "activation_func_clamp_value", None) is not None:
        return None
    if float(getattr(config, "glu_linear_offset", 0.0) or 0.0) != 0.0:
        return None
    if config.bias_activation_fusion:
        from megatron.core.fusions.fused_bias_swiglu import swiglu

        return swiglu

    def glu(y):  # megatron MLP.forward's unfused branch
        y_glu, y_linear = torch.chunk(y, 2, dim=-1)
        return config.activation_func(y_glu) * y_linear

    return glu


def wire_adapter_input_recompute(model) -> dict:
    """Rewire eligible adapters to keep a tensor the base keeps anyway; returns counts by kind."""
    from megatron.core.transformer.mlp import MLP

    from trainer.model.lora import LoRALinear

    wired = {"fc2": 0, "norm": 0}
    for module in model.modules():
        if (isinstance(module, LoRALinear) and module.fused_norm and not _pre_dropout(module)
                and getattr(module.base, "normalization", None) in ("RMSNorm", "LayerNorm")):
            module.base.return_layernorm_output = False
            module.adapter_norm = norm_of(module.base)
            wired["norm"] += 1
        if type(module) is not MLP:  # experts / shared experts transform x further: leave them
            continue
        fc2 = getattr(module, "linear_fc2", None)
        if not isinstance(fc2, LoRALinear) or fc2.is_expert or fc2.fused_norm or _pre_dropout(fc2):
            continue
        act = swiglu_of(module.config)
        if act is None:
            continue
        fc2.input_act = act

        def remember(_module, _inputs, output, fc2=fc2):
            fc2.pending_act_input = output[0] if isinstance(output, tuple) else output

        module.linear_fc1.register_forward_hook(remember)
        wired["fc2"] += 1
    return wired


def _pre_dropout(lora) -> bool:  # dropout of the adapter input would need its mask kept
    return lora.dropout is not None and lora.dropout_position == "pre"
