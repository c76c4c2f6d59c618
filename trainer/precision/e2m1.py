"""FP4 E2M1 element format shared by NVFP4 and MXFP4.

Codes 0..7 are +{0, 0.5, 1, 1.5, 2, 3, 4, 6}, 8..15 the same negated. Rounding is to nearest with ties to
the even code (TE's reference thresholds: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4),
magnitudes above 6 saturate to 6, -0.0 encodes as +0 and NaN encodes as +0 (the block scale carries NaN).
"""
from __future__ import annotations

from typing import Optional

import torch

E2M1_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# (threshold, inclusive): magnitude code = number of thresholds passed
_UP = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_table(dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    vals = list(E2M1_GRID) + [-v for v in E2M1_GRID]
    return torch.tensor(vals, dtype=dtype, device=device)


def encode(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 values (already scaled into the E2M1 range) to E2M1 codes (uint8, one per element)."""
    a = v.abs()
    mag = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for threshold, inclusive in _UP:
        mag += (a >= threshold if inclusive else a > threshold).to(torch.uint8)
    return mag | ((v < 0).to(torch.uint8) << 3)


def encode_stochastic(v: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Stochastic rounding to E2M1: round up in magnitude with probability (|v|-lo)/(hi-lo); saturate at 6."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=v.device)
    a = v.abs().float().clamp(max=E2M1_MAX)
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    lo_idx = (torch.bucketize(a, grid, right=True) - 1).clamp(0, 7)
    hi_idx = (lo_idx + 1).clamp(max=7)
    lo, hi = grid[lo_idx], grid[hi_idx]
    frac = torch.where(hi > lo, (a - lo) / (hi - lo), torch.zeros_like(a))
    u = torch.rand(a.shape, generator=generator, device=v.device, dtype=torch.float32)
    mag = torch.where(u < frac, hi_idx, lo_idx).to(torch.uint8)
    return mag | ((v < 0).to(torch.uint8) << 3)


def decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return e2m1_table(dtype, codes.device)[codes.long()]


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., n] codes -> [..., n/2] bytes; element 2i in the low nibble (TE's cast_to_fp4x2 layout)."""
    return codes[..., ::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)
