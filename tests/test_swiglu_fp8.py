"""trainer.precision.fp8_swiglu_kernels (trainer/model/swiglu_fp8.py): the FP8 SwiGLU input store in two Triton
passes instead of megatron's two casts.

The kernels run in Triton's CPU interpreter: the FP8 copy they keep is torch's float8_e4m3fn cast byte for byte (the
integer encoding is exact in the interpreter as on a GPU), over every edge of the format; the activation is the
unfused SwiGLU's and the gradient megatron's at that copy, to fp32 rounding. On CPU the wiring is checked with the
kernels swapped for the unfused reference: the wired model's loss equals megatron's unfused SwiGLU bit for bit and
its gradients are those at the FP8 copy."""
import textwrap

import pytest
import torch

from tests.model_helpers import interpreted

KERNELS = textwrap.dedent("""
    import math
    import torch
    from trainer.model import swiglu_fp8 as mod
    from trainer.model.swiglu_fp8 import saturates, swiglu_fp8, swiglu_fp8_reference
    torch.manual_seed(0)
    edges = [0.0, -0.0, 2.0 ** -10, 2.0 ** -9, 1.5 * 2.0 ** -9, 2.5 * 2.0 ** -9, 2.0 ** -6, 2.0 ** -6 * 1.0625,
             0.015625 * 1.0625, 1.0 + 1 / 16, 1.0 + 3 / 16, 448.0, 460.0, 464.0, 464.5, 479.9, 480.0, 1e6,
             float("inf"), float("-inf"), float("nan"), -3.3e-3, 300.0, -17.25]
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    cases = [torch.tensor(edges + [-x for x in edges]), codes, torch.randn(4096) * 40, torch.randn(4096) * 1e-2]
    for vals in cases:
        n = vals.numel()
        u = torch.stack([vals, vals.flip(0)], 0).reshape(1, 2 * n)  # every value as gate and as up
        ref = u.to(torch.float8_e4m3fn).view(torch.uint8)
        act = swiglu_fp8(u.clone().requires_grad_(True))
        got = act.grad_fn.saved_tensors[0].view(torch.uint8)
        assert torch.equal(got, ref), (u[got != ref][:8], got[got != ref][:8], ref[got != ref][:8])
    # a torch whose cast makes finite magnitudes past 448 NaN (2.11 on CUDA): the kernels and fp8_copy still saturate
    mod.saturates = lambda device: False
    u = torch.stack([cases[0], cases[0].flip(0)], 0).reshape(1, -1)
    want = u.to(torch.float8_e4m3fn).view(torch.uint8)  # (this torch saturates: 2.13)
    past = (u.abs() > 464) & ~u.isnan()
    assert past.sum() >= 10 and torch.equal(want[past] & 0x7F, torch.full_like(want[past], 0x7E))
    got = swiglu_fp8(u.clone().requires_grad_(True)).grad_fn.saved_tensors[0].view(torch.uint8)
    assert torch.equal(got, want), (u[got != want], got[got != want], want[got != want])
    clamped = mod.fp8_copy(u).view(torch.uint8)
    assert torch.equal(clamped, want), (u[clamped != want], clamped[clamped != want], want[clamped != want])
    mod.saturates = saturates
    print("bytes ok")
    for shape in ((70, 80), (33, 260), (3, 5, 64), (1, 2)):
        for dtype in (torch.float32, torch.bfloat16):
            u = (torch.randn(*shape) * 3).to(dtype)
            d = torch.randn(*shape[:-1], shape[-1] // 2).to(dtype)
            outs = []
            for fn in (swiglu_fp8_reference, swiglu_fp8):
                x = u.clone().requires_grad_(True)
                y = fn(x)
                y.backward(d)
                outs.append((y.detach().float(), x.grad.float()))
            (y0, g0), (y1, g1) = outs
            tol = 2e-5 if dtype == torch.float32 else 2e-2  # (the interpreter truncates to bf16; a GPU rounds)
            torch.testing.assert_close(y1, y0, rtol=tol, atol=tol, msg=f"act {shape} {dtype}")
            torch.testing.assert_close(g1, g0, rtol=tol, atol=tol, msg=f"du {shape} {dtype}")
            assert y0.abs().sum() > 0 and g0.abs().sum() > 0
            if dtype == torch.float32:  # the gradient is the one at the FP8 copy, not at u
                x = u.clone().requires_grad_(True)
                half = shape[-1] // 2
                exact = torch.autograd.grad(torch.nn.functional.silu(x[..., :half]) * x[..., half:], x, d)[0]
                assert not torch.allclose(exact, g1, rtol=1e-4, atol=1e-4)
    # every FP8 code decoded: the backward at u = the codes themselves (NaN where the code is NaN)
    u = torch.cat([codes, codes.flip(0)]).reshape(1, 512)
    d = torch.ones(1, 256)
    grads = []
    for fn in (swiglu_fp8_reference, swiglu_fp8):
        x = u.clone().requires_grad_(True)
        fn(x).backward(d)
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=2e-5, atol=2e-5, equal_nan=True)
    print("kernels ok")
""")


def test_kernels_keep_torchs_fp8_bytes_and_megatrons_gradient_in_the_interpreter():
    pytest.importorskip("triton")
    done = interpreted("-c", KERNELS)
    assert done.returncode == 0 and "bytes ok" in done.stdout and "kernels ok" in done.stdout, done.stderr[-3000:]


def _losses(wired_with=None, **lora):
    """8 iterations of the tiny model with fused_swiglu off; wired_with: route its MLPs through wire_swiglu_fp8 with
    that function standing in for the kernels (megatron's store is GPU-only: its fused bias_swiglu)."""
    import trainer.model.swiglu_fp8 as mod
    from tests.model_helpers import tiny_cfg, train_losses

    wired = []

    def check(model):
        if wired_with is None:
            return
        model.config.activation_func_fp8_input_store = True  # what precision.fp8_swiglu_input sets on a GPU
        model.config.bias_activation_fusion = True
        wired.append(mod.wire_swiglu_fp8(model))
        wired.append(mod.wire_swiglu_fp8(model))  # (a second call finds them rewired already)

    saved = mod.swiglu_fp8
    mod.swiglu_fp8 = wired_with or saved
    try:
        losses = train_losses(tiny_cfg(trainer={"lora": {"fused_swiglu": False, **lora}}), 8, seed=3,
                              check_model=check)
    finally:
        mod.swiglu_fp8 = saved
    return losses, wired


def test_wired_mlps_keep_the_forward_and_take_the_gradient_at_the_fp8_copy():
    """Every dense MLP is rewired once; the first loss equals megatron's unfused SwiGLU bit for bit (the forward reads
    u itself), and training follows it closely but not exactly (the backward reads the FP8 copy)."""
    from trainer.model.swiglu_fp8 import swiglu_fp8_reference

    ref, _ = _losses()
    ours, wired = _losses(swiglu_fp8_reference)
    assert wired == [2, 0]
    assert ours[0] == ref[0] and ref[-1] < ref[0]
    assert ours != ref
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=2e-2, atol=0)


def test_what_is_left_to_megatron():
    """Not wired: without the store or megatron's fused SwiGLU (which alone keeps the copy), with activation
    offload (megatron marks the saved input for the host), an MLP fused_swiglu folded, MoE experts."""
    from tests.model_helpers import dist_session, tiny_cfg
    from trainer.model import build_model
    from trainer.model.lora.swiglu import wire_fused_swiglu
    from trainer.model.swiglu_fp8 import wire_swiglu_fp8
    from trainer.model.swiglu_store import megatron_store_count

    cfg = tiny_cfg(trainer={"lora": {"fused_swiglu": False}})
    with dist_session(cfg) as info:
        for store, fusion, offload, n in ((False, True, False, 0), (True, False, False, 0), (True, True, True, 0),
                                          (True, True, False, 2)):
            model = build_model(cfg, info.device)
            model.config.activation_func_fp8_input_store, model.config.bias_activation_fusion = store, fusion
            model.config.cpu_offloading = offload
            assert wire_swiglu_fp8(model) == n, (store, fusion, offload)
        model = build_model(cfg, info.device)
        assert wire_fused_swiglu(model, strict=False) == 2  # the fold (its kernels keep their own FP8 copy)
        model.config.activation_func_fp8_input_store, model.config.bias_activation_fusion = True, True
        assert wire_swiglu_fp8(model) == 0
    moe = tiny_cfg(trainer={"lora": {"fused_swiglu": False}, "model": {
        "num_moe_experts": 4, "moe_ffn_hidden_size": 32, "moe_router_topk": 2, "moe_first_k_dense": 1}})
    with dist_session(moe) as info:
        model = build_model(moe, info.device)
        model.config.activation_func_fp8_input_store, model.config.bias_activation_fusion = True, True
        assert wire_swiglu_fp8(model) == 1  # the dense first layer; the experts keep megatron's functions,
        for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
            config.activation_func_fp8_input_store = True  # (as the trainer's config before the build: copied)
        assert megatron_store_count(model) == 4  # (saturated where torch's cast is not: tests/test_swiglu_store.py)


def test_the_planner_prices_megatrons_casts_and_not_the_kernels():
    """primus_contract/plan/speed.py swiglu_store_casts on the 70B recipe (fc1 without an adapter): megatron's cast
    in every forward and its copy back before every backward, at the H200 profile's kernel times; none with the
    store's kernels on an NVIDIA GPU, nor where the fold writes the copy; on ROCm (no store kernels) the casts stay."""
    from primus_contract.plan import calibration as cal
    from primus_contract.plan import plan
    from primus_slurm.config.recipe import load_recipe

    base = ["cluster.env_profile=h200", "trainer.data.train.path=.", "trainer.precision.fp8_swiglu_input=true",
            "trainer.recompute.method=block", "trainer.recompute.num_layers=40"]

    def casts(*sets, recipe="bench/recipes/llama2_70b_1xh200.yaml"):
        return plan(load_recipe(recipe, [*base, *sets]).resolved).time_parts.get("fp8 swiglu store casts", 0.0)

    elements = 8192 * 57344 * 80
    want = elements * (cal.FP8_SWIGLU_CAST_S * 1.5 + cal.FP8_SWIGLU_UNCAST_S)  # 40 of 80 layers recomputed
    megatrons = casts("trainer.precision.fp8_swiglu_kernels=false")
    assert abs(megatrons / want - 1) < 1e-9 and 0.15 < megatrons < 0.25
    assert casts() == 0.0  # (the kernels: on by default)
    assert casts("cluster.env_profile=mi300x") > 0.15
    # the fold's forward kernel writes the copy itself: no cast either
    assert casts("trainer.lora.target_modules=[linear_qkv,linear_fc1]", "trainer.precision.fp8_swiglu_kernels=false") == 0

    assert casts("trainer.precision.fp8_swiglu_input=false") == 0.0
    # activation offload keeps megatron's store (wire_swiglu_fp8 leaves it): its casts are priced with the kernels on
    offload = ("trainer.recompute.granularity=null", "trainer.recompute.activation_offload_layers=48")
    assert casts(*offload) == casts("trainer.recompute.granularity=null", "trainer.precision.fp8_swiglu_kernels=false")
    assert casts(*offload) > 0.15


def test_the_contract_notes_where_the_kernels_do_nothing():
    """trainer.precision.fp8_swiglu_kernels acts only with the store, on an NVIDIA GPU in BF16, on an MLP the fold
    does not take: elsewhere validate and submit say so when it is set (false: the default is true; rules_dependent),
    and nothing is refused."""
    from primus_contract.rules_dependent import inert_keys
    from primus_slurm.config.recipe import load_recipe

    base = ["trainer.data.train.path=.", "trainer.precision.fp8_swiglu_kernels=false"]  # (set away from its default)

    def noted(*sets):
        r = load_recipe("bench/recipes/llama2_70b_1xh200.yaml", [*base, *sets]).resolved
        return any("fp8_swiglu_kernels" in line for line in inert_keys(r))

    store = "trainer.precision.fp8_swiglu_input=true"
    assert not noted(store, "cluster.env_profile=h200")
    assert noted("cluster.env_profile=h200")  # no store
    assert noted(store, "cluster.env_profile=mi300x")  # ROCm: megatron's casts
    assert noted(store, "cluster.env_profile=h200", "trainer.lora.target_modules=[linear_fc1]")  # every MLP folded
    assert not noted(store, "cluster.env_profile=h200", "trainer.lora.target_modules=[linear_fc1]",
                     "trainer.lora.fused_swiglu=false")
    assert noted(store, "cluster.env_profile=h200", "trainer.recompute.granularity=null",
                 "trainer.recompute.activation_offload_layers=48")  # offload keeps megatron's store
