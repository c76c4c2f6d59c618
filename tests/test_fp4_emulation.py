"""FP4 emulation on CPU through megatron local linears: shapes, gradients, bounded deviation, log line."""
import pytest
import torch

from trainer.precision import apply_emulation, describe, resolve
from trainer.precision.emulation import EmulationSpec, FP4EmulatedMatmul

from model_helpers import dist_session, packed_batch, perturb_adapters, tiny_cfg


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_emulated_matmul_forward_backward(fmt):
    torch.manual_seed(0)
    x = torch.randn(2, 48, 64, requires_grad=True)
    w = torch.randn(96, 64, requires_grad=True)
    spec = EmulationSpec(fmt=fmt)
    y = FP4EmulatedMatmul.apply(x, w, spec)
    ref = x @ w.t()
    assert y.shape == (2, 48, 96)
    rel = ((y - ref).norm() / ref.norm()).item()
    assert 0.01 < rel < 0.25                     # it does quantize, and stays close
    g = torch.randn_like(y)
    y.backward(g)
    dx_ref, dw_ref = g @ w, g.reshape(-1, 96).t() @ x.detach().reshape(-1, 64)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    for got, want in ((x.grad, dx_ref), (w.grad, dw_ref)):
        r = ((got - want).norm() / want.norm()).item()
        assert 0.01 < r < 0.3


def test_rht_and_sr_options_change_wgrad_only_as_expected():
    torch.manual_seed(1)
    x = torch.randn(64, 32)
    w = torch.randn(48, 32, requires_grad=True)
    g = torch.randn(64, 48)
    grads = {}
    for name, spec in {"plain": EmulationSpec("nvfp4"), "rht": EmulationSpec("nvfp4", rht=True)}.items():
        w.grad = None
        FP4EmulatedMatmul.apply(x, w, spec).backward(g)
        grads[name] = w.grad.clone()
    exact = g.t() @ x
    assert not torch.equal(grads["plain"], grads["rht"])
    for grad in grads.values():
        assert ((grad - exact).norm() / exact.norm()).item() < 0.3
    # stochastic rounding: the mean over many draws approaches the RNE-free product
    torch.manual_seed(2)
    acc = torch.zeros_like(exact)
    for _ in range(16):
        w.grad = None
        FP4EmulatedMatmul.apply(x, w, EmulationSpec("nvfp4", stochastic=True)).backward(g)
        acc += w.grad
    assert ((acc / 16 - exact).norm() / exact.norm()).item() < ((grads["plain"] - exact).norm() / exact.norm()).item()


def _cfg(**precision):
    base = {"bf16": False, "fp4": "e2m1", "fp4_emulation": True}
    base.update(precision)
    return tiny_cfg(trainer={"precision": base})


def _loss(model, batch):
    from trainer.model.forward import forward_losses

    losses = forward_losses(model, batch)
    return (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()


@pytest.mark.parametrize("precision,expect", [
    ({}, 8), ({"fp4_recipe": "mxfp4"}, 8), ({"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
                                            "num_layers_at_end_in_bf16": 0}, 4)])
def test_apply_emulation_on_tiny_gpt(precision, expect):
    from trainer.model.build import build, build_model
    from trainer.precision.emulation import emulated_layer_count

    cfg = _cfg(**precision)
    with dist_session(cfg):
        torch.manual_seed(0)
        model = build_model(tiny_cfg(trainer={"precision": {"bf16": False}}), torch.device("cpu"))  # not emulated
        perturb_adapters(model)
        batch = packed_batch(2, 32, [20, 30, 14], vocab=128)
        base_loss = _loss(model, batch).item()
        prec = resolve(cfg)
        n = apply_emulation(model, prec)
        assert n == expect                      # qkv, proj, fc1, fc2 per emulated layer
        assert apply_emulation(model, prec) == 0  # idempotent
        loss = _loss(model, batch)
        assert loss.item() != base_loss and abs(loss.item() - base_loss) < 0.05 * base_loss
        loss.backward()
        lora_grads = [p.grad for n_, p in model.named_parameters() if "lora" in n_]
        assert lora_grads and all(g is not None and torch.isfinite(g).all() for g in lora_grads)
        line = describe(prec, model)
        fmt = precision.get("fp4_recipe", "nvfp4").upper()
        assert line.startswith(f"precision | fp4 e2m1 | fp8 None | recipe {fmt}-emulated | tensor_class {fmt}EmulatedQDQ")
        assert f"emulated_linears {expect}" in line
        built = build(cfg, torch.device("cpu"), prec)  # the build applies it as its last transform
        assert built.lines[-1][0] == "fp4 emulation" and emulated_layer_count(built.model) == expect


def test_apply_emulation_inert_when_off():
    cfg = tiny_cfg()
    assert apply_emulation(torch.nn.Linear(2, 2), resolve(cfg)) == 0
    assert describe(resolve(cfg)).startswith("precision | fp4 None | fp8 None | recipe none | tensor_class torch.Tensor")
