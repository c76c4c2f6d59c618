"""trainer.lora.fused_swiglu (trainer/model/lora/swiglu.py): fc1's adapter folded into the SwiGLU kernels.

The Triton kernels run in Triton's CPU interpreter against the unfused ops they replace (u = addmm(u_base, h, B^T),
megatron's swiglu): the same activation and the same gradients of u_base, h and B, to fp32 rounding (u is formed
in the kernel's fp32 registers). On CPU the model path uses those unfused ops, so a model trained with the wiring
matches one trained without it bit for bit."""
import os
import textwrap

import pytest
import torch

from tests.model_helpers import interpreted, tiny_cfg, train_losses

SCRIPT = textwrap.dedent("""
    import torch
    from trainer.model.lora.swiglu import swiglu_lora, swiglu_lora_reference
    torch.manual_seed(0)
    for t, n, r in ((70, 40, 4), (64, 64, 16), (33, 130, 8)):
        u = torch.randn(t, 2 * n, requires_grad=True)
        h = torch.randn(t, r, requires_grad=True)
        b = torch.randn(2 * n, r, requires_grad=True)
        up = torch.randn(t, n)
        grads = []
        for kernels in (False, True):
            for p in (u, h, b):
                p.grad = None
            act = swiglu_lora(u, h, b, 0.5, kernels=kernels)
            (act * up).sum().backward()
            grads.append((act.detach(), u.grad.clone(), h.grad.clone(), b.grad.clone()))
        for name, ref, got in zip(("act", "du", "dh", "dB"), grads[0], grads[1]):
            assert ref.abs().sum() > 0, name
            torch.testing.assert_close(got, ref, rtol=2e-5, atol=2e-5, msg=f"{name} {t}x{n} r{r}")
    print("kernels ok")
""")


def test_kernels_match_the_unfused_ops_in_the_interpreter():
    pytest.importorskip("triton")
    done = interpreted("-c", SCRIPT)
    assert done.returncode == 0 and "kernels ok" in done.stdout, done.stderr[-3000:]


def _train(fused: bool, iters: int = 20):
    def check(model):  # both layers' dense MLPs are wired, or none
        assert sum(hasattr(m, "_primus_megatron_forward") for m in model.modules()) == (2 if fused else 0)

    return train_losses(tiny_cfg(trainer={"lora": {"fused_swiglu": fused}}), iters, seed=4, check_model=check)


def test_wired_model_trains_exactly_as_the_unfused_one_on_cpu():
    ref, ours = _train(False), _train(True)
    assert ref[-1] < ref[0]
    assert ours == ref


@pytest.mark.slow  # 18 s on 2 cores: make test runs it, make check does not
def test_wired_model_with_the_kernels_trains_as_the_unfused_one():
    """The same 20 iterations with the Triton kernels themselves (interpreter): losses agree to 1e-5 relative."""
    pytest.importorskip("triton")
    script = ("import json; import trainer.model.lora.swiglu as m; from tests.test_lora_swiglu import _train\n"
              "calls = []; launch = m._launch\n"
              "m._launch = lambda *a, **k: calls.append(a[0]) or launch(*a, **k)\n"
              "print('LOSSES', json.dumps([_train(False), _train(True), len(calls)]))")
    done = interpreted("-c", script, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    ref, ours, launches = json.loads(done.stdout.split("LOSSES", 1)[1])
    assert ref[-1] < ref[0] and launches == 20 * 2 * 2  # forward and backward kernel, 2 MLPs, 20 iterations
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=1e-5, atol=1e-6)


FP8_STORE = textwrap.dedent("""
    import torch
    from trainer.model.lora.inputs import gated_silu
    from trainer.model.lora.swiglu import swiglu_lora
    torch.manual_seed(0)
    for t, n, r in ((70, 40, 4), (33, 130, 16)):
        u = torch.randn(t, 2 * n) * 2
        u[0, :3] = torch.tensor([500.0, -470.0, 1e4])  # (the copy saturates to 448, as torch 2.13's cast)
        u.requires_grad_(True)
        h, b, up = torch.randn(t, r, requires_grad=True), torch.randn(2 * n, r, requires_grad=True), torch.randn(t, n)
        act = swiglu_lora(u, h, b, 0.5, kernels=True, fp8_store=True)
        (act * up).sum().backward()
        got = (act.detach(), u.grad, h.grad, b.grad)
        # reference: the forward from u itself; the backward at u's FP8 e4m3 copy plus the exact adapter product
        uq = u.detach().to(torch.float8_e4m3fn).float()
        hh, bb = h.detach().requires_grad_(True), b.detach().requires_grad_(True)
        full = (uq + 0.5 * hh @ bb.t()).detach().requires_grad_(True)
        (gated_silu(full) * up).sum().backward()
        ref_du = full.grad
        ref = (gated_silu(u.detach() + 0.5 * h.detach() @ b.detach().t()), ref_du, 0.5 * ref_du @ b.detach(),
               0.5 * ref_du.t() @ h.detach())
        for name, x, y in zip(("act", "du", "dh", "dB"), ref, got):
            torch.testing.assert_close(y, x, rtol=2e-5, atol=2e-5, msg=f"{name} {t}x{n} r{r}")
        assert not torch.equal(uq, u.detach())  # the store really rounds (so the check above is not vacuous)
    print("fp8 store ok")
""")


def test_fp8_store_kernels_keep_fc1_output_in_fp8():
    """With precision.fp8_swiglu_input the kernels keep u_base as FP8 e4m3 (megatron's plain cast) and add s h B^T
    back exactly in backward: the forward is unchanged, the gradients are those at the FP8 copy (interpreter)."""
    pytest.importorskip("triton")
    done = interpreted("-c", FP8_STORE)
    assert done.returncode == 0 and "fp8 store ok" in done.stdout, done.stderr[-3000:]


def test_wiring_under_the_fp8_store_and_where_nothing_can_be_wired(monkeypatch):
    """The FP8 store (GPU only by the contract) is wired with the kernels and refused without them (the unfused ops
    would drop the FP8 copy) and on ROCm (its FP8 is e4m3fnuz); a model with no fc1 adapter refuses fused_swiglu
    instead of ignoring it."""
    from tests.model_helpers import dist_session
    from trainer.config import ConfigError
    from trainer.model import build, build_model
    from trainer.model.lora.swiglu import wire_fused_swiglu

    cfg = tiny_cfg()
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        model.config.activation_func_fp8_input_store = True  # what precision.fp8_swiglu_input sets on a GPU
        if os.environ.get("TRITON_INTERPRET") != "1":
            with pytest.raises(ConfigError, match="needs its Triton kernels"):
                wire_fused_swiglu(model)
        import trainer.model.lora.swiglu as swiglu

        # as on a GPU: the ROCm refusal next
        monkeypatch.setattr(swiglu, "kernels_usable", lambda device, rank=16, dtype=None: True)
        monkeypatch.setattr(torch.version, "hip", "6.4")
        with pytest.raises(ConfigError, match="NVIDIA's FP8"):
            wire_fused_swiglu(model)
        none = tiny_cfg(trainer={"lora": {"fused_swiglu": True, "target_modules": ["linear_qkv", "linear_proj"]}})
        with pytest.raises(ConfigError, match="no dense gated-SiLU MLP with an adapter on linear_fc1"):
            build(none, info.device)


def test_null_folds_wherever_it_applies_and_says_where_it_cannot():
    """fused_swiglu null (auto): wired like true where an MLP can fold its fc1 adapter; where none can (no fc1
    adapter here), the unfused path and a line that says so, where true refuses; the planner and the contract
    agree (primus_contract.rules_precision.fused_swiglu_on)."""
    from primus_contract.rules_precision import fused_swiglu_on
    from tests.model_helpers import dist_session
    from trainer.model import build

    auto = tiny_cfg(trainer={"lora": {"fused_swiglu": None}})
    none_here = tiny_cfg(trainer={"lora": {"fused_swiglu": None, "target_modules": ["linear_qkv", "linear_proj"]}})
    with dist_session(auto) as info:
        built = build(auto, info.device)
        assert sum(hasattr(m, "_primus_megatron_forward") for m in built.model.modules()) == 2
        assert "fc1 adapters folded into the activation | 2 MLPs" in dict(built.lines)["fused swiglu"]
        built = build(none_here, info.device)
        assert not any(hasattr(m, "_primus_megatron_forward") for m in built.model.modules())
        assert "no MLP here can fold" in dict(built.lines)["fused swiglu"]
    lora = {"enabled": True, "fused_swiglu": None, "target_modules": ["linear_fc1"], "exclude_modules": [],
            "dropout": 0.0, "dropout_position": "pre", "dim": 16}
    t = {"lora": lora, "recompute": {"adapter_inputs": False, "adapter_inputs_scope": "all"},
         "model": tiny_cfg().to_dict()["trainer"]["model"],
         "precision": {"fp8_swiglu_input": False, "bf16": True}, "distributed": {"device": "cuda"}}
    assert fused_swiglu_on(t, "h200")
    assert not fused_swiglu_on({**t, "recompute": {"adapter_inputs": True, "adapter_inputs_scope": "fc2"}}, "h200")
    for targets, excludes, on in ((["linear_fc*"], [], True), (["*"], ["linear_fc1"], False),
                                  (["decoder.layers.*.mlp.linear_fc1"], [], True), (["linear_qkv"], [], False)):
        assert fused_swiglu_on({**t, "lora": {**lora, "target_modules": targets, "exclude_modules": excludes}},
                               "h200") is on, (targets, excludes)
    moe = {**t, "model": {**t["model"], "num_moe_experts": 8, "moe_ffn_hidden_size": 32, "moe_router_topk": 2,
                          "moe_first_k_dense": 0, "moe_layer_freq": 1}}
    assert not fused_swiglu_on(moe, "h200")  # experts keep their grouped path; no dense MLP
    assert fused_swiglu_on({**moe, "model": {**moe["model"], "moe_first_k_dense": 1}}, "h200")
    store = {**t, "precision": {"fp8_swiglu_input": True, "bf16": True}}
    assert fused_swiglu_on(store, "h200") and not fused_swiglu_on(store, "mi300x")
    assert not fused_swiglu_on({**store, "lora": {**lora, "dim": 256}}, "h200")  # a rank above the kernels' tile
    assert fused_swiglu_on({**store, "distributed": {"device": "auto"}}, "h200")  # the recipes' default device
    assert not fused_swiglu_on({**store, "distributed": {"device": "auto"}}, "mi355x")
    assert not fused_swiglu_on({**store, "distributed": {"device": "cpu"}}, "cpu")
    assert fused_swiglu_on({**t, "lora": {**lora, "fused_swiglu": True, "target_modules": []}}, "h200")


def test_adapter_inputs_all_keeps_fc1_unfolded_as_the_contract_says():
    """recompute.adapter_inputs scope all|fc2 with fc1 targeted and fc2 not: the contract says no fold (so the
    epilogue owns fc1 on CPU); the trainer folded there anyway (no fc2 adapter was rewired) and then refused the
    epilogue at its start (audit, 2026-12-06). Now it keeps the unfused path and the epilogue takes fc1. (On CPU the
    contract now refuses this recipe whole: adapter_inputs rewires nothing there. On a GPU, scope all rewires fc1's
    norm and the recipe stands; the build here checks the trainer's side of the rule.)"""
    from primus_contract.rules_precision import epilogue_owners, fused_swiglu_on
    from tests.model_helpers import dist_session
    from trainer.model import build

    cfg = tiny_cfg(trainer={"lora": {"fused_swiglu": None, "epilogue": True, "target_modules": ["linear_fc1"]},
                            "recompute": {"adapter_inputs": True}})
    t = cfg.to_dict()["trainer"]
    assert not fused_swiglu_on(t, "cpu") and epilogue_owners(t, "cpu") == ["mlp.linear_fc1"]
    with dist_session(cfg) as info:
        built = build(cfg, info.device)
    lines = dict(built.lines)
    assert "off: recompute.adapter_inputs scope all" in lines["fused swiglu"]
    assert not any(hasattr(m, "_primus_megatron_forward") for m in built.model.modules())
    assert "| 2 of 2 linears |" in lines["lora epilogue"]
