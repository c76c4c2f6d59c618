"""The plan resolves the null (auto) levers for the recipe's machine as the trainer will (primus_contract/plan
auto_levers, a note) and prices FP8 attention where it runs (speed.py: the attention feature times
calibration.FP8_ATTENTION_TIME)."""
from __future__ import annotations

from pathlib import Path

from primus_contract.plan import plan
from primus_contract.plan import calibration as cal
from primus_slurm.config.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent


def planned(*sets):
    return plan(load_recipe(ROOT / "bench/recipes/llama3_8b_h200.yaml", ["cluster.env_profile=h200", *sets]).resolved)


def _note(p) -> str:
    return next(n for n in p.notes if n.startswith("automatic levers"))


def test_the_note_says_how_each_null_lever_runs_here():
    bf16 = _note(planned())
    assert all(f"{k} on" in bf16 for k in ("lora.fused_swiglu", "lora.epilogue", "lora.epilogue_norm"))
    assert "precision.fp8_dot_product_attention off" in bf16
    fp8 = _note(planned("trainer.precision.fp8=hybrid", "trainer.data.packing=false"))
    assert "lora.epilogue on" in fp8 and "lora.epilogue_norm on" in fp8  # FP8 delayed: TE's functional linear
    blockwise = _note(planned("trainer.precision.fp8=hybrid", "trainer.precision.fp8_recipe=blockwise"))
    assert "lora.epilogue off" in blockwise and "lora.epilogue_norm off" in blockwise
    assert "precision.fp8_dot_product_attention on" in fp8
    written = _note(planned("trainer.lora.epilogue=false"))  # a key written out is not listed
    assert "lora.epilogue " not in written and "lora.epilogue_norm off" in written


def test_fp8_attention_is_priced_where_it_runs():
    auto = planned("trainer.precision.fp8=hybrid", "trainer.data.packing=false")
    off = planned("trainer.precision.fp8=hybrid", "trainer.data.packing=false",
                  "trainer.precision.fp8_dot_product_attention=false")
    assert abs(auto.time_parts["attention"] - cal.FP8_ATTENTION_TIME * off.time_parts["attention"]) < 1e-12
    assert auto.tokens_per_s_per_gpu > off.tokens_per_s_per_gpu
    packed = planned("trainer.precision.fp8=hybrid")  # THD: TE has no FP8 attention, nothing changes
    assert "precision.fp8_dot_product_attention off" in _note(packed)
    # unless every packed row holds one document, which only the loaded data shows (trainer.precision.follow_data)
    assert "off (on at start if every row of the train split holds one document)" in _note(packed)
    current = _note(planned("trainer.precision.fp8=hybrid", "trainer.precision.fp8_recipe=tensorwise"))
    assert "precision.fp8_dot_product_attention off" in current and "one document" not in current  # sm90: never
    thd = _note(planned("trainer.precision.fp8=hybrid", "trainer.data.single_document_sbhd=false"))
    assert "precision.fp8_dot_product_attention off" in thd and "one document" not in thd  # always THD
