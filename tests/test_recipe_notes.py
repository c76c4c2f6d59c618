"""The `note:` lines of primus_contract/rules_dependent.py: a key set where its feature is off is accepted (turning a
feature off with one override leaves its settings behind, and that must run), and validate, the dry run and the
trainer say so in one line, never silently, and never where the key may act."""
from __future__ import annotations

import pytest

from primus_slurm.cli import run
from primus_slurm.config.recipe import load_recipe
from primus_slurm.resources import recipes_dir

QS = str(recipes_dir() / "quickstart.yaml")


@pytest.mark.parametrize("sets,note", [
    (["trainer.schedule.eval_interval=null", "trainer.schedule.target_eval_loss=1.0"],
     "note: `trainer.schedule.target_eval_loss` is 1.0 but does nothing without `trainer.schedule.eval_interval`"),
    (["trainer.recompute.method=block"], 'note: `trainer.recompute.method` is "block" but does nothing without '
                                         "`trainer.recompute.granularity: full`"),
    (["trainer.precision.fp8_recipe=tensorwise"], 'note: `trainer.precision.fp8_recipe` is "tensorwise"'),
    (["trainer.logging.profile_trace=true"], "note: `trainer.logging.profile_trace` is true"),
    (["cluster.currency=EUR"], 'note: `cluster.currency` is "EUR" but does nothing without `cluster.gpu_hour_price`'),
    # silent before (audit, 2026-12-06)
    (["trainer.data.packing=false", "trainer.data.single_document_sbhd=false"],
     "note: `trainer.data.single_document_sbhd` is false but does nothing without `trainer.data.packing: true`"),
    (["trainer.recompute.chunked_loss=false", "trainer.recompute.chunked_loss_kernel=false"],
     "note: `trainer.recompute.chunked_loss_kernel` is false but does nothing without `trainer.recompute.chunked_loss"),
    (["trainer.distributed.nccl_eager_init=true"], "note: `trainer.distributed.nccl_eager_init` is true but does "
                                                    "nothing without NCCL"),
    # device auto on env profile cpu runs on CPU over gloo (audit, 2026-12-07: the rule read the raw device)
    (["trainer.distributed.device=auto", "trainer.distributed.backend=auto",
      "trainer.distributed.nccl_eager_init=true"],
     "note: `trainer.distributed.nccl_eager_init` is true but does nothing without NCCL"),
])
def test_a_key_whose_feature_is_off_is_a_note_never_silent(sets, note, capsys):
    """primus_contract/rules_dependent.py: accepted (turning a feature off with one override leaves its settings
    behind, and that must run), but validate and the dry run each say, in one note line, that it does nothing."""
    argv = [a for s in sets for a in ("--set", s)]
    assert run(["validate", QS, *argv]) == 0
    assert note in capsys.readouterr().out
    assert run(["submit", QS, "--executor", "local", "--dry-run", *argv]) == 0
    assert note in capsys.readouterr().err


def test_a_device_the_recipe_leaves_to_the_node_gets_no_note_it_may_contradict():
    """Device auto on env profile none (the schema's default) may run on an NVIDIA GPU or on CPU: a GPU-only key is
    noted only where it does nothing on either (audit, 2026-12-07: the kernels' keys were noted as doing nothing, and
    the trainer repeated the notes on an NVIDIA node); the trainer judges the device it got (trainer/__main__.py)."""
    from primus_contract.rules_dependent import inert_keys
    from trainer.__main__ import _on_device

    unknown = ["cluster.env_profile=none", "trainer.distributed.device=auto", "trainer.distributed.backend=auto",
               "trainer.precision.bf16=true", "trainer.recompute.chunked_loss_kernel=false"]
    r = load_recipe(QS, unknown).resolved
    assert not [line for line in inert_keys(r) if "chunked_loss_kernel" in line]
    for device, noted in (("cpu", True), ("cuda", False)):
        got = inert_keys(_on_device(r, type("Device", (), {"type": device})()))
        assert any("chunked_loss_kernel" in line for line in got) == noted, device
    # a key that does nothing on either device is still noted
    r = load_recipe(QS, [*unknown, "trainer.recompute.chunked_loss=false"]).resolved
    assert any("chunked_loss_kernel" in line for line in inert_keys(r))
