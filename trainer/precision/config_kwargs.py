"""Map trainer.precision onto megatron-core TransformerConfig kwargs.

Only keys the installed megatron-core dataclass has are returned (0.16.1 on CPU CI, 0.19.2 on the
GPU); a key the chosen mode *needs* but megatron lacks is a PrecisionError, never a silent drop.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .errors import PrecisionError
from .gating import Mode, Precision
from .settings import PrecisionSettings

FACTORY_MODULE = "trainer.precision.te_factory"


def factory_path(s: PrecisionSettings) -> str:
    """Import path of the TE CustomRecipe quantizer factory for an emulated FP4 run."""
    if s.fp4_recipe == "mxfp4":
        name = "mxfp4" + ("_sr" if s.fp4_stochastic_rounding else "") + "_factory"
    else:
        name = "nvfp4" + ("_rht" if s.fp4_random_hadamard else "") + ("_sr" if s.fp4_stochastic_rounding else "") \
            + "_factory"
    return f"{FACTORY_MODULE}.{name}"


def _fields(cls: Any) -> set:
    return {f.name for f in dataclasses.fields(cls)}


def _transformer_config_fields() -> set:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return _fields(TransformerConfig)


def build_kwargs(s: PrecisionSettings, mode: Mode) -> tuple[dict, set]:
    """(kwargs, required keys) before filtering against the installed megatron-core."""
    import torch

    kw: dict = {"bf16": bool(s.bf16), "params_dtype": torch.bfloat16 if s.bf16 else torch.float32}
    required = {"bf16", "params_dtype"}
    if mode.kind == "fp8":
        kw.update(fp8=s.fp8, fp8_recipe=s.fp8_recipe, fp8_param=s.fp8_param,
                  fp8_dot_product_attention=s.fp8_dot_product_attention)  # (the same field in 0.16.1 and 0.19.2)
        required |= {"fp8", "fp8_recipe"} | ({"fp8_param"} if s.fp8_param else set()) \
            | ({"fp8_dot_product_attention"} if s.fp8_dot_product_attention else set())
    elif mode.kind == "fp4-native":
        if s.fp4_recipe == "nvfp4":
            kw.update(fp4=s.fp4, fp4_recipe="nvfp4", fp4_param=s.fp4_param)
        else:  # ROCm MXFP4BlockScaling is a CustomRecipe: route through megatron's custom hook
            kw.update(fp4=s.fp4, fp4_recipe="custom", fp4_param=s.fp4_param,
                      fp4_quantizer_factory=f"{FACTORY_MODULE}.rocm_mxfp4_factory")
            required |= {"fp4_quantizer_factory"}
        required |= {"fp4", "fp4_recipe"}
    elif mode.kind == "fp4-te-emulated":
        kw.update(fp4=s.fp4, fp4_recipe="custom", fp4_quantizer_factory=factory_path(s))
        required |= {"fp4", "fp4_recipe", "fp4_quantizer_factory"}
    # fp4-local-emulated: megatron sees plain bf16/fp32; apply_emulation() wraps the linears.
    if (s.fp8 or s.fp4) and s.first_last_layers_bf16:
        kw.update(first_last_layers_bf16=True, num_layers_at_start_in_bf16=s.num_layers_at_start_in_bf16,
                  num_layers_at_end_in_bf16=s.num_layers_at_end_in_bf16)
        required |= {"first_last_layers_bf16"}
    return kw, required


def _filter(kw: dict, required: set, available: set, what: str) -> dict:
    missing = sorted(k for k in required if k not in available)
    if missing:
        try:
            import megatron.core as mc

            version = getattr(mc, "__version__", "?")
        except Exception:  # noqa: BLE001
            version = "?"
        raise PrecisionError(f"trainer.precision needs megatron-core {what} field(s) {', '.join(missing)}, "
                             f"which megatron-core {version} lacks; upgrade megatron-core")
    return {k: v for k, v in kw.items() if k in available}


def transformer_config_kwargs(p: Precision) -> dict:
    """kwargs for megatron.core TransformerConfig (bf16/params_dtype, fp8*, fp4*, first/last bf16)."""
    kw, required = build_kwargs(p.settings, p.mode)
    return _filter(kw, required, _transformer_config_fields(), "TransformerConfig")


def te_environment(cfg: Any) -> dict:
    """NVTE_* variables that make TE's NVFP4BlockScaling match the recipe's RHT / stochastic-rounding flags.

    TE reads them when transformer_engine.common.recipe is first imported, so the launcher exports them
    (or the trainer sets os.environ before importing megatron/TE). Empty unless native NVFP4.
    """
    s = PrecisionSettings.from_cfg(cfg)
    if not (s.fp4 and s.fp4_recipe == "nvfp4" and not s.fp4_emulation):
        return {}
    return {"NVTE_NVFP4_DISABLE_RHT": "0" if s.fp4_random_hadamard else "1",
            "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "0" if s.fp4_stochastic_rounding else "1"}
