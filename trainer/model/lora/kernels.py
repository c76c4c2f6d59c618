"""Triton kernels for the adapters' rank-r passes (memory-bound at rank 16), each with the torch ops it replaces.

    dh, db = dual_grad(dy, b, h, s)              # dh = s dy B, dB = s dy^T h: dy [tokens, out] read ONCE
    out = masked_product(dh, a, keep, p, out)    # (dh A) * keep, written into `out` or added to it (accumulate=True)
    h = down_product(x, a)                       # x A^T: x [tokens, in] read once, h [tokens, r]
    da = weight_grad(dh, x)                      # dh^T x in fp32: x read once, split over tokens, no atomics

Measured against cuBLAS at the 8B's widths (H100, 2026-12-05, bench/adapter_gemms.py,
bench/results/2026-12-05d_h100_speed): masked_product without a mask, in place, is 21-27 % faster than addmm_
(trainer.lora.triton_products runs it for the fused and epilogue paths' y += s h B^T and dx += dh A; the masked form
runs wherever pre-dropout does); dual_grad took 2.2-2.5x the time of cuBLAS's two products, and down_product and
weight_grad (candidates for fwd_A and bwd_dA) lost too (0.6-0.9x cuBLAS's speed): nothing in training calls those
three (the epilogue takes dh and dB from cuBLAS); they stay for the bench, as the baseline a better kernel must beat.
weight_grad sums its token splits' fp32 partials with torch (a fixed order: deterministic, unlike dual_grad's atomic
dB).

dual_grad: one program per block of token rows streams its rows of dy once, in column blocks: each block feeds both
products (dh's rows accumulate in registers; dB's partial sums go to an fp32 buffer by atomic adds, so dB's summation
order differs from one GPU run to the next at fp32 rounding). The torch path reads dy twice (two GEMMs).

masked_product: the K=r product dh A formed tile by tile in registers, multiplied by the dropout mask (bool with its
1/(1-p), or CPU noise) and written once, or added in place into `out` (one read and one write of out); the torch path
writes dh A, masks it (undrop) and adds it in further passes.

Kernels run where `kernels_usable(device, rank)` (an NVIDIA GPU with Triton, or Triton's CPU interpreter,
TRITON_INTERPRET=1); tests/test_lora_epilogue.py runs them in the interpreter against the torch ops.
"""
from __future__ import annotations

import os

import torch

from primus_contract.rules_precision import LORA_KERNEL_MAX_RANK
from trainer.model.lora.drop import keep_scale, undrop

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None


# The kernels hold a whole rank in one tile (no loop over R): past LORA_KERNEL_MAX_RANK their shared memory outgrows
# a block (131 KB at rank 512 on sm_90, ahead-of-time compiled); larger ranks take the torch ops
MAX_RANK = LORA_KERNEL_MAX_RANK


def triton_runs_on(device: torch.device) -> bool:
    """The project's Triton kernels run on `device`: an NVIDIA GPU with Triton (never run on ROCm), or anywhere in
    Triton's CPU interpreter (TRITON_INTERPRET=1). The one rule for these kernels and trainer/model/ce_kernel.py's."""
    if triton is None:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device.type == "cuda" and torch.version.hip is None


def kernels_usable(device: torch.device, rank: int = 16, dtype: torch.dtype | None = None) -> bool:
    """The Triton kernels run on `device` for LoRA rank `rank` (triton_runs_on); rank at most MAX_RANK. Not for
    float32 on the GPU: tl.dot takes fp32 inputs in TF32 there (~1e-3 relative), where the torch path keeps fp32 (the
    interpreter computes fp32 exactly, so the CPU tests never saw it; audit, 2026-12-05)."""
    if rank > MAX_RANK or not triton_runs_on(device):
        return False
    return os.environ.get("TRITON_INTERPRET") == "1" or dtype != torch.float32


def rank_block(r: int) -> int:
    """The rank padded to what tl.dot takes (a power of two, at least 16)."""
    return max(16, triton.next_power_of_2(r))


if triton is not None:
    @triton.jit
    def _dual_kernel(dy_ptr, b_ptr, h_ptr, dh_ptr, db_ptr, T, N, R, sdy, sb, sh, sdh, scale,
                     BT: tl.constexpr, BN: tl.constexpr, RP: tl.constexpr):
        rt = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)  # row offsets past 2^31 elements
        rk = tl.arange(0, RP)
        mt, mk = rt < T, rk < R
        h = tl.load(h_ptr + rt[:, None] * sh + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
        acc = tl.zeros((BT, RP), dtype=tl.float32)
        for n0 in range(0, N, BN):
            rn = n0 + tl.arange(0, BN)
            mn = rn < N
            dy = tl.load(dy_ptr + rt[:, None] * sdy + rn[None, :], mask=mt[:, None] & mn[None, :], other=0.0)
            b = tl.load(b_ptr + rn[:, None] * sb + rk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
            acc += tl.dot(dy, b)
            part = tl.dot(tl.trans(dy), h) * scale
            tl.atomic_add(db_ptr + rn[:, None] * R + rk[None, :], part, mask=mn[:, None] & mk[None, :])
        out = (acc * scale).to(dh_ptr.dtype.element_ty)
        tl.store(dh_ptr + rt[:, None] * sdh + rk[None, :], out, mask=mt[:, None] & mk[None, :])

    @triton.jit
    def _masked_kernel(dh_ptr, a_ptr, k_ptr, o_ptr, T, K, R, sdh, sa, sk, so, scale,
                       HAS_KEEP: tl.constexpr, ACC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       RP: tl.constexpr):
        rt = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)  # row offsets past 2^31 elements
        rc = tl.program_id(1) * BK + tl.arange(0, BK)
        rk = tl.arange(0, RP)
        mt, mc, mk = rt < T, rc < K, rk < R
        dh = tl.load(dh_ptr + rt[:, None] * sdh + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
        a = tl.load(a_ptr + rk[:, None] * sa + rc[None, :], mask=mk[:, None] & mc[None, :], other=0.0)
        prod = tl.dot(dh, a)
        m = mt[:, None] & mc[None, :]
        if HAS_KEEP:
            keep = tl.load(k_ptr + rt[:, None] * sk + rc[None, :], mask=m, other=0).to(tl.float32)
            prod = prod * keep * scale
        else:
            prod = prod * scale
        if ACC:
            prod += tl.load(o_ptr + rt[:, None] * so + rc[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(o_ptr + rt[:, None] * so + rc[None, :], prod.to(o_ptr.dtype.element_ty), mask=m)


_BT, _BN = 64, 64
_SPLIT_ROWS = 1024  # weight_grad: the token rows one program sums (8192 tokens: 8 splits per column block)

if triton is not None:
    @triton.jit
    def _down_kernel(x_ptr, a_ptr, h_ptr, T, K, R, sx, sa, sh, BT: tl.constexpr, BK: tl.constexpr,
                     RP: tl.constexpr):
        rt = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)  # row offsets past 2^31 elements
        rk = tl.arange(0, RP)
        mt, mk = rt < T, rk < R
        acc = tl.zeros((BT, RP), dtype=tl.float32)
        for k0 in range(0, K, BK):
            rc = k0 + tl.arange(0, BK)
            mc = rc < K
            x = tl.load(x_ptr + rt[:, None] * sx + rc[None, :], mask=mt[:, None] & mc[None, :], other=0.0)
            a = tl.load(a_ptr + rk[:, None] * sa + rc[None, :], mask=mk[:, None] & mc[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(a).to(x.dtype))
        tl.store(h_ptr + rt[:, None] * sh + rk[None, :], acc.to(h_ptr.dtype.element_ty),
                 mask=mt[:, None] & mk[None, :])

    @triton.jit
    def _wgrad_kernel(dh_ptr, x_ptr, p_ptr, T, K, R, sdh, sx, ROWS, BT: tl.constexpr, BK: tl.constexpr,
                      RP: tl.constexpr):
        rc = tl.program_id(0) * BK + tl.arange(0, BK)
        split = tl.program_id(1)
        rk = tl.arange(0, RP)
        mc, mk = rc < K, rk < R
        acc = tl.zeros((RP, BK), dtype=tl.float32)
        for t0 in range(split * ROWS, tl.minimum(split * ROWS + ROWS, T), BT):
            rt = (t0 + tl.arange(0, BT)).to(tl.int64)
            mt = rt < T
            dh = tl.load(dh_ptr + rt[:, None] * sdh + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
            x = tl.load(x_ptr + rt[:, None] * sx + rc[None, :], mask=mt[:, None] & mc[None, :], other=0.0)
            acc += tl.dot(tl.trans(dh), x)
        tl.store(p_ptr + split * R * K + rk[:, None] * K + rc[None, :], acc, mask=mk[:, None] & mc[None, :])


def dual_grad(dy: torch.Tensor, b: torch.Tensor, h: torch.Tensor, scale: float, kernels: bool = False):
    """(dh, dB) = (s dy B, s dy^T h) for 2-D dy [T, N], b [N, R], h [T, R]; dB in fp32 on the kernel path."""
    if not kernels:  # the products in the unfused path's order (addmm's backward): dh = (dy B) s, dB = (dy^T h) s
        dh, db = dy.mm(b), dy.t().mm(h)
        return (dh.mul_(scale), db.mul_(scale)) if scale != 1.0 else (dh, db)
    dy, b, h = dy.contiguous(), b.contiguous(), h.contiguous()
    t, n = dy.shape
    r = b.shape[1]
    dh = torch.empty(t, r, dtype=dy.dtype, device=dy.device)
    db = torch.zeros(n, r, dtype=torch.float32, device=dy.device)
    _dual_kernel[(triton.cdiv(t, _BT),)](dy, b, h, dh, db, t, n, r, dy.stride(0), b.stride(0), h.stride(0),
                                         dh.stride(0), float(scale), BT=_BT, BN=_BN, RP=rank_block(r))
    return dh, db


def masked_product(dh: torch.Tensor, a: torch.Tensor, keep, p: float, out: torch.Tensor = None,
                   accumulate: bool = False, kernels: bool = False, scale: float = 1.0) -> torch.Tensor:
    """scale (dh A) * keep (keep None: no dropout) for dh [T, R], a [R, K]; written into `out` (a new tensor when
    None) or, with accumulate, added to it in place. scale only without keep (the adapter's forward, out += s h B^T:
    addmm's alpha on the torch path)."""
    if keep is not None and scale != 1.0:
        raise ValueError("masked_product: scale is for the product without a dropout mask")
    if not kernels:
        if keep is not None:
            prod = undrop(dh.mm(a), keep, p)
        elif out is not None and accumulate:  # addmm_'s own accumulation (beta 1, alpha s): one rounding
            return out.addmm_(dh, a, alpha=scale)
        else:  # alpha inside the GEMM, as addmm applies it
            prod = dh.mm(a) if scale == 1.0 else torch.addmm(dh.new_empty(dh.shape[0], a.shape[1]), dh, a, beta=0,
                                                              alpha=scale)
        if out is None:
            return prod
        return out.add_(prod) if accumulate else out.copy_(prod)
    t, k = dh.shape[0], a.shape[1]
    if out is None:
        out, accumulate = torch.empty(t, k, dtype=dh.dtype, device=dh.device), False
    dh, a = dh.contiguous(), a.contiguous()
    kp = keep.view(torch.uint8) if keep is not None and keep.dtype == torch.bool else keep
    grid = (triton.cdiv(t, _BT), triton.cdiv(k, _BN))
    _masked_kernel[grid](dh, a, kp if kp is not None else dh, out, t, k, dh.shape[1], dh.stride(0), a.stride(0),
                         kp.stride(0) if kp is not None else 0, out.stride(0),
                         keep_scale(keep, p) if keep is not None else float(scale), HAS_KEEP=keep is not None,
                         ACC=accumulate, BT=_BT, BK=_BN, RP=rank_block(dh.shape[1]))
    return out


def down_product(x: torch.Tensor, a: torch.Tensor, kernels: bool = False) -> torch.Tensor:
    """h = x A^T for x [T, K], a [R, K] (A may be fp32: cast to x's dtype, as the autocast path does)."""
    if not kernels:
        return x.mm(a.to(x.dtype).t())
    x, a = x.contiguous(), a.contiguous()
    t, k = x.shape
    h = torch.empty(t, a.shape[0], dtype=x.dtype, device=x.device)
    _down_kernel[(triton.cdiv(t, _BT),)](x, a, h, t, k, a.shape[0], x.stride(0), a.stride(0), h.stride(0),
                                         BT=_BT, BK=_BN, RP=rank_block(a.shape[0]))
    return h


def weight_grad(dh: torch.Tensor, x: torch.Tensor, kernels: bool = False) -> torch.Tensor:
    """dA = dh^T x in fp32 for dh [T, R], x [T, K]: per column block, token splits of _SPLIT_ROWS rows each write an
    fp32 partial; torch sums the partials (a fixed order)."""
    if not kernels:
        return dh.t().mm(x).float()
    dh, x = dh.contiguous(), x.contiguous()
    t, k = x.shape
    r = dh.shape[1]
    splits = triton.cdiv(t, _SPLIT_ROWS)
    parts = torch.empty(splits, r, k, dtype=torch.float32, device=x.device)
    _wgrad_kernel[(triton.cdiv(k, _BN), splits)](dh, x, parts, t, k, r, dh.stride(0), x.stride(0), _SPLIT_ROWS,
                                                 BT=_BT, BK=_BN, RP=rank_block(r))
    return parts.sum(0)
