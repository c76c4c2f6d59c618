"""Quantize a frozen weight once: cache derived tensors (FP4 QDQ / payloads) per weight object and version.

LoRA freezes the base weights, so their FP4 quantization is the same every step; recomputing it is pure
overhead. `cached(weight, key, compute)` returns compute()'s result from the previous call with the same
weight object, key and weight state, where the state is (weight._version, data_ptr, shape, stride, dtype):
an in-place update through autograd-visible ops (optimizer steps, copy_, load_state_dict) or a new storage
invalidates it. Writes through `weight.data` bypass `_version`; nothing in the trainer does that after the
first forward (megatron's TE workspace cache, `is_first_microbatch`, makes the same assumption).
Weights that require grad are never cached. The recipe's trainer.precision.fp8_weight_cache: false turns caching off
(configure(), at the model's build: TE's own copies follow the same key), as does PRIMUS_FP4_WEIGHT_CACHE=0.
Entries live as long as the weight (weak keys); the cost is one payload-sized tensor per cached key.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Hashable

import torch
from torch.utils.weak import WeakIdKeyDictionary

_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


_RECIPE = {"enabled": True}


def configure(enabled_by_recipe: bool) -> None:
    """trainer.precision.fp8_weight_cache for this process (trainer/model/build.py sets it at the build)."""
    _RECIPE["enabled"] = bool(enabled_by_recipe)


def enabled() -> bool:
    return _RECIPE["enabled"] and os.environ.get("PRIMUS_FP4_WEIGHT_CACHE", "1") != "0"


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


# Transformer Engine's own copies of the frozen weights (fp8_weight_cache: megatron passes is_first_microbatch, and
# TE quantizes a weight only when it is True, keeping the copy otherwise). Megatron's modules start with it True and
# set it False after their first forward; only megatron's pipeline schedule sets it True again (every step). Without
# a refresh the copy made by a process's first forward is kept for the whole run: with delayed scaling that forward
# quantizes with the initial scale (1.0, no amax seen yet), not the weight's own, so an uninterrupted run trained on
# those copies while a resumed one (scales restored from the checkpoint) quantized with the real scale: FP8 resume was
# not bit-exact on the H200 (2026-12-05, max |dloss| 0.0089 from the first resumed iteration). A frozen weight's amax
# never changes, so its scale is final after the first update: refreshing at the first two steps of every process
# gives every run, fresh or resumed, the same copies from its second step on, at the cost of one extra quantization.
REFRESH_STEPS = 2


def refresh_te_weight_copies(model) -> int:
    """Ask every TE module of the model (megatron's set_is_first_microbatch: a no-op without fp8/fp4) to quantize
    its weights again at its next forward; returns how many model chunks were asked."""
    chunks = model if isinstance(model, (list, tuple)) else [model]
    asked = 0
    for chunk in chunks:
        target = getattr(chunk, "module", chunk)  # a DDP-style wrapper
        if hasattr(target, "set_is_first_microbatch"):
            target.set_is_first_microbatch()
            asked += 1
    return asked
