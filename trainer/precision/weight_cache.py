"""Quantize a frozen weight once: cache derived tensors (FP4 QDQ / payloads) per weight object and version.

LoRA freezes the base weights, so their FP4 quantization is the same every step; recomputing it is pure
overhead. `cached(weight, key, compute)` returns compute()'s result from the previous call with the same
weight object, key and weight state, where the state is (weight._version, data_ptr, shape, stride, dtype):
an in-place update through autograd-visible ops (optimizer steps, copy_, load_state_dict) or a new storage
invalidates it. Writes through `weight.data` bypass `_version`; nothing in the trainer does that after the
first forward (megatron's TE workspace cache, `is_first_microbatch`, makes the same assumption).
Weights that require grad are never cached. PRIMUS_FP4_WEIGHT_CACHE=0 turns caching off.
Entries live as long as the weight (weak keys); the cost is one payload-sized tensor per cached key.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Hashable

import torch
from torch.utils.weak import WeakIdKeyDictionary

_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


def enabled() -> bool:
    return os.environ.get("PRIMUS_FP4_WEIGHT_CACHE", "1") != "0"


def _state(weight: torch.Tensor) -> tuple:
    return (weight._version, weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()), weight.dtype)


def cached(weight: torch.Tensor, key: Hashable, compute: Callable[[], Any]) -> Any:
    if weight.requires_grad or not enabled():
        return compute()
    slots = _CACHE.get(weight)
    if slots is None:
        slots = _CACHE[weight] = {}
    state = _state(weight)
    hit = slots.get(key)
    if hit is not None and hit[0] == state:
        return hit[1]
    value = compute()
    slots[key] = (state, value)
    return value


def clear() -> None:
    _CACHE.clear()


def size() -> int:
    """Number of cached entries (all weights, all keys)."""
    return sum(len(slots) for slots in _CACHE.values())
