"""Quantizer factories for TE's CustomRecipe (megatron-core `fp4_recipe: custom` + `fp4_quantizer_factory`).

megatron resolves e.g. `trainer.precision.te_factory.nvfp4_factory` and builds
CustomRecipe(qfactory=...); TE calls it with a QuantizerRole per GEMM operand. The quantizers subclass TE's
reference NVFP4QuantizerRef (so TE's custom-tensor plumbing is unchanged) but quantize with our fused
kernels (bit-equal to the reference) and run each GEMM as one bf16 GEMM on dequantized blocks with TE's
alpha = amax_a * amax_b / (6*6*448*448) epilogue, instead of the reference's per-16-column loop.
Roles: weight -> 16x16 tiles; input / grad_output -> 1x16, RHT on the columnwise (wgrad) copy when enabled,
stochastic rounding on grad_output when enabled. MXFP4: 1x32 E8M0 for every role.
Importing this module needs no TE; the factories need TE >= 2.9.
"""
from __future__ import annotations

import functools

import torch

from . import e2m1


def _dequant_blocks(codes: torch.Tensor, scale: torch.Tensor, rows: int, block: int, pow2: bool,
                    dtype: torch.dtype) -> torch.Tensor:
    """codes [r, k/2] + block scales -> [r, k] in dtype, without the per-tensor factor (exact in bf16)."""
    values = e2m1.decode(e2m1.unpack(codes), torch.float32)
    s = scale[:rows]
    s = torch.ldexp(torch.ones_like(s, dtype=torch.float32), s.to(torch.int32) - 127) if pow2 else s.float()
    return (values * s.repeat_interleave(block, dim=1)[:, : values.shape[1]]).to(dtype)


@functools.lru_cache(maxsize=1)
def _classes():
    from transformer_engine.pytorch.custom_recipes import gemm, reference_utils
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef

    from . import mxfp4, nvfp4

    class PrimusFP4Quantizer(NVFP4QuantizerRef):
        """NVFP4 (pow2=False, tiles 1x16/16x16) or MXFP4 (pow2=True, 1x32) with fused kernels."""

        def __init__(self, tile=(1, 16), rht=False, stochastic=False, mx=False):
            super().__init__(dtype=reference_utils.Fp4Formats.E2M1, pow_2_scales=mx, quant_tile_shape=tile,
                             with_rht=rht)
            self.stochastic, self.mx = stochastic, mx

        def _one(self, x, rht):
            if self.mx:
                if x.is_cuda and x.shape[-1] % 32 == 0:
                    from .fp4_triton import mxfp4_quantize

                    _, codes, scales = mxfp4_quantize(x, stochastic=self.stochastic)
                    return codes, scales, None
                q = mxfp4.quantize_ref(x, stochastic=self.stochastic)
                return q.data, q.scale, None
            if x.is_cuda and x.shape[-1] % 16 == 0:
                from .fp4_triton import nvfp4_quantize

                _, codes, scales, amax = nvfp4_quantize(x, tile=self.quant_tile_shape, rht=rht,
                                                        stochastic=self.stochastic)
                return codes, scales.view(torch.float8_e4m3fn), amax
            q = nvfp4.quantize_ref(x, tile=self.quant_tile_shape, rht=rht, stochastic=self.stochastic)
            return q.data, q.scale, q.amax

        def _quantize(self, tensor):
            qx = sx = qx_t = sx_t = amax_row = amax_col = None
            if self.rowwise_usage:
                qx, sx, amax_row = self._one(tensor, rht=False)
            if self.columnwise_usage:
                qx_t, sx_t, amax_col = self._one(tensor.t().contiguous(), rht=self.with_rht)
            if amax_col is None:
                amax_col = amax_row
            if amax_row is None:
                amax_row = amax_col
            return qx, sx, qx_t, sx_t, amax_row, amax_col

        def qgemm(self, qx, qw, m_params, out_dtype, sx, sw, bias=None, out=None, accumulate=False,
                  gemm_type=gemm.GEMMType.FPROP, qresult_x=None, qresult_w=None):
            block = 32 if self.mx else 16
            gemm_dtype = torch.bfloat16 if out_dtype in (torch.bfloat16, torch.float32) else out_dtype
            a = _dequant_blocks(qx, sx, qx.shape[0], block, self.mx, gemm_dtype)
            b = _dequant_blocks(qw, sw, qw.shape[0], block, self.mx, gemm_dtype)
            y = (a @ b.t()).float()
            if not self.mx:
                if gemm_type == gemm.GEMMType.WGRAD:
                    alpha = qresult_x.global_amax_col * qresult_w.global_amax_col
                else:
                    alpha = qresult_x.global_amax_row * qresult_w.global_amax_row
                y = y * (alpha.float() / (6.0 * 6.0 * 448.0 * 448.0))
            if bias is not None:
                y = y + bias.float()
            if accumulate:
                y = y + out.float()
            return y.to(out_dtype)

    return PrimusFP4Quantizer


def _is(role, kind: str) -> bool:
    return (role is not None and getattr(role, "module_type", "") in ("linear", "grouped_linear", "")
            and getattr(role, "tensor_type", "") == kind)


def _nvfp4(role, rht: bool, sr: bool):
    quantizer = _classes()
    if _is(role, "weight"):
        return quantizer(tile=(16, 16))
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
    """MXFP4 emulation (OCP MX v1.0): 1x32 blocks, E8M0 scales, every role."""
    return _classes()(tile=(1, 32), mx=True)


def rocm_mxfp4_factory(role):
    """Native MXFP4 on gfx950: delegate to ROCm TE's MXFP4BlockScaling quantizer factory."""
    from transformer_engine.common import recipe

    return _rocm_factory(recipe)(role)


@functools.lru_cache(maxsize=1)
def _rocm_factory(recipe):
    return recipe.MXFP4BlockScaling().qfactory
