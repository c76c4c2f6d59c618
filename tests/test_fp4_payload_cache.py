"""Frozen-weight quantization cache and the bf16 payload GEMM used by the TE CustomRecipe quantizers (CPU)."""
import gc

import pytest
import torch

from trainer.precision import fp4_payload, nvfp4, weight_cache
from trainer.precision.emulation import EmulationSpec, FP4EmulatedMatmul


@pytest.fixture(autouse=True)
def _fresh_cache():
    weight_cache.clear()
    yield
    weight_cache.clear()


def test_cache_computes_once_per_weight_version_and_skips_trainable():
    w = torch.randn(32, 64)
    calls = []

    def compute():
        calls.append(1)
        return w * 2

    a = weight_cache.cached(w, "k", compute)
    b = weight_cache.cached(w, "k", compute)
    assert a is b and len(calls) == 1
    weight_cache.cached(w, "other", compute)
    assert len(calls) == 2                          # keys are separate
    with torch.no_grad():
        w.add_(1.0)                                 # in-place update bumps _version: recompute
    c = weight_cache.cached(w, "k", compute)
    assert len(calls) == 3 and torch.equal(c, w * 2)
    t = torch.randn(8, 16, requires_grad=True)
    weight_cache.cached(t, "k", compute)
    weight_cache.cached(t, "k", compute)
    assert len(calls) == 5                          # trainable weights are never cached


def test_cache_entries_die_with_the_weight_and_env_switch(monkeypatch):
    w = torch.randn(16, 16)
    weight_cache.cached(w, "k", lambda: w + 1)
    assert weight_cache.size() == 1
    del w
    gc.collect()
    assert weight_cache.size() == 0
    monkeypatch.setenv("PRIMUS_FP4_WEIGHT_CACHE", "0")
    v = torch.randn(16, 16)
    weight_cache.cached(v, "k", lambda: v + 1)
    assert weight_cache.size() == 0


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_frozen_weight_matmul_uses_cache_and_matches_uncached(fmt, monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(48, 64, requires_grad=True)
    w = torch.randn(96, 64)                          # frozen (LoRA base)
    g = torch.randn(48, 96)
    spec = EmulationSpec(fmt)
    outs = []
    for _ in range(2):
        x.grad = None
        y = FP4EmulatedMatmul.apply(x, w, spec)
        y.backward(g)
        outs.append((y.detach(), x.grad.clone()))
    assert weight_cache.size() == (1 if fmt == "nvfp4" else 2)   # NVFP4 16x16 serves fprop and dgrad
    monkeypatch.setenv("PRIMUS_FP4_WEIGHT_CACHE", "0")
    x.grad = None
    y = FP4EmulatedMatmul.apply(x, w, spec)
    y.backward(g)
    for got_y, got_dx in outs:
        assert torch.equal(got_y, y.detach()) and torch.equal(got_dx, x.grad)


def test_nvfp4_payload_is_block_values_and_gemm_applies_alpha():
    torch.manual_seed(1)
    x = torch.randn(64, 128) * 3
    w = torch.randn(32, 128)
    px, ax = fp4_payload.nvfp4_payload(x)
    pw, aw = fp4_payload.nvfp4_payload(w, tile=(16, 16))
    assert px.dtype == torch.bfloat16 and torch.equal(ax, x.abs().max().view(1))
    # payload x tensor scale == the reference QDQ (the payload itself is exact in bf16)
    q = nvfp4.quantize_ref(x)
    assert torch.equal(px.float(), fp4_payload.nvfp4_block_values(q, torch.float32))
    assert torch.allclose(px.float() * (ax / 2688.0), nvfp4.qdq_ref(x), rtol=1e-6, atol=0)
    y = fp4_payload.payload_gemm(px, pw, torch.bfloat16, ax, aw)
    alpha = (ax * aw).float() / fp4_payload.ALPHA_DIVISOR
    assert torch.equal(y, ((px @ pw.t()).float() * alpha).bfloat16())
    ref = nvfp4.qdq_ref(x) @ nvfp4.qdq_ref(w, tile=(16, 16)).t()
    assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2
    # transposed view operand (dgrad with the cached weight), bias and accumulation
    yt = fp4_payload.payload_gemm(px[:, :32].contiguous(), pw.t()[:, :32], torch.float32, ax, aw)
    assert torch.equal(yt, (px[:, :32] @ pw[:32]).float() * alpha)
    bias, acc = torch.randn(32), torch.randn(64, 32)
    yb = fp4_payload.payload_gemm(px, pw, torch.float32, ax, aw, bias=bias, out=acc, accumulate=True)
    assert torch.allclose(yb, (px @ pw.t()).float() * alpha + bias + acc)


def test_mxfp4_payload_is_the_qdq():
    from trainer.precision import mxfp4

    x = torch.randn(16, 64) * 100
    assert torch.equal(fp4_payload.mxfp4_payload(x), mxfp4.qdq_ref(x).bfloat16())
    assert torch.equal(fp4_payload.mxfp4_payload(x.t()), mxfp4.qdq_ref(x.t().contiguous()).bfloat16())


def test_the_recipes_fp8_weight_cache_false_turns_the_fp4_copies_off():
    """trainer.precision.fp8_weight_cache: false (weight_cache.configure at the build) keeps no FP4 payload copy, as
    it keeps no TE copy; it was read only by TE, so the FP4 emulation cached whatever the recipe said."""
    w = torch.randn(16, 16)
    try:
        weight_cache.configure(False)
        weight_cache.cached(w, "k", lambda: w + 1)
        assert weight_cache.size() == 0
    finally:
        weight_cache.configure(True)
    weight_cache.cached(w, "k", lambda: w + 1)
    assert weight_cache.size() == 1
