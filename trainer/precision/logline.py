"""The `precision | fp4 ... | fp8 ... | recipe ... | tensor_class ...` log line (docs/contract.md section 3).

verify-fp4 reads it back: the first four fields are fixed; extra `key value` fields follow
(mode, format, emulated_linears, weight_dtype).
"""
from __future__ import annotations

from typing import Any, Optional

from .gating import FP4_RECIPE_CLASS, FP8_RECIPE_CLASS, Mode, Precision
from .settings import FP8_ATTENTION_ATTR, PrecisionSettings


def _storage_dtype(param: Any) -> str:
    """The weight's storage type: TE quantized tensors report their nominal (bf16) dtype, so name
    the stored format from the class instead (Float8Tensor -> fp8, NVFP4Tensor / Float4 -> fp4)."""
    cls = type(param.data).__name__
    if "Float8" in cls or "FP8" in cls:
        return "fp8"
    if "FP4" in cls or "Float4" in cls:
        return "fp4"
    return str(param.dtype).replace("torch.", "")


def _weight_class(model: Any) -> Optional[tuple[str, str]]:
    """(class name, storage dtype) of the first transformer-layer linear weight."""
    if model is None:
        return None
    chunks = model if isinstance(model, (list, tuple)) else [model]
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if ".layers." in f".{name}" and name.endswith("weight") and param.dim() == 2 and "lora" not in name:
                return type(param.data).__name__, _storage_dtype(param)
    return None


def recipe_name(s: PrecisionSettings, mode: Mode) -> str:
    if mode.kind == "fp8":
        return FP8_RECIPE_CLASS[s.fp8_recipe]
    if mode.kind == "fp4-native":
        return FP4_RECIPE_CLASS[s.fp4_recipe]
    if mode.emulated:
        return f"{s.fp4_recipe.upper()}-emulated"
    return "none"


def tensor_class(s: PrecisionSettings, mode: Mode, weight: Optional[tuple[str, str]]) -> str:
    if mode.kind == "fp4-local-emulated":
        return f"{s.fp4_recipe.upper()}EmulatedQDQ"
    if mode.kind == "fp4-te-emulated":
        return "PrimusNVFP4TensorRef" if s.fp4_recipe == "nvfp4" else "PrimusMXFP4TensorRef"
    if mode.kind == "fp4-native":
        if weight and ("FP4" in weight[0] or "Float4" in weight[0]):
            return weight[0]
        return "NVFP4Tensor" if s.fp4_recipe == "nvfp4" else "MXFP4Tensor"
    if mode.kind == "fp8" and weight and "Float8" in weight[0]:
        return weight[0]
    if mode.kind == "fp8":
        return "Float8Tensor"
    return "torch.Tensor"


def describe(p: Precision, model: Any = None) -> str:
    """The line for the run's resolved precision (and the built model's weights, when given)."""
    s, mode = p.settings, p.mode
    weight = _weight_class(model)
    fields = [
        "precision",
        f"fp4 {s.fp4 if s.fp4 else None}",
        f"fp8 {s.fp8 if s.fp8 else None}",
        f"recipe {recipe_name(s, mode)}",
        f"tensor_class {tensor_class(s, mode, weight)}",
        f"mode {mode.kind}",
    ]
    if mode.kind == "fp8":  # TE's FP8 attention (precision.fp8_dot_product_attention: true, or null where it runs)
        per_batch = model is not None and getattr(model, FP8_ATTENTION_ATTR, False)
        fields.append("attention " + ("fp8 (one-document micro-batches)" if per_batch
                                      else "fp8" if s.fp8_dot_product_attention else "bf16"))
    if mode.fp4_format:
        tiles = "act/grad 1x16, weight 16x16" if s.fp4_recipe == "nvfp4" else "1x32"
        extras = [x for x, on in (("rht", s.fp4_random_hadamard), ("sr", s.fp4_stochastic_rounding)) if on]
        fields.append(f"format {s.fp4_recipe} {tiles}" + (f" +{'+'.join(extras)}" if extras else ""))
    if mode.kind == "fp4-local-emulated" and model is not None:
        from .emulation import emulated_layer_count

        fields.append(f"emulated_linears {emulated_layer_count(model)}")
    if weight:
        fields.append(f"weight_dtype {weight[1]}")
    return " | ".join(fields)
