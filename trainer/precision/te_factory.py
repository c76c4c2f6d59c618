"""Quantizer factories for TE's CustomRecipe (megatron-core `fp4_recipe: custom` + `fp4_quantizer_factory`).

megatron resolves e.g. `trainer.precision.te_factory.nvfp4_factory` and builds
CustomRecipe(qfactory=...); TE calls it with a QuantizerRole per GEMM operand. The quantizers subclass TE's
reference NVFP4QuantizerRef (so TE's custom-tensor plumbing is unchanged) but quantize with our fused
kernels and carry bf16 payloads (fp4_payload: codes and block scales bit-equal to the reference, decoded in
the same kernel pass) instead of packed codes; each GEMM is one bf16 GEMM on payloads with TE's
alpha = amax_a * amax_b / (6*6*448*448) epilogue, instead of the reference's per-16-column loop.
Roles: weight -> 16x16 tiles; input / grad_output -> 1x16, RHT on the columnwise (wgrad) copy when enabled,
stochastic rounding on grad_output when enabled. MXFP4: 1x32 E8M0 for every role.

Weights (frozen LoRA bases) are quantized once per weight version (weight_cache), always with both the
rowwise and the columnwise copy, and their tensors are persistent: TE caches them across micro-batches as
the module's weight workspace (megatron passes is_first_microbatch), so prepare_for_saving must not empty
them and update_usage must be able to bring either copy back. (TE's reference tensor empties itself when
saved for a backward that never runs - e.g. layer 1's qkv when the embedding is frozen - and the next
forward then fails with "Cannot generate FP4 data, even from FP4 data transpose"; and its _create_transpose
transposes packed nibbles, which is not the columnwise quantization.)
Importing this module needs no TE; the factories need TE >= 2.9.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

from . import fp4_payload
from .weight_cache import cached


def _scale_field(payload: Optional[torch.Tensor], amax: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """What TE's plumbing sees as `scale`: the NVFP4 tensor amax, or an empty tensor for MXFP4 (whose block
    scales are all inside the payload); None only when that copy does not exist."""
    if payload is None:
        return None
    return amax if amax is not None else payload.new_empty(0)


@functools.lru_cache(maxsize=1)
def _classes():
    from transformer_engine.pytorch.custom_recipes import gemm, reference_utils
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef, NVFP4TensorRef

    @dataclasses.dataclass(repr=False)
    class PrimusFP4TensorRef(NVFP4TensorRef):
        """data / data_t: bf16 payloads [m, k] / [k, m]; scale / scale_t: the fp32 tensor amaxes (block scales
        are folded into the payload). `persistent` (weights): copies survive saving and usage changes."""

        persistent: Optional[tuple] = None

        def prepare_for_saving(self):
            if self.persistent is None:
                return super().prepare_for_saving()
            return [self.data, self.data_t, self.scale, self.scale_t], self

        def update_usage(self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None):
            if self.persistent is not None:
                if rowwise_usage and self.data is None:
                    self.data, self.scale = self.persistent[0], self.persistent[1]
                if columnwise_usage and self.data_t is None:
                    self.data_t, self.scale_t = self.persistent[2], self.persistent[3]
            super().update_usage(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage)

        def _create_transpose(self):
            raise RuntimeError("FP4 columnwise data is a separate quantization (blocks run along the other "
                               "dimension); it cannot be derived from the rowwise copy of an activation")

    class PrimusFP4Quantizer(NVFP4QuantizerRef):
        """NVFP4 (pow2=False, tiles 1x16/16x16) or MXFP4 (pow2=True, 1x32) with fused kernels."""

        def __init__(self, tile=(1, 16), rht=False, stochastic=False, mx=False, weight=False):
            super().__init__(dtype=reference_utils.Fp4Formats.E2M1, pow_2_scales=mx, quant_tile_shape=tile,
                             with_rht=rht)
            self.stochastic, self.mx, self.weight = stochastic, mx, weight

        def _one(self, x, rht):
            """(payload, amax) of a 2-D x along its last dim."""
            if self.mx:   # no tensor scale: MXFP4 GEMMs take no alpha
                return fp4_payload.mxfp4_payload(x, stochastic=self.stochastic), None
            return fp4_payload.nvfp4_payload(x, tile=self.quant_tile_shape, rht=rht, stochastic=self.stochastic)

        def _weight_copies(self, w):
            """Both copies of a weight; NVFP4 16x16 tiles are symmetric, so columnwise is the rowwise transpose."""
            row, amax = self._one(w, rht=False)
            if not self.mx and self.quant_tile_shape[0] == 16:
                return row, amax, row.t(), amax
            col, amax_col = self._one(w.t(), rht=False)
            return row, amax, col, amax_col

        def _quantize(self, tensor):
            if self.weight:
                key = ("te-weight", self.mx, self.quant_tile_shape)
                row, amax, col, amax_col = cached(tensor, key, lambda: self._weight_copies(tensor))
                return row, _scale_field(row, amax), col, _scale_field(col, amax_col), amax, amax_col
            qx = qx_t = amax_row = amax_col = None
            if self.rowwise_usage:
                qx, amax_row = self._one(tensor, rht=False)
            if self.columnwise_usage:
                qx_t, amax_col = self._one(tensor.t(), rht=self.with_rht)
            sx, sx_t = _scale_field(qx, amax_row), _scale_field(qx_t, amax_col)
            amax_col = amax_row if amax_col is None else amax_col
            amax_row = amax_col if amax_row is None else amax_row
            return qx, sx, qx_t, sx_t, amax_row, amax_col

        def _fill(self, dst, src_shape, dtype, fields):
            qx, sx, qx_t, sx_t, amax_row, amax_col = fields
            dst.data, dst.scale, dst.data_t, dst.scale_t = qx, sx, qx_t, sx_t
            dst.global_amax_row, dst.global_amax_col = amax_row, amax_col
            dst.dtype, dst.quant_dtype, dst.original_shape = dtype, self.dtype, src_shape
            dst.persistent = (qx, sx, qx_t, sx_t) if self.weight else None
            return dst

        def quantize(self, tensor, *, out=None, **kwargs):  # noqa: ARG002 - TE passes dtype=...
            if tensor.dtype not in reference_utils.HIGH_PRECISION_FLOAT_DTYPES:
                raise TypeError(f"Unsupported input dtype {tensor.dtype}")
            if out is not None:
                return self.update_quantized(tensor, out)
            shape = tensor.shape
            flat = tensor.reshape(-1, shape[-1]) if tensor.ndim > 2 else tensor
            out = PrimusFP4TensorRef(device=tensor.device, _quantizer=self)
            return self._fill(out, shape, tensor.dtype, self._quantize(flat))

        def update_quantized(self, src, dst, *, noop_flag=None):
            if noop_flag is not None and noop_flag.item() != 0:
                return dst
            shape = src.shape
            flat = src.reshape(-1, shape[-1]) if src.ndim > 2 else src
            return self._fill(dst, shape, src.dtype, self._quantize(flat))

        def qgemm(self, qx, qw, m_params, out_dtype, sx, sw, bias=None, out=None, accumulate=False,
                  gemm_type=gemm.GEMMType.FPROP, qresult_x=None, qresult_w=None):
            amax_x = amax_w = None
            if not self.mx:
                if gemm_type == gemm.GEMMType.WGRAD:
                    amax_x, amax_w = qresult_x.global_amax_col, qresult_w.global_amax_col
                else:
                    amax_x, amax_w = qresult_x.global_amax_row, qresult_w.global_amax_row
            return fp4_payload.payload_gemm(qx, qw, out_dtype, amax_x, amax_w, bias=bias, out=out,
                                            accumulate=accumulate)

    return PrimusFP4Quantizer


def _is(role, kind: str) -> bool:
    return (role is not None and getattr(role, "module_type", "") in ("linear", "grouped_linear", "")
            and getattr(role, "tensor_type", "") == kind)


def _nvfp4(role, rht: bool, sr: bool):
    quantizer = _classes()
    if _is(role, "weight"):
        return quantizer(tile=(16, 16), weight=True)
    return quantizer(tile=(1, 16), rht=rht, stochastic=sr and _is(role, "grad_output"))


def nvfp4_factory(role):
    """NVFP4 emulation: weights 16x16, activations/grads 1x16, no RHT, round-to-nearest-even."""
    return _nvfp4(role, rht=False, sr=False)


def nvfp4_rht_factory(role):
    return _nvfp4(role, rht=True, sr=False)


def nvfp4_sr_factory(role):
    return _nvfp4(role, rht=False, sr=True)


def nvfp4_rht_sr_factory(role):
    """TE's NVFP4BlockScaling defaults: RHT on wgrad operands, stochastic rounding on gradients."""
    return _nvfp4(role, rht=True, sr=True)


def mxfp4_factory(role):
    """MXFP4 emulation (OCP MX v1.0): 1x32 blocks, E8M0 scales, every role, round-to-nearest-even."""
    return _classes()(tile=(1, 32), mx=True, weight=_is(role, "weight"))


def mxfp4_sr_factory(role):
    """MXFP4 emulation with stochastic rounding of the gradients (grad_output), as the local emulation rounds them."""
    return _classes()(tile=(1, 32), mx=True, weight=_is(role, "weight"), stochastic=_is(role, "grad_output"))


def rocm_mxfp4_factory(role):
    """Native MXFP4 on gfx950: delegate to ROCm TE's MXFP4BlockScaling quantizer factory."""
    from transformer_engine.common import recipe

    return _rocm_factory(recipe)(role)


@functools.lru_cache(maxsize=1)
def _rocm_factory(recipe):
    return recipe.MXFP4BlockScaling().qfactory
