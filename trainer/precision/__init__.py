"""Precision for the trainer: BF16 / FP8 / FP4 (NVFP4, MXFP4) gating, megatron kwargs and FP4 emulation.

    p = resolve(cfg)                 once at start: one probe of the machine, one Mode (PrecisionError if it
                                     cannot run the recipe's precision); passed down to what follows
    transformer_config_kwargs(p)     kwargs for megatron-core TransformerConfig
    apply_emulation(model, p)        wrap megatron local linears with FP4 quantize-dequantize (no-TE path)
    describe(p, model)               the `precision | ...` log line (docs/contract.md section 3)
    te_environment(cfg)              NVTE_* variables native NVFP4 needs before TE is imported
    follow_data(p, cfg, one_doc)     FP8 attention null on packed data of one document a row (after the data load)
    fp8_attention_coverage(m, packs) the note of how many train packs FP8 attention can take, where it follows them
"""
from __future__ import annotations

from .capabilities import Environment, probe_environment
from .config_kwargs import te_environment, transformer_config_kwargs
from .emulation import apply_emulation
from .errors import PrecisionError
from .gating import (Mode, Precision, check_capabilities, follow_data, fp8_attention_coverage, resolve,
                     resolve_mode)
from .logline import describe
from .settings import PrecisionSettings

__all__ = ["Environment", "Mode", "Precision", "PrecisionError", "PrecisionSettings", "apply_emulation",
           "check_capabilities", "describe", "follow_data", "fp8_attention_coverage", "probe_environment", "resolve",
           "resolve_mode", "te_environment", "transformer_config_kwargs"]
