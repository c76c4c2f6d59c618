"""fc1's adapter folded into the SwiGLU that reads its output (trainer.lora.fused_swiglu; null, the
default: wherever it applies; false: never).

A dense gated-SiLU MLP computes act = swiglu(u) with u = fc1(x) = u_base + s h B^T (h = x A^T, the rank-sized
adapter activation). Unfused, u is formed by an addmm over fc1's [tokens, 2 ffn] output (read u_base, write u) and
then read again by the activation: for Llama-3-8B at 8192 tokens that is two passes of 470 MB a layer more than the
frozen base makes. Here the activation kernel reads u_base and forms u tile by tile in registers (the rank-16 product
h B^T is a K=16 tensor-core dot inside the kernel): u is never written. Backward recomputes u the same way from the
kept u_base and h (the memory kept is the same: megatron keeps u) and writes du, from which dh = s du B and
dB = s du^T h are formed as in the unfused path.

    act = swiglu_lora(u_base, h, B, s)        # differentiable in u_base, h and B

On a GPU with Triton: the two kernels below (u in fp32 registers: the result differs from the unfused path only by
u's rounding to the activation dtype, which the unfused addmm makes). Elsewhere (CPU): the unfused ops themselves,
so the path is bit-identical there and only the wiring is exercised. tests/test_lora_swiglu.py runs the kernels in
Triton's CPU interpreter against the ops they replace.

`wire_fused_swiglu(model)` makes each eligible dense MLP (trainer.model.lora.inputs.swiglu_of holds, fc1 a LoRALinear
without post-dropout, not an expert) call fc1 for (u_base, h) and the fused activation instead of fc1's addmm and
megatron's swiglu; the MLP's other paths are megatron's own forward.
"""
from __future__ import annotations

import torch

from trainer.model.lora.inputs import dense_mlps, gated_silu, rewire_forward, swiglu_of
from trainer.model.lora.kernels import kernels_usable

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

if triton is not None:
    from trainer.model.swiglu_fp8 import _from_byte, _to_byte, fp8_conversions, swiglu_grads


def swiglu_lora_reference(u_base, h, b, scale: float, act=gated_silu) -> torch.Tensor:
    """The unfused ops: u = addmm(u_base, h, B^T, alpha=s) (trainer/model/lora/layers.py), then `act`, the SwiGLU
    megatron applies (trainer.model.lora.inputs.swiglu_of)."""
    u = torch.addmm(u_base.reshape(-1, u_base.shape[-1]), h.reshape(-1, h.shape[-1]), b.t(), alpha=scale)
    return act(u.view(u_base.shape))


if triton is not None:
    @triton.jit
    def _gate_up(u_ptr, h_ptr, b_ptr, rt, rn, T, N, R, su, sh, sb, scale, RP: tl.constexpr,
                 BYTES: tl.constexpr, HW: tl.constexpr):
        """(g, v, ug, uv): the gate and up halves of u = u_base + s h B^T for rows rt, columns rn, and the same of
        u_base alone, in fp32. BYTES: u_base is the FP8 store's e4m3fn bytes (uint8), decoded by swiglu_fp8's
        _from_byte (HW: the GPU's conversion, sm_89+; else the integer form, which an A100 and the interpreter run)."""
        rk = tl.arange(0, RP)
        mt, mn, mk = rt < T, rn < N, rk < R
        h = tl.load(h_ptr + rt[:, None] * sh + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
        bg = tl.load(b_ptr + rn[None, :] * sb + rk[:, None], mask=mn[None, :] & mk[:, None], other=0.0)
        bu = tl.load(b_ptr + (rn[None, :] + N) * sb + rk[:, None], mask=mn[None, :] & mk[:, None], other=0.0)
        m = mt[:, None] & mn[None, :]
        at = rt[:, None] * su + rn[None, :]
        if BYTES:
            ug = _from_byte(tl.load(u_ptr + at, mask=m, other=0), HW)
            uv = _from_byte(tl.load(u_ptr + at + N, mask=m, other=0), HW)
        else:
            ug = tl.load(u_ptr + at, mask=m, other=0.0).to(tl.float32)
            uv = tl.load(u_ptr + at + N, mask=m, other=0.0).to(tl.float32)
        return ug + scale * tl.dot(h, bg), uv + scale * tl.dot(h, bu), ug, uv

    @triton.jit
    def _fwd_kernel(u_ptr, h_ptr, b_ptr, o_ptr, q_ptr, T, N, R, su, sh, sb, so, sq, scale,
                    BT: tl.constexpr, BN: tl.constexpr, RP: tl.constexpr, STORE: tl.constexpr, HW: tl.constexpr):
        """act; STORE: also u_base's FP8 e4m3 byte (swiglu_fp8's saturating cast) into q, from the same read."""
        # int64 rows: rows x the row stride passes 2**31 at ~75k tokens of the 8B's fc1 (audit, 2026-12-06; kernels.py)
        rt = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        g, v, ug, uv = _gate_up(u_ptr, h_ptr, b_ptr, rt, rn, T, N, R, su, sh, sb, scale, RP, False, False)
        m = (rt < T)[:, None] & (rn < N)[None, :]
        act = g * tl.sigmoid(g) * v
        tl.store(o_ptr + rt[:, None] * so + rn[None, :], act.to(o_ptr.dtype.element_ty), mask=m)
        if STORE:
            qt = rt[:, None] * sq + rn[None, :]
            tl.store(q_ptr + qt, _to_byte(ug, HW), mask=m)
            tl.store(q_ptr + qt + N, _to_byte(uv, HW), mask=m)

    @triton.jit
    def _bwd_kernel(u_ptr, h_ptr, b_ptr, d_ptr, du_ptr, T, N, R, su, sh, sb, sd, sdu, scale,
                    BT: tl.constexpr, BN: tl.constexpr, RP: tl.constexpr, BYTES: tl.constexpr, HW: tl.constexpr):
        # int64 rows: rows x the row stride passes 2**31 at ~75k tokens of the 8B's fc1 (audit, 2026-12-06; kernels.py)
        rt = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        g, v, _, _ = _gate_up(u_ptr, h_ptr, b_ptr, rt, rn, T, N, R, su, sh, sb, scale, RP, BYTES, HW)
        m = (rt < T)[:, None] & (rn < N)[None, :]
        d = tl.load(d_ptr + rt[:, None] * sd + rn[None, :], mask=m, other=0.0).to(tl.float32)
        dg, dv = swiglu_grads(d, g, v)
        out_ty = du_ptr.dtype.element_ty
        tl.store(du_ptr + rt[:, None] * sdu + rn[None, :], dg.to(out_ty), mask=m)
        tl.store(du_ptr + rt[:, None] * sdu + rn[None, :] + N, dv.to(out_ty), mask=m)


_BT, _BN = 64, 64


def _launch(kernel, u2, h2, b, tensors, scale, **constexprs):
    """kernel over (rows of u, columns of one half): u2 [T, 2N], h2 [T, R], b [2N, R]; `tensors`: the kernel's
    further [T, *] arguments, each followed in the signature by its row stride."""
    t, n2 = u2.shape
    n, r = n2 // 2, h2.shape[1]
    rp = max(16, triton.next_power_of_2(r))
    grid = (triton.cdiv(t, _BT), triton.cdiv(n, _BN))
    kernel[grid](u2, h2, b, *tensors, t, n, r, u2.stride(0), h2.stride(0), b.stride(0),
                 *[x.stride(0) for x in tensors], float(scale), BT=_BT, BN=_BN, RP=rp, **constexprs)


class _SwigluLoRA(torch.autograd.Function):
    """fp8_store (precision.fp8_swiglu_input): u_base is kept for backward as float8 e4m3 (the cast megatron's
    activation_func_fp8_input_store makes of the whole u, saturated on every torch as swiglu_fp8's kernels write it;
    here only the base part is rounded, written by the forward kernel from its own read of u_base: s h B^T is added
    back exactly in the backward kernel, which reads the FP8 copy)."""

    @staticmethod
    def forward(ctx, u_base, h, b, scale, fp8_store=False):
        u2 = u_base.reshape(-1, u_base.shape[-1]).contiguous()
        h2 = h.reshape(-1, h.shape[-1]).contiguous()
        h_c, b_c = h2.to(u2.dtype), b.to(u2.dtype).contiguous()
        out = torch.empty(u2.shape[0], u2.shape[1] // 2, dtype=u2.dtype, device=u2.device)
        q = torch.empty(u2.shape, dtype=torch.uint8, device=u2.device) if fp8_store else out  # (out: unread)
        _launch(_fwd_kernel, u2, h_c, b_c, (out, q), scale, STORE=bool(fp8_store), HW=fp8_conversions(u2.device))
        ctx.scale, ctx.b_dtype, ctx.h_dtype, ctx.shape, ctx.u_dtype = scale, b.dtype, h.dtype, u_base.shape, u2.dtype
        ctx.save_for_backward(q.view(torch.float8_e4m3fn) if fp8_store else u2, h_c, b_c)
        return out.view(*u_base.shape[:-1], -1)

    @staticmethod
    def backward(ctx, dact):
        u2, h_c, b_c = ctx.saved_tensors
        store = u2.dtype == torch.float8_e4m3fn  # (read as bytes: Triton loads e4m3 only on sm_89+)
        u2 = u2.view(torch.uint8) if store else u2
        d2 = dact.reshape(-1, dact.shape[-1]).contiguous()
        du = torch.empty(u2.shape, dtype=ctx.u_dtype, device=u2.device)
        _launch(_bwd_kernel, u2, h_c, b_c, (d2, du), ctx.scale, BYTES=store, HW=fp8_conversions(u2.device))
        s = ctx.scale
        dh = du.mm(b_c).mul_(s)
        db = du.t().mm(h_c).mul_(s)
        return du.view(ctx.shape), dh.view(*ctx.shape[:-1], -1).to(ctx.h_dtype), db.to(ctx.b_dtype), None, None


def swiglu_lora(u_base: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scale: float, act=gated_silu,
                kernels: bool | None = None, fp8_store: bool = False) -> torch.Tensor:
    """act(u_base + scale * h B^T) without writing the sum (kernels: act is SiLU-gated), or by the unfused ops with
    `act` (no kernels). fp8_store: u_base kept in FP8 for backward (kernels only)."""
    if kernels is None:
        kernels = kernels_usable(u_base.device, h.shape[-1], u_base.dtype)
    if not kernels:
        if fp8_store:  # (wire_fused_swiglu refuses this before a step runs)
            raise RuntimeError("fused_swiglu with fp8_swiglu_input needs the Triton kernels")
        return swiglu_lora_reference(u_base, h, b.to(u_base.dtype), scale, act)
    return _SwigluLoRA.apply(u_base, h, b, scale, fp8_store)


def _mlp_forward(self, hidden_states, per_token_scale=None, **kwargs):
    """megatron's dense MLP forward with fc1's adapter folded into the activation (no bias, gated SiLU: checked when
    wired). Per-token scales (MoE routing) go to megatron's own forward; the other keywords a TransformerLayer passes
    (padding_mask) megatron's dense MLP ignores too."""
    if per_token_scale is not None:
        return self._primus_megatron_forward(hidden_states, per_token_scale, **kwargs)
    fc1 = self.linear_fc1
    u_base, h = fc1.forward_parts(hidden_states)
    act = swiglu_lora(u_base, h, fc1.lora_b, fc1.scale, self._primus_swiglu, fp8_store=self._primus_fp8_store)
    return self.linear_fc2(act)


def eligible(mlp, lora_cls) -> bool:
    fc1 = getattr(mlp, "linear_fc1", None)
    return (isinstance(fc1, lora_cls) and not fc1.is_expert and swiglu_of(mlp.config, fp8_store_ok=True) is not None
            and not (fc1.dropout is not None and fc1.dropout_position == "post"))


def wire_fused_swiglu(model, strict: bool = True) -> int:
    """Route every eligible dense MLP through swiglu_lora; returns how many were wired. With the FP8 SwiGLU input
    store (megatron's activation_func_fp8_input_store) the fused kernels keep fc1's output in FP8 as megatron would;
    a ConfigError where they cannot run (no Triton device: the unfused ops would drop the store), or, not `strict`
    (fused_swiglu null: wherever it applies), those MLPs keep the unfused path."""
    from trainer.config import ConfigError
    from trainer.model.lora.layers import LoRALinear

    wired = 0
    for _, module in dense_mlps(model):
        if not eligible(module, LoRALinear):
            continue
        fc2 = getattr(module, "linear_fc2", None)
        if getattr(fc2, "input_act", None) is not None:  # fc2's adapter recomputes swiglu(u): it needs u itself
            continue
        store = bool(getattr(module.config, "activation_func_fp8_input_store", False))
        rank = module.linear_fc1.lora_a.shape[0]
        usable = kernels_usable(module.linear_fc1.weight.device, rank, module.linear_fc1.weight.dtype)
        if store and not strict and (torch.version.hip or not usable):
            continue
        if store and not usable:
            raise ConfigError("trainer.lora.fused_swiglu with trainer.precision.fp8_swiglu_input needs its Triton "
                              "kernels (a GPU with Triton): the unfused ops here would not keep the FP8 copy")
        if store and torch.version.hip:  # e4m3fn loads in Triton: written for NVIDIA's FP8; ROCm's is e4m3fnuz
            raise ConfigError("trainer.lora.fused_swiglu with trainer.precision.fp8_swiglu_input is built for "
                              "NVIDIA's FP8 (e4m3fn) only; on ROCm set one of them to false")
        module._primus_fp8_store = store
        module.linear_fc1.swiglu_folded = True
        # what megatron applies (its forward: the store changes only what it keeps): the unfused path's activation
        module._primus_swiglu = swiglu_of(module.config, fp8_store_ok=True)
        rewire_forward(module, _mlp_forward)
        wired += 1
    return wired
