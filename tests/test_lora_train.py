"""LoRA on a real megatron-core GPTModel (CPU, gloo): what trains, what stays frozen, recompute."""
import pytest
import torch

from tests.model_helpers import dist_session, models_with_same_adapters, packed_batch, perturb_adapters, tiny_cfg
from trainer.model import adapter_state_dict, build_model, forward_losses
from trainer.model.lora.layers import LoRALinear, lora_modules


def _loss(model, batch):
    losses = forward_losses(model, batch)
    return (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()


def test_lora_wraps_targets_and_freezes_base():
    cfg = tiny_cfg(trainer={"lora": {"exclude_modules": ["decoder.layers.1.mlp.*"]}})
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        wrapped = lora_modules(model)
        assert len(wrapped) == 4 * 2 - 2  # layer 1's fc1/fc2 excluded
        assert not isinstance(model.decoder.layers[1].mlp.linear_fc1, LoRALinear)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        assert trainable == set(adapter_state_dict(model))
        assert all(n.endswith((".lora_a", ".lora_b")) for n in trainable)
        qkv = model.decoder.layers[0].self_attention.linear_qkv
        assert qkv.lora_a.shape == (4, 64) and qkv.lora_b.shape == (128, 4)
        assert torch.count_nonzero(qkv.lora_b) == 0 and torch.count_nonzero(qkv.lora_a) > 0


def test_lora_trains_adapters_only():
    cfg = tiny_cfg()
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        batch = packed_batch(2, 32, [20, 17, 25], vocab=128, seed=1)
        losses = []
        for _ in range(12):
            opt.zero_grad()
            loss = _loss(model, batch)
            loss.backward()
            for n, p in model.named_parameters():
                if p.requires_grad:
                    assert p.grad is not None, n
                else:
                    assert p.grad is None, n
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0] - 0.5, losses
        for n, p in model.named_parameters():
            if not p.requires_grad:
                assert torch.equal(p, base_before[n]), n


@pytest.mark.parametrize("granularity", ["full", "selective"])
def test_recompute_gives_same_adapter_grads(granularity):
    batch = packed_batch(2, 32, [30, 9, 21], vocab=128, seed=2)
    grads = {}
    grans = (None, granularity)
    cfgs = [tiny_cfg(trainer={"recompute": {"granularity": g, "method": "uniform", "num_layers": 1}}) for g in grans]
    for gran, (_, model) in zip(grans, models_with_same_adapters(cfgs, seed=3)):
        assert model.config.recompute_granularity == gran
        _loss(model, batch).backward()
        grads[gran] = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    ref, got = grads[None], grads[granularity]
    assert set(ref) == set(got) and len(ref) == 16
    for n in ref:
        assert ref[n].abs().sum() > 0, n
        torch.testing.assert_close(got[n], ref[n], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_dropout_is_active_in_train_mode_only(position):
    cfg = tiny_cfg(trainer={"lora": {"dropout": 0.5, "dropout_position": position}})
    batch = packed_batch(1, 32, [32], vocab=128, seed=4)
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        perturb_adapters(model, seed=5, std=0.3)
        model.eval()
        with torch.no_grad():
            a, b = forward_losses(model, batch), forward_losses(model, batch)
        torch.testing.assert_close(a, b)
        model.train()
        with torch.no_grad():
            c = forward_losses(model, batch)
        assert not torch.allclose(a, c)


def test_bf16_model_keeps_fp32_master_adapters():
    """Base weights bf16; adapter params (what AdamW updates) fp32 with fp32 grads; GEMMs run in bf16."""
    cfg = tiny_cfg(trainer={"precision": {"bf16": True}})
    batch = packed_batch(2, 32, [40, 24], vocab=128, seed=6)
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
        trainable = {p.dtype for p in model.parameters() if p.requires_grad}
        assert frozen == {torch.bfloat16} and trainable == {torch.float32}
        losses = forward_losses(model, batch)
        assert losses.dtype == torch.float32 and losses.shape == (2, 32)
        assert torch.isfinite(losses).all()
        _loss(model, batch).backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert grads and all(g is not None and g.dtype == torch.float32 for g in grads)
