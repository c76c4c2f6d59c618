"""trainer.recompute.norm_output (trainer/model/lora/norm_epilogue.py): the norm epilogue's nodes keep the norm's input
(which the norm keeps for its own backward: one storage) instead of its output, and run the norm again in backward.
Against keeping the output, on the CPU stand-in of TE's LayerNormLinear: the same outputs and gradients bit for bit,
with and without pre-dropout (then with the dropped copy recomputed too), for qkv and the SwiGLU fold's fc1 parts;
the norm's output no longer kept; the planner counts it; the contract notes where it does nothing."""
from __future__ import annotations

import pytest
import torch

from tests.model_helpers import FusedNormLinear
from trainer.model.lora.layers import LoRALinear

HIDDEN, OUT = 32, 48


def _run(norm_recompute: bool, dropout: float, parts: bool, normalization: str = "RMSNorm",
         dropout_recompute: bool = True, dtype=torch.float32):
    lora = LoRALinear(FusedNormLinear(HIDDEN, OUT, seed=1, normalization=normalization), "linear_qkv", dim=4,
                      alpha=8, dropout=dropout, dropout_position="pre", a_init="kaiming", b_init="zero", tp_size=1,
                      tp_rank=0, sequence_parallel=False, seed=2, epilogue=True, epilogue_norm=True,
                      dropout_recompute=dropout_recompute, norm_recompute=norm_recompute)
    with torch.no_grad():
        lora.lora_b.normal_(0, 0.1, generator=torch.Generator().manual_seed(4))
    assert lora.uses_norm_epilogue()
    x = torch.randn(6, 2, HIDDEN, generator=torch.Generator().manual_seed(3)).to(dtype).requires_grad_(True)
    up = torch.linspace(-1, 1, OUT).to(dtype)
    lora.base.to(dtype)
    kept = []

    def pack(t):
        if t.dim() >= 2 and t.shape[-1] == HIDDEN and t.numel() == x.numel():
            kept.append(t.untyped_storage().data_ptr())
        return t

    torch.manual_seed(0)  # the dropout's mask
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if parts:  # the SwiGLU fold's consumer applies B itself
            out, h = lora.forward_parts(x)
            y = out + lora.scale * h @ lora.lora_b.to(h.dtype).t()
        else:
            y, _ = lora(x)
    (y.float() * up.float()).sum().backward()
    # the [tokens, hidden] storages autograd keeps: the norm's input (x) and, unless recomputed, its output
    storages = {p for p in kept}
    return [y.detach(), x.grad, lora.lora_a.grad, lora.lora_b.grad], storages, x.untyped_storage().data_ptr()


@pytest.mark.parametrize("normalization", ["RMSNorm", "LayerNorm"])
@pytest.mark.parametrize("parts", [False, True], ids=["qkv", "fc1-parts"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_bits_and_the_norm_output_not_kept(normalization, parts, dropout, dtype):
    ref, kept_ref, x_ref = _run(False, dropout, parts, normalization, dtype=dtype)
    got, kept, x_ptr = _run(True, dropout, parts, normalization, dtype=dtype)
    for r, g in zip(ref, got):
        assert r.abs().sum() > 0 and torch.equal(g, r)
    if dtype == torch.float32:  # (the CPU's BF16 norms keep an fp32 copy of x, not x; the GPU's fused RMSNorm keeps
        # x itself: tests/gpu/test_fp8_epilogue.py)
        assert x_ref in kept_ref and len(kept_ref) == 2  # x (the norm's input) and the norm's output (or its drop)
        assert kept == {x_ptr}  # x only: the norm's and the adapter's one storage


def test_under_dropout_without_the_dropped_copy_recomputed_the_output_is_kept():
    """norm_output with dropout_recompute off: the node must keep the dropped copy, so it keeps the output path."""
    ref, _, _ = _run(False, 0.1, False, dropout_recompute=False)
    got, kept, x_ptr = _run(True, 0.1, False, dropout_recompute=False)
    assert all(torch.equal(g, r) for g, r in zip(got, ref))
    assert x_ptr in kept and len(kept) == 3  # x, the dropped copy and the CPU's noise (its keep)


def test_the_planner_and_the_contract():
    from primus_contract.plan.memory import layer_activation_bytes
    from primus_contract.plan.shapes import Layout, layer_linears_local
    from primus_contract.rules_dependent import DEPENDENT
    from primus_slurm.config.recipe import deep_merge
    from primus_slurm.config.schema import apply_schema
    from tests.model_helpers import TINY

    def recipe(norm_output, dropout=0.0, dropout_recompute=True, device="cuda"):
        return apply_schema(deep_merge(TINY, {"cluster": {"env_profile": "h200"}, "trainer": {
            "distributed": {"device": device}, "precision": {"bf16": True},
            "lora": {"dropout": dropout, "dropout_recompute": dropout_recompute},
            "recompute": {"norm_output": norm_output}}}))

    def adapter(r):
        t, m = r["trainer"], r["trainer"]["model"]
        lay = Layout(tp=1, pp=1, ep=1, dp=1, sp=False, world=1, mbs=1, gbs=1, seq=10)
        return layer_activation_bytes(m, t, lay, layer_linears_local(m, t["lora"], lay, 0), False, "h200")["adapter"]

    h = TINY["trainer"]["model"]["hidden_size"]
    normed = 2  # qkv and fc1 read the input norm's output (TE's LayerNormLinear)
    assert adapter(recipe(False)) - adapter(recipe(True)) == normed * 10 * h * 2
    assert adapter(recipe(False, 0.1)) - adapter(recipe(True, 0.1)) == normed * 10 * h * 2
    assert adapter(recipe(False, 0.1, False)) == adapter(recipe(True, 0.1, False))  # the dropped copy kept
    note = next(test for key, _, test in DEPENDENT if key == "trainer.recompute.norm_output")
    assert note(recipe(True)) and not note(recipe(True, 0.1, False)) and not note(recipe(True, device="cpu"))
