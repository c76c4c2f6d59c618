"""Precision for the trainer: BF16 / FP8 / FP4 (NVFP4, MXFP4) gating, megatron kwargs and FP4 emulation.

Public API (names are imported lazily so that `trainer.precision.settings` and `.gating` stay
importable without torch):

    check_capabilities(cfg)          raise PrecisionError unless this machine can run the recipe's precision
    transformer_config_kwargs(cfg)   kwargs for megatron-core TransformerConfig
    apply_emulation(model, cfg)      wrap megatron local linears with FP4 quantize-dequantize (no-TE path)
    describe(cfg, model)             the `precision | ...` log line (docs/contract.md section 3)
    te_environment(cfg)              NVTE_* variables native NVFP4 needs before TE is imported
"""
from __future__ import annotations

import importlib

from .errors import PrecisionError

_LAZY = {
    "check_capabilities": "gating",
    "resolve_mode": "gating",
    "probe_environment": "capabilities",
    "Environment": "capabilities",
    "transformer_config_kwargs": "config_kwargs",
    "te_environment": "config_kwargs",
    "apply_emulation": "emulation",
    "describe": "logline",
    "PrecisionSettings": "settings",
}

__all__ = ["PrecisionError", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
