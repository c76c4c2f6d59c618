"""fc2 adapter input recomputed in backward (trainer.model.lora_inputs): same gradients, x not kept."""
import pytest
import torch
import torch.nn.functional as F

from tests.model_helpers import dist_session, packed_batch, perturb_adapters, tiny_cfg
from trainer.model import adapter_state_dict, build_model, forward_losses, load_adapter_state_dict
from trainer.model.lora_inputs import adapter_a


def _swiglu(y):
    y1, y2 = torch.chunk(y, 2, dim=-1)
    return F.silu(y1) * y2


def _saved_storages(fn):
    """Run fn() and return the data pointers of every tensor autograd saved meanwhile."""
    ptrs = []

    def pack(t):
        ptrs.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, set(ptrs)


def test_adapter_keeps_preactivation_not_input_and_matches_plain_linear():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(3, 5, 2 * 24, generator=g).requires_grad_(True)
    a = torch.randn(4, 24, generator=g).requires_grad_(True)
    up = torch.randn(3, 5, 4, generator=g)

    def run(recompute: bool):
        u.grad = a.grad = None
        x = _swiglu(u)
        h, saved = _saved_storages(lambda: adapter_a(x, a, u if recompute else None, _swiglu))
        (h * up).sum().backward()
        return h.detach(), u.grad.clone(), a.grad.clone(), saved, x.untyped_storage().data_ptr()

    h0, du0, da0, saved0, x0 = run(False)
    h1, du1, da1, saved1, x1 = run(True)
    assert x0 in saved0  # the plain path keeps x ...
    assert x1 not in saved1 and u.untyped_storage().data_ptr() in saved1  # ... ours keeps u instead
    assert torch.equal(h0, h1)
    torch.testing.assert_close(da1, da0, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(du1, du0, rtol=1e-6, atol=1e-6)
    assert da1.abs().sum() > 0 and du1.abs().sum() > 0


def _count_nodes(root, name: str) -> int:
    seen, stack, n = set(), [root], 0
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        n += type(fn).__name__ == name
        stack.extend(f for f, _ in fn.next_functions)
    return n


@pytest.mark.parametrize("recompute", [None, "full"])
def test_model_grads_equal_with_and_without_adapter_input_recompute(recompute):
    batch = packed_batch(2, 32, [30, 9, 21], vocab=128, seed=4)
    grads, sd = {}, None
    for on in (False, True):
        cfg = tiny_cfg(trainer={"recompute": {"adapter_inputs": on, "granularity": recompute}})
        with dist_session(cfg) as info:
            model = build_model(cfg, info.device)
            if sd is None:
                perturb_adapters(model, seed=5)
                sd = {k: v.clone() for k, v in adapter_state_dict(model).items()}
            load_adapter_state_dict(model, sd)
            losses = forward_losses(model, batch)
            loss = (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
            if recompute is None:  # (under full recompute the layers' graphs are built in backward)
                assert _count_nodes(loss.grad_fn, "_AdapterAFromRecomputedInputBackward") == (2 if on else 0)
            loss.backward()
            grads[on] = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert set(grads[True]) == set(grads[False]) and len(grads[True]) == 16
    for n, ref in grads[False].items():
        assert ref.abs().sum() > 0, n
        torch.testing.assert_close(grads[True][n], ref, rtol=1e-5, atol=1e-7)


def test_pre_dropout_adapter_is_not_rewired():
    cfg = tiny_cfg(trainer={"lora": {"dropout": 0.1, "dropout_position": "pre"}})
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        fc2 = model.decoder.layers[0].mlp.linear_fc2
        assert fc2.input_act is None
    cfg = tiny_cfg(trainer={"lora": {"dropout": 0.1, "dropout_position": "post"}})
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        assert model.decoder.layers[0].mlp.linear_fc2.input_act is not None


@pytest.mark.parametrize("kind,zero_centered", [("RMSNorm", False), ("RMSNorm", True), ("LayerNorm", False)])
def test_norm_adapter_keeps_norm_input_and_matches_reference(kind, zero_centered):
    from types import SimpleNamespace

    from trainer.model.lora_inputs import adapter_a_of_norm, norm_of

    g = torch.Generator().manual_seed(1)
    hidden = 32
    base = SimpleNamespace(layer_norm_weight=torch.rand(hidden, generator=g) + 0.5, eps=1e-5,
                           layer_norm_bias=torch.randn(hidden, generator=g) if kind == "LayerNorm" else None,
                           normalization=kind, zero_centered_gamma=zero_centered)
    norm = norm_of(base)
    w = base.layer_norm_weight + (1.0 if zero_centered else 0.0)
    x = torch.randn(4, 3, hidden, generator=g, dtype=torch.float64).float().requires_grad_(True)
    ref_norm = (F.rms_norm(x, (hidden,), w, 1e-5) if kind == "RMSNorm"
                else F.layer_norm(x, (hidden,), w, base.layer_norm_bias, 1e-5))
    torch.testing.assert_close(norm(x), ref_norm, rtol=1e-6, atol=1e-6)
    a = torch.randn(4, hidden, generator=g).requires_grad_(True)
    up = torch.randn(4, 3, 4, generator=g)

    def run(ours: bool):
        x.grad = a.grad = None
        if ours:
            h, saved = _saved_storages(lambda: adapter_a_of_norm(x, a, norm))
        else:
            h, saved = _saved_storages(lambda: F.linear(norm(x), a))
        (h * up).sum().backward()
        return h.detach(), x.grad.clone(), a.grad.clone(), saved

    h0, dx0, da0, saved0 = run(False)
    h1, dx1, da1, saved1 = run(True)
    assert torch.equal(h0, h1)
    assert saved1 == {x.untyped_storage().data_ptr(), a.untyped_storage().data_ptr()}
    assert len(saved0) > len(saved1)  # the plain path also keeps the normed copy (and norm temporaries)
    torch.testing.assert_close(dx1, dx0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(da1, da0, rtol=1e-5, atol=1e-6)
    assert dx1.abs().sum() > 0
