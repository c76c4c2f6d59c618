"""FP4 emulation in the project's own linear path (no TE): megatron local Column/RowParallelLinear GEMMs
run on quantize-dequantized operands, quantized on the same tensors and axes TE quantizes:

    fprop  y  = Q(x, 1xB along K)           @ Q(W along K)^T          W: 16x16 tiles (NVFP4) / 1x32 (MXFP4)
    dgrad  dx = Q(dy, 1xB along N, SR)      @ Q(W along N)
    wgrad  dW = Q(H dy^T, 1xB along M, SR)  @ Q(H x^T, 1xB along M)^T   H: RHT when fp4_random_hadamard
GEMMs run in the input dtype (bf16 on GPU). Frozen (LoRA base) weights skip wgrad, and their quantized
copies are computed once and reused every step (weight_cache: keyed on the weight's version).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from .errors import PrecisionError
from .gating import Precision
from .qdq import qdq
from .settings import FIELD, PrecisionSettings
from .weight_cache import cached


@dataclass(frozen=True)
class EmulationSpec:
    fmt: str                  # nvfp4 | mxfp4
    stochastic: bool = False  # stochastic rounding of gradients
    rht: bool = False         # random Hadamard transform on wgrad operands (NVFP4)

    @property
    def label(self) -> str:
        return f"{self.fmt.upper()}-emulated"

    def act(self, x):
        return qdq(x, self.fmt)

    def act_col(self, xt):
        return qdq(xt, self.fmt, rht=self.rht)

    def grad_row(self, dy):
        return qdq(dy, self.fmt, stochastic=self.stochastic)

    def grad_col(self, dyt):
        return qdq(dyt, self.fmt, rht=self.rht, stochastic=self.stochastic)

    def weight_fwd(self, w):
        if self.fmt == "nvfp4":
            return cached(w, "nvfp4-16x16", lambda: qdq(w, "nvfp4", tile=(16, 16)))
        return cached(w, "mxfp4-rows", lambda: qdq(w, "mxfp4"))

    def weight_bwd(self, w):
        if self.fmt == "nvfp4":  # 2-D tiles: the same quantized weight serves fprop and dgrad
            return self.weight_fwd(w)
        return cached(w, "mxfp4-cols", lambda: qdq(w.t(), "mxfp4").t())


class FP4EmulatedMatmul(torch.autograd.Function):
    """y = x @ W^T with every GEMM operand FP4 quantize-dequantized."""

    @staticmethod
    def forward(ctx, x, weight, spec: EmulationSpec):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2 if ctx.needs_input_grad[1] else None, weight)   # x only feeds wgrad
        ctx.spec, ctx.x_shape = spec, x.shape
        y = spec.act(x2) @ spec.weight_fwd(weight).to(x2.dtype).t()
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        spec = ctx.spec
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = (spec.grad_row(dy2) @ spec.weight_bwd(weight).to(dy2.dtype)).view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            dw = (spec.grad_col(dy2.t().contiguous()) @ spec.act_col(x2.t().contiguous()).t()).to(weight.dtype)
        return dx, dw, None


def emulated_forward_impl(spec: EmulationSpec, input, weight, bias=None, gradient_accumulation_fusion=False,
                          allreduce_dgrad=False, sequence_parallel=False, tp_group=None, **_unused):
    """Drop-in for megatron's linear_with_grad_accumulation_and_async_allreduce / linear_with_frozen_weight."""
    from megatron.core.tensor_parallel import mappings

    if gradient_accumulation_fusion and weight.requires_grad:
        raise PrecisionError(f"{FIELD}.fp4_emulation cannot fuse gradient accumulation into main_grad; "
                             "build the model with gradient_accumulation_fusion=False")
    if sequence_parallel:
        input = mappings.gather_from_sequence_parallel_region(input, tensor_parallel_output_grad=True, group=tp_group)
    elif allreduce_dgrad:
        input = mappings.copy_to_tensor_model_parallel_region(input, group=tp_group)
    out = FP4EmulatedMatmul.apply(input, weight, spec)
    return out + bias if bias is not None else out


def spec_from_settings(s: PrecisionSettings) -> EmulationSpec:
    return EmulationSpec(fmt=s.fp4_recipe, stochastic=s.fp4_stochastic_rounding, rht=s.fp4_random_hadamard)


def _linear_classes():
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    return ColumnParallelLinear, RowParallelLinear


def _bf16_layer(index: int, s: PrecisionSettings, num_layers: int) -> bool:
    if not s.first_last_layers_bf16:
        return False
    return index < s.num_layers_at_start_in_bf16 or index >= num_layers - s.num_layers_at_end_in_bf16


def _targets(model: torch.nn.Module, s: PrecisionSettings):
    """(name, module) of the linears TE would run in FP4: inside transformer layers, minus bf16 layers."""
    linear = _linear_classes()
    layers = [m for m in model.modules() if type(m).__name__.endswith("TransformerLayer") and hasattr(m, "layer_number")]
    if not layers:  # not a megatron GPT: every local linear except the output head
        return [(n, m) for n, m in model.named_modules() if isinstance(m, linear) and "output_layer" not in n]
    num_layers = s.num_layers or max(m.layer_number for m in layers)
    found = []
    for layer in layers:
        if _bf16_layer(layer.layer_number - 1, s, num_layers):
            continue
        found += [(f"layer{layer.layer_number}.{n}", m) for n, m in layer.named_modules() if isinstance(m, linear)]
    return found


def apply_emulation(model: Any, p: Precision) -> int:
    """Wrap the model's megatron local linears for FP4 emulation; returns how many were wrapped.

    0 unless the resolved mode is fp4-local-emulated (fp4_emulation off, or TE on this GPU: TE's
    CustomRecipe path emulates then, via transformer_config_kwargs), or when they are wrapped already.
    Raises PrecisionError if emulation is on but nothing could be wrapped.
    """
    s = p.settings
    if p.mode.kind != "fp4-local-emulated":
        return 0
    spec = spec_from_settings(s)
    chunks = model if isinstance(model, (list, tuple)) else [model]
    count = seen = 0
    for chunk in chunks:
        for _, module in _targets(chunk, s):
            seen += 1
            if not module.__dict__.get("_fp4_emulation"):
                module._forward_impl = functools.partial(emulated_forward_impl, spec)
                module._fp4_emulation = spec.label
                count += 1
    if seen == 0:
        raise PrecisionError(f"{FIELD}.fp4_emulation: true found no megatron local ColumnParallelLinear/"
                             "RowParallelLinear to emulate (TE layers need TE's custom recipe path)")
    return count


def emulated_layer_count(model: Any) -> int:
    chunks = model if isinstance(model, (list, tuple)) else [model]
    return sum(1 for c in chunks for m in c.modules() if m.__dict__.get("_fp4_emulation"))
