"""The adapter-A products whose backward keeps a tensor the frozen base keeps anyway (trainer/model/lora/inputs.py
says when each applies): x A^T from the recomputed activation input, and rmsnorm(x) A^T from the norm's input."""
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
        dx = dh.matmul(a) if ctx.needs_input_grad[0] else None
        da = None
        if ctx.needs_input_grad[2]:
            with torch.no_grad():
                x = ctx.act(u)
            da = dh.reshape(-1, dh.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
        return dx, None, da, None


class _AdapterAOfRMSNorm(torch.autograd.Function):
    """h = rmsnorm(x) A^T without materialising rmsnorm(x).

    rmsnorm(x) = r * (x * w) with r = 1/sqrt(mean(x^2) + eps) per token, so h = r * (x A'^T) with
    A' = A * w (w folded into the adapter's input dim). Kept: x (the base keeps it for its own norm
    backward), h ([tokens, rank]) and r ([tokens], fp32; one reduction over x). With g = dh * r:
        dA' = g^T x,   dA = dA' * w,   dx = g A' - (r^2 / H) * (dh . h) * x
    (the second term is the gradient through r). Cost over a plain adapter: one row reduction and one
    fused multiply-subtract over x -- no fp32 copies of the activation."""

    @staticmethod
    def forward(ctx, x, a, w, eps):
        r = _rsigma(x, eps)
        h = _scaled(F.linear(x, _fold(a, w)), r)
        ctx.save_for_backward(x, a, w, h, r)
        return h

    @staticmethod
    def backward(ctx, dh):
        x, a, w, h, r = ctx.saved_tensors
        g = _scaled(dh, r)
        dx = da = None
        if ctx.needs_input_grad[1]:
            gx = g.reshape(-1, g.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
            da = (gx.to(r.dtype) * w.to(r.dtype)).to(a.dtype)
        if ctx.needs_input_grad[0]:
            c = (dh.to(r.dtype) * h.to(r.dtype)).sum(-1) * r.square() / x.shape[-1]
            dx = g.matmul(_fold(a, w)).addcmul_(x, c.unsqueeze(-1).to(x.dtype), value=-1.0)
        return dx, da, None, None


def _fold(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A * w (the norm weight folded into A's input dim), formed in fp32, in A's dtype."""
    acc = _acc(a)
    return (a.to(acc) * w.to(acc)).to(a.dtype)


def _scaled(t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """t * r[..., None] computed in r's (fp32) precision, returned in t's dtype."""
    return (t.to(r.dtype) * r.unsqueeze(-1)).to(t.dtype)


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _rsigma(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1/sqrt(mean(x^2) + eps) per row, in fp32 (or wider), one reduction kernel (no fp32 copy of x)."""
    n2 = torch.linalg.vector_norm(x, dim=-1, dtype=_acc(x))
    return torch.rsqrt(n2.square() / x.shape[-1] + eps)


def adapter_a_of_rmsnorm(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """rmsnorm(x; w, eps) A^T, keeping x and the rank-sized h (not rmsnorm(x)) for the backward."""
    if not torch.is_grad_enabled() or not (x.requires_grad or a.requires_grad):
        return _scaled(F.linear(x, _fold(a, w)), _rsigma(x, eps))
    return _AdapterAOfRMSNorm.apply(x, a, w, eps)


def rmsnorm_weight(base):
    """(effective weight, eps) of a TE LayerNormLinear's RMSNorm, or None for LayerNorm."""
    if getattr(base, "normalization", None) != "RMSNorm":
        return None
    w = base.layer_norm_weight.detach().float()  # (1 + w of a zero-centred gamma is not exact in bf16)
    return (w + 1 if getattr(base, "zero_centered_gamma", False) else w), float(base.eps)


def adapter_a(x: torch.Tensor, a: torch.Tensor, u, act) -> torch.Tensor:
    """x A^T, keeping u instead of x for the backward when u (the pre-activation) is given."""
    if u is None or not torch.is_grad_enabled() or not (x.requires_grad or a.requires_grad):
        return F.linear(x, a)
    return _AdapterAFromRecomputedInput.apply(x, u, a, act)
