"""Read trainer.precision (and the few neighbours gating needs) out of a config object.

Accepts the whole resolved recipe (`cfg.trainer.precision`), the `trainer` section, the precision
block itself, or plain dicts of any of those. No torch import here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from primus_contract.errors import ContractError
from primus_contract.fields import SCHEMA
from primus_contract.rules_precision import fp8_attention_fits
from primus_contract.schema import coerce_value

from .errors import PrecisionError

FIELD = "trainer.precision"
_DEFAULTS = SCHEMA["trainer"]["precision"]
_DEFAULTS_DIST = SCHEMA["trainer"]["distributed"]


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
# set on a model whose FP8 attention follows each micro-batch's layout (trainer.model.inputs, read by the log line)
FP8_ATTENTION_ATTR = "primus_fp8_attention_per_batch"
_NOT_PRECISION = ("num_layers", "device", "pipeline", "fp8_attention_auto")  # read from elsewhere, or derived


def fp8_attention_fits_trainer(trainer: Any, prec: Any, one_document_rows: bool = False) -> bool:
    """primus_contract's fp8_attention_fits on the trainer section (False where only the precision block was given:
    nothing tells the layout and the heads)."""
    sections = {k: _get(trainer, k) for k in ("data", "parallelism", "model")}
    if any(v is None for v in sections.values()) or prec is trainer:
        return False
    try:
        return fp8_attention_fits({**sections, "precision": prec}, one_document_rows)
    except (KeyError, TypeError):  # a partial section (a test's, a tool's): nothing tells, so off
        return False


@dataclass(frozen=True)
class PrecisionSettings:
    # defaults: primus_contract.fields (the one definition)
    bf16: bool = _DEFAULTS["bf16"].default
    fp8: Optional[str] = _DEFAULTS["fp8"].default
    fp8_recipe: str = _DEFAULTS["fp8_recipe"].default
    fp4: Optional[str] = _DEFAULTS["fp4"].default
    fp4_recipe: str = _DEFAULTS["fp4_recipe"].default
    fp4_param: bool = _DEFAULTS["fp4_param"].default
    fp8_param: bool = _DEFAULTS["fp8_param"].default
    fp8_swiglu_input: bool = _DEFAULTS["fp8_swiglu_input"].default
    fp8_swiglu_kernels: bool = _DEFAULTS["fp8_swiglu_kernels"].default
    # (the contract's default is null: from_cfg resolves it from the recipe; built directly, off)
    fp8_dot_product_attention: bool = False
    fp4_param_gather: bool = _DEFAULTS["fp4_param_gather"].default
    fp4_emulation: bool = _DEFAULTS["fp4_emulation"].default
    fp4_stochastic_rounding: bool = _DEFAULTS["fp4_stochastic_rounding"].default
    fp4_random_hadamard: bool = _DEFAULTS["fp4_random_hadamard"].default
    first_last_layers_bf16: bool = _DEFAULTS["first_last_layers_bf16"].default
    num_layers_at_start_in_bf16: int = _DEFAULTS["num_layers_at_start_in_bf16"].default
    num_layers_at_end_in_bf16: int = _DEFAULTS["num_layers_at_end_in_bf16"].default
    num_layers: Optional[int] = None
    device: str = _DEFAULTS_DIST["device"].default
    pipeline: int = 1
    fp8_attention_auto: bool = False  # fp8_dot_product_attention was null: the node may still turn it off (gating)

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
            if name in _NOT_PRECISION:
                continue
            if _has(prec, name):
                values[name] = _get(prec, name)
        model = _get(trainer, "model")
        values["num_layers"] = _get(model, "num_layers")
        values["device"] = _get(_get(trainer, "distributed"), "device", "auto") or "auto"
        values["pipeline"] = _get(_get(trainer, "parallelism"), "pipeline", 1) or 1
        if values.get("fp8_dot_product_attention") is None:  # null (auto): the recipe's side here, the node's in gating
            values["fp8_dot_product_attention"] = fp8_attention_fits_trainer(trainer, prec)
            values["fp8_attention_auto"] = True
        settings = cls(**values)
        settings.validate_types()
        return settings

    def validate_types(self) -> None:
        """Each value against its field in the contract (type, allowed values, range)."""
        for name in self.__dataclass_fields__:
            if name in ("num_layers", "pipeline", "fp8_attention_auto"):
                continue
            where = "trainer.distributed.device" if name == "device" else f"{FIELD}.{name}"
            try:
                coerce_value(where, getattr(self, name))
            except ContractError as err:
                raise PrecisionError(str(err)) from None

    @property
    def fp4_format(self) -> Optional[str]:
        """'nvfp4' or 'mxfp4' when FP4 is on, else None."""
        return self.fp4_recipe if self.fp4 else None
