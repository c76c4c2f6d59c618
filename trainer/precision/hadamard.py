"""Random Hadamard transform (RHT) as TE applies it before NVFP4 quantization of wgrad operands.

T = diag(s) @ H_16 / 4 with Sylvester H and TE's fixed sign vector s; T is orthonormal, so applying it to
both wgrad operands along the reduced dimension leaves dW = dy^T x unchanged except for quantization.
"""
from __future__ import annotations

import functools

import torch

# TE's hard-coded wgrad sign vector (custom_recipes/reference_nvfp4.get_wgrad_sign_vector), public numbers.
SIGNS_16 = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


@functools.lru_cache(maxsize=16)
def _matrix_cpu(size: int, random_signs: bool) -> torch.Tensor:
    if size & (size - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {size}")
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    if random_signs:
        if size != len(SIGNS_16):
            raise ValueError("the fixed random sign vector is defined for size 16")
        h = torch.tensor(SIGNS_16, dtype=torch.float32)[:, None] * h
    return h


def rht_matrix(size: int = 16, dtype=torch.float32, device=None, random_signs: bool = True) -> torch.Tensor:
    """The transform T (entries +-1/sqrt(size)) in `dtype`, on `device`: made once per (device, dtype), not copied
    to the GPU at every call (a blocking host-to-device copy on each emulated-FP4 wgrad)."""
    return _matrix_on(size, dtype, None if device is None else torch.device(device), random_signs)


@functools.lru_cache(maxsize=64)
def _matrix_on(size: int, dtype, device, random_signs: bool) -> torch.Tensor:
    return (_matrix_cpu(size, random_signs) * (1.0 / size ** 0.5)).to(device=device, dtype=dtype)


def apply_rht(x: torch.Tensor, size: int = 16, random_signs: bool = True) -> torch.Tensor:
    """Blockwise x[..., k*size:(k+1)*size] @ T along the last dim, computed in x.dtype like TE's reference."""
    if x.shape[-1] % size:
        raise ValueError(f"last dimension {x.shape[-1]} must be divisible by the Hadamard size {size}")
    t = rht_matrix(size, x.dtype, x.device, random_signs)
    return (x.contiguous().view(-1, size) @ t).view(x.shape)
