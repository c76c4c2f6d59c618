"""FP4 GEMM operands as bf16 "payloads" and the GEMM on them (TE-free; used by te_factory's quantizers).

A payload is a tensor dequantized block by block, written by one fused kernel pass:
  NVFP4: E2M1 value x E4M3 block scale (1x16, or 16x16 tiles for weights) - no tensor scale, so every value
         is exact in bf16; the GEMM applies alpha = amax_a * amax_b / (6*6*448*448) afterwards, as TE does.
  MXFP4: E2M1 value x 2^e per 1x32 block - the full dequantized value (exact in bf16).
The codes and block scales are the reference's bit for bit (fp4_triton / nvfp4 / mxfp4), so the payload
equals decoding TE's NVFP4QuantizerRef output; only the GEMM's accumulation order differs from TE's loop.
Off CUDA (or for widths that are not a block multiple) the pure-torch references compute the same values.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import e2m1, mxfp4, nvfp4
from .hadamard import apply_rht

PAYLOAD_DTYPE = torch.bfloat16
ALPHA_DIVISOR = 6.0 * 6.0 * 448.0 * 448.0


def _fast(x: torch.Tensor, block: int) -> bool:
    if not x.is_cuda or x.shape[-1] % block:
        return False
    from . import fp4_triton
    from .qdq import _FORCE_REF

    return fp4_triton.available() and not _FORCE_REF


def amax_of(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        from .fp4_triton import tensor_amax

        return tensor_amax(x)
    return x.abs().max().float().view(1)


def nvfp4_block_values(q: nvfp4.NVFP4Tensor, dtype: torch.dtype = PAYLOAD_DTYPE) -> torch.Tensor:
    """Decoded codes times E4M3 block scales, without the tensor scale (reference path)."""
    m, n = q.shape
    values = e2m1.decode(e2m1.unpack(q.data)[:, :n])
    return (values * q.scale.float()[:m].repeat_interleave(nvfp4.BLOCK, dim=1)[:, :n]).to(dtype)


def nvfp4_payload(x2: torch.Tensor, tile: Tuple[int, int] = (1, 16), rht: bool = False,
                  stochastic: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(payload [m, n] bf16, tensor amax fp32 [1]) of a 2-D x2 quantized along its last dim (after RHT if rht)."""
    if rht:
        x2 = apply_rht(x2)
    amax = amax_of(x2)
    if _fast(x2, 16):
        if tile[0] == 16:
            from .fp4_triton import nvfp4_qdq_2d

            return nvfp4_qdq_2d(x2, amax, tile, stochastic, global_scale=False, out_dtype=PAYLOAD_DTYPE), amax
        from .fp4_rows import nvfp4_rows

        return nvfp4_rows(x2, amax, stochastic, global_scale=False, out_dtype=PAYLOAD_DTYPE), amax
    q = nvfp4.quantize_ref(x2.contiguous(), tile=tile, amax=amax, stochastic=stochastic)
    return nvfp4_block_values(q), amax


def mxfp4_payload(x2: torch.Tensor, stochastic: bool = False) -> torch.Tensor:
    """MXFP4 1x32 QDQ of a 2-D x2 along its last dim, as bf16."""
    if _fast(x2, 32):
        from .fp4_rows import mxfp4_rows

        return mxfp4_rows(x2, stochastic, out_dtype=PAYLOAD_DTYPE)
    return mxfp4.quantize_ref(x2.contiguous(), stochastic=stochastic).dequantize(PAYLOAD_DTYPE)


def _scale(y: torch.Tensor, alpha: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if y.is_cuda:
        from . import fp4_triton

        if fp4_triton.available():
            from .fp4_rows import scale_output

            return scale_output(y, alpha, out_dtype)
    return (y.float() * alpha).to(out_dtype)


def payload_gemm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, amax_a: Optional[torch.Tensor] = None,
                 amax_b: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None, accumulate: bool = False) -> torch.Tensor:
    """out_dtype(alpha * (a @ b^T) [+ bias] [+ out]) for payloads a [m, k], b [n, k] (b may be a transposed view).

    alpha = amax_a * amax_b / (6*6*448*448) for NVFP4 (amaxes given), 1 for MXFP4. The bf16 GEMM rounds to
    bf16 and the scaling runs in fp32, fused into one pass (same numbers as float(y) * alpha, then the cast).
    """
    y = a @ b.t()
    plain = bias is None and not accumulate
    if amax_a is not None:
        alpha = (amax_a * amax_b).float() / ALPHA_DIVISOR
        y = _scale(y, alpha, out_dtype if plain else torch.float32)
    if plain:
        return y.to(out_dtype)
    y = y.float()
    if bias is not None:
        y = y + bias.float()
    if accumulate:
        y = y + out.float()
    return y.to(out_dtype)
