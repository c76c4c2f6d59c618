"""trainer.lora.fused (trainer/model/lora/fused.py) against the unfused adapter path: the same forward output, the
same gradients of A, B and the input; bitwise where the order of sums is unchanged (y, dA, dB), to the activation
dtype's rounding for dx (dh A is added in the GEMM's accumulator instead of being rounded first)."""
import pytest
import torch

from tests.model_helpers import FrozenLinear, tiny_cfg, train_losses
from trainer.model.lora.fused import fused_adapter
from trainer.model.lora.inputs import gated_silu


_Base = FrozenLinear



def _unfused(base, x, a, b, s, u=None):
    """trainer/model/lora/layers.py's unfused path: h = x A^T (or from u), y = addmm(out, h, B^T, alpha=s)."""
    from trainer.model.adapter_grads import adapter_a

    out, _ = base(x)
    h = adapter_a(x, a.to(out.dtype), u, gated_silu if u is not None else None)
    y = torch.addmm(out.reshape(-1, out.shape[-1]), h.reshape(-1, h.shape[-1]), b.to(out.dtype).t(), alpha=s)
    return y.view(out.shape)


def _run(path, dtype, recompute: bool, seed=0):
    g = torch.Generator().manual_seed(seed)
    din, dout, r, s = 48, 40, 4, 2.0
    base = _Base(torch.randn(dout, din, generator=g).to(dtype) * 0.2)
    a = (torch.randn(r, din, generator=g) * 0.3).requires_grad_(True)  # fp32 masters, as LoRALinear keeps them
    b = (torch.randn(dout, r, generator=g) * 0.3).requires_grad_(True)
    up = torch.randn(3, 7, dout, generator=g).to(dtype)
    if recompute:
        u = torch.randn(3, 7, 2 * din, generator=g).to(dtype).requires_grad_(True)
        x = gated_silu(u)
    else:
        u = None
        x = torch.randn(3, 7, din, generator=g).to(dtype).requires_grad_(True)
    if path == "fused":
        y, _ = fused_adapter(base, x, a, b, s, u=u, act=gated_silu if u is not None else None)
    else:
        y = _unfused(base, x, a, b, s, u)
    (y.float() * up.float()).sum().backward()
    leaf = u if recompute else x
    return y.detach(), a.grad, b.grad, leaf.grad


@pytest.mark.parametrize("recompute", [False, True], ids=["x-kept", "fc2-swiglu-recomputed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_adapter_matches_unfused(dtype, recompute):
    y0, da0, db0, dx0 = _run("unfused", dtype, recompute)
    y1, da1, db1, dx1 = _run("fused", dtype, recompute)
    assert torch.equal(y1, y0)  # the same addmm, written in place
    assert torch.equal(da1, da0) and torch.equal(db1, db0)  # the same products in the same order
    assert da0.dtype == torch.float32 and db0.dtype == torch.float32 and da0.abs().sum() > 0 and db0.abs().sum() > 0
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(dx1, dx0, **tol)
    assert dx0.abs().sum() > 0


def test_fused_recompute_keeps_the_preactivation_not_the_input():
    """With fc2's SwiGLU recomputed (trainer.model.lora.inputs), the fused node keeps u, never x = swiglu(u)."""
    torch.manual_seed(3)
    base, a, b = _Base(torch.randn(6, 5)), torch.randn(2, 5, requires_grad=True), torch.randn(6, 2)
    u = torch.randn(4, 10, requires_grad=True)
    x = gated_silu(u)
    ptrs = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: ptrs.append(t.untyped_storage().data_ptr()) or t,
                                                  lambda t: t):
        fused_adapter(base, x, a, b, 1.0, u=u, act=gated_silu)
    assert u.untyped_storage().data_ptr() in ptrs and x.untyped_storage().data_ptr() not in ptrs


def test_fused_adapter_dx_is_the_full_input_gradient():
    """dx = dy W + s (dy B) A: the tap really adds the adapter's part (a tap that dropped it would pass the
    base-only check)."""
    torch.manual_seed(1)
    w, a, b = torch.randn(6, 5), torch.randn(2, 5), torch.randn(6, 2)
    x = torch.randn(4, 5, requires_grad=True)
    dy = torch.randn(4, 6)
    y, _ = fused_adapter(_Base(w), x, a, b, 3.0)
    y.backward(dy)
    expected = dy @ w + 3.0 * (dy @ b) @ a
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.detach(), x.detach() @ w.t() + 3.0 * (x.detach() @ a.t()) @ b.t())


def test_fused_adapter_without_grad_is_the_forward():
    torch.manual_seed(2)
    base, a, b = _Base(torch.randn(6, 5)), torch.randn(2, 5), torch.randn(6, 2)
    x = torch.randn(4, 5)
    with torch.no_grad():
        y, _ = fused_adapter(base, x, a, b, 0.5)
    torch.testing.assert_close(y, _unfused(base, x, a, b, 0.5))


def _train_losses(fused: bool, iters: int = 20):
    def check(model):
        wrapped = [m for m in model.modules() if type(m).__name__ == "LoRALinear"]
        assert wrapped and all(m.uses_fused_path() == fused for m in wrapped)

    # fc1 not folded into the SwiGLU (on by default: tests/test_lora_swiglu.py), so every adapter takes the path
    return train_losses(tiny_cfg(trainer={"lora": {"fused": fused, "fused_swiglu": False}}), iters, seed=3,
                        check_model=check)


def test_tiny_model_trains_the_same_fused_and_unfused():
    """20 AdamW iterations of the tiny 2-layer model (every adapter on the fused path on CPU): the losses agree to
    1e-5 relative (fp32; only dx's summation order differs), and they fall."""
    ref, ours = _train_losses(False), _train_losses(True)
    assert ref[-1] < ref[0]
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=1e-5, atol=1e-6)


def test_which_layouts_take_the_fused_path():
    from trainer.model.lora.layers import LoRALinear

    kw = dict(leaf_name="linear_proj", dim=2, alpha=4.0, dropout=0.0, dropout_position="pre", a_init="xavier",
              b_init="zero", tp_rank=0, sequence_parallel=False, seed=0, fused=True)
    assert LoRALinear(_Base(torch.randn(6, 5)), tp_size=1, **kw).uses_fused_path()
    assert LoRALinear(_Base(torch.randn(6, 5)), tp_size=2, **kw).uses_fused_path()  # the collective sits between
    # pre-dropout is fused into A (tests/test_lora_epilogue.py pins it against the unfused path); post is not
    assert LoRALinear(_Base(torch.randn(6, 5)), tp_size=1, **{**kw, "dropout": 0.1}).uses_fused_path()
    assert not LoRALinear(_Base(torch.randn(6, 5)), tp_size=1,
                          **{**kw, "dropout": 0.1, "dropout_position": "post"}).uses_fused_path()
    assert not LoRALinear(_Base(torch.randn(6, 5)), tp_size=1, **{**kw, "fused": False}).uses_fused_path()
