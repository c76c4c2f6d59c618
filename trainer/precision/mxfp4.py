"""MXFP4 (OCP Microscaling Formats v1.0): E2M1 elements, one E8M0 power-of-two scale per 32 elements.

Per block (OCP MX v1.0 section 6.3):
    shared_exp = floor(log2(max|v|)) - emax_elem        (emax_elem = 2 for E2M1)
    X          = 2^shared_exp, clamped below to 2^-127 (E8M0's smallest; all-zero blocks get it);
                 a block whose max is Inf or NaN gets the NaN scale (0xFF), so it decodes to NaN
    P_i        = e2m1_rne(v_i / X), magnitudes above 6 saturate to 6
E8M0 code = shared_exp + 127. floor(log2) comes from the fp32 exponent bits, exact for subnormals too.
This is NOT NVFP4: no per-tensor scale, power-of-two block scales, blocks of 32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import e2m1

BLOCK = 32
EMAX_ELEM = 2
E8M0_BIAS = 127
E8M0_NAN = 255


@dataclass
class MXFP4Tensor:
    data: torch.Tensor      # uint8 [m, n/2] E2M1 codes, low nibble = even column
    scale: torch.Tensor     # uint8 [m, n_pad/32] E8M0 codes
    shape: Tuple[int, int]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        m, n = self.shape
        codes = e2m1.unpack(self.data)[:, :n]
        return (e2m1.decode(codes) * e8m0_to_float(self.scale).repeat_interleave(BLOCK, dim=1)[:, :n]).to(dtype)


def e8m0_to_float(code: torch.Tensor) -> torch.Tensor:
    value = torch.ldexp(torch.ones_like(code, dtype=torch.float32), code.to(torch.int32) - E8M0_BIAS)
    return torch.where(code == E8M0_NAN, torch.full_like(value, float("nan")), value)


def shared_exponent(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 codes (uint8) for fp32 block maxima."""
    bits = amax.float().contiguous().view(torch.int32)
    biased = (bits >> 23) & 0xFF                       # 0 for zero/subnormal -> clamps to the minimum
    exp = torch.clamp(biased - 127 - EMAX_ELEM, min=-E8M0_BIAS)
    code = (exp + E8M0_BIAS).to(torch.int32)
    return torch.where(biased == 0xFF, torch.full_like(code, E8M0_NAN), code).to(torch.uint8)


def quantize_ref(x: torch.Tensor, stochastic: bool = False,
                 generator: Optional[torch.Generator] = None) -> MXFP4Tensor:
    """Quantize a 2-D tensor in 1x32 blocks along its last dim (zero-padded to a multiple of 32)."""
    if x.dim() != 2:
        raise ValueError(f"MXFP4 quantization expects a 2-D tensor, got shape {tuple(x.shape)}")
    m, n = x.shape
    pad = (-n) % BLOCK
    xp = (F.pad(x, (0, pad)) if pad else x).float().view(m, -1, BLOCK)
    scale = shared_exponent(xp.abs().amax(dim=-1))
    exp = scale.to(torch.int32) - E8M0_BIAS
    scaled = torch.ldexp(xp, -exp.unsqueeze(-1)).clamp(-e2m1.E2M1_MAX, e2m1.E2M1_MAX).view(m, -1)
    codes = e2m1.encode_stochastic(scaled, generator) if stochastic else e2m1.encode(scaled)
    return MXFP4Tensor(data=e2m1.pack(codes)[:, : (n + 1) // 2].contiguous(), scale=scale, shape=(m, n))


def qdq_ref(x: torch.Tensor, stochastic: bool = False) -> torch.Tensor:
    shape = x.shape
    return quantize_ref(x.reshape(-1, shape[-1]), stochastic=stochastic).dequantize(x.dtype).view(shape)
