"""The chunked loss's passes over the logits in the plan's step time (primus_contract/plan/speed.py, feature
loss_elementwise): trainer.recompute.chunked_loss_kernel makes a BF16 plan on an NVIDIA GPU faster by the bytes its
two Triton passes save over the fp32 torch path; where the kernel does not run (ROCm, fp32) or there is no chunked
loss, the key changes nothing."""
from __future__ import annotations

from pathlib import Path

import pytest

from primus_contract.plan import plan
from primus_contract.plan.speed import LOSS_BYTES_PER_LOGIT
from primus_slurm.config.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent
ON, OFF = "trainer.recompute.chunked_loss_kernel=true", "trainer.recompute.chunked_loss_kernel=false"


def planned(*sets):
    return plan(load_recipe(ROOT / "bench/recipes/llama3_8b_h200.yaml", list(sets)).resolved)


@pytest.mark.parametrize("sets", [("cluster.env_profile=h200",), ("cluster.env_profile=h100",),
                                  ("cluster.env_profile=h100", "trainer.precision.fp8=hybrid")],
                         ids=["h200-bf16", "h100-bf16", "h100-fp8"])
def test_the_kernel_makes_a_bf16_nvidia_plan_faster(sets):
    on, off = planned(*sets, ON), planned(*sets, OFF)
    loss_on, loss_off = on.time_parts["loss_elementwise"], off.time_parts["loss_elementwise"]
    assert loss_on == pytest.approx(loss_off * LOSS_BYTES_PER_LOGIT["kernel"] / LOSS_BYTES_PER_LOGIT["torch"])
    assert on.step_s - loss_on == pytest.approx(off.step_s - loss_off)  # nothing else moves
    # a few percent at the 8B shape (measured on an H100, 2026-12-06b: +2.5 % BF16, +2.7-3.1 % FP8)
    assert 1.01 < on.tokens_per_s_per_gpu / off.tokens_per_s_per_gpu < 1.05


@pytest.mark.parametrize("sets", [("cluster.env_profile=mi300x",),
                                  ("cluster.env_profile=h200", "trainer.precision.bf16=false"),
                                  ("cluster.env_profile=h200", "trainer.recompute.chunked_loss=false")],
                         ids=["rocm", "fp32", "chunked-loss-off"])
def test_where_the_kernel_does_not_run_the_plan_is_unchanged(sets):
    on, off = planned(*sets, ON), planned(*sets, OFF)
    assert on.time_parts == off.time_parts and on.step_s == off.step_s
    chunked = "trainer.recompute.chunked_loss=false" not in sets
    assert ("loss_elementwise" in on.time_parts) == chunked  # the torch path's passes, or megatron's loss
