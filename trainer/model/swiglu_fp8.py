"""The FP8 SwiGLU input store in two Triton passes (trainer.precision.fp8_swiglu_kernels, with fp8_swiglu_input).

megatron's store (activation_func_fp8_input_store) keeps fc1's output u for the SwiGLU's backward as
u.to(float8_e4m3fn), a cast pass after the activation's own read of u, and its backward first copies that back to
16 bits (u8.to(bfloat16)) before the SwiGLU's backward reads it. On the Llama2-70B shape on an H200 those two passes
took ~190 ms of a 2,941 ms step (bench/results/2026-12-06i_h200_speed: the copy back runs at 0.83 TB/s). Here the
forward kernel reads u once and writes both the activation and the FP8 copy; the backward kernel reads the FP8 copy
and the incoming gradient and writes du. Nothing else is written.

    act = swiglu_fp8(u)      # u [..., 2 ffn]: act = silu(u_gate) * u_up, u kept as float8_e4m3fn

The copy is a saturating cast: torch 2.13's own bit for bit (the byte c10's fp8e4m3fn_from_fp32_value makes: round
to nearest even, subnormals, finite magnitudes past 448 to 448). Older torch (2.11, the H100/H200 stack's) makes
those NaN, and so megatron's store a NaN gradient for every fc1 output past 464 in magnitude (measured on an H100,
bench/results/2026-12-07_h100_lifecycle): the kernels saturate on every torch, so their bytes are megatron's
wherever megatron's are finite, and `fp8_copy` is the same cast in torch ops (fused_swiglu's fold keeps it). A GPU
of compute capability 8.9+ converts with its own instruction (cvt.rn.satfinite: the same bytes but a NaN's sign
bit); an A100, whose Triton has no e4m3, and the interpreter by integer operations that follow c10's code
(e4m3fn_byte; fp8_conversions picks). The backward decodes the bytes exactly (the GPU's conversion, or
e4m3fn_value). The gradient is therefore megatron's at the same FP8 copy, to fp32 rounding (u in fp32 registers),
and the activation megatron's to one rounding of the fp32 result.
tests/test_swiglu_fp8.py runs both kernels in Triton's CPU interpreter against torch's cast and the unfused ops;
tests/test_triton_sm90.py compiles both forms for sm_90 and the integer form for sm_80; tests/gpu/test_swiglu_fp8.py
holds the GPU's bytes to megatron's.

`wire_swiglu_fp8(model)` routes every dense gated-SiLU MLP that keeps its input in FP8 and whose fc1 adapter
fused_swiglu did not fold (its kernels read their own FP8 copy, trainer/model/lora/swiglu.py) through these kernels;
MoE experts, activation offload (megatron marks its saved input for the host) and everything else keep megatron's
functions, whose copy trainer/model/swiglu_store.py saturates where torch's cast does not.
"""
from __future__ import annotations

import functools

import torch

from trainer.model.lora.inputs import dense_mlps, gated_silu, rewire_forward, swiglu_of

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

_BT, _BN = 32, 128


if triton is not None:
    @triton.jit
    def e4m3fn_byte(x):
        """torch 2.13's float32 -> float8_e4m3fn byte (c10 fp8e4m3fn_from_fp32_value), as int32: finite magnitudes
        past 448 (rounded) become 448, a NaN stays NaN."""
        bits = x.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        a = bits & 0x7FFFFFFF
        # below 2^-6: adding 2^14 rounds to a multiple of 2^-9 (nearest even); the low bits are the subnormal code
        sub = (a.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - (141 << 23)
        odd = (a >> 20) & 1
        normal = (a - (120 << 23) + 0x7FFFF + odd) >> 20
        code = tl.where(a >= 0x43F00000, 0x7F, tl.where(a < (121 << 23), sub, normal))
        code = tl.where((code == 0x7F) & (a <= 0x7F800000), 0x7E, code)  # (saturate; a NaN stays NaN)
        return code | sign

    @triton.jit
    def e4m3fn_value(byte):
        """The float32 value of a float8_e4m3fn byte (int32 0..255): exact."""
        e = (byte >> 3) & 0xF
        m = byte & 0x7
        bits = tl.where((e == 15) & (m == 7), 0x7FC00000, ((e + 120) << 23) | (m << 20))  # (S.1111.111: NaN)
        mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, bits.to(tl.float32, bitcast=True))  # m x 2^-9
        return tl.where(byte >= 128, -mag, mag)

    @triton.jit
    def swiglu_grads(d, g, v):
        """(d act / d gate, d act / d up) x d for act = silu(g) v, in fp32 (megatron's swiglu_back)."""
        sig = tl.sigmoid(g)
        return d * v * sig * (1.0 + g * (1.0 - sig)), d * g * sig

    @triton.jit
    def _to_byte(x, HW: tl.constexpr):
        """HW: the GPU's own conversion (cvt.rn.satfinite on sm_89+: round to nearest even, saturating; ~20
        integer operations an element fewer); else e4m3fn_byte."""
        if HW:
            return x.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        return e4m3fn_byte(x).to(tl.uint8)

    @triton.jit
    def _from_byte(byte, HW: tl.constexpr):
        """The float32 value of a kept byte: the GPU's conversion (exact), or e4m3fn_value (the interpreter)."""
        if HW:
            return byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return e4m3fn_value(byte.to(tl.int32))

    @triton.jit
    def _fwd_kernel(u_ptr, o_ptr, q_ptr, T, N, su, so, sq, HW: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
        rt = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)  # int64 rows: rows x stride can pass 2**31
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        m = (rt < T)[:, None] & (rn < N)[None, :]
        at = rt[:, None] * su + rn[None, :]
        g = tl.load(u_ptr + at, mask=m, other=0.0).to(tl.float32)
        v = tl.load(u_ptr + at + N, mask=m, other=0.0).to(tl.float32)
        tl.store(o_ptr + rt[:, None] * so + rn[None, :], (g * tl.sigmoid(g) * v).to(o_ptr.dtype.element_ty), mask=m)
        qt = rt[:, None] * sq + rn[None, :]
        tl.store(q_ptr + qt, _to_byte(g, HW), mask=m)
        tl.store(q_ptr + qt + N, _to_byte(v, HW), mask=m)

    @triton.jit
    def _bwd_kernel(q_ptr, d_ptr, du_ptr, T, N, sq, sd, sdu, HW: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
        rt = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        m = (rt < T)[:, None] & (rn < N)[None, :]
        qt = rt[:, None] * sq + rn[None, :]
        g = _from_byte(tl.load(q_ptr + qt, mask=m, other=0), HW)
        v = _from_byte(tl.load(q_ptr + qt + N, mask=m, other=0), HW)
        d = tl.load(d_ptr + rt[:, None] * sd + rn[None, :], mask=m, other=0.0).to(tl.float32)
        dg, dv = swiglu_grads(d, g, v)
        at = rt[:, None] * sdu + rn[None, :]
        tl.store(du_ptr + at, dg.to(du_ptr.dtype.element_ty), mask=m)
        tl.store(du_ptr + at + N, dv.to(du_ptr.dtype.element_ty), mask=m)


@functools.lru_cache(maxsize=None)
def saturates(device: torch.device) -> bool:
    """Whether this torch's float8_e4m3fn cast on `device` saturates finite overflow to 448 (2.13: yes; 2.11 on
    CUDA makes it NaN). Asked of torch once a device (fp8_copy, and swiglu_store.install for megatron's store)."""
    probe = torch.tensor([1e6, 470.0], device=device).to(torch.float8_e4m3fn).view(torch.uint8)
    return bool((probe == 0x7E).all())


@functools.lru_cache(maxsize=None)
def fp8_conversions(device: torch.device) -> bool:
    """Whether the kernels convert with the GPU's own FP8 instructions (HW): NVIDIA compute capability 8.9 and later
    (Ada, Hopper, Blackwell). Triton refuses e4m3 (fp8e4nv) on an A100 (sm_80/86), ROCm's FP8 is e4m3fnuz, and the
    interpreter has none: there the integer form (e4m3fn_byte, e4m3fn_value) writes and reads the same bytes."""
    return (device.type == "cuda" and not torch.version.hip
            and tuple(torch.cuda.get_device_capability(device)) >= (8, 9))


class _SwigluFP8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u):
        u2 = u.reshape(-1, u.shape[-1]).contiguous()
        t, n = u2.shape[0], u2.shape[1] // 2
        out = torch.empty(t, n, dtype=u2.dtype, device=u2.device)
        q = torch.empty(u2.shape, dtype=torch.uint8, device=u2.device)
        grid = (triton.cdiv(t, _BT), triton.cdiv(n, _BN))
        _fwd_kernel[grid](u2, out, q, t, n, u2.stride(0), out.stride(0), q.stride(0),
                          HW=fp8_conversions(u2.device), BT=_BT, BN=_BN)
        ctx.save_for_backward(q.view(torch.float8_e4m3fn))  # (what megatron keeps, saturated: the same dtype)
        ctx.shape, ctx.dtype = u.shape, u.dtype
        return out.view(*u.shape[:-1], n)

    @staticmethod
    def backward(ctx, dact):
        (q8,) = ctx.saved_tensors
        q = q8.view(torch.uint8)
        d2 = dact.reshape(-1, dact.shape[-1]).contiguous()
        du = torch.empty(q.shape, dtype=ctx.dtype, device=q.device)
        t, n = q.shape[0], q.shape[1] // 2
        grid = (triton.cdiv(t, _BT), triton.cdiv(n, _BN))
        _bwd_kernel[grid](q, d2, du, t, n, q.stride(0), d2.stride(0), du.stride(0),
                          HW=fp8_conversions(q.device), BT=_BT, BN=_BN)
        return du.view(ctx.shape)


def swiglu_fp8(u: torch.Tensor) -> torch.Tensor:
    """silu(u_gate) * u_up, differentiable in u, keeping only u's FP8 e4m3 copy for the backward (Triton)."""
    if triton is None:
        raise RuntimeError("trainer.precision.fp8_swiglu_kernels needs Triton")
    return _SwigluFP8.apply(u)


def fp8_copy(u: torch.Tensor) -> torch.Tensor:
    """u as float8_e4m3fn, finite magnitudes past 448 saturated on every torch (the kernels' copy): torch's cast,
    after a clamp where this torch's cast would make them NaN (saturates)."""
    if not saturates(u.device):
        u = u.clamp(-448.0, 448.0)  # (a NaN stays NaN)
    return u.to(torch.float8_e4m3fn)


def swiglu_fp8_reference(u: torch.Tensor) -> torch.Tensor:
    """The same function by megatron's ops: the activation from u, its backward at fp8_copy(u) in u's dtype
    (megatron's SwiGLUFunction with fp8_input_store, the unfused math, with the kernels' saturating copy)."""
    return _Reference.apply(u)


class _Reference(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(fp8_copy(u))
        ctx.dtype = u.dtype
        return gated_silu(u)

    @staticmethod
    def backward(ctx, d):
        (q,) = ctx.saved_tensors
        with torch.enable_grad():
            u = q.to(ctx.dtype).detach().requires_grad_(True)
            act = gated_silu(u)
        return torch.autograd.grad(act, u, d)[0]


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the kernels run: an NVIDIA GPU with Triton, 16-bit activations (fp8_swiglu_input's e4m3fn is NVIDIA's
    FP8; the contract asks for BF16)."""
    return (triton is not None and device.type == "cuda" and not torch.version.hip
            and dtype in (torch.bfloat16, torch.float16))


def _store_forward(self, hidden_states, per_token_scale=None, **kwargs):
    """megatron's dense MLP forward with the SwiGLU through swiglu_fp8 (no bias: checked when wired). Per-token
    scales (MoE routing) go to megatron's own forward."""
    if per_token_scale is not None:
        return self._primus_megatron_forward(hidden_states, per_token_scale, **kwargs)
    u, _ = self.linear_fc1(hidden_states)
    return self.linear_fc2(swiglu_fp8(u))


def wire_swiglu_fp8(model) -> int:
    """Route every dense MLP that keeps its SwiGLU input in FP8 and is not already rewired (fused_swiglu's fold)
    through swiglu_fp8; returns how many. Leaves MoE experts and activation offload to megatron."""
    wired = 0
    for _, module in dense_mlps(model):
        if hasattr(module, "_primus_megatron_forward"):  # (rewired: fused_swiglu's fold)
            continue
        config = module.config  # (megatron keeps the FP8 copy only in its fused bias_swiglu)
        if not (getattr(config, "activation_func_fp8_input_store", False) and config.bias_activation_fusion) \
                or getattr(config, "cpu_offloading", False):
            continue
        if swiglu_of(config, fp8_store_ok=True) is None or getattr(module.linear_fc2, "input_act", None) is not None:
            continue
        rewire_forward(module, _store_forward)
        wired += 1
    return wired

