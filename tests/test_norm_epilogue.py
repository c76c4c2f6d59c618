"""trainer.lora.epilogue_norm (trainer/model/lora/norm_epilogue.py): a norm-fed linear's norm, base GEMM and adapter
in the epilogue's passes give the same outputs and gradients as TE's LayerNormLinear with the adapter on its returned
norm output (the default path), here on a CPU stand-in of LayerNormLinear whose norm is torch's (fp32: only where the
sums are rounded differs). Also the SwiGLU fold's parts, pre-dropout (the same mask), and where it applies."""
from __future__ import annotations

import pytest
import torch

from tests.model_helpers import FusedNormLinear
from trainer.model.lora.layers import LoRALinear

HIDDEN, OUT = 32, 48


def _lora(norm_epilogue: bool, dropout: float = 0.0, **base_kw) -> LoRALinear:
    lora = LoRALinear(FusedNormLinear(HIDDEN, OUT, seed=1, **base_kw), "linear_qkv", dim=4, alpha=8, dropout=dropout,
                      dropout_position="pre", a_init="kaiming", b_init="zero", tp_size=1, tp_rank=0,
                      sequence_parallel=False, seed=2, epilogue=norm_epilogue, epilogue_norm=norm_epilogue)
    with torch.no_grad():
        lora.lora_b.normal_(0, 0.1, generator=torch.Generator().manual_seed(4))
    assert lora.uses_norm_epilogue() is norm_epilogue
    return lora


def _run(lora: LoRALinear, parts: bool = False, rng: int = 0):
    x = torch.randn(6, 2, HIDDEN, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    torch.manual_seed(rng)  # the dropout mask
    up = torch.linspace(-1, 1, OUT)
    if parts:  # the SwiGLU fold's consumer applies B itself
        out, h = lora.forward_parts(x)
        y = out + lora.scale * h @ lora.lora_b.t()
    else:
        y, bias = lora(x)
        assert bias is None
    (y * up).sum().backward()
    return y.detach(), x.grad, lora.lora_a.grad, lora.lora_b.grad


@pytest.mark.parametrize("base_kw", [{}, {"normalization": "LayerNorm"}], ids=["rmsnorm", "layernorm"])
@pytest.mark.parametrize("parts", [False, True], ids=["linear", "swiglu-parts"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_norm_epilogue_matches_the_layernorm_linear_path(base_kw, parts, dropout):
    ref = _run(_lora(False, dropout, **base_kw), parts)
    got = _run(_lora(True, dropout, **base_kw), parts)
    for r, g in zip(ref, got):
        assert r.abs().sum() > 0
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_dropout_draws_the_same_mask_and_a_new_one_with_another_seed():
    a = _run(_lora(True, 0.5), rng=0)[0]
    torch.testing.assert_close(_run(_lora(False, 0.5), rng=0)[0], a, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(_run(_lora(True, 0.5), rng=1)[0], a)


def test_where_it_applies():
    lora = _lora(True)
    lora.base.normalization = "ScaleNorm"  # a norm torch is not told how to run: the linear keeps its path
    assert not lora.uses_norm_epilogue()
    lora = _lora(True)
    lora.base.zero_centered_gamma = True  # TE adds its 1 in fp32: not taken (our models never set it)
    assert not lora.uses_norm_epilogue()
    lora = _lora(True)
    lora.epilogue = False  # an extension of the epilogue only
    assert not lora.uses_norm_epilogue()
    lora = _lora(True, dropout=0.1)
    lora.dropout_position = "post"
    assert not lora.uses_norm_epilogue()
    lora = LoRALinear(torch.nn.Linear(HIDDEN, OUT, bias=False), "linear_proj", dim=4, alpha=8, dropout=0.0,
                      dropout_position="pre", a_init="kaiming", b_init="zero", tp_size=1, tp_rank=0,
                      sequence_parallel=False, seed=2, epilogue=True, epilogue_norm=True)
    assert not lora.uses_norm_epilogue() and lora.uses_epilogue()  # not norm-fed: the plain epilogue


def test_the_planner_prices_the_norm_fed_linears_too():
    from primus_contract.plan.adapter_passes import design_of, passes

    assert design_of({"epilogue": True, "epilogue_norm": True}) == "epilogue-all"
    assert design_of({"epilogue": True, "epilogue_norm": True}, tp=2) == "fused"
    assert passes("epilogue-all", norm_fed=True, short="linear_qkv") == (3.0, 3.0)
    assert passes("epilogue", norm_fed=True, short="linear_qkv") == (6.0, 4.0)
    # fc1 folded into the SwiGLU goes through the fused path's tap (norm_parts), not the epilogue node
    assert passes("epilogue-all", norm_fed=True, short="linear_fc1", swiglu=True) == (4.0, 2.0)


@pytest.mark.parametrize("recipe, sets, refused", [
    ("bench/recipes/llama3_8b_h200.yaml", (), None),  # qkv and fc1: accepted
    ("bench/recipes/llama3_8b_h200.yaml", ("trainer.lora.target_modules=[linear_fc1]",), None),
    # every layer MoE: no dense fc1 anywhere, and a shared expert's fc1 is a plain linear (its norm is the MLP's)
    ("recipes/qwen3_30b_a3b_bf16.yaml", ("trainer.lora.target_modules=[linear_fc1]",), "names only experts"),
    ("recipes/qwen3_30b_a3b_bf16.yaml", ("trainer.lora.target_modules=[linear_qkv]",), None),
])
def test_the_contract_counts_only_linears_that_are_norm_fed(recipe, sets, refused):
    """Validation and the trainer agree on what epilogue_norm can take: a recipe validate accepts has a norm-fed
    target the trainer builds (else the trainer would refuse in the queue)."""
    from primus_contract.errors import ContractError
    from primus_slurm.config.recipe import load_recipe

    sets = ("cluster.env_profile=h200", "trainer.distributed.device=cuda", "trainer.lora.epilogue=true",
            "trainer.lora.epilogue_norm=true", "trainer.precision.fp8=null", "trainer.precision.fp8_param=false",
            *sets)
    if refused is None:
        load_recipe(recipe, list(sets))
    else:
        with pytest.raises(ContractError, match=refused):
            load_recipe(recipe, list(sets))


def test_the_epilogue_finds_no_dense_mlp_in_an_all_moe_model():
    """epilogue true on an all-MoE model's linear_fc2 only: no dense MLP exists there (its fc2 was counted before,
    and the trainer would have refused in the queue)."""
    from primus_contract.errors import ContractError
    from primus_slurm.config.recipe import load_recipe

    with pytest.raises(ContractError, match="names only experts"):  # linear_fc2 names only the experts' there
        load_recipe("recipes/qwen3_30b_a3b_bf16.yaml", [
            "cluster.env_profile=h200", "trainer.distributed.device=cuda", "trainer.lora.epilogue=true",
            "trainer.precision.fp8=null", "trainer.precision.fp8_param=false",
            "trainer.lora.target_modules=[linear_fc2]"])
