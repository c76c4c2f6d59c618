"""trainer.precision.fp8_swiglu_kernels (trainer/model/swiglu_fp8.py) against megatron's own FP8 SwiGLU store on the
GPU: the same FP8 bytes kept wherever megatron's are finite (the kernels saturate past 448 on every torch; torch
2.11's cast, and so megatron's store, makes those NaN and their gradient NaN: 2026-12-07 on an H100), the activation
and the gradient to BF16 rounding, at the 70B's fc1 width (two halves of 28,672) over 2,048 tokens; and the tiny
model trained through the wiring against megatron's store. The CPU tests run the kernels in the interpreter
(tests/test_swiglu_fp8.py); only a GPU shows them beside megatron's compiled swiglu and its cast. Seconds."""
from __future__ import annotations

import pytest
import torch

import lifecycle_support as ls

if ls.device() != "cuda":
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytestmark = pytest.mark.gpu

TOKENS, FFN = 2048, 28672


def test_kernels_keep_megatrons_bytes_and_match_its_swiglu(record):
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

    from trainer.model.swiglu_fp8 import saturates, swiglu_fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    u = torch.randn(TOKENS, 1, 2 * FFN, device="cuda", dtype=torch.bfloat16, generator=g) * 3
    u[0, 0, :8] = torch.tensor([500.0, -470.0, 1e4, 2.0 ** -8, -(2.0 ** -9), 0.0, -0.0, 448.0], device="cuda")
    d = torch.randn(TOKENS, 1, FFN, device="cuda", dtype=torch.bfloat16, generator=g)
    outs = []
    for fn in (lambda x: bias_swiglu_impl(x, None, True, False), swiglu_fp8):
        x = u.clone().requires_grad_(True)
        kept = []  # what each keeps for its backward (megatron's output is a view made outside its Function)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            y = fn(x)
        y.backward(d)
        fp8 = [t for t in kept if t.dtype == torch.float8_e4m3fn]
        assert len(fp8) == 1 and fp8[0].numel() == u.numel(), [(t.dtype, t.shape) for t in kept]
        outs.append((y.detach(), x.grad, fp8[0]))
    (y0, g0, k0), (y1, g1, k1) = outs
    b0, b1 = k0.view(torch.uint8).reshape(-1), k1.view(torch.uint8).reshape(-1)
    over = (b0 & 0x7F) == 0x7F  # megatron's NaN bytes: u is finite here, so past 464 on a torch that does not saturate
    same_bytes = torch.equal(b0[~over], b1[~over])
    finite = g0.isfinite()
    act_diff = (y1.float() - y0.float()).abs()
    du_err = float((g1.float() - g0.float())[finite].norm() / g0.float()[finite].norm())
    record(kept_dtype=[str(k0.dtype), str(k1.dtype)], same_bytes=same_bytes, saturates=saturates(u.device),
           megatron_nan_bytes=int(over.sum()), megatron_nan_grads=int((~finite).sum()),
           act_max_abs=float(act_diff.max()), act_differing=int((act_diff > 0).sum()), du_rel_err=round(du_err, 6))
    assert k0.dtype == k1.dtype == torch.float8_e4m3fn and same_bytes
    negative = u.reshape(-1)[over] < 0
    assert torch.equal(b1[over], torch.where(negative, 0xFE, 0x7E).to(torch.uint8))  # ours: +-448
    assert int(over.sum()) == (0 if saturates(u.device) else 3)  # 500, -470, 1e4
    assert bool(g1.isfinite().all())
    torch.testing.assert_close(y1, y0, rtol=1.6e-2, atol=1e-2)
    assert du_err < 1e-2


def test_the_tiny_model_trains_through_the_wiring_like_megatrons_store(record):
    from tests.model_helpers import tiny_cfg, train_losses

    def run(kernels: bool):
        cfg = tiny_cfg(trainer={"precision": {"bf16": True, "fp8_swiglu_input": True, "fp8_swiglu_kernels": kernels},
                                "distributed": {"device": "cuda"}, "lora": {"fused_swiglu": False}})
        wired = []
        losses = train_losses(cfg, 8, seed=3, check_model=lambda m: wired.append(
            sum(hasattr(x, "_primus_megatron_forward") for x in m.modules())))
        return losses, wired

    ref, ref_wired = run(False)
    ours, wired = run(True)
    record(megatron=ref, kernels=ours, wired=[ref_wired, wired])
    assert ref_wired == [0] and wired == [2]
    assert ref[-1] < ref[0]
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=1e-2, atol=0)


def test_megatrons_own_store_saturates_once_installed(record, monkeypatch):
    """trainer/model/swiglu_store.py on this GPU's torch: where its cast does not saturate, install() points
    megatron's MLP and experts modules at the saturating functions. Against megatron's own (the dense SwiGLU, the
    experts' token-weighted one): the same activation, the same gradients wherever megatron's are finite, and finite
    where megatron's are NaN (500, -470 and 1e4 in the first token)."""
    import megatron.core.transformer.mlp as mlp
    import megatron.core.transformer.moe.experts as experts
    from megatron.core.fusions import fused_bias_swiglu as fbs

    from trainer.model import swiglu_store
    from trainer.model.swiglu_fp8 import saturates

    for module in (mlp, experts):  # (restored after the test; the experts module imports only the weighted one)
        for attr in ("bias_swiglu_impl", "weighted_bias_swiglu_impl"):
            if hasattr(module, attr):
                monkeypatch.setattr(module, attr, getattr(module, attr))
    installed = swiglu_store.install(torch.device("cuda"))
    assert installed == (not saturates(torch.device("cuda")))
    g = torch.Generator(device="cuda").manual_seed(1)
    u = torch.randn(TOKENS, 2 * FFN, device="cuda", dtype=torch.bfloat16, generator=g) * 3
    u[0, :3] = torch.tensor([500.0, -470.0, 1e4], device="cuda")
    w = torch.rand(TOKENS, 1, device="cuda", generator=g)
    d = torch.randn(TOKENS, FFN, device="cuda", dtype=torch.bfloat16, generator=g)
    rows = {}
    for name, theirs, ours, args in (("dense", fbs.bias_swiglu_impl, mlp.bias_swiglu_impl, (None, True)),
                                     ("experts", fbs.weighted_bias_swiglu_impl, experts.weighted_bias_swiglu_impl,
                                      (None, w, True))):
        got = []
        for fn in (theirs, ours):
            x = u.clone().requires_grad_(True)
            leaves = [a.clone().requires_grad_(True) if isinstance(a, torch.Tensor) else a for a in args]
            y = fn(x, *leaves)
            y.backward(d)
            got.append((y.detach(), x.grad, [a.grad for a in leaves if isinstance(a, torch.Tensor)]))
        (y0, g0, w0), (y1, g1, w1) = got
        finite = g0.isfinite()
        rows[name] = dict(megatron_nan_grads=int((~finite).sum()), ours_finite=bool(g1.isfinite().all()),
                          same_act=torch.equal(y0, y1), same_grads=torch.equal(g0[finite], g1[finite]))
        assert rows[name]["same_act"] and rows[name]["ours_finite"] and rows[name]["same_grads"], rows
        assert int((~finite).sum()) == (6 if installed else 0), rows  # (gate and up of columns 0-2)
        for a, b in zip(w0, w1):  # the per-token weights' gradient: megatron's NaN for the first token only
            assert bool(b.isfinite().all()) and torch.equal(a[1:], b[1:])
    record(installed=installed, **rows)


def test_the_fold_writes_the_saturated_copy_in_its_forward(record):
    """fused_swiglu's fold under the store (trainer/model/lora/swiglu.py): its forward kernel writes u_base's FP8
    copy from its own read, by the GPU's saturating conversion. The copy is fp8_copy's bytes (torch's cast where that
    is finite, +-448 past it), the activation the fold's without the store bit for bit, and the gradients those of the
    fold without the store run on the copy itself (bit for bit), finite where the inputs pass 448."""
    from trainer.model.lora.swiglu import swiglu_lora
    from trainer.model.swiglu_fp8 import fp8_copy

    g = torch.Generator(device="cuda").manual_seed(2)
    u = torch.randn(TOKENS, 2 * FFN, device="cuda", dtype=torch.bfloat16, generator=g) * 3
    u[0, :3] = torch.tensor([500.0, -470.0, 1e4], device="cuda")
    h = torch.randn(TOKENS, 16, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(2 * FFN, 16, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    d = torch.randn(TOKENS, FFN, device="cuda", dtype=torch.bfloat16, generator=g)

    def run(base, store):
        leaves = [t.clone().requires_grad_(True) for t in (base, h, b)]
        act = swiglu_lora(*leaves[:2], leaves[2], 0.5, kernels=True, fp8_store=store)
        kept = act.grad_fn.saved_tensors[0] if store else None
        act.backward(d)
        return act.detach(), [t.grad for t in leaves], kept

    act1, grads1, kept = run(u, True)
    act0, _, _ = run(u, False)
    _, grads_q, _ = run(kept.to(torch.bfloat16), False)
    same_bytes = torch.equal(kept.view(torch.uint8), fp8_copy(u).view(torch.uint8))
    same_grads = [torch.equal(a, c) for a, c in zip(grads1, grads_q)]
    record(same_bytes=same_bytes, same_act=torch.equal(act0, act1), same_grads=same_grads,
           first_bytes=kept.view(torch.uint8)[0, :3].tolist(), finite=[bool(x.isfinite().all()) for x in grads1])
    assert kept.dtype == torch.float8_e4m3fn and same_bytes
    assert kept.view(torch.uint8)[0, :3].tolist() == [0x7E, 0xFE, 0x7E]
    assert torch.equal(act0, act1) and all(same_grads) and all(x.isfinite().all() for x in grads1)
