"""The GEMM-epilogue adapter path (trainer.lora.epilogue): one autograd node owns the frozen base GEMM and its adapter.

    y  = s (drop(x) A^T) B^T  ->  y += x W^T          the rank-r product writes y once; the base GEMM adds into it
                                                       (beta = 1: the read of y hides in a compute-bound GEMM)
    dh, dB = s dy B, s dy^T h                          two cuBLAS GEMMs (dy read twice; see below)
    dx = (dh A) * mask  ->  dx += dy W                 the adapter's input gradient (dropout's mask applied as it is
                                                       formed) written once; the base dgrad GEMM adds into it
    dA = dh^T drop(x)

Against trainer.lora.fused (which keeps the base module's own forward and adds the adapter after it: out read and
written again, dy read twice, dx read and written again) this saves one [tokens, out] pass forward and one
[tokens, out] plus one [tokens, in] pass backward per linear (bench/adapter_traffic.py, design "epilogue"). The design
follows LoRAFusion's fused linear+LoRA kernels and Transformer Engine's op fuser (BasicLinear's functional forward /
backward with accumulate_into_out / accumulate_into_grad_input); the base GEMMs here are torch's (cuBLAS with
beta = 1), the rank-r passes Triton kernels where they run.

Dropout (pre, the MLPerf recipes' 0.1) is drawn as nn.Dropout draws it (trainer.model.lora.drop: the same generator
calls, so the same mask from the same RNG state) and folded into A: the masked input feeds A, the mask is kept for
dx. Numerics against the unfused path (tests/test_lora_epilogue.py): h, dh, dB, dA identical ops on CPU; y and dx
differ only in where the two GEMMs' sums are rounded (bitwise in fp32 on CPU, to rounding in bf16).

Runs where the base GEMM is x W^T alone, which this node can own: TP 1, no bias, not a norm-fused linear (those with
trainer.lora.epilogue_norm: trainer.model.lora.norm_epilogue runs their norm first), not an expert or duplicated
linear; a 16/32-bit weight, or with trainer.lora.epilogue true in an FP8 run (delayed or tensorwise scaling) a TE
linear whose FP8 GEMMs the node runs through TE's functional linear with the module's quantizers
(trainer.model.lora.base_gemm; null takes it there too since it was timed on 2026-12-06; FP4 and FP8 blockwise
are refused by the contract). LoRALinear.uses_epilogue says where; the others keep their path.
"""
from __future__ import annotations

import torch

from trainer.model.lora.base_gemm import TorchGemm, adds_bias, owns_fp8_base_gemm
from trainer.model.lora.drop import draw, input_for_grad, kept_for_grad
from trainer.model.lora.kernels import dual_grad, masked_product

PLAIN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def owns_base_gemm(base, fp8: bool = False) -> bool:
    """The base's forward is y = x W^T alone: a plain 16/32-bit 2-D weight (no FP8 tensor), no bias added; with
    fp8 (trainer.lora.epilogue on in an FP8 run), a TE linear whose FP8 GEMM it can run (base_gemm)."""
    if fp8:
        return owns_fp8_base_gemm(base)
    w = getattr(base, "weight", None)
    if type(w) not in (torch.nn.Parameter, torch.Tensor) or w.dim() != 2 or w.dtype not in PLAIN_DTYPES:
        return False
    if adds_bias(base):
        return False
    # (TE sets a module's `fp8` inside its forward's prepare_forward: a 16-bit owner here is one the FP8 epilogue's
    # base_gemm never quantizes; FP8 runs ask owns_fp8_base_gemm, FP4 ones are kept off by the contract and
    # auto_blocker)
    return not getattr(base, "fp8", False)


def auto_blocker(device: torch.device, settings) -> str | None:
    """Why trainer.lora.epilogue null (auto) stays off on this node (None: on, where a linear can own its GEMM): the
    conditions of primus_contract.rules_precision.epilogue_on, seen from the node. settings: PrecisionSettings."""
    from primus_contract.rules_model import FP8_EPILOGUE_RECIPES
    from trainer.model.lora.base_gemm import te_functional

    if device.type != "cuda" or torch.version.hip is not None:
        return "not an NVIDIA GPU (where it was measured)"
    if settings.fp4:
        return "FP4 base GEMMs (no epilogue for them)"
    if settings.fp8 and settings.fp8_recipe not in FP8_EPILOGUE_RECIPES:
        return f"FP8 {settings.fp8_recipe} scaling (the FP8 epilogue takes per-tensor scaling: delayed, tensorwise)"
    if settings.fp8 and te_functional() is None:
        return "this Transformer Engine has no functional linear (ops.BasicLinear) for the FP8 base GEMMs"
    if not settings.bf16:
        return "not a BF16 run"
    return None


class _Epilogue(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, u, gemm, a, b, scale, p, act, kernels, products, recompute_drop):
        y, xd2, keep, h, a_c, b_c = _forward(x, gemm, a, b, scale, p, kernels and products)
        # trainer.lora.dropout_recompute: x (the caller's storage, or u) and the mask's bits instead of xd and the mask
        kept, keep, ctx.drop, act = kept_for_grad(x.detach(), xd2, keep, p, None if u is None else u.detach(), act,
                                                  recompute_drop, kernels)
        ctx.save_for_backward(kept, keep, h, a_c, b_c)
        ctx.gemm = gemm  # the frozen base GEMM (trainer.model.lora.base_gemm): its weight, or TE's FP8 operands
        ctx.meta = (scale, p, act, kernels, x.shape, a.dtype, b.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        kept, keep, h, a_c, b_c = ctx.saved_tensors
        gemm, ctx.gemm = ctx.gemm, None
        scale, p, act, kernels, x_shape, a_dtype, b_dtype = ctx.meta
        dy2 = dy.reshape(-1, dy.shape[-1])
        # dh and dB by cuBLAS, dy read twice: the one-read Triton kernel (dual_grad's) took 2.2-2.5x their time at the
        # 8B's widths (H100, bench/adapter_gemms.py, 2026-12-05: bench/results/2026-12-05d_h100_speed)
        dh, db = dual_grad(dy2, b_c, h, scale, kernels=False)
        xin, keep = input_for_grad(kept, keep, ctx.drop, act)  # (xd rebuilt bitwise: trainer.model.lora.drop)
        ctx.drop = None
        da = dh.t().mm(xin)
        del xin
        dx = None
        if ctx.needs_input_grad[0]:
            dx = masked_product(dh, a_c, keep, p, kernels=kernels)
            gemm.dgrad_into(dy2, dx)  # the base dgrad GEMM accumulates into the adapter's input gradient (beta = 1)
            dx = dx.view(x_shape)
        gemm.done()
        return dx, None, None, da.to(a_dtype), db.to(b_dtype), None, None, None, None, None, None


def epilogue_adapter(w, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float,
                     p: float = 0.0, u=None, act=None, kernels: bool = False, products: bool = False,
                     recompute_drop: bool = False) -> torch.Tensor:
    """x W^T + scale * drop_p(x) A^T B^T through the epilogue node. w: the base weight, or its GEMM
    (trainer.model.lora.base_gemm: TorchGemm, TeFp8Gemm). With (u, act): x = act(u), u kept instead of x
    (trainer.model.lora.inputs, the norm epilogue's recompute.norm_output; with dropout only with recompute_drop).
    p: the pre-dropout probability in effect (0: none). kernels: the Triton passes run here (dx's masked product);
    products: s h B^T by one too (trainer.lora.triton_products). recompute_drop (trainer.lora.dropout_recompute): under pre-dropout keep x and the mask's bits, not xd and the
    mask (trainer.model.lora.drop.kept_drop)."""
    gemm = TorchGemm(w) if isinstance(w, torch.Tensor) else w
    if u is not None and p and not recompute_drop:
        raise ValueError("the epilogue path recomputes x = act(u) under dropout only with recompute_drop")
    if not (torch.is_grad_enabled() and (x.requires_grad or a.requires_grad or b.requires_grad)):
        # the node's own forward ops in its order (s h B^T first, then the base GEMM accumulates): megatron's
        # recompute runs a layer's first forward without grad and its replay with grad, and in BF16 the other order
        # rounds differently (audit, 2026-12-06: the two differed in 1 ulp, so recompute was not exact)
        with torch.no_grad():
            return _forward(x, gemm, a, b, scale, p, kernels and products)[0]
    return _Epilogue.apply(x, u, gemm, a, b, scale, float(p), act, kernels, products, recompute_drop)


def _forward(x, gemm, a, b, scale, p, products):
    """(y, xd2, keep, h, a_c, b_c): x W^T + scale * drop_p(x) A^T B^T, the adapter's product written first."""
    x2 = x.reshape(-1, x.shape[-1])
    a_c, b_c = a.to(x.dtype), b.to(x.dtype)
    xd2, keep = draw(x2, p) if p else (x2, None)
    h = xd2.mm(a_c.t())
    y = masked_product(h, b_c.t(), None, 0.0, kernels=products, scale=scale)  # s h B^T, written once
    gemm.forward_into(x2, y)  # the base GEMM accumulates into the adapter's product (beta = 1)
    return y.view(*x.shape[:-1], y.shape[-1]), xd2, keep, h, a_c, b_c
