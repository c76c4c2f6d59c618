"""Decide how the recipe's precision runs here, or refuse with one line saying what would work.

Modes:
    fp32 / bf16            plain megatron-core
    fp8                    TE FP8 (DelayedScaling / Float8CurrentScaling / Float8BlockScaling)
    fp4-native             TE NVFP4BlockScaling (CC >= 10.0) or ROCm TE MXFP4BlockScaling (gfx950)
    fp4-te-emulated        TE present, no FP4 units: megatron fp4_recipe=custom + our quantizer factory
    fp4-local-emulated     no TE: our quantize-dequantize wrapped around megatron local linears
megatron-core silently ignores fp8/fp4 without TE; every path here either runs it or raises.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .capabilities import Environment, probe_environment
from .errors import PrecisionError
from .settings import FIELD, PrecisionSettings

NVFP4_MIN_TE = (2, 8)
CUSTOM_RECIPE_MIN_TE = (2, 9)
FP8_MIN_CC = (8, 9)
FP8_BLOCKWISE_MIN_CC = (9, 0)
NVFP4_MIN_CC = (10, 0)
# primus_slurm.validate refuses the same (the login side cannot import the trainer). TE's backend selection
# (nvte_get_fused_attn_backend) takes FP8 inputs in bshd/sbhd only; an H200 run failed with "No dot product
# attention backend is available".
FP8_ATTENTION_WHY = ("TE's FP8 fused attention takes bshd/sbhd inputs only, and this trainer always runs the "
                     "packed THD layout (per-document cu_seqlens); remove it")
FP8_MIN_GFX = 942
MXFP4_GFX = 950

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
    """Consistency rules that hold on any machine; returns the first broken one as a line, or None."""
    if s.fp4 and s.fp8:
        return (f"{FIELD}.fp4 ({s.fp4}) and {FIELD}.fp8 ({s.fp8}) cannot both be set: "
                "megatron-core runs one low-precision recipe; set the other to null")
    if not s.fp4:
        for flag in ("fp4_param", "fp4_emulation", "fp4_stochastic_rounding", "fp4_random_hadamard"):
            if getattr(s, flag):
                return f"{FIELD}.{flag}: true needs {FIELD}.fp4: e2m1 (fp4 is null)"
    if s.fp4 and s.fp4_recipe == "mxfp4" and s.fp4_random_hadamard:
        return (f"{FIELD}.fp4_random_hadamard: true is implemented for fp4_recipe: nvfp4 only "
                "(TE's 16-point RHT); set it to false for mxfp4")
    if s.fp8_param and not s.fp8:
        return f"{FIELD}.fp8_param: true needs {FIELD}.fp8: hybrid|e4m3 (fp8 is null)"
    if s.fp8_dot_product_attention:
        return f"{FIELD}.fp8_dot_product_attention: true is not supported: {FP8_ATTENTION_WHY}"
    if s.fp4_param_gather:  # as primus_slurm.validate says: nothing all-gathers parameters here
        return (f"{FIELD}.fp4_param_gather: true has no effect in LoRA training (the frozen base is sharded by "
                "tensor/pipeline parallelism only; no parameters are all-gathered); remove it")
    if s.fp4_param and s.fp4_emulation:
        return (f"{FIELD}.fp4_param: true keeps weights as real FP4 tensors, which emulation has not; "
                "set fp4_param: false to emulate, or run natively on FP4 hardware")
    if s.first_last_layers_bf16:
        if not (s.fp4 or s.fp8):
            return f"{FIELD}.first_last_layers_bf16: true only applies with fp8 or fp4 set"
        if s.fp8 and s.fp8_recipe == "delayed":
            return (f"{FIELD}.first_last_layers_bf16: true is not supported with fp8_recipe: delayed "
                    "(megatron-core refuses it); use fp8_recipe: tensorwise or blockwise")
        if s.num_layers is not None:
            per_stage = s.num_layers // max(1, s.pipeline)
            for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
                if getattr(s, name) > per_stage:
                    return (f"{FIELD}.{name}: {getattr(s, name)} exceeds the {per_stage} layers "
                            "per pipeline stage")
            if s.num_layers_at_start_in_bf16 + s.num_layers_at_end_in_bf16 >= s.num_layers:
                return (f"{FIELD}.num_layers_at_start_in_bf16 + num_layers_at_end_in_bf16 "
                        f"({s.num_layers_at_start_in_bf16}+{s.num_layers_at_end_in_bf16}) leaves none of the "
                        f"{s.num_layers} layers in low precision")
    return None


def _cc(env: Environment) -> str:
    return f"{env.cuda_cc[0]}.{env.cuda_cc[1]}" if env.cuda_cc else "?"


def _fp8_error(s: PrecisionSettings, env: Environment) -> Optional[str]:
    alt = "use bf16 instead, or fp4: e2m1 with fp4_emulation: true for FP4 accuracy studies"
    if env.device == "cpu":
        return f"{FIELD}.fp8: {s.fp8} needs a GPU with FP8 units and Transformer Engine; this is a CPU; {alt}"
    if not env.has_te:
        return (f"{FIELD}.fp8: {s.fp8} needs Transformer Engine (megatron-core would silently run bf16 "
                f"without it); found {env.summary()}; install TE or {alt}")
    if env.is_rocm:
        gfx = env.gfx_number()
        if gfx is None or gfx < FP8_MIN_GFX:
            return f"{FIELD}.fp8: {s.fp8} needs gfx942 or newer (MI300X/MI325X/MI355X); found {env.summary()}; {alt}"
        return None
    if env.cuda_cc is None or env.cuda_cc < FP8_MIN_CC:
        return (f"{FIELD}.fp8: {s.fp8} needs compute capability >= 8.9 (Ada/Hopper/Blackwell); "
                f"found {env.summary()}; {alt}")
    if s.fp8_recipe == "blockwise" and env.cuda_cc < FP8_BLOCKWISE_MIN_CC:
        return (f"{FIELD}.fp8_recipe: blockwise (Float8BlockScaling) needs compute capability >= 9.0; "
                f"found {_cc(env)}; use fp8_recipe: delayed or tensorwise")
    return None


def _fp4_native_error(s: PrecisionSettings, env: Environment) -> Optional[str]:
    emulate = f"set {FIELD}.fp4_emulation: true to emulate {s.fp4_recipe.upper()} numerics here"
    fp8_alt = ", or use fp8: hybrid" if env.device == "cuda" and _fp8_error(
        PrecisionSettings(fp8="hybrid", fp8_recipe="tensorwise"), env) is None else ""
    if s.fp4_recipe == "nvfp4":
        if env.device == "cpu":
            return f"{FIELD}.fp4_recipe: nvfp4 needs a GPU with FP4 units (compute capability >= 10.0); this is a CPU; {emulate}"
        if env.is_rocm:
            return (f"{FIELD}.fp4_recipe: nvfp4 is NVIDIA's format (CC >= 10.0); found {env.summary()}; "
                    f"on gfx950 use fp4_recipe: mxfp4, or {emulate}{fp8_alt}")
        if not env.has_te or env.te_version < NVFP4_MIN_TE:
            return (f"{FIELD}.fp4_recipe: nvfp4 needs Transformer Engine >= 2.8 (megatron-core ignores fp4 "
                    f"without it); found {env.summary()}; {emulate}{fp8_alt}")
        if env.cuda_cc is None or env.cuda_cc < NVFP4_MIN_CC:
            return (f"{FIELD}.fp4_recipe: nvfp4 needs compute capability >= 10.0 (B200/GB200/B300); "
                    f"found {env.summary()}; {emulate}{fp8_alt}")
        return None
    # mxfp4
    if env.device == "cpu":
        return f"{FIELD}.fp4_recipe: mxfp4 needs an AMD gfx950 GPU (MI355X/MI350X) with ROCm TE; this is a CPU; {emulate}"
    if not env.is_rocm or env.gfx_number() != MXFP4_GFX:
        return (f"{FIELD}.fp4_recipe: mxfp4 runs natively only on gfx950 (MI355X/MI350X) with ROCm TE "
                f"MXFP4BlockScaling; found {env.summary()}; {emulate}{fp8_alt}")
    if not env.te_has_mxfp4:
        return (f"{FIELD}.fp4_recipe: mxfp4 needs ROCm Transformer Engine with recipe.MXFP4BlockScaling; "
                f"found {env.summary()}; {emulate}{fp8_alt}")
    return None


def resolve_mode(s: PrecisionSettings, env: Environment) -> Mode:
    """The mode this recipe runs in on `env`; raises PrecisionError when it cannot."""
    problem = config_errors(s)
    if problem:
        raise PrecisionError(problem)
    if s.fp8:
        problem = _fp8_error(s, env)
        if problem:
            raise PrecisionError(problem)
        return Mode("fp8", None)
    if s.fp4:
        if s.fp4_emulation:
            if env.has_te and env.device == "cuda" and env.te_version >= CUSTOM_RECIPE_MIN_TE:
                return Mode("fp4-te-emulated", s.fp4_recipe)
            return Mode("fp4-local-emulated", s.fp4_recipe)
        problem = _fp4_native_error(s, env)
        if problem:
            raise PrecisionError(problem)
        return Mode("fp4-native", s.fp4_recipe)
    return Mode("bf16" if s.bf16 else "fp32", None)


def check_capabilities(cfg: Any, env: Optional[Environment] = None) -> Mode:
    """Raise PrecisionError (one line) unless this machine can run cfg's precision; returns the Mode."""
    settings = PrecisionSettings.from_cfg(cfg)
    if env is None:
        env = probe_environment(settings.device)
    return resolve_mode(settings, env)
