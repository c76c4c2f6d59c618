"""What happens to the GPTModel after megatron-core built it: one ordered list of transforms, one interface.

    for t in TRANSFORMS:
        if t.applies(ctx):
            line = t.apply(model, ctx)   # its log line, or None when it has nothing to say

In order: HF import (checkpoint.pretrained) | FP8 params (random-init FP8 weights drawn again with their own
scales) | LoRA (base frozen, adapters wrapped) | FP8 weight transposes (made in each linear's backward, freed
after it) | adapter-input recompute | fused SwiGLU | the LoRA epilogue | the TE userbuffers' report (set up
before the model was built) | chunked loss | FP4 emulation. The train loop
logs the lines in this order, after the precision line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from trainer.model import tp_overlap
from trainer.model.chunked_loss import install_chunked_loss
from trainer.model.hf.importer import load_hf
from trainer.model.lora.layers import apply_lora
from trainer.model.lora.inputs import wire_adapter_input_recompute
from trainer.step.optim import trainable_parameters
from trainer.precision import Precision, apply_emulation, fp8_params
from trainer.precision.fp8_release import release_after_backward


@dataclass(frozen=True)
class BuildContext:
    """What the transforms read: the recipe, megatron's TransformerConfig, the device, the resolved precision
    and the TE userbuffers' token count (None: no tp_comm_overlap)."""
    cfg: Any
    config: Any
    device: torch.device
    precision: Precision
    ub_tokens: Optional[int] = None


@dataclass(frozen=True)
class Transform:
    name: str
    applies: Callable[[BuildContext], bool]
    apply: Callable[[torch.nn.Module, BuildContext], Optional[str]]


def _hf_import(model, ctx: BuildContext) -> str:
    return load_hf(model, ctx.cfg.trainer.checkpoint.pretrained, ctx.cfg.trainer.model.to_dict())


def _fp8_redraw(model, ctx: BuildContext) -> Optional[str]:
    """Delayed scaling: the initial FP8 weights drawn again, each with its own scale."""
    checks = fp8_params.redraw_delayed(model, _init_seed_of(model, int(ctx.cfg.experiment.seed)))
    if not checks:
        return None
    return "fp8_param | initial weights drawn in BF16 and quantized with their own scales" + \
        fp8_params.checks_summary(checks)


def _init_seed_of(model, seed: int):
    """Per-weight init seed: (experiment seed, global layer name, TP rank), so any PP layout draws alike."""
    from megatron.core import parallel_state as ps

    from trainer.model.layout import namer
    from trainer.model.lora.layers import _seed

    global_name, tp_rank = namer(model), ps.get_tensor_model_parallel_rank()
    return lambda name: _seed(seed, f"{global_name(name)}@tp{tp_rank}") % 2**63


def _lora(model, ctx: BuildContext) -> Optional[str]:
    from megatron.core import parallel_state as ps

    lora = ctx.cfg.trainer.lora
    wrapped = apply_lora(model, lora, tp_size=ps.get_tensor_model_parallel_world_size(),
                         tp_rank=ps.get_tensor_model_parallel_rank(), sequence_parallel=ctx.config.sequence_parallel,
                         seed=int(ctx.cfg.experiment.seed), norm_recompute=bool(ctx.cfg.trainer.recompute.norm_output))
    if not lora.enabled:
        return None
    trainable = sum(p.numel() for p in trainable_parameters(model))
    return (f"lora | rank {lora.dim} | alpha {lora.alpha:g} | wrapped linears {len(wrapped)} | "
            f"trainable parameters {trainable} (this rank)")


def _fp8_transposes(model, ctx: BuildContext) -> str:
    """FP8 weights: no transpose kept from the build (an import may have made them), each made per backward."""
    fp8_params.release_transposes(model)
    armed = release_after_backward(model)
    return f"fp8 weight transposes | made in each linear's backward and freed after it | {armed} modules"


def _adapter_inputs(model, ctx: BuildContext) -> str:
    """What trainer.recompute.adapter_inputs rewired (zero: nothing eligible)."""
    scope = ctx.cfg.trainer.recompute.adapter_inputs_scope
    wired = wire_adapter_input_recompute(model, scope)
    # (where it rewires nothing the contract refused the recipe: rules_levers.adapter_inputs_rules)
    return f"adapter inputs | scope {scope} | fc2 {wired['fc2']} | norm {wired['norm']}"


def _fused_swiglu(model, ctx: BuildContext) -> str:
    """trainer.lora.fused_swiglu: dense MLPs whose fc1 adapter is folded into the activation."""
    from trainer.model.lora.swiglu import kernels_usable, wire_fused_swiglu

    strict = ctx.cfg.trainer.lora.fused_swiglu is True  # null: wherever it applies, and says where it did not
    rec = ctx.cfg.trainer.recompute
    if rec.adapter_inputs and rec.adapter_inputs_scope in ("all", "fc2"):  # as rules_precision.swiglu_blocker says
        return (f"fused swiglu | off: recompute.adapter_inputs scope {rec.adapter_inputs_scope} recomputes fc2's input "
                "from fc1's full output, which the fold never writes; the unfused path")  # (true: refused at submit)
    wired = wire_fused_swiglu(model, strict)
    if not strict:
        if not wired:
            return "fused swiglu | auto (fused_swiglu null): no MLP here can fold its fc1 adapter; the unfused path"
    elif not _model_wide(wired, ctx):  # accepted and ignored would be a lie: no dense MLP of the model has an fc1
        from trainer.config import ConfigError  # adapter it could fold

        raise ConfigError("trainer.lora.fused_swiglu: no dense gated-SiLU MLP with an adapter on linear_fc1 here "
                          "(targets, experts, bias or activation); set fused_swiglu: false")
    elif not wired:  # a pipeline stage of MoE layers only
        return "fused swiglu | no dense MLP with an fc1 adapter on this pipeline stage (folded on the others)"
    how = ("Triton kernels" if kernels_usable(ctx.device, int(ctx.cfg.trainer.lora.dim), _dtype(ctx))
           else "the unfused ops (no GPU Triton here: same numerics, no saving)")
    return f"fused swiglu | fc1 adapters folded into the activation | {wired} MLPs | {how}"


def _model_wide(count: int, ctx: BuildContext) -> int:
    """count summed over the pipeline stages (at PP > 1 one all-reduce at build; every rank of the group must ask):
    a strict key is refused when the whole model has nothing for it, as the contract checks, not one stage."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return count
    import torch

    total = torch.tensor([float(count)], device=ctx.device)
    torch.distributed.all_reduce(total, group=ps.get_pipeline_model_parallel_group())
    return int(total.item())


def _dtype(ctx: BuildContext):
    """The run's compute dtype, for kernels_usable (float32 takes the torch path on a GPU)."""
    import torch

    return torch.bfloat16 if ctx.cfg.trainer.precision.bf16 else torch.float32


def _epilogue(model, ctx: BuildContext) -> str:
    """trainer.lora.epilogue: which wrapped linears own their base GEMM (trainer/model/lora/epilogue.py); none is a
    refusal (the contract refused what it can see; a norm-fused or quantized base is seen only here)."""
    from trainer.config import ConfigError
    from trainer.model.lora import epilogue
    from trainer.model.lora.kernels import kernels_usable
    from trainer.model.lora.layers import LoRALinear

    wrapped = [m for m in model.modules() if isinstance(m, LoRALinear)]
    if ctx.cfg.trainer.lora.epilogue is None:  # auto: BF16 / FP8 per-tensor on NVIDIA (primus_contract epilogue_on)
        why = epilogue.auto_blocker(ctx.device, ctx.precision.settings)
        if why:
            return f"lora epilogue | auto (epilogue null): off, {why}"
        for m in wrapped:
            m.epilogue = True
        fp8 = _fp8_epilogue(wrapped, ctx)  # (before asking who owns a GEMM: an FP8 weight is owned in FP8 only)
        if not any(m.uses_epilogue() or m.uses_norm_epilogue() for m in wrapped):  # (epilogue_on's owners)
            for m in wrapped:
                m.epilogue = m.fp8_epilogue = False
            return "lora epilogue | auto (epilogue null): off, no wrapped linear here can own its base GEMM"
    else:
        fp8 = _fp8_epilogue(wrapped, ctx)
    normed = sum(m.uses_norm_epilogue() for m in wrapped)  # trainer.lora.epilogue_norm (lora/norm_epilogue.py)
    taken = sum(m.uses_epilogue() for m in wrapped) + normed
    # (true: every rank of the stages' group asks once; auto reaches here only where some linear took the path)
    if ctx.cfg.trainer.lora.epilogue is True and _model_wide(taken, ctx) and not taken:
        return "lora epilogue | no linear on this pipeline stage can own its base GEMM (others' do)"
    if not taken:
        import torch

        from trainer.model.lora.norm_epilogue import FUSED_RMS_NORM

        old_torch = "" if FUSED_RMS_NORM or not any(m.fused_norm for m in wrapped) else (
            f"; this torch ({torch.__version__}) has no fused RMSNorm, which the norm-fed linears' epilogue needs "
            "(torch >= 2.8)")
        raise ConfigError("trainer.lora.epilogue: no wrapped linear can own its base GEMM here (norm-fused, "
                          f"quantized, biased, expert or TP-sharded bases keep their paths){old_torch}; set "
                          "epilogue: false")
    # a rank whose layers hold no norm-fed target (a pipeline stage of MoE layers only) has nothing to take; one
    # that holds some the path cannot take refuses (the contract checked the model has norm-fed targets)
    if ctx.cfg.trainer.lora.epilogue_norm is True and not normed and any(m.fused_norm for m in wrapped):
        raise ConfigError("trainer.lora.epilogue_norm: no wrapped norm-fused linear here whose norm and GEMM this "
                          "path can own (TE's LayerNormLinear, RMSNorm/LayerNorm, 16/32-bit, no bias); set "
                          "epilogue_norm: false")
    how = ("Triton rank-r kernels" if kernels_usable(ctx.device, int(ctx.cfg.trainer.lora.dim), _dtype(ctx))
           else "torch ops (no Triton device here, or a rank above the kernels')")
    norm = f" (norm-fed {normed})" if normed or ctx.cfg.trainer.lora.epilogue_norm else ""
    if normed and ctx.cfg.trainer.recompute.norm_output:  # (lora/norm_epilogue.py: the norm's input kept)
        norm += ", their norm output recomputed in backward"
    gemms = "FP8 base GEMMs (TE's functional linear)" if fp8 else "base GEMMs"
    return f"lora epilogue | {gemms} accumulate the adapters | {taken} of {len(wrapped)} linears{norm} | {how}"


def _fp8_epilogue(wrapped, ctx: BuildContext) -> bool:
    """trainer.lora.epilogue on in an FP8 run (true, which the contract took, or null: delayed or tensorwise scaling,
    NVIDIA): the wrapped linears run their base GEMMs in FP8 through TE's functional linear
    (trainer/model/lora/base_gemm.py)."""
    settings = ctx.precision.settings
    if not (settings.fp8 and any(m.epilogue for m in wrapped)):  # (true, or null that auto_blocker let on)
        return False
    from trainer.config import ConfigError
    from trainer.model.lora.base_gemm import te_functional

    if ctx.device.type != "cuda" or te_functional() is None:
        raise ConfigError("trainer.lora.epilogue true with trainer.precision.fp8 runs the base GEMMs through "
                          "Transformer Engine's functional linear (ops.BasicLinear), which this node's TE lacks (or no "
                          "GPU); set epilogue: false")
    for m in wrapped:
        m.fp8_epilogue = True
    return True


def _swiglu_fp8(model, ctx: BuildContext) -> str:
    """trainer.precision.fp8_swiglu_kernels: the FP8 SwiGLU store of the MLPs not folded by fused_swiglu in two
    Triton passes (trainer/model/swiglu_fp8.py) instead of megatron's cast and copy back."""
    from trainer.model.swiglu_fp8 import usable, wire_swiglu_fp8

    if not usable(ctx.device, _dtype(ctx)):  # (the contract's note says so at submit: an NVIDIA GPU in BF16)
        return "fp8 swiglu kernels | not on this device (an NVIDIA GPU in BF16): megatron's casts"
    if getattr(ctx.config, "cpu_offloading", False):  # (as wire_swiglu_fp8 and the contract's swiglu_kernels_can_run)
        return "fp8 swiglu kernels | off under recompute.activation_offload_layers: megatron's casts"
    wired = wire_swiglu_fp8(model)
    return f"fp8 swiglu kernels | {wired} MLPs keep fc1's output in FP8 by the SwiGLU's own passes"


def _swiglu_store(model, ctx: BuildContext) -> Optional[str]:
    """The MLPs left on megatron's FP8 SwiGLU store (experts, activation offload, the kernels off): its copy saturated
    where this torch's cast makes magnitudes past 448 NaN (trainer/model/swiglu_store.py)."""
    from trainer.model.swiglu_store import install, megatron_store_count

    left = megatron_store_count(model)
    if not left or not install(ctx.device):
        return None  # (nothing left to megatron's functions, or this torch's cast saturates)
    return (f"fp8 swiglu store | {left} MLPs keep megatron's FP8 SwiGLU store, its copy saturated (this torch's "
            f"float8_e4m3fn cast makes magnitudes past 448 NaN)")


def _chunked_loss(model, ctx: BuildContext) -> Optional[str]:
    from trainer.model.ce_kernel import ce_kernel_usable

    kernel = bool(ctx.cfg.trainer.recompute.chunked_loss_kernel)
    if not install_chunked_loss(model, kernel=kernel):
        return None  # megatron's own output layer + loss stays (trainer.model.chunked_loss says when)
    how = "Triton passes" if kernel and ce_kernel_usable(ctx.device, _dtype(ctx)) else "torch ops"
    return f"chunked loss | output layer + cross-entropy in token chunks, logits not kept | {how}"


def _emulation(model, ctx: BuildContext) -> str:
    count = apply_emulation(model, ctx.precision)
    return f"fp4 emulation | {ctx.precision.settings.fp4_recipe} quantize-dequantize on {count} linears"


TRANSFORMS = (
    Transform("hf import", lambda ctx: bool(ctx.cfg.trainer.checkpoint.pretrained), _hf_import),
    Transform("fp8 params", lambda ctx: not ctx.cfg.trainer.checkpoint.pretrained
              and bool(getattr(ctx.config, "fp8_param", False)), _fp8_redraw),
    Transform("lora", lambda ctx: True, _lora),
    Transform("fp8 transposes", lambda ctx: bool(getattr(ctx.config, "fp8_param", False)), _fp8_transposes),
    Transform("adapter inputs", lambda ctx: bool(ctx.cfg.trainer.recompute.adapter_inputs), _adapter_inputs),
    Transform("fused swiglu", lambda ctx: ctx.cfg.trainer.lora.fused_swiglu is not False, _fused_swiglu),
    Transform("fp8 swiglu kernels", lambda ctx: bool(ctx.cfg.trainer.precision.fp8_swiglu_kernels)
              and bool(ctx.cfg.trainer.precision.fp8_swiglu_input), _swiglu_fp8),
    Transform("fp8 swiglu store", lambda ctx: bool(ctx.cfg.trainer.precision.fp8_swiglu_input)
              and ctx.device.type == "cuda", _swiglu_store),
    Transform("lora epilogue", lambda ctx: ctx.cfg.trainer.lora.epilogue is True
              or (ctx.cfg.trainer.lora.epilogue is None and bool(ctx.cfg.trainer.lora.enabled)), _epilogue),
    Transform("tp comm overlap", lambda ctx: bool(ctx.ub_tokens),
              lambda model, ctx: tp_overlap.describe(model, ctx.ub_tokens)),
    Transform("chunked loss", lambda ctx: bool(ctx.cfg.trainer.recompute.chunked_loss), _chunked_loss),
    Transform("fp4 emulation", lambda ctx: ctx.precision.mode.kind == "fp4-local-emulated", _emulation),
)


def apply_transforms(model, ctx: BuildContext) -> tuple:
    """Apply every transform that applies, in order; ((name, log line or None), ...) of those applied."""
    return tuple((t.name, t.apply(model, ctx)) for t in TRANSFORMS if t.applies(ctx))
