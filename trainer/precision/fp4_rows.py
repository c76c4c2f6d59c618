"""Fast fused FP4 quantize-dequantize for 1-D blocks (NVFP4 1x16, MXFP4 1x32) and the NVFP4 GEMM epilogue.

One program handles ROWS consecutive blocks as a [ROWS, BLOCK] tile: each block is one tile row, so the
block amax is a row reduction and there is no in-kernel reshape. The per-block arithmetic is fp4_triton's
(_nvfp4_globals / _nvfp4_block / _mx_block / _mx_deq / _e2m1_code), so results are bit-equal to the tiled
kernels and to the pure-torch references. The output is written directly as the QDQ tensor in the requested
dtype (no codes/scales round trip); `global_scale=False` leaves out NVFP4's tensor scale amax/2688, which
gives E2M1 value x E4M3 block scale, exact in bf16 (the operand of TE's alpha-epilogue GEMM).
"""
from __future__ import annotations

from typing import Optional

import torch

from .fp4_triton import _seed, tensor_amax, triton

if triton is not None:
    import triton.language as tl

    from .fp4_triton import (_block_nan_max, _e2m1_code, _e2m1_value, _mx_block, _mx_deq, _nan_clamp,
                             _nvfp4_block, _nvfp4_globals, _to_out)

    @triton.jit
    def _qdq_rows_kernel(x_ptr, amax_ptr, out_ptr, n_blocks, N, stride_m, seed, ROWS: tl.constexpr,
                         BLOCK: tl.constexpr, MX: tl.constexpr, GLOBAL: tl.constexpr, STOCHASTIC: tl.constexpr):
        b = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64: offsets past 2**31 elements
        j = tl.arange(0, BLOCK)
        per_row = N // BLOCK
        row = b // per_row
        col = (b - row * per_row) * BLOCK
        mask = (b < n_blocks)[:, None] & (j < BLOCK)[None, :]
        offs = row[:, None] * stride_m + col[:, None] + j[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        isnan, vmax = _block_nan_max(x, 1)
        if MX:
            e, biased, inv = _mx_block(vmax, isnan)
            scale = inv
        else:
            amax = tl.load(amax_ptr)
            ges, gds = _nvfp4_globals(amax)
            dsf, _, scale = _nvfp4_block(vmax, ges, gds)
        v = _nan_clamp(x * scale[:, None], -6.0, 6.0)
        u = tl.rand(seed, offs) if STOCHASTIC else v
        mag, sign = _e2m1_code(v, u, STOCHASTIC)
        if MX:
            deq = _mx_deq(_e2m1_value(mag, sign), e[:, None], biased[:, None])
        else:
            deq = _e2m1_value(mag, sign) * dsf[:, None]
            if GLOBAL:
                deq = deq * tl.math.div_rn(amax, 2688.0)
        tl.store(out_ptr + b[:, None] * BLOCK + j[None, :], _to_out(deq, out_ptr), mask=mask)

    @triton.jit
    def _scale_kernel(y_ptr, alpha_ptr, out_ptr, numel, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < numel
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, _to_out(y * tl.load(alpha_ptr), out_ptr), mask=mask)


ROWS_ELEMENTS = 2048   # elements per program (ROWS = ROWS_ELEMENTS // BLOCK)


def _rows(x2: torch.Tensor, block: int, mx: bool, amax: Optional[torch.Tensor], stochastic: bool,
          global_scale: bool, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, n = x2.shape
    if n % block:
        raise ValueError(f"the rows kernel needs the last dim ({n}) to be a multiple of {block}")
    out = torch.empty((m, n), dtype=out_dtype or x2.dtype, device=x2.device)
    n_blocks = m * (n // block)
    if n_blocks == 0:
        return out
    rows = ROWS_ELEMENTS // block
    _qdq_rows_kernel[(triton.cdiv(n_blocks, rows),)](
        x2, x2 if amax is None else amax, out, n_blocks, n, x2.stride(0), _seed(stochastic), ROWS=rows, BLOCK=block,
        MX=mx, GLOBAL=global_scale, STOCHASTIC=stochastic, num_warps=4)
    return out


def nvfp4_rows(x2: torch.Tensor, amax: torch.Tensor, stochastic: bool = False, global_scale: bool = True,
               out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """NVFP4 1x16 QDQ of a 2-D x2 (n % 16 == 0, unit column stride) against the given fp32 [1] amax."""
    return _rows(x2, 16, False, amax, stochastic, global_scale, out_dtype)


def mxfp4_rows(x2: torch.Tensor, stochastic: bool = False, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """MXFP4 1x32 QDQ of a 2-D x2 (n % 32 == 0)."""
    return _rows(x2, 32, True, None, stochastic, True, out_dtype)


def nvfp4_qdq(x: torch.Tensor, tile=(1, 16), rht: bool = False, stochastic: bool = False) -> torch.Tensor:
    """QDQ along the last dim, same shape and dtype; 1x16 through the rows kernel, 16x16 through the tiled one."""
    shape = x.shape
    if shape[-1] % 16:
        from .nvfp4 import qdq_ref

        return qdq_ref(x, tile=tile, rht=rht, stochastic=stochastic)
    x2 = x.reshape(-1, shape[-1])
    if rht:
        from .hadamard import apply_rht

        x2 = apply_rht(x2)
    amax = tensor_amax(x2)
    if tile[0] == 16:
        from .fp4_triton import nvfp4_qdq_2d

        return nvfp4_qdq_2d(x2, amax, tile, stochastic).view(shape)
    return nvfp4_rows(x2, amax, stochastic).view(shape)


def mxfp4_qdq(x: torch.Tensor, stochastic: bool = False) -> torch.Tensor:
    shape = x.shape
    if shape[-1] % 32:
        from .mxfp4 import qdq_ref

        return qdq_ref(x, stochastic=stochastic)
    return mxfp4_rows(x.reshape(-1, shape[-1]), stochastic).view(shape)


def scale_output(y: torch.Tensor, alpha: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """out_dtype(float(y) * alpha) in one pass (in place when the dtypes agree); alpha fp32 with one element."""
    y = y.contiguous()
    out = y if out_dtype == y.dtype else torch.empty(y.shape, dtype=out_dtype, device=y.device)
    if y.numel():
        block = 4096
        _scale_kernel[(triton.cdiv(y.numel(), block),)](y, alpha, out, y.numel(), BLOCK=block, num_warps=8)
    return out
