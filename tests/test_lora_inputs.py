"""fc2 adapter input recomputed in backward (trainer.model.lora.inputs): same gradients, x not kept."""
import pytest
import torch
import torch.nn.functional as F

from primus_slurm.config.recipe import deep_merge
from tests.model_helpers import (DEEPSEEK_MLA, FusedNormLinear, arch_sections, dist_session,
                                 models_with_same_adapters, packed_batch, tiny_cfg)
from trainer.model import build_model, forward_losses
from trainer.model.lora.inputs import adapter_a, gated_silu



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
        x = gated_silu(u)
        h, saved = _saved_storages(lambda: adapter_a(x, a, u if recompute else None, gated_silu))
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


@pytest.mark.parametrize("arch,recompute", [("dense", None), ("dense", "full"), ("deepseek_mla", None)])
def test_model_grads_equal_with_and_without_adapter_input_recompute(arch, recompute):
    """Dense: both layers' fc2 adapters are rewired. DeepSeek (MLA, dense first layer, MoE second layer with
    shared experts): only the dense layer's MLP is; experts and shared experts keep their inputs."""
    batch = packed_batch(2, 32, [30, 9, 21], vocab=128, seed=4)
    sections = arch_sections(DEEPSEEK_MLA) if arch == "deepseek_mla" else {}
    grads = {}
    # (the unfused adapters: trainer.lora.fused's own recompute path is pinned in tests/test_lora_fused.py)
    cfgs = [tiny_cfg(trainer=deep_merge(sections, {"recompute": {"adapter_inputs": on, "granularity": recompute},
                                                   "lora": {"fused": False}}))
            for on in (False, True)]
    for on, (_, model) in zip((False, True), models_with_same_adapters(cfgs, seed=5)):
        losses = forward_losses(model, batch)
        loss = (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
        if recompute is None:  # (under full recompute the layers' graphs are built in backward)
            wired = 2 if arch == "dense" else 1
            assert _count_nodes(loss.grad_fn, "_AdapterAFromRecomputedInputBackward") == (wired if on else 0)
        loss.backward()
        grads[on] = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert set(grads[True]) == set(grads[False]) and len(grads[True]) >= 16
    for n, ref in grads[False].items():
        assert ref.abs().sum() > 0, n
        torch.testing.assert_close(grads[True][n], ref, rtol=1e-5, atol=1e-7)


def test_scope_selects_which_adapters_are_rewired():
    for scope, wired in (("all", True), ("fc2", True), ("norm", False)):  # (no fused norms on the CPU path)
        cfg = tiny_cfg(trainer={"recompute": {"adapter_inputs": True, "adapter_inputs_scope": scope}})
        with dist_session(cfg) as info:
            model = build_model(cfg, info.device)
            assert (model.decoder.layers[1].mlp.linear_fc2.input_act is not None) == wired, scope


def test_pre_dropout_adapter_is_not_rewired():
    cfg = tiny_cfg(trainer={"lora": {"dropout": 0.1, "dropout_position": "pre"},
                            "recompute": {"adapter_inputs": True}})
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        fc2 = model.decoder.layers[0].mlp.linear_fc2
        assert fc2.input_act is None
    cfg = tiny_cfg(trainer={"lora": {"dropout": 0.1, "dropout_position": "post"},
                            "recompute": {"adapter_inputs": True}})
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        assert model.decoder.layers[0].mlp.linear_fc2.input_act is not None


def test_rmsnorm_adapter_keeps_only_norm_input_and_matches_reference():
    from trainer.model.lora.inputs import adapter_a_of_rmsnorm

    g = torch.Generator().manual_seed(1)
    tokens, hidden, rank, eps = 12, 32, 4, 1e-5
    w = torch.rand(hidden, generator=g, dtype=torch.float64) + 0.5
    x = torch.randn(3, 4, hidden, generator=g, dtype=torch.float64).requires_grad_(True)
    a = torch.randn(rank, hidden, generator=g, dtype=torch.float64).requires_grad_(True)
    up = torch.randn(3, 4, rank, generator=g, dtype=torch.float64)

    def run(ours: bool):
        x.grad = a.grad = None
        if ours:
            h, saved = _saved_storages(lambda: adapter_a_of_rmsnorm(x, a, w, eps))
        else:
            h, saved = _saved_storages(lambda: F.linear(F.rms_norm(x, (hidden,), w, eps), a))
        (h * up).sum().backward()
        return h.detach(), x.grad.clone(), a.grad.clone(), saved

    h0, dx0, da0, _ = run(False)
    h1, dx1, da1, saved1 = run(True)
    torch.testing.assert_close(h1, h0, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dx1, dx0, rtol=1e-10, atol=1e-12)  # includes the gradient through 1/rms
    torch.testing.assert_close(da1, da0, rtol=1e-10, atol=1e-12)
    assert dx1.abs().sum() > 0 and da1.abs().sum() > 0
    # kept: x (the base keeps it anyway), A, w, the rank-sized h and per-token 1/rms -- no normed copy
    assert x.untyped_storage().data_ptr() in saved1 and len(saved1) == 5
    assert tokens * hidden * 8 == x.untyped_storage().nbytes()


def test_rmsnorm_adapter_without_grad_matches_forward():
    from trainer.model.lora.inputs import adapter_a_of_rmsnorm

    g = torch.Generator().manual_seed(2)
    x, a, w = torch.randn(5, 16, generator=g), torch.randn(2, 16, generator=g), torch.rand(16, generator=g) + 0.5
    with torch.no_grad():
        ref = F.linear(F.rms_norm(x, (16,), w, 1e-6), a)
        torch.testing.assert_close(adapter_a_of_rmsnorm(x, a, w, 1e-6), ref, rtol=1e-5, atol=1e-6)


def test_rmsnorm_adapter_in_bf16_tracks_fp32_reference():
    from trainer.model.lora.inputs import adapter_a_of_rmsnorm

    g = torch.Generator().manual_seed(3)
    x32 = torch.randn(64, 128, generator=g) * 3
    a32, w32 = torch.randn(8, 128, generator=g) * 0.1, torch.rand(128, generator=g) + 0.5
    up = torch.randn(64, 8, generator=g)
    grads = []
    for dtype in (torch.float32, torch.bfloat16):
        x = x32.to(dtype).detach().requires_grad_(True)
        a = a32.to(dtype).detach().requires_grad_(True)
        (adapter_a_of_rmsnorm(x, a, w32.to(dtype), 1e-5).float() * up).sum().backward()
        grads.append((x.grad.float(), a.grad.float()))
    for ref, got in zip(grads[0], grads[1]):
        assert (got - ref).norm() / ref.norm() < 2e-2


def test_fused_norm_lora_linear_rewired_matches_ln_out_path():
    from trainer.model.lora.layers import LoRALinear
    from trainer.model.lora.inputs import wire_adapter_input_recompute

    x0 = torch.randn(6, 2, 32, generator=torch.Generator().manual_seed(3))
    results = []
    for rewire in (False, True):
        lora = LoRALinear(FusedNormLinear(32, 48, seed=1), "linear_qkv", dim=4, alpha=8, dropout=0.0,
                          dropout_position="pre", a_init="kaiming", b_init="zero", tp_size=1, tp_rank=0,
                          sequence_parallel=False, seed=2)
        with torch.no_grad():
            lora.lora_b.normal_(0, 0.1, generator=torch.Generator().manual_seed(4))
        assert lora.base.return_layernorm_output  # LoRALinear asked the base for ln_out
        if rewire:
            assert wire_adapter_input_recompute(lora, "fc2") == {"fc2": 0, "norm": 0}  # out of scope
            assert wire_adapter_input_recompute(lora) == {"fc2": 0, "norm": 1}
            assert not lora.base.return_layernorm_output and lora.adapter_norm is not None
        x = x0.clone().requires_grad_(True)
        out, _ = lora(x)
        (out * torch.linspace(-1, 1, 48)).sum().backward()
        results.append((out.detach(), x.grad, lora.lora_a.grad, lora.lora_b.grad))
    for ref, got in zip(*results):
        assert ref.abs().sum() > 0
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
