"""The frozen base GEMM that the epilogue paths own (trainer.model.lora.epilogue, norm_epilogue), in 16/32-bit or FP8.

    with base_gemm(base, x, fp8) as (x, gemm):
        gemm.forward_into(x2, y)     # y += x W^T       (beta = 1: y holds the adapter's product)
        gemm.dgrad_into(dy2, dx)     # dx += dy W       (dx holds the adapter's input gradient)
        gemm.done()                  # once per backward of the node, after its GEMMs (FP8 bookkeeping)

16/32-bit (`TorchGemm`): torch's addmm_ on the weight, the epilogue's GEMMs as they were.

FP8 (`TeFp8Gemm`, trainer.lora.epilogue on in an FP8 run with delayed or tensorwise scaling): the base's own Transformer Engine
quantizers and weight, through TE's functional linear (transformer_engine.pytorch.ops.BasicLinear's
_functional_forward / _functional_backward, the functions its op fuser's fused linear+add ops call with
accumulate_into_out / accumulate_into_grad_input): the input quantized by the module's input quantizer, the weight
as TE's forward would take it (a primary FP8 weight as it is; a 16-bit one quantized into the module's cached
workspace on the first micro-batch, as megatron's is_first_microbatch asks), dy by its grad-output quantizer. The
module's forward bookkeeping runs around it (prepare_forward / end_forward: FP8 metadata, delayed scaling's amax
registration and its recompute-phase copies), and the backward reduction of the amaxes where this module is the
first FP8 module of the forward, as TE's _Linear does. Primary FP8 weights (fp8_param) get their transpose in the
dgrad and lose it right after (trainer.precision.fp8_release's rule; the module's own forward pre-hook, which
does that for TE's path, never runs here).
"""
from __future__ import annotations

import contextlib
import functools

import torch


class TorchGemm:
    """y += x W^T and dx += dy W with torch's addmm_ (cuBLAS with beta = 1 on a GPU)."""

    def __init__(self, weight: torch.Tensor):
        self.w = weight

    def forward_into(self, x2: torch.Tensor, y: torch.Tensor) -> None:
        y.addmm_(x2, self.w.t())

    def forward_new(self, x2: torch.Tensor) -> torch.Tensor:
        return x2.mm(self.w.t())

    def dgrad_into(self, dy2: torch.Tensor, dx: torch.Tensor) -> None:
        dx.addmm_(dy2, self.w)

    def done(self) -> None:
        pass


# what this module calls on TE's functional linear (transformer_engine.pytorch.ops.basic.BasicLinear)
FUNCTIONAL = ("_functional_forward", "_functional_backward")


@functools.lru_cache(maxsize=1)
def te_functional():
    """TE's functional linear (BasicLinear) where this TE has everything this module calls, else None. TE 2.9-2.14
    have the functional linear but not the rest: prepare_forward was a context manager there (no end_forward), and
    module.base.quantize_weight and the quantized_tensor module came later (audit of the 2.9 and 2.12-2.19 wheels,
    2026-12-06); 2.15+ have all of it, 2.20.2 ran it (tests/gpu/test_fp8_epilogue.py)."""
    import inspect

    try:
        from transformer_engine.pytorch.module import base as te_base
        from transformer_engine.pytorch.ops.basic import BasicLinear
        from transformer_engine.pytorch.quantized_tensor import QuantizedTensor  # noqa: F401
    except Exception:  # no TE (CPU), or one without the op fuser or these modules
        return None
    module = te_base.TransformerEngineBaseModule
    ok = (all(callable(getattr(BasicLinear, name, None)) for name in FUNCTIONAL)
          and callable(getattr(te_base, "quantize_weight", None)) and callable(getattr(module, "end_forward", None))
          and not inspect.isgeneratorfunction(inspect.unwrap(module.prepare_forward)))
    return BasicLinear if ok else None


def owns_fp8_base_gemm(base) -> bool:
    """`base` is a TE linear whose FP8 GEMM the epilogue can run: TE's quantizers, a 2-D weight (16-bit, or FP8 as
    fp8_param stores it), no bias, no per-module quantization recipe of megatron's (te_quant_params)."""
    w = getattr(base, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not hasattr(base, "_get_quantizers"):
        return False
    if getattr(base, "te_quant_params", None) is not None or not hasattr(base, "prepare_forward"):
        return False
    return not adds_bias(base)


def adds_bias(base) -> bool:
    """The base's forward adds a bias after its GEMM (a megatron use_bias flag, or a non-empty bias tensor)."""
    bias = getattr(base, "bias", None)
    return bool(getattr(base, "use_bias", False) or (isinstance(bias, torch.Tensor) and bias.numel() > 0))


class TeFp8Gemm:
    """The base's FP8 GEMMs through TE's functional linear (see the module doc)."""

    def __init__(self, weight, input_q, grad_q, reduce_bwd: bool, release: list):
        self.w, self.input_q, self.grad_q = weight, input_q, grad_q
        self.reduce_bwd, self.release = reduce_bwd, release
        self.linear = te_functional()

    def _forward(self, x2, y, accumulate: bool):
        return self.linear._functional_forward(
            x2, self.w, dtype=x2.dtype, out=y, accumulate_into_out=accumulate, with_quantized_compute=True,
            input_quantizer=self.input_q, input_requires_grad=True, weight_requires_grad=False)[0]

    def forward_into(self, x2: torch.Tensor, y: torch.Tensor) -> None:
        self._forward(x2, y, True)

    def forward_new(self, x2: torch.Tensor) -> torch.Tensor:
        return self._forward(x2, None, False)

    def _dgrad(self, dy2, dx, accumulate: bool):
        return self.linear._functional_backward(
            dy2.contiguous(), None, self.w, input_requires_grad=True, weight_requires_grad=False, dtype=dy2.dtype,
            grad_input=dx, accumulate_into_grad_input=accumulate, with_quantized_compute=True,
            grad_output_quantizer=self.grad_q)[0]

    def dgrad_into(self, dy2: torch.Tensor, dx: torch.Tensor) -> None:
        self._dgrad(dy2, dx, True)

    def dgrad_new(self, dy2: torch.Tensor) -> torch.Tensor:
        return self._dgrad(dy2, None, False)

    def done(self) -> None:
        from trainer.precision.fp8_release import drop_transposes

        drop_transposes(self.release)
        if self.reduce_bwd:
            from transformer_engine.pytorch.quantization import FP8GlobalStateManager

            self.reduce_bwd = False
            FP8GlobalStateManager.reduce_and_update_fp8_tensors(forward=False)


def _first_fp8_module() -> bool:
    """Whether this is the forward's first FP8 module, whose backward reduces the backward amaxes (TE's _Linear:
    module/linear.py _check_fp8_reduce_and_update; the recompute phase does not use the flag up)."""
    from transformer_engine.pytorch.distributed import in_fp8_activation_recompute_phase
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager

    state = FP8GlobalStateManager.quantization_state
    before = state.is_first_fp8_module
    first = FP8GlobalStateManager.is_first_fp8_module()
    if in_fp8_activation_recompute_phase():
        state.is_first_fp8_module = before
    return first


def _fp8_weight(base, quantizer, first_microbatch, needs_dgrad: bool, dtype):
    """The weight as TE's Linear forward takes it (module/linear.py, module/base.py quantize_weight): a primary FP8
    weight as it is; a 16-bit one quantized with its transpose where a dgrad follows, cached in the module's
    workspace across the micro-batches of a step when megatron passes is_first_microbatch."""
    from transformer_engine.pytorch.distributed import (in_fp8_activation_recompute_phase,
                                                        is_fp8_activation_recompute_enabled)
    from transformer_engine.pytorch.module.base import quantize_weight
    from transformer_engine.pytorch.quantized_tensor import QuantizedTensor

    weight = base.weight
    if not isinstance(weight, QuantizedTensor):
        columnwise = needs_dgrad or (is_fp8_activation_recompute_enabled() and not in_fp8_activation_recompute_phase())
        quantizer.set_usage(rowwise=True, columnwise=columnwise)
    else:
        quantizer = weight._quantizer
    cache = "weight" if first_microbatch is not None else None
    workspace = base._fp8_workspaces.get(cache) if cache else None
    w, new = quantize_weight(tensor=weight, quantizer=quantizer, workspace=workspace,
                             update_workspace=first_microbatch is None or first_microbatch, skip_update_flag=None,
                             fsdp_group=None, workspace_dtype=dtype, cache=cache is not None)
    if new is not None and cache:
        base._fp8_workspaces[cache] = new.detach() if isinstance(new, torch.Tensor) else new
    w.update_usage(rowwise_usage=True)
    return w


@contextlib.contextmanager
def base_gemm(base, x: torch.Tensor, fp8: bool):
    """(x, gemm) for one forward of `base` through the epilogue: TorchGemm on its weight, or with fp8 the module's
    FP8 GEMM between TE's prepare_forward and end_forward (x as TE's prepare_forward hands it back; a module TE runs
    unquantized there, a layer kept in BF16 by first_last_layers_bf16, gets TorchGemm on its weight)."""
    if not fp8:
        yield x, TorchGemm(base.weight)
        return
    # megatron's TE wrappers pass is_first_microbatch (None: no weight cache) and clear it after the forward
    first = None if getattr(base, "disable_parameter_transpose_cache", True) else getattr(base, "is_first_microbatch",
                                                                                           None)
    x = base.prepare_forward(x)
    try:
        yield x, _gemm(base, x, first)
    finally:
        base.end_forward()
        if hasattr(base, "is_first_microbatch"):
            base.is_first_microbatch = False


def _gemm(base, x: torch.Tensor, first):
    from transformer_engine.pytorch.quantized_tensor import QuantizedTensor
    from transformer_engine.pytorch.utils import assert_dim_for_fp8_exec

    from trainer.precision.fp8_params import releasable

    w = base.weight
    if not getattr(base, "fp8", False):  # (a plain tensor's dequantize() is a float32 copy: only TE's tensors')
        return TorchGemm(w.dequantize(dtype=x.dtype) if isinstance(w, QuantizedTensor) else w.to(x.dtype))
    assert_dim_for_fp8_exec(x, w)  # TE's Linear checks the same before its FP8 GEMM (cuBLAS would fail unclearly)
    grad = torch.is_grad_enabled()
    input_q, weight_q, _, _, _, grad_q = base._get_quantizers(False, False, grad)
    # a backward (and so done()) follows exactly when x needs a gradient: the weight is frozen, and the epilogue
    # node or _BaseLinear is recorded then; TE's _Linear takes the first-module flag on the same condition
    needs_dgrad = grad and x.requires_grad
    w = _fp8_weight(base, weight_q, first, needs_dgrad, x.dtype)
    reduce_bwd = needs_dgrad and _first_fp8_module()
    release = [p for p in base.parameters(recurse=False) if releasable(p)]
    return TeFp8Gemm(w, input_q, grad_q, reduce_bwd, release)
