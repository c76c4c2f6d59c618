"""Read trainer.precision (and the few neighbours gating needs) out of a config object.

Accepts the whole resolved recipe (`cfg.trainer.precision`), the `trainer` section, the precision
block itself, or plain dicts of any of those. No torch import here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .errors import PrecisionError

FIELD = "trainer.precision"


def _get(node: Any, key: str, default: Any = None) -> Any:
    if node is None:
        return default
    if isinstance(node, dict) or hasattr(node, "keys"):
        try:
            return node[key] if key in node else default
        except (KeyError, TypeError):
            return default
    return getattr(node, key, default)


def _has(node: Any, key: str) -> bool:
    return _get(node, key, _MISSING) is not _MISSING


_MISSING = object()


@dataclass(frozen=True)
class PrecisionSettings:
    bf16: bool = True
    fp8: Optional[str] = None
    fp8_recipe: str = "delayed"
    fp4: Optional[str] = None
    fp4_recipe: str = "nvfp4"
    fp4_param: bool = False
    fp8_param: bool = False
    fp8_dot_product_attention: bool = False
    fp4_param_gather: bool = False
    fp4_emulation: bool = False
    fp4_stochastic_rounding: bool = False
    fp4_random_hadamard: bool = False
    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: int = 1
    num_layers_at_end_in_bf16: int = 1
    num_layers: Optional[int] = None
    device: str = "auto"
    pipeline: int = 1

    @classmethod
    def from_cfg(cls, cfg: Any) -> "PrecisionSettings":
        if isinstance(cfg, PrecisionSettings):
            return cfg
        trainer = _get(cfg, "trainer") if _has(cfg, "trainer") else cfg
        prec = _get(trainer, "precision") if _has(trainer, "precision") else trainer
        if prec is None:
            raise PrecisionError(f"{FIELD} is missing from the resolved recipe")
        values = {}
        for name in cls.__dataclass_fields__:
            if name in ("num_layers", "device", "pipeline"):
                continue
            if _has(prec, name):
                values[name] = _get(prec, name)
        model = _get(trainer, "model")
        values["num_layers"] = _get(model, "num_layers")
        values["device"] = _get(_get(trainer, "distributed"), "device", "auto") or "auto"
        values["pipeline"] = _get(_get(trainer, "parallelism"), "pipeline", 1) or 1
        settings = cls(**values)
        settings.validate_types()
        return settings

    def validate_types(self) -> None:
        choices = {
            "fp8": (None, "hybrid", "e4m3"),
            "fp8_recipe": ("delayed", "tensorwise", "blockwise"),
            "fp4": (None, "e2m1"),
            "fp4_recipe": ("nvfp4", "mxfp4"),
            "device": ("auto", "cpu", "cuda"),
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                shown = "|".join("null" if a is None else a for a in allowed)
                where = "trainer.distributed.device" if name == "device" else f"{FIELD}.{name}"
                raise PrecisionError(f"{where}: {value!r} is not one of {shown}")
        for name in ("bf16", "fp4_param", "fp8_param", "fp8_dot_product_attention", "fp4_param_gather",
                     "fp4_emulation", "fp4_stochastic_rounding", "fp4_random_hadamard", "first_last_layers_bf16"):
            if not isinstance(getattr(self, name), bool):
                raise PrecisionError(f"{FIELD}.{name}: expected true or false, got {getattr(self, name)!r}")
        for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise PrecisionError(f"{FIELD}.{name}: expected an integer >= 0, got {value!r}")

    @property
    def fp4_format(self) -> Optional[str]:
        """'nvfp4' or 'mxfp4' when FP4 is on, else None."""
        return self.fp4_recipe if self.fp4 else None
