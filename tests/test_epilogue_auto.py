"""trainer.lora.epilogue null (auto, the default since it was timed on 2026-12-06): on for BF16 and for FP8 with
per-tensor scaling (delayed, tensorwise; since the thirteenth session) on an NVIDIA GPU where a linear can own its
base GEMM, off elsewhere; the contract (rules_precision.epilogue_on, which the planner prices) and the trainer
(trainer/model/lora/epilogue.py auto_blocker, at build) decide alike; true / false as written."""
from __future__ import annotations

import types

import pytest
import torch

from primus_contract.rules_precision import epilogue_on
from primus_slurm.config.recipe import load_recipe

R8 = "bench/recipes/llama3_8b_h200.yaml"


def _t(*sets: str, profile: str = "h200"):
    r = load_recipe(R8, [f"cluster.env_profile={profile}", *sets]).resolved
    return r["trainer"], profile


AUTO = "trainer.lora.epilogue=null"


@pytest.mark.parametrize("sets, profile, on", [
    ((), "h200", True),                                                   # the default: null
    ((AUTO,), "h200", True),                                              # BF16 on an H200: the 8B shape
    ((AUTO,), "h100", True),
    ((AUTO, "trainer.precision.fp8=hybrid"), "h200", True),               # FP8 delayed: TE's functional linear
    ((AUTO, "trainer.precision.fp8=hybrid", "trainer.precision.fp8_recipe=tensorwise"), "h200", True),
    ((AUTO, "trainer.precision.fp8=hybrid", "trainer.precision.fp8_recipe=blockwise"), "h200", False),  # not built
    ((AUTO, "trainer.precision.fp4=e2m1", "trainer.precision.fp4_emulation=true"), "h200", False),
    ((AUTO, "trainer.parallelism.tensor=2", "cluster.nproc_per_node=2", "cluster.gpus_per_node=2"), "h200", False),
    ((AUTO, "trainer.lora.dropout=0.1", "trainer.lora.dropout_position=post"), "h200", False),
    ((AUTO,), "mi300x", False),                                           # measured on NVIDIA only
    ((AUTO, "trainer.distributed.device=cpu", "trainer.distributed.backend=gloo"), "cpu", False),
    ((AUTO, "trainer.lora.target_modules=[linear_qkv]"), "h200", True),   # norm-fed: the norm epilogue owns it
    ((AUTO, "trainer.lora.target_modules=[linear_qkv]", "trainer.lora.epilogue_norm=false"), "h200", False),
    ((AUTO, "trainer.lora.target_modules=[linear_qkv]", "trainer.recompute.adapter_inputs=true",
      "trainer.recompute.adapter_inputs_scope=norm"), "h200", False),   # the norm folded into A: nothing to own
    (("trainer.lora.epilogue=false",), "h200", False),                    # as written
    (("trainer.lora.epilogue=true", "trainer.distributed.device=cpu", "trainer.distributed.backend=gloo"), "cpu",
     True),
])
def test_the_contract_resolves_null(sets, profile, on):
    assert epilogue_on(*_t(*sets, profile=profile)) is on


def test_epilogue_norm_rides_the_auto_epilogue_where_it_is_on():
    """epilogue_norm with the default epilogue (null): accepted where the auto epilogue runs (BF16, FP8 per-tensor on
    an NVIDIA GPU), refused where it stays off (FP8 blockwise), so it never sits accepted and idle."""
    from primus_contract.errors import ContractError

    r = load_recipe(R8, ["cluster.env_profile=h200", "trainer.lora.epilogue_norm=true"]).resolved
    assert r["trainer"]["lora"]["epilogue"] is None and epilogue_on(r["trainer"], "h200")
    with pytest.raises(ContractError, match="epilogue null stays off"):
        load_recipe(R8, ["cluster.env_profile=h200", "trainer.lora.epilogue_norm=true",
                         "trainer.precision.fp8=hybrid", "trainer.precision.fp8_recipe=blockwise"])


def test_the_trainer_decides_auto_by_the_same_conditions():
    from trainer.model.lora.epilogue import auto_blocker

    s = types.SimpleNamespace(fp8=None, fp4=None, bf16=True, fp8_recipe="delayed")
    fp8 = types.SimpleNamespace(fp8="hybrid", fp4=None, bf16=True, fp8_recipe="delayed")
    cuda = torch.device("cuda")
    hip = torch.version.hip
    try:
        torch.version.hip = None
        assert auto_blocker(cuda, s) is None
        # FP8 per-tensor: on where TE has its functional linear (none on this CPU machine: it says so)
        assert "functional linear" in auto_blocker(cuda, fp8)
        assert "blockwise" in auto_blocker(cuda, types.SimpleNamespace(**{**vars(fp8), "fp8_recipe": "blockwise"}))
        assert "FP4" in auto_blocker(cuda, types.SimpleNamespace(**{**vars(s), "fp4": "e2m1"}))
        assert "BF16" in auto_blocker(cuda, types.SimpleNamespace(**{**vars(s), "bf16": False}))
        assert "NVIDIA" in auto_blocker(torch.device("cpu"), s)
        torch.version.hip = "6.4"
        assert "NVIDIA" in auto_blocker(cuda, s)
    finally:
        torch.version.hip = hip


def test_the_build_takes_it_where_auto_is_on_and_says_why_not_elsewhere(monkeypatch):
    from tests.model_helpers import dist_session, tiny_cfg
    from trainer.model import build
    from trainer.model.lora import epilogue

    cfg = tiny_cfg(trainer={"lora": {"epilogue": None}})
    with dist_session(cfg) as info:
        built = build(cfg, info.device)
        line = dict(built.lines)["lora epilogue"]
        assert "auto (epilogue null): off" in line and "NVIDIA" in line, line
        assert not any(m.uses_epilogue() for m in built.model.modules() if type(m).__name__ == "LoRALinear")
        monkeypatch.setattr(epilogue, "auto_blocker", lambda device, settings: None)  # as on a BF16 NVIDIA node
        built = build(cfg, info.device)
        line = dict(built.lines)["lora epilogue"]
        assert line.startswith("lora epilogue | base GEMMs accumulate the adapters | 6 of 8 linears"), line


@pytest.mark.parametrize("sets, profile, on", [
    ((), "h200", True),                                                     # the default: null, the epilogue on
    (("trainer.lora.epilogue_norm=false",), "h200", False),                 # as written
    (("trainer.precision.fp8=hybrid",), "h200", True),                      # FP8 delayed: the epilogue is on
    (("trainer.precision.fp8=hybrid", "trainer.precision.fp8_recipe=blockwise"), "h200", False),  # and off here
    ((), "mi300x", False),                                                  # and off on AMD
    (("trainer.lora.target_modules=[linear_proj,linear_fc2]",), "h200", False),  # no norm-fed target
    (("trainer.recompute.adapter_inputs=true", "trainer.recompute.adapter_inputs_scope=norm"), "h200", False),
    (("trainer.recompute.adapter_inputs=true", "trainer.recompute.adapter_inputs_scope=fc2"), "h200", True),
    (("trainer.lora.epilogue=true", "trainer.distributed.device=cpu", "trainer.distributed.backend=gloo"), "cpu",
     False),                                                                # no TE norm-fused linear on a CPU
])
def test_the_norm_epilogue_resolves_null_where_the_epilogue_is_on(sets, profile, on):
    from primus_contract.rules_precision import epilogue_norm_on

    assert epilogue_norm_on(*_t(*sets, profile=profile)) is on


@pytest.mark.parametrize("value, taken", [(None, True), (True, True), (False, False)])
def test_the_trainer_wraps_norm_fed_linears_with_the_norm_epilogue_unless_it_is_false(value, taken):
    """null reaches each LoRALinear as `on where it applies` (the contract's epilogue_norm_on resolves it alike)."""
    from tests.model_helpers import FusedNormLinear
    from trainer.model.lora.layers import apply_lora

    model = torch.nn.Module()
    model.linear_qkv = FusedNormLinear(32, 48, seed=1)
    lcfg = types.SimpleNamespace(enabled=True, target_modules=["linear_qkv"], exclude_modules=[], dim=4, alpha=8,
                                 dropout=0.0, dropout_position="pre", a_init="kaiming", b_init="zero", fused=True,
                                 epilogue=True, epilogue_norm=value, triton_products=False)
    assert apply_lora(model, lcfg) == ["linear_qkv"]
    assert model.linear_qkv.uses_norm_epilogue() is taken
    model.linear_qkv.epilogue = False  # the epilogue off (false, or auto off on this node): the norm path too
    assert model.linear_qkv.uses_norm_epilogue() is False
