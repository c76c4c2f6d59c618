"""Decide how the recipe's precision runs here, or refuse with one line saying what would work.

Modes:
    fp32 / bf16            plain megatron-core
    fp8                    TE FP8 (DelayedScaling / Float8CurrentScaling / Float8BlockScaling)
    fp4-native             TE NVFP4BlockScaling (CC >= 10.0) or ROCm TE MXFP4BlockScaling (gfx950)
    fp4-te-emulated        TE present, no FP4 units: megatron fp4_recipe=custom + our quantizer factory
    fp4-local-emulated     no TE: our quantize-dequantize wrapped around megatron local linears
megatron-core silently ignores fp8/fp4 without TE; every path here either runs it or raises. The rules are
primus_contract's (rules_precision: any machine; machine: this one).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from primus_contract.errors import ContractError
from primus_contract.machine import CUSTOM_RECIPE_MIN_TE, fp4_native_error, fp8_attention_runs, fp8_error
from primus_contract.rules_precision import precision_rules

from .capabilities import Environment, probe_environment
from .errors import PrecisionError
from .settings import PrecisionSettings, fp8_attention_fits_trainer

FP8_RECIPE_CLASS = {"delayed": "DelayedScaling", "tensorwise": "Float8CurrentScaling",
                    "blockwise": "Float8BlockScaling"}
FP4_RECIPE_CLASS = {"nvfp4": "NVFP4BlockScaling", "mxfp4": "MXFP4BlockScaling"}


@dataclass(frozen=True)
class Mode:
    kind: str                    # fp32 | bf16 | fp8 | fp4-native | fp4-te-emulated | fp4-local-emulated
    fp4_format: Optional[str]    # nvfp4 | mxfp4 | None

    @property
    def emulated(self) -> bool:
        return self.kind in ("fp4-te-emulated", "fp4-local-emulated")


def config_errors(s: PrecisionSettings) -> Optional[str]:
    """The contract's precision rules (the ones that hold on any machine); the first broken one, or None."""
    try:
        precision_rules(dataclasses.asdict(s), s.num_layers, s.pipeline, "auto")  # (device: the machine rules)
    except ContractError as err:
        return str(err)
    return None


def resolve_mode(s: PrecisionSettings, env: Environment) -> Mode:
    """The mode this recipe runs in on `env`; raises PrecisionError when it cannot."""
    problem = config_errors(s)
    if problem:
        raise PrecisionError(problem)
    if s.fp8:
        problem = fp8_error(s, env)
        if problem:
            raise PrecisionError(problem)
        return Mode("fp8", None)
    if s.fp4:
        if s.fp4_emulation:
            if env.has_te and env.device == "cuda" and env.te_version >= CUSTOM_RECIPE_MIN_TE:
                return Mode("fp4-te-emulated", s.fp4_recipe)
            return Mode("fp4-local-emulated", s.fp4_recipe)
        problem = fp4_native_error(s, env)
        if problem:
            raise PrecisionError(problem)
        return Mode("fp4-native", s.fp4_recipe)
    return Mode("bf16" if s.bf16 else "fp32", None)


@dataclass(frozen=True)
class Precision:
    """The run's precision, resolved once at start and passed down (model build, megatron kwargs, FP4
    emulation, the log line): the recipe's settings, the machine they were checked on, the mode."""
    settings: PrecisionSettings
    env: Environment
    mode: Mode


def resolve(cfg: Any, env: Optional[Environment] = None) -> Precision:
    """Raise PrecisionError (one line) unless this machine can run cfg's precision; `env` None: probe this
    process's machine (the one probe of a run)."""
    settings = PrecisionSettings.from_cfg(cfg)
    if env is None:
        env = probe_environment(settings.device)
    if settings.fp8_attention_auto and settings.fp8_dot_product_attention and not fp8_attention_runs(env):
        # null (auto): off where TE's FP8 attention cannot run (refused only when asked for with true)
        settings = dataclasses.replace(settings, fp8_dot_product_attention=False)
    return Precision(settings, env, resolve_mode(settings, env))


def check_capabilities(cfg: Any, env: Optional[Environment] = None) -> Mode:
    """The Mode of resolve(cfg, env)."""
    return resolve(cfg, env).mode


def follow_data(p: Precision, cfg: Any, one_document_rows: bool) -> Precision:
    """`p` with FP8 attention on where fp8_dot_product_attention is null, the run packs its data, and the loaded train
    split holds one document in every row (`one_document_rows`): the 'auto' layout then runs every micro-batch sbhd,
    as packing false does, which null turns it on for (primus_contract.rules_precision.fp8_attention_fits). The
    recipe alone cannot tell such data, so `validate` and `plan` say off there; the log's precision line and the
    checkpoint's metadata (`fp8_attention`, which post jobs follow: trainer.post.runstate) say what ran."""
    s = p.settings
    if (not s.fp8_attention_auto or s.fp8_dot_product_attention or not one_document_rows or p.mode.kind != "fp8"
            or not fp8_attention_runs(p.env)):
        return p
    trainer = getattr(cfg, "trainer", cfg)
    if not fp8_attention_fits_trainer(trainer, trainer.precision, one_document_rows=True):
        return p
    return dataclasses.replace(p, settings=dataclasses.replace(s, fp8_dot_product_attention=True))


def fp8_attention_coverage(model: Any, packs: Any) -> Optional[str]:
    """A note where FP8 attention follows each micro-batch's layout (the model's FP8_ATTENTION_ATTR: `true` on
    packed data) and the train split says how many of its packs hold one document: a micro-batch runs it only when
    every row does, so none of them means the run is all BF16 attention (None: nothing to say)."""
    from .settings import FP8_ATTENTION_ATTR

    if not getattr(model, FP8_ATTENTION_ATTR, False) or packs is None or not hasattr(packs, "one_document_packs"):
        return None
    one, total = packs.one_document_packs(), len(packs)
    if one == 0:
        return (f"note | fp8 attention | none of the {total} train packs holds one document: every micro-batch "
                "runs BF16 attention (packed THD; precision.fp8_dot_product_attention true runs FP8 only on "
                "one-document rows)")
    return f"fp8 attention | {one} of {total} train packs hold one document (FP8 where a micro-batch's rows all do)"
