"""trainer/model/swiglu_store.py: megatron's FP8 SwiGLU store with the copy saturated, for what the store's kernels
do not reach (MoE experts, activation offload, the kernels off) on a torch whose cast makes overflow NaN.

torch 2.13 on the CPU saturates, so megatron's own functions are the reference here, bit for bit, with inputs past
448: `saturates` is patched to false so that the saturating functions are installed and fp8_copy clamps before the
cast. tests/gpu/test_swiglu_fp8.py holds them to torch 2.11's CUDA cast, where megatron's gradient is NaN."""
import types

import pytest
import torch


@pytest.fixture
def unsaturated(monkeypatch):
    return _unsaturate(monkeypatch)


def _unsaturate(monkeypatch) -> list:
    """As on torch 2.11's CUDA: saturates() false; megatron's names restored after the test; fp8_copy's calls (their
    shapes) listed."""
    import importlib

    import trainer.model.swiglu_fp8 as sf
    from trainer.model import swiglu_store

    for name in swiglu_store._TARGETS:
        module = importlib.import_module(name)
        for attr in swiglu_store._OURS:
            if hasattr(module, attr):
                monkeypatch.setattr(module, attr, getattr(module, attr))
    calls = []
    copy = sf.fp8_copy
    monkeypatch.setattr(sf, "saturates", lambda _device: False)
    monkeypatch.setattr(sf, "fp8_copy", lambda u: calls.append(u.shape) or copy(u))
    return calls


def _inputs(tokens=64, ffn=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(tokens, 2 * ffn, generator=g) * 40
    u.view(-1)[:6] = torch.tensor([500.0, -470.0, 1e4, 464.5, -1e6, 448.0])  # (past 448: NaN on torch 2.11's CUDA)
    return u.bfloat16(), torch.randn(2 * ffn, generator=g).bfloat16(), torch.rand(tokens, 1, generator=g)


def _run(fn, *tensors):
    leaves = [t.clone().requires_grad_(True) if t is not None else None for t in tensors]
    out = fn(*leaves)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.dtype))
    return out, [t.grad for t in leaves if t is not None]


def test_the_saturating_functions_are_megatrons_bit_for_bit(unsaturated):
    """Forward and every gradient (input, bias, per-token weights) equal megatron's functions with the store, in 2-D
    and 3-D; the saved copy is fp8_copy's; without the store megatron's own function runs."""
    from megatron.core.fusions import fused_bias_swiglu as fbs

    from trainer.model import swiglu_store as st

    u, bias, w = _inputs()
    cases = [(lambda x: fbs.bias_swiglu_impl(x, None, True), lambda x: st.bias_swiglu_impl(x, None, True), (u,)),
             (lambda x, b: fbs.bias_swiglu_impl(x, b, True), lambda x, b: st.bias_swiglu_impl(x, b, True), (u, bias)),
             (lambda x: fbs.bias_swiglu_impl(x.view(8, 8, -1), None, True),
              lambda x: st.bias_swiglu_impl(x.view(8, 8, -1), None, True), (u,)),
             (lambda x, p: fbs.weighted_bias_swiglu_impl(x, None, p, True),
              lambda x, p: st.weighted_bias_swiglu_impl(x, None, p, True), (u, w))]
    for theirs, ours, tensors in cases:
        want, want_grads = _run(theirs, *tensors)
        got, got_grads = _run(ours, *tensors)
        assert got.shape == want.shape and torch.equal(got, want)
        assert len(got_grads) == len(tensors)
        for a, b in zip(got_grads, want_grads):
            assert a.dtype == b.dtype and torch.isfinite(a).all() and torch.equal(a, b)
    assert len(unsaturated) == len(cases)  # (each ran through fp8_copy)
    x = u.clone().requires_grad_(True)
    saved = st.bias_swiglu_impl(x, None, True).grad_fn.saved_tensors[0]
    assert saved.dtype == torch.float8_e4m3fn
    assert saved.view(torch.uint8)[0, :6].tolist() == [0x7E, 0xFE, 0x7E, 0x7E, 0xFE, 0x7E]  # ±448
    plain = st.bias_swiglu_impl(u.clone().requires_grad_(True), None, False)
    assert type(plain.grad_fn).__name__ == "SwiGLUFunctionBackward" and len(unsaturated) == len(cases) + 1


def test_install_where_torch_does_not_saturate_and_the_moe_trains_as_megatrons():
    """Nothing replaced where this torch saturates. Otherwise megatron's MLP and experts modules call the saturating
    functions: the MoE model (a dense first layer, 4 experts in the second) trains to megatron's losses bit for bit,
    through fp8_copy; the transform names the 5 MLPs."""
    import megatron.core.transformer.mlp as mlp

    from tests.model_helpers import tiny_cfg, train_losses
    from trainer.model import swiglu_store
    from trainer.model.transforms import _swiglu_store

    original = mlp.bias_swiglu_impl
    assert not swiglu_store.install(torch.device("cpu")) and mlp.bias_swiglu_impl is original

    def losses(install: bool, lines: list):
        def check(model):
            for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
                config.activation_func_fp8_input_store, config.bias_activation_fusion = True, True
            if install:
                lines.append(_swiglu_store(model, types.SimpleNamespace(device=torch.device("cpu"))))
                lines.append(swiglu_store.megatron_store_count(model))

        cfg = tiny_cfg(trainer={"lora": {"fused_swiglu": False}, "model": {
            "num_moe_experts": 4, "moe_ffn_hidden_size": 32, "moe_router_topk": 2, "moe_first_k_dense": 1}})
        return train_losses(cfg, 4, seed=3, check_model=check)

    want = losses(False, [])
    with pytest.MonkeyPatch.context() as mp:
        calls = _unsaturate(mp)
        lines = []
        got = losses(True, lines)
        assert mlp.bias_swiglu_impl is swiglu_store.bias_swiglu_impl
    assert mlp.bias_swiglu_impl is original
    assert got == want and want[-1] < want[0]
    widths = [shape[-1] for shape in calls]  # the experts' fc1 (2 x 32) and the dense layer's (2 x 160), each step
    assert set(widths) == {64, 320} and widths.count(320) == 4 and len(widths) >= 4 * 2
    line, left = lines
    assert left == 5 and line.startswith("fp8 swiglu store | 5 MLPs keep megatron's FP8 SwiGLU store, its copy "
                                          "saturated"), line
