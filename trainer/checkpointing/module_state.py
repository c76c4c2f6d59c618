"""Each module's extra state in a checkpoint: Transformer Engine keeps an FP8 module's scaling state (the scales and,
with delayed scaling, the amax history the next scales come from) there, through torch's extra-state protocol
(nn.Module.get_extra_state / set_extra_state). LoRA freezes the base, so those scales are the only base-side state
that changes while training: without them a resumed FP8 run would start its amax history again and step differently
from the uninterrupted one.

    state["extra_state"] = extra_state(model)          # at save, on every rank
    restore_extra_state(model, state["extra_state"])    # at a same-layout resume (another layout starts them anew)

A module whose get_extra_state is torch's own (no extra state) is skipped; on the CPU, where megatron-core builds
no TE modules, the dict is empty.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterable

import torch
from torch import nn


def _modules(model) -> Iterable[tuple[str, nn.Module]]:
    chunks = model if isinstance(model, (list, tuple)) else [model]
    for k, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            if type(module).get_extra_state is not nn.Module.get_extra_state:
                yield (f"{k}.{name}" if len(chunks) > 1 else name), module


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").clone()
    return value


def extra_state(model) -> dict:
    """{module name: its extra state, tensors on the CPU} of every module that has one."""
    out = {}
    for name, module in _modules(model):
        value = module.get_extra_state()
        if value is not None and not (isinstance(value, torch.Tensor) and value.numel() == 0):
            out[name] = _to_cpu(value)
    return out


def restore_extra_state(model, saved: dict | None) -> int:
    """Give each module its saved extra state; returns how many were restored. A saved name this model lacks is an
    error (the layout matched, so the modules must too)."""
    if not saved:
        return 0
    modules = dict(_modules(model))
    unknown = sorted(set(saved) - set(modules))
    if unknown:
        raise KeyError(f"checkpoint holds extra state of {len(unknown)} modules this model lacks, e.g. {unknown[:3]}")
    with _own_pickles():
        for name, value in saved.items():
            modules[name].set_extra_state(value)
    return len(saved)


@contextlib.contextmanager
def _own_pickles():
    """TE (since 2.18) refuses a pickled delayed-scaling state unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1: the
    state restored here is this run's own checkpoint, written by this trainer, so it is allowed while restoring."""
    key = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
