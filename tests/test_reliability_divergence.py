"""Divergence on the real local cluster: an absurd learning rate makes the real trainer's loss/gradients
non-finite; it stops within one log interval, never saves the poisoned state over the last good checkpoint,
exits 3, and `status` says DIVERGED."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from conftest import cli, wait_state
from reliability_support import submit, trainer_recipe
from trainer.checkpointing import checkpoint as ckpt

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
LOG_INTERVAL = 4


def test_absurd_lr_diverges_stops_and_keeps_the_good_checkpoint(local_slurm, job_env, tmp_path):
    entry = submit(job_env, trainer_recipe(tmp_path, "nan"), "trainer.schedule.train_iters=40",
                   "trainer.schedule.lr=10", "trainer.schedule.min_lr=10", "trainer.schedule.warmup_iters=0",
                   "trainer.schedule.lr_decay=constant", "trainer.schedule.clip_grad=0",
                   "trainer.checkpoint.save_interval=2", "trainer.checkpoint.keep_last=20",
                   f"trainer.logging.log_interval={LOG_INTERVAL}")
    row = wait_state(job_env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240,
                     key="scheduler_state")
    assert row["state"] == "DIVERGED" and row["diverged"] is True, row
    assert row["scheduler_state"] == "FAILED" and row["trainer_exit_code"] == 3
    assert "DIVERGED" in cli(job_env, "status").stdout

    run_dir = Path(entry["run_dir"])
    text = (run_dir / "logs" / "rank-0" / "debug.log").read_text()
    bad = int(re.search(r"\] diverged \| iteration (\d+) \|", text).group(1))
    stopped = int(re.search(r"training finished \| iterations (\d+) \| exit 3", text).group(1))
    assert bad <= stopped < bad + LOG_INTERVAL  # within one log interval of the first non-finite step

    saved = [int(m) for m in re.findall(r"\] checkpoint saved \| iteration (\d+)", text)]
    assert saved and max(saved) < bad  # nothing saved from the bad iteration on
    ck = run_dir / "checkpoints"
    assert (ck / "latest").read_text() == ckpt.iter_name(max(saved))
    assert not [p for p in ck.iterdir() if p.name.startswith(("iter_", ".tmp-")) and int(p.name[-7:]) >= bad]
    state, meta = ckpt.load(ckpt.read_latest(str(ck)), rank=0, coords=(0, 0, 0))
    assert math.isfinite(meta["lm_loss"]) and json.dumps(meta)
    assert all(torch.isfinite(t).all() for t in state["adapter"].values())
