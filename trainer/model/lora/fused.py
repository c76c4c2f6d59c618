"""The fused adapter path of LoRALinear (trainer.lora.fused): two autograd nodes for the whole adapter (A, then B;
the TP/SP collective between them, if any), and the adapter's input gradient added in place into the frozen base's
own input gradient.

The unfused path (trainer/model/lora/layers.py) builds the adapter from autograd ops:

    h = x A^T;  y = out + s h B^T                      (addmm, out is the base linear's output)
    backward:  dh = s dy B,  dB = s dy^T h,  dA = dh^T x,  dx_a = dh A,  dx = dx_base + dx_a

where autograd writes dx_a ([tokens, in]) and then sums it with the base's dx in a separate pass (read both,
write one: four passes over a [tokens, in] tensor in all). The fused path keeps every product and its operand
order, and changes two things:

* backward of the input: the base linear is called on a tap of x (`_InputGradTap`, the identity forward) whose
  backward adds dh A into the base's dx in place (`dx.addmm_(dh, A)`: read and write dx once, the product never
  materialised on its own). The adapter node hands dh and A to the tap through a one-use slot; autograd runs the
  tap's backward after A's: A reads the tapped x as well (giving it no gradient), so autograd holds the tap's
  backward until both of its consumers, the base and A, have run theirs.
* forward: y is written into the base output's storage (`out.addmm_`), so no second [tokens, out] buffer lives
  beside it (unless the output is a view made by a custom Function, which autograd forbids writing: then a new one).

Numerics: out, h, y, dh, dB and dA are the same ops in the same order as the unfused path (bitwise on CPU); dx
differs only in where dh A is rounded (added in the GEMM's accumulator instead of rounded to the activation dtype
first). tests/test_lora_fused.py pins both, and 20 iterations of a small model. With trainer.lora.triton_products
(off by default until timed in training) the two in-place rank-r products (y += s h B^T, dx += dh A) run on an NVIDIA
GPU as one Triton pass each (masked_product: at the 8B's widths 22-27 % faster than cuBLAS's addmm_ in isolation,
H100 2026-12-05, bench/results/2026-12-05d_h100_speed): the same sums, rounded once, their K = r terms added in the
kernel's order (tests/test_lora_epilogue.py, in the interpreter).

Pre-dropout (lora.dropout with dropout_position pre, the MLPerf recipes') is fused into A: the mask is drawn as
nn.Dropout draws it (trainer.model.lora.drop: the same RNG calls, so the same mask), the masked input feeds A and is
kept for dA, and the tap adds the masked dh A into dx: on a GPU in one pass (trainer.model.lora.kernels'
masked_product kernel, checked against the torch ops on an H200 by bench/kernel_check.py on 2026-12-05: dx then
differs from the unfused path only in where dh A is rounded); on CPU with torch's ops, the dropout's own backward op,
so dx stays bitwise there.

Applies to a base whose adapter input is the base's own input x: linear_proj, linear_fc2 (also with fc2's SwiGLU
recomputed from fc1's output, trainer.model.lora.inputs), any non-norm linear, at any TP size with or without
sequence parallelism (the same collectives as the unfused path, between A and B), with or without pre-dropout.
Elsewhere (a LayerNormLinear whose adapter reads TE's returned norm output, the folded-norm adapter, post-dropout)
LoRALinear keeps the unfused path; with trainer.lora.epilogue_norm a LayerNormLinear's norm runs in torch and fc1's
parts for the SwiGLU fold come through this path's tap (`parts`, trainer.model.lora.norm_epilogue).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.model.lora.drop import input_for_grad, kept_for_grad
from trainer.model.lora.kernels import masked_product


class _Slot:
    """Hands (dh, A, the dropout mask) from the adapter's A node's backward to the tap's backward; used once."""
    __slots__ = ("dh", "a", "keep", "p", "kernels", "products")

    def __init__(self, p: float = 0.0, kernels: bool = False, products: bool = False):
        self.dh = self.a = self.keep = None
        self.p, self.kernels, self.products = p, kernels, products


class _InputGradTap(torch.autograd.Function):
    """Identity on x; in backward, dx += dh A with the slot's dh and A in place (addmm_, or one Triton pass with
    trainer.lora.triton_products), with pre-dropout dx += undrop(dh A) (one masked pass, Triton where it runs):
    trainer.model.lora.kernels.masked_product."""

    @staticmethod
    def forward(ctx, x, slot):
        ctx.slot = slot
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx):
        slot, ctx.slot = ctx.slot, None
        dh, a, keep = slot.dh, slot.a, slot.keep
        slot.dh = slot.a = slot.keep = None
        if dh is None:  # the adapter node ran no backward (its output was unused): nothing to add
            return dx, None
        dx = dx.contiguous()
        dx2 = dx.view(-1, dx.shape[-1])
        masked_product(dh.view(-1, dh.shape[-1]), a, None if keep is None else keep.view(dx2.shape), slot.p, out=dx2,
                       accumulate=True, kernels=slot.kernels and (keep is not None or slot.products))
        return dx, None


class _AdapterA(torch.autograd.Function):
    """h = x A^T. Backward: dA = dh^T x, and (dh, A) handed to the tap instead of a gradient for x.

    With (u, act) given, x = act(u) and u is kept instead of x: x is recomputed in backward for dA
    (trainer.model.lora.inputs). With (xd, keep) given (pre-dropout, drawn by the caller): h = xd A^T, xd kept for dA
    and the mask handed to the tap."""

    @staticmethod
    def forward(ctx, x, u, a, dtype, slot, act, xd=None, keep=None, recompute_drop=False):
        a_c = a.to(dtype)
        src = x if xd is None else xd
        ctx.a_dtype, ctx.slot = a.dtype, slot
        # trainer.lora.dropout_recompute: x (or u) and the mask's bits instead of xd and the mask
        kept, keep, ctx.drop, ctx.act = kept_for_grad(x, src, keep, slot.p, u, act, recompute_drop, slot.kernels)
        ctx.save_for_backward(kept, a_c, keep)
        return F.linear(src, a_c)

    @staticmethod
    def backward(ctx, dh):
        kept, a_c, keep = ctx.saved_tensors
        xin, keep = input_for_grad(kept, keep, ctx.drop, ctx.act)  # (xd rebuilt bitwise: trainer.model.lora.drop)
        ctx.drop = ctx.act = None
        dh2 = dh.reshape(-1, dh.shape[-1])
        da = dh2.t().mm(xin)
        del xin
        slot, ctx.slot = ctx.slot, None
        slot.dh, slot.a, slot.keep = dh2, a_c, keep
        return None, None, da.to(ctx.a_dtype), None, None, None, None, None, None


class _AdapterB(torch.autograd.Function):
    """out += s h B^T, in place. Backward: d(out) = dy, dh = s dy B, dB = s dy^T h (addmm's own products)."""

    @staticmethod
    def forward(ctx, out, h, b, scale, kernels=False):
        b_c = b.to(out.dtype)
        h2 = h.reshape(-1, h.shape[-1])
        if out._is_view():  # an input returned as-is by a custom Function (megatron's TP-1 all-reduce): not in place
            out = torch.addmm(out.reshape(-1, out.shape[-1]), h2, b_c.t(), alpha=scale).view(out.shape)
        else:  # in place: addmm_ (torch), or one Triton pass with trainer.lora.triton_products
            masked_product(h2, b_c.t(), None, 0.0, out=out.view(-1, out.shape[-1]), accumulate=True, kernels=kernels,
                           scale=scale)
            ctx.mark_dirty(out)
        ctx.scale, ctx.b_dtype = scale, b.dtype
        ctx.save_for_backward(h, b_c)
        return out

    @staticmethod
    def backward(ctx, dy):
        h, b_c = ctx.saved_tensors
        s = ctx.scale
        dy2 = dy.reshape(-1, dy.shape[-1])
        # addmm's own backward: mat1 grad (dy B) * alpha; mat2 = B^T is column-major, so its grad is formed as
        # (dy^T h)^T: B's grad is dy^T h * alpha
        dh = dy2.mm(b_c)
        db = dy2.t().mm(h.reshape(-1, h.shape[-1]))
        if s != 1.0:
            dh, db = dh.mul_(s), db.mul_(s)
        return dy, dh.view(h.shape), db.to(ctx.b_dtype), None, None


def fused_adapter(base, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float, args=(), kwargs=None,
                  u=None, act=None, collective=None, drop=None, p: float = 0.0, kernels: bool = False,
                  products: bool = False, parts: bool = False, recompute_drop: bool = False):
    """(y, bias) of base(x) + scale * collective(drop(x) A^T) B^T through the fused path; base returns (out, bias).
    `collective`: the TP/SP mapping between A and B (megatron's autograd functions), None at TP 1. `drop`: pre-dropout
    of probability p, a callable x -> (xd, keep) (trainer.model.lora.drop.draw under the caller's RNG rules).
    parts: ((out, h), bias), B left to the caller (trainer.model.lora.norm_epilogue: the SwiGLU fold applies it).
    recompute_drop (trainer.lora.dropout_recompute): A keeps x and the mask's bits, not xd and the mask."""
    slot = _Slot(p, kernels, products)
    needs_dx = torch.is_grad_enabled() and x.requires_grad
    # A reads the tapped x too (and gives it no gradient): the tap's backward then waits for A's, whose dh it adds
    x_in = _InputGradTap.apply(x, slot) if needs_dx else x
    out, bias = base(x_in, *args, **(kwargs or {}))
    if not out.is_contiguous():
        out = out.contiguous()
    xd, keep = drop(x.detach()) if drop is not None else (None, None)  # drawn after the base, as the unfused path
    h = _AdapterA.apply(x_in, None if u is None else u.detach(), a, out.dtype, slot, act, xd, keep, recompute_drop)
    if collective is not None:
        h = collective(h)
    if parts:
        return (out, h), bias
    return _AdapterB.apply(out, h, b, scale, kernels and products), bias
