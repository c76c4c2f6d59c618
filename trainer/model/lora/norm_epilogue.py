"""The epilogue for norm-fed linears (trainer.lora.epilogue_norm): the adapter path also owns the norm that
Transformer Engine fuses into qkv and fc1 (LayerNormLinear), so their adapters get the epilogue's passes too.

With TE's LayerNormLinear the adapter reads the norm output that TE returns (`return_layernorm_output`), and TE adds
the adapter's input gradient to its own dgrad in a separate pass before the norm's backward (read both, write one).
This path runs the norm itself (torch's F.rms_norm / F.layer_norm, with TE's weight and eps) and then:

    qkv (a whole linear):   the GEMM epilogue node on the norm output (trainer.model.lora.epilogue): y = s h B^T
                            written once, the base GEMM adds into it; dx_a written once, the dgrad GEMM adds into it
    fc1 folded by the SwiGLU (forward_parts: the base output and h, B applied by the SwiGLU kernels): the fused path's
                            tap (trainer.model.lora.fused) on the norm output, so dh A is added in place into the
                            base's dgrad

and autograd runs the norm's backward on the summed gradient. Against TE's LayerNormLinear + the unfused adapter
this saves, per linear and step, the separate sum and one write of the adapter's input gradient ([tokens, in]), and
for qkv the forward's second pass over its output (primus_contract/plan/adapter_passes.py: design epilogue-all).

Numerics: the norm is torch's, not TE's kernel (both compute in fp32 and round the output once; on CPU the test
stand-in's norm is torch's, so the CPU tests compare the same ops: tests/test_norm_epilogue.py). Runs where the
epilogue does (16/32-bit base GEMMs, TP 1: FP8/FP4 and TP > 1 keep it off) on a LayerNormLinear without a
GEMM bias whose norm is RMSNorm or LayerNorm; elsewhere the linear keeps its path.

With trainer.recompute.norm_output the nodes keep the norm's input x (which F.rms_norm / F.layer_norm keep for their
own backward: the same storage) instead of its output, and run the norm again in backward for dA: the same op on the
same input, so the same bits (tests/test_norm_output_recompute.py); [tokens, hidden] x 2 bytes less per norm-fed
adapter, one norm pass more.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from trainer.model.lora.base_gemm import TorchGemm, base_gemm
from trainer.model.lora.drop import draw
from trainer.model.lora.epilogue import epilogue_adapter, owns_base_gemm
from trainer.model.lora.fused import fused_adapter

FUSED_RMS_NORM = hasattr(torch.ops.aten, "_fused_rms_norm")  # torch's one-kernel RMSNorm (looked up once)


def owns_norm(base, fp8: bool = False) -> bool:
    """`base` is a norm-fused linear whose norm torch runs as TE does: TE's LayerNormLinear with a tensor norm weight,
    LayerNorm, or RMSNorm where torch has its fused kernel (one rounding of the output, as TE's; older torch rounds
    the normalised value before the weight and keeps fp32 intermediates), no zero-centred gamma (TE adds its 1 in
    fp32; our models never set it), and a plain base GEMM this path can own (trainer.model.lora.epilogue)."""
    weight = getattr(base, "layer_norm_weight", None)
    kind = getattr(base, "normalization", "LayerNorm")
    return (isinstance(weight, torch.Tensor) and hasattr(base, "return_layernorm_output")
            and (kind == "LayerNorm" or (kind == "RMSNorm" and FUSED_RMS_NORM))
            and not getattr(base, "zero_centered_gamma", False) and owns_base_gemm(base, fp8))


def norm(base, x: torch.Tensor) -> torch.Tensor:
    """TE's input norm of `base` as torch ops: its weight, eps and kind."""
    gamma = base.layer_norm_weight
    shape, eps = (x.shape[-1],), float(getattr(base, "eps", 1e-5))
    if getattr(base, "normalization", "LayerNorm") == "RMSNorm":
        return F.rms_norm(x, shape, gamma.to(x.dtype), eps)
    bias = getattr(base, "layer_norm_bias", None)
    return F.layer_norm(x, shape, gamma.to(x.dtype), None if bias is None else bias.to(x.dtype), eps)


def _recomputed_from(lora, x: torch.Tensor, p: float):
    """(u, act) for the node to keep x (the norm's input, kept by the norm's own backward anyway) and run the norm
    again in backward (trainer.recompute.norm_output; under pre-dropout only with trainer.lora.dropout_recompute),
    else (None, None): the node keeps the norm's output."""
    if not lora.norm_recompute or (p and not lora.dropout_recompute):
        return None, None
    return x, functools.partial(norm, lora.base)


def norm_epilogue(lora, x: torch.Tensor, p: float, kernels: bool) -> torch.Tensor:
    """base(x) + scale * drop_p(norm(x)) A^T B^T of a norm-fed LoRALinear, through the epilogue node on norm(x)
    (its base GEMM in FP8 with lora.fp8_epilogue: trainer.model.lora.base_gemm)."""
    u, act = _recomputed_from(lora, x, p)
    with base_gemm(lora.base, norm(lora.base, x), lora.fp8_epilogue) as (xn, gemm):
        return epilogue_adapter(gemm, xn, lora.lora_a, lora.lora_b, lora.scale, p, u=u, act=act, kernels=kernels,
                                products=lora.triton_products, recompute_drop=lora.dropout_recompute)


class _BaseLinear(torch.autograd.Function):
    """norm(x) W^T by a base GEMM object (trainer.model.lora.base_gemm) and its dgrad: the FP8 base of norm_parts."""

    @staticmethod
    def forward(ctx, z, gemm):
        ctx.gemm, ctx.shape = gemm, z.shape
        return gemm.forward_new(z.reshape(-1, z.shape[-1])).view(*z.shape[:-1], -1)

    @staticmethod
    def backward(ctx, dy):
        gemm, ctx.gemm = ctx.gemm, None
        dx = gemm.dgrad_new(dy.reshape(-1, dy.shape[-1])).view(ctx.shape) if ctx.needs_input_grad[0] else None
        gemm.done()
        return dx, None


def norm_parts(lora, x: torch.Tensor, p: float, kernels: bool):
    """(norm(x) W^T, drop_p(norm(x)) A^T) of a norm-fed LoRALinear whose consumer applies B itself (the SwiGLU fold),
    dh A added in place into the base's dgrad by the fused path's tap."""
    u, act = _recomputed_from(lora, x, p)
    with base_gemm(lora.base, norm(lora.base, x), lora.fp8_epilogue) as (xn, gemm):
        base = (lambda z: (F.linear(z, gemm.w), None)) if isinstance(gemm, TorchGemm) else \
            (lambda z: (_BaseLinear.apply(z, gemm), None))
        return fused_adapter(base, xn, lora.lora_a, lora.lora_b, lora.scale, u=u, act=act,
                             drop=(lambda t: draw(t, p)) if p else None, p=p, kernels=kernels,
                             products=lora.triton_products, parts=True, recompute_drop=lora.dropout_recompute)[0]
