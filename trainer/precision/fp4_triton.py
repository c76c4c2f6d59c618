"""Fused Triton quantize(-dequantize) kernels for NVFP4 and MXFP4 (CUDA fast path of qdq.py).

The arithmetic is the reference's (nvfp4.py / mxfp4.py) step for step in fp32 - IEEE-rounded division
(div_rn), RNE E4M3 casts, NaN-preserving clamps - so results equal the reference bit for bit; the GPU
check (bench/fp4_gpu_check.py) verifies that against TE's NVFP4QuantizerRef.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

# Globals a @triton.jit kernel reads must be constexpr (compiled kernels reject plain module globals).
FLT_MAX = tl.constexpr(3.4028234663852886e38) if triton is not None else 3.4028234663852886e38
RCP6 = tl.constexpr(0.1666666716337204) if triton is not None else 0.1666666716337204  # fp32(1/6)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:
    @triton.jit
    def _e2m1_code(v, u, STOCHASTIC: tl.constexpr):
        a = tl.abs(v)
        if STOCHASTIC:
            lo = ((a >= 0.5).to(tl.int32) + (a >= 1.0).to(tl.int32) + (a >= 1.5).to(tl.int32) + (a >= 2.0).to(tl.int32)
                  + (a >= 3.0).to(tl.int32) + (a >= 4.0).to(tl.int32) + (a >= 6.0).to(tl.int32))
            hi = tl.minimum(lo + 1, 7)
            lo_v = tl.where(lo < 4, lo.to(tl.float32) * 0.5, tl.where(lo < 7, (lo - 2).to(tl.float32), 6.0))
            hi_v = tl.where(hi < 4, hi.to(tl.float32) * 0.5, tl.where(hi < 7, (hi - 2).to(tl.float32), 6.0))
            frac = tl.where(hi_v > lo_v, (a - lo_v) / (hi_v - lo_v), 0.0)
            mag = tl.where(u < frac, hi, lo)
            mag = tl.where(a != a, 0, mag)
        else:
            mag = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
                   + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
                   + (a > 5.0).to(tl.int32))
        return mag, (v < 0).to(tl.int32)

    @triton.jit
    def _e2m1_value(mag, sign):
        val = tl.where(mag < 4, mag.to(tl.float32) * 0.5, tl.where(mag < 7, (mag - 2).to(tl.float32), 6.0))
        return tl.where(sign != 0, -val, val)

    @triton.jit
    def _to_out(v, out_ptr):
        """Cast to the output dtype; bf16 is rounded to nearest-even by hand so every backend agrees."""
        if out_ptr.dtype.element_ty == tl.bfloat16:
            bits = v.to(tl.int32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
            v = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
        return v.to(out_ptr.dtype.element_ty)

    @triton.jit
    def _nan_clamp(v, lo, hi):
        return tl.where(v != v, v, tl.minimum(tl.maximum(v, lo), hi))

    @triton.jit
    def _e4m3_rne(v):
        """Round non-negative fp32 (<= 448, or NaN) to E4M3 with ties to even: (value as fp32, code as uint8)."""
        sub = (v + 16384.0) - 16384.0                      # fp32 ulp at 2^14 is 2^-9: RNE onto the subnormal grid
        bits = v.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576   # keep 3 mantissa bits, RNE (0xFFF00000)
        nrm = bits.to(tl.float32, bitcast=True)
        is_sub = v < 0.015625
        val = tl.where(is_sub, sub, nrm)
        exp = ((bits >> 23) & 0xFF) - 120
        code_n = (exp << 3) | ((bits >> 20) & 7)
        code_s = (sub * 512.0).to(tl.int32)
        code = tl.where(is_sub, code_s, code_n)
        code = tl.where(v != v, 0x7F, code)
        val = tl.where(v != v, v, val)
        return val, code.to(tl.uint8)

    @triton.jit
    def _store_codes(codes_ptr, mag, sign, rows, pid_n, M, N, TILE_M: tl.constexpr, WIDTH: tl.constexpr):
        code = (mag | (sign << 3)).to(tl.uint8)
        pairs = tl.reshape(code, (TILE_M, WIDTH // 2, 2))
        lo, hi = tl.split(pairs)
        packed = lo | (hi << 4)
        pcols = pid_n * (WIDTH // 2) + tl.arange(0, WIDTH // 2)
        pmask = (rows[:, None] < M) & (pcols[None, :] < N // 2)
        tl.store(codes_ptr + rows[:, None] * (N // 2) + pcols[None, :], packed, mask=pmask)

    @triton.jit
    def _store_payload(codes_ptr, scale_ptr, mag, sign, scales, rows, pid_n, M, N, TILE_M: tl.constexpr,
                       WIDTH: tl.constexpr, BLOCKS: tl.constexpr, BLOCK: tl.constexpr):
        """Packed codes of the tile and its BLOCKS per-row block scales (one per BLOCK elements)."""
        _store_codes(codes_ptr, tl.reshape(mag, (TILE_M, WIDTH)), tl.reshape(sign, (TILE_M, WIDTH)),
                     rows, pid_n, M, N, TILE_M, WIDTH)
        scols = pid_n * BLOCKS + tl.arange(0, BLOCKS)
        smask = (rows[:, None] < M) & (scols[None, :] < N // BLOCK)
        tl.store(scale_ptr + rows[:, None] * (N // BLOCK) + scols[None, :], scales, mask=smask)

    @triton.jit
    def _tile(M, N, stride_m, TILE_M: tl.constexpr, WIDTH: tl.constexpr):
        """(pid_n, rows, in-bounds mask, element offsets) of this program's TILE_M x WIDTH tile."""
        pid_m, pid_n = tl.program_id(0).to(tl.int64), tl.program_id(1)  # int64: offsets past 2**31 elements
        rows = pid_m * TILE_M + tl.arange(0, TILE_M)
        cols = pid_n * WIDTH + tl.arange(0, WIDTH)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        return pid_n, rows, mask, rows[:, None] * stride_m + cols[None, :]

    @triton.jit
    def _nvfp4_globals(amax):
        """(global encode, global decode) from the fp32 tensor amax, as TE's reference."""
        ges = tl.math.div_rn(2688.0, amax)
        ges = tl.where(ges != ges, ges, tl.minimum(ges, FLT_MAX))
        ges = tl.where(ges == 0.0, 1.0, ges)
        return ges, tl.math.div_rn(1.0, ges)

    @triton.jit
    def _nvfp4_block(vmax, ges, gds):
        """Per-block (decode scale as fp32, its E4M3 code, encode scale) from the block amax."""
        ds = vmax * (ges * RCP6)
        ds = tl.where(ds != ds, ds, tl.minimum(ds, FLT_MAX))
        dsf, ds8 = _e4m3_rne(_nan_clamp(ds, -448.0, 448.0))
        es = tl.math.div_rn(tl.full(dsf.shape, 1.0, tl.float32), dsf * gds)
        es = tl.where(es != es, es, tl.minimum(es, FLT_MAX))
        return dsf, ds8, es

    @triton.jit
    def _block_nan_max(x, axis: tl.constexpr):
        """(any NaN in the block as int, block amax with NaN propagated); tl.max alone drops NaNs."""
        isnan = tl.max((x != x).to(tl.int32), axis=axis)
        return isnan, tl.where(isnan > 0, float("nan"), tl.max(tl.abs(x), axis=axis))

    @triton.jit
    def _mx_block(vmax, isnan):
        """OCP MX shared exponent: (e, biased exponent of the block amax (255 for NaN/Inf), 2^-e)."""
        biased = (vmax.to(tl.int32, bitcast=True) >> 23) & 0xFF
        biased = tl.where(isnan > 0, 255, biased)
        e = tl.maximum(biased - 129, -127)
        inv = ((127 - e) << 23).to(tl.float32, bitcast=True)           # 2^-e, always a normal number
        return e, biased, inv

    @triton.jit
    def _mx_deq(val, e, biased):
        """val * 2^e for broadcast e/biased, exact down to 2^-127 and NaN for NaN/Inf blocks."""
        p2 = ((tl.maximum(e, -126) + 127) << 23).to(tl.float32, bitcast=True)   # 2^max(e,-126), normal
        deq = val * p2
        deq = tl.where(e == -127, deq * 0.5, deq)   # exact: 2^-127 = 2^-126 * 0.5
        return tl.where(biased == 255, float("nan"), deq)

    @triton.jit
    def _nvfp4_kernel(x_ptr, amax_ptr, out_ptr, codes_ptr, scale_ptr, M, N, stride_m, seed,
                      TILE_M: tl.constexpr, BLOCKS: tl.constexpr, TWO_D: tl.constexpr, WRITE_QDQ: tl.constexpr,
                      WRITE_CODES: tl.constexpr, STOCHASTIC: tl.constexpr, GLOBAL: tl.constexpr):
        WIDTH: tl.constexpr = BLOCKS * 16
        pid_n, rows, mask, offs = _tile(M, N, stride_m, TILE_M, WIDTH)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        amax = tl.load(amax_ptr)
        ges, gds = _nvfp4_globals(amax)
        xb = tl.reshape(x, (TILE_M, BLOCKS, 16))
        isnan, vmax = _block_nan_max(xb, 2)
        if TWO_D:
            tile_nan = tl.max(isnan, axis=0)
            tile_max = tl.where(tile_nan > 0, float("nan"), tl.max(tl.where(isnan > 0, 0.0, vmax), axis=0))
            vmax = tl.broadcast_to(tile_max[None, :], (TILE_M, BLOCKS))
        dsf, ds8, es = _nvfp4_block(vmax, ges, gds)
        v = _nan_clamp(xb * es[:, :, None], -6.0, 6.0)
        u = tl.rand(seed, tl.reshape(offs, (TILE_M, BLOCKS, 16))) if STOCHASTIC else v
        mag, sign = _e2m1_code(v, u, STOCHASTIC)
        if WRITE_QDQ:
            deq = _e2m1_value(mag, sign) * dsf[:, :, None]
            if GLOBAL:
                deq = deq * tl.math.div_rn(amax, 2688.0)
            tl.store(out_ptr + offs, _to_out(tl.reshape(deq, (TILE_M, WIDTH)), out_ptr), mask=mask)
        if WRITE_CODES:
            _store_payload(codes_ptr, scale_ptr, mag, sign, ds8, rows, pid_n, M, N, TILE_M, WIDTH, BLOCKS, 16)

    @triton.jit
    def _mxfp4_kernel(x_ptr, out_ptr, codes_ptr, scale_ptr, M, N, stride_m, seed,
                      TILE_M: tl.constexpr, BLOCKS: tl.constexpr, WRITE_QDQ: tl.constexpr,
                      WRITE_CODES: tl.constexpr, STOCHASTIC: tl.constexpr):
        WIDTH: tl.constexpr = BLOCKS * 32
        pid_n, rows, mask, offs = _tile(M, N, stride_m, TILE_M, WIDTH)
        xb = tl.reshape(tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32), (TILE_M, BLOCKS, 32))
        isnan, vmax = _block_nan_max(xb, 2)
        e, biased, inv = _mx_block(vmax, isnan)
        v = _nan_clamp(xb * inv[:, :, None], -6.0, 6.0)
        u = tl.rand(seed, tl.reshape(offs, (TILE_M, BLOCKS, 32))) if STOCHASTIC else v
        mag, sign = _e2m1_code(v, u, STOCHASTIC)
        if WRITE_QDQ:
            deq = _mx_deq(_e2m1_value(mag, sign), e[:, :, None], biased[:, :, None])
            tl.store(out_ptr + offs, _to_out(tl.reshape(deq, (TILE_M, WIDTH)), out_ptr), mask=mask)
        if WRITE_CODES:
            code = tl.where(biased == 255, 255, e + 127).to(tl.uint8)
            _store_payload(codes_ptr, scale_ptr, mag, sign, code, rows, pid_n, M, N, TILE_M, WIDTH, BLOCKS, 32)

def _seed(stochastic: bool) -> int:
    return int(torch.randint(0, 2 ** 31 - 1, (1,)).item()) if stochastic else 0


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as fp32 [1] in one reduction pass (no |x| temporary); NaN propagates, -0.0 becomes +0.0."""
    lo, hi = torch.aminmax(x)
    return torch.maximum(lo.abs(), hi.abs()).float().view(1)


def _nvfp4_launch(x: torch.Tensor, amax: torch.Tensor, tile, out, codes, scales, stochastic: bool, global_scale: bool):
    m, n = x.shape
    blocks = 8 if n % 128 == 0 else (2 if n % 32 == 0 else 1)
    grid = (triton.cdiv(m, 16), triton.cdiv(n, blocks * 16))
    write_qdq, write_codes = out is not None, codes is not None
    dummy = codes if out is None else out
    _nvfp4_kernel[grid](x, amax, out if write_qdq else dummy, codes if write_codes else dummy,
                        scales if write_codes else dummy, m, n, x.stride(0), _seed(stochastic), TILE_M=16,
                        BLOCKS=blocks, TWO_D=tile[0] == 16, WRITE_QDQ=write_qdq, WRITE_CODES=write_codes,
                        STOCHASTIC=stochastic, GLOBAL=global_scale)


def nvfp4_quantize(x: torch.Tensor, tile: Tuple[int, int] = (1, 16), rht: bool = False, qdq: bool = False,
                   stochastic: bool = False) -> Tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qdq output or None, packed codes [m, n/2], E4M3 scales as uint8 [m_pad, n/16], amax fp32[1]).
    2-D x with n % 16 == 0; scale rows padded to 16 for 16x16 tiles, as TE's reference."""
    from .hadamard import apply_rht

    if rht:
        x = apply_rht(x)
    x = x.contiguous()
    m, n = x.shape
    amax = tensor_amax(x)
    m_pad = -(-m // 16) * 16 if tile[0] == 16 else m
    codes = torch.empty(m, n // 2, dtype=torch.uint8, device=x.device)
    scales = torch.zeros(m_pad, n // 16, dtype=torch.uint8, device=x.device)
    out = torch.empty_like(x) if qdq else None
    _nvfp4_launch(x, amax, tile, out, codes, scales, stochastic, global_scale=True)
    if tile[0] == 16 and m_pad > m:
        scales[m:] = scales[m - m % 16: m - m % 16 + 1] if m % 16 else scales[m:]
    return out, codes, scales, amax


def nvfp4_qdq_2d(x2: torch.Tensor, amax: torch.Tensor, tile=(16, 16), stochastic: bool = False,
                 global_scale: bool = True, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """QDQ of a 2-D x2 (n % 16 == 0) with the tiled kernel (16x16 weight tiles); values without the tensor
    scale amax/2688 when not global_scale (exact in bf16: E2M1 value times E4M3 block scale)."""
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    out = torch.empty(x2.shape, dtype=out_dtype or x2.dtype, device=x2.device)
    _nvfp4_launch(x2, amax, tile, out, None, None, stochastic, global_scale)
    return out


def mxfp4_quantize(x: torch.Tensor, qdq: bool = False, stochastic: bool = False):
    """(qdq output or None, packed codes [m, n/2], E8M0 codes uint8 [m, n/32]); n % 32 == 0."""
    x = x.contiguous()
    m, n = x.shape
    codes = torch.empty(m, n // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(m, n // 32, dtype=torch.uint8, device=x.device)
    out = torch.empty_like(x) if qdq else codes
    blocks = 4 if n % 128 == 0 else 1
    grid = (triton.cdiv(m, 16), triton.cdiv(n, blocks * 32))
    _mxfp4_kernel[grid](x, out, codes, scales, m, n, x.stride(0), _seed(stochastic), TILE_M=16, BLOCKS=blocks,
                        WRITE_QDQ=qdq, WRITE_CODES=True, STOCHASTIC=stochastic)
    return (out if qdq else None), codes, scales
