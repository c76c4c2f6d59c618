"""Triton passes for trainer.lora.dropout_recompute's mask bits (trainer/model/lora/drop.py), each with the torch ops
it replaces there:

    packed = pack_bits(keep)                          # keep [rows, n] (bool, or the CPU noise) read once -> uint8
                                                      # [rows, ceil(n / 8)], bit j of byte i = element 8 i + j
    xd, keep = undrop_bits(x, packed, scale, noise_dtype)  # x and the bits read once; the dropped copy and the
                                                           # mask (bool, or the noise in noise_dtype) written once

The torch ops stream the mask several times (pack: a uint8 copy, the shift, the sum; restore: the shift, the and, the
bool copy, then the dropout's backward op): ~15 bytes an element against ~6 here. The dropped copy is computed as the
dropout's own ops compute it, (mask * x) * scale in fp32 and one rounding: native_dropout's forward and its backward
op on a GPU (scale 1 / (1 - p), which drop.recomputable checks is the forward's float), x * noise on CPU (scale the
noise's value): bitwise (tests/test_lora_dropout_recompute.py in Triton's interpreter for fp32, whose bf16 casts
truncate; tests/gpu/test_fp8_epilogue.py for bf16 on a GPU).
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

_BR, _BB, _BN = 16, 64, 256  # rows a program, packed bytes a program (pack), elements a program (undrop)

if triton is not None:
    @triton.jit
    def _pack_kernel(k_ptr, o_ptr, R, N, NB, sk, so, BR: tl.constexpr, BB: tl.constexpr):
        rr = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)  # row offsets past 2^31 elements
        rb = tl.program_id(1) * BB + tl.arange(0, BB)
        j = tl.arange(0, 8)
        col = rb[:, None] * 8 + j[None, :]  # [BB, 8]: the elements of each byte
        m = (rr[:, None, None] < R) & (col[None, :, :] < N)
        k = tl.load(k_ptr + rr[:, None, None] * sk + col[None, :, :], mask=m, other=0)
        byte = tl.sum((k != 0).to(tl.int32) << j[None, None, :], axis=2)
        tl.store(o_ptr + rr[:, None] * so + rb[None, :], byte.to(tl.uint8),
                 mask=(rr[:, None] < R) & (rb[None, :] < NB))

    @triton.jit
    def _undrop_kernel(x_ptr, b_ptr, xd_ptr, k_ptr, R, N, sx, sb, sxd, sk, scale, NOISE: tl.constexpr,
                       BR: tl.constexpr, BN: tl.constexpr):
        rr = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
        rc = tl.program_id(1) * BN + tl.arange(0, BN)
        m = (rr[:, None] < R) & (rc[None, :] < N)
        byte = tl.load(b_ptr + rr[:, None] * sb + (rc // 8)[None, :], mask=m, other=0).to(tl.int32)
        bit = ((byte >> (rc % 8)[None, :]) & 1).to(tl.float32)
        x = tl.load(x_ptr + rr[:, None] * sx + rc[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(xd_ptr + rr[:, None] * sxd + rc[None, :], ((bit * x) * scale).to(xd_ptr.dtype.element_ty), mask=m)
        if NOISE:  # the CPU's keep: 1 / (1 - p) in x's dtype where kept
            tl.store(k_ptr + rr[:, None] * sk + rc[None, :], (bit * scale).to(k_ptr.dtype.element_ty), mask=m)
        else:  # the bool mask, as uint8
            tl.store(k_ptr + rr[:, None] * sk + rc[None, :], bit.to(tl.uint8), mask=m)


def pack_bits(keep: torch.Tensor) -> torch.Tensor:
    """keep [rows, n] (bool or the CPU noise) as uint8 [rows, ceil(n / 8)] in one pass (drop.pack_keep's layout)."""
    keep = keep.contiguous()
    rows, n = keep.shape
    nb = -(-n // 8)
    out = torch.empty(rows, nb, dtype=torch.uint8, device=keep.device)
    src = keep.view(torch.uint8) if keep.dtype == torch.bool else keep
    _pack_kernel[(triton.cdiv(rows, _BR), triton.cdiv(nb, _BB))](src, out, rows, n, nb, src.stride(0), out.stride(0),
                                                                 BR=_BR, BB=_BB)
    return out


def undrop_bits(x: torch.Tensor, packed: torch.Tensor, scale: float,
                noise_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(xd, keep) of x [rows, n] from its packed mask: xd = (mask * x) * scale rounded once to x's dtype; keep the
    bool mask, or with noise_dtype the noise (mask * scale) in that dtype."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, n = x.shape
    xd = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    keep = torch.empty(rows, n, dtype=noise_dtype or torch.bool, device=x.device)
    dst = keep if noise_dtype is not None else keep.view(torch.uint8)
    _undrop_kernel[(triton.cdiv(rows, _BR), triton.cdiv(n, _BN))](
        x, packed, xd, dst, rows, n, x.stride(0), packed.stride(0), xd.stride(0), dst.stride(0), float(scale),
        NOISE=noise_dtype is not None, BR=_BR, BN=_BN)
    return xd, keep
