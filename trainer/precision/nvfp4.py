"""NVFP4: E2M1 elements, one E4M3 scale per 16 elements (1x16, or 16x16 tiles for weights), FP32 tensor scale.

`quantize_ref` reproduces TE's reference quantizer (NVFP4QuantizerRef._quantize_blockwise_reference,
TE 2.20) step for step in fp32, so codes and E4M3 scales match it bit for bit:

    global_encode = min(448*6 / amax, FLT_MAX), 1.0 if that is 0;  global_decode = 1 / global_encode
    block_decode  = e4m3(clamp(min(block_amax * (global_encode * rcp(6)), FLT_MAX), +-448))   (RNE)
    block_encode  = min(1 / (block_decode * global_decode), FLT_MAX)
    code          = e2m1_rne(clamp(x * block_encode, +-6))

The dequantized value TE's GEMM uses is code * block_decode * amax / (6*448) (its alpha epilogue).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import e2m1
from .hadamard import apply_rht

E4M3_MAX = 448.0
FLT_MAX = torch.finfo(torch.float32).max
BLOCK = 16


@dataclass
class NVFP4Tensor:
    """Quantized 2-D tensor in TE's reference layout."""
    data: torch.Tensor          # uint8 [m, n/2], two E2M1 codes per byte (low nibble = even column)
    scale: torch.Tensor         # float8_e4m3fn [m_pad, n_pad/16] (16x16 tiles: each tile's scale on all 16 rows)
    amax: torch.Tensor          # fp32 [1], the per-tensor amax the FP32 scale is derived from
    shape: Tuple[int, int]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        m, n = self.shape
        codes = e2m1.unpack(self.data)[:, :n]
        scale = self.scale.float()[:m].repeat_interleave(BLOCK, dim=1)[:, :n]
        value = e2m1.decode(codes) * scale * global_decode_for_gemm(self.amax)
        return value.to(dtype)


def global_decode_for_gemm(amax: torch.Tensor) -> torch.Tensor:
    """amax / (6*448): the per-operand factor of TE's NVFP4 GEMM alpha."""
    return amax.float() / (e2m1.E2M1_MAX * E4M3_MAX)


def global_scales(amax: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(global_encode, global_decode) from the fp32 tensor amax, exactly as TE's reference computes them."""
    six = torch.tensor(e2m1.E2M1_MAX, dtype=torch.float32, device=amax.device)
    enc = torch.div(torch.tensor(E4M3_MAX, device=amax.device) * six, amax.float())
    enc = torch.min(enc, torch.tensor(FLT_MAX, device=amax.device))
    enc = torch.where(enc == 0.0, torch.ones_like(enc), enc)
    return enc, torch.div(1.0, enc)


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    m, n = x.shape
    pr, pc = (-m) % rows, (-n) % cols
    return F.pad(x, (0, pc, 0, pr)) if pr or pc else x


def block_scales(x: torch.Tensor, amax: torch.Tensor, tile_rows: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 block decode scales [m, n/16], fp32 block encode scales [m, n/16]) for a padded 2-D x."""
    m, n = x.shape
    if tile_rows == BLOCK:
        tiles = x.float().abs().view(m // BLOCK, BLOCK, n // BLOCK, BLOCK).amax(dim=(1, 3))
        vec_max = tiles.repeat_interleave(BLOCK, dim=0)
    else:
        vec_max = x.float().abs().view(m, n // BLOCK, BLOCK).amax(dim=-1)
    enc, dec = global_scales(amax)
    six = torch.tensor(e2m1.E2M1_MAX, dtype=torch.float32, device=x.device)
    multiplier = enc * torch.reciprocal(six)
    decode = torch.min(vec_max * multiplier, torch.tensor(FLT_MAX, device=x.device))
    decode = torch.clamp(decode, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    encode = torch.min(torch.div(1.0, decode.float() * dec), torch.tensor(FLT_MAX, device=x.device))
    return decode, encode


def quantize_ref(x: torch.Tensor, tile: Tuple[int, int] = (1, BLOCK), rht: bool = False,
                 amax: Optional[torch.Tensor] = None, stochastic: bool = False,
                 generator: Optional[torch.Generator] = None) -> NVFP4Tensor:
    """Quantize a 2-D tensor along its last dim (TE rowwise). For TE's columnwise pass use x.t() (rht=True
    for activations/gradients there). `amax` overrides the tensor amax (after RHT when rht)."""
    if x.dim() != 2:
        raise ValueError(f"NVFP4 quantization expects a 2-D tensor, got shape {tuple(x.shape)}")
    if tile not in ((1, BLOCK), (BLOCK, BLOCK)):
        raise ValueError(f"NVFP4 tiles are 1x16 or 16x16, got {tile}")
    if rht:
        x = apply_rht(x)
    if amax is None:
        amax = x.abs().max().float().view(1)
    m, n = x.shape
    xp = _pad(x, tile[0], BLOCK)
    decode, encode = block_scales(xp, amax, tile[0])
    mp, np_ = xp.shape
    scaled = (xp.float().view(mp, np_ // BLOCK, BLOCK) * encode.unsqueeze(-1)).clamp(-e2m1.E2M1_MAX, e2m1.E2M1_MAX)
    scaled = scaled.view(mp, np_)
    codes = e2m1.encode_stochastic(scaled, generator) if stochastic else e2m1.encode(scaled)
    data = e2m1.pack(codes)[:m, : (n + 1) // 2]
    return NVFP4Tensor(data=data.contiguous(), scale=decode, amax=amax, shape=(m, n))


def qdq_ref(x: torch.Tensor, tile: Tuple[int, int] = (1, BLOCK), rht: bool = False,
            stochastic: bool = False) -> torch.Tensor:
    """Quantize-dequantize along the last dim; same shape and dtype (values are in the RHT basis if rht)."""
    shape = x.shape
    q = quantize_ref(x.reshape(-1, shape[-1]), tile=tile, rht=rht, stochastic=stochastic)
    return q.dequantize(x.dtype).view(shape)
