"""Quantize-dequantize dispatch: fused Triton kernels on CUDA, the exact pure-torch reference elsewhere."""
from __future__ import annotations

import os
from typing import Tuple

import torch

from . import mxfp4, nvfp4

_FORCE_REF = os.environ.get("PRIMUS_FP4_REFERENCE", "0") == "1"


def _use_triton(x: torch.Tensor) -> bool:
    if _FORCE_REF or not x.is_cuda:
        return False
    from . import fp4_triton

    return fp4_triton.available()


def qdq(x: torch.Tensor, fmt: str, tile: Tuple[int, int] = (1, 16), rht: bool = False,
        stochastic: bool = False) -> torch.Tensor:
    """Quantize-dequantize x along its last dim with `fmt` ('nvfp4' tiles 1x16/16x16, 'mxfp4' 1x32)."""
    if fmt == "nvfp4":
        if _use_triton(x):
            from . import fp4_rows

            return fp4_rows.nvfp4_qdq(x, tile=tile, rht=rht, stochastic=stochastic)
        return nvfp4.qdq_ref(x, tile=tile, rht=rht, stochastic=stochastic)
    if fmt == "mxfp4":
        if rht:
            raise ValueError("the random Hadamard transform is only defined here for NVFP4")
        if _use_triton(x):
            from . import fp4_rows

            return fp4_rows.mxfp4_qdq(x, stochastic=stochastic)
        return mxfp4.qdq_ref(x, stochastic=stochastic)
    raise ValueError(f"unknown FP4 format {fmt!r}")
