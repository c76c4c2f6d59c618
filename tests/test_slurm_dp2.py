"""Data parallelism across the project's local Slurm cluster: a DP=2 training job (node1 + node2, one
rank each) goes through the real rendered sbatch script, srun and torchrun into `python -m trainer`,
finishes COMPLETED, and logs the same per-iteration losses as one process running the job's own
resolved recipe (global token mean over both ranks' micro-batches, DP grad SUM)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import wait_state
from reliability_support import cancel, submit, trainer_recipe
from test_train_support import beside, log_text, losses, run_trainer

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ITERS = 4


def test_dp2_two_node_job_matches_single_process(local_slurm, job_env, tmp_path):
    recipe = trainer_recipe(tmp_path, "dp2", nodes=2)
    entry = submit(job_env, recipe, f"trainer.schedule.train_iters={ITERS}", "trainer.checkpoint.disable_last_saving=true")
    run_dir = Path(entry["run_dir"])
    single = tmp_path / "single"  # the job's own resolved recipe in one process, while the job runs
    reference = beside(run_trainer, run_dir / "recipe.resolved.yaml", single)
    try:
        done = wait_state(job_env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"},
                          timeout=240, key="scheduler_state")
    finally:
        cancel(entry["job_id"])
    text = log_text(run_dir)
    assert done["state"] == "COMPLETED", (done, text[-2000:])
    assert text.rstrip().endswith(f"training finished | iterations {ITERS} | exit 0")
    assert done["nodes"] == "node[1-2]" and "| world_size 2 |" in text
    job = {it: float(v) for it, v in losses(text).items()}
    assert sorted(job) == list(range(1, ITERS + 1))

    res = reference.result()
    assert res.returncode == 0, res.stderr[-3000:]
    ref = {it: float(v) for it, v in losses(log_text(single)).items()}
    assert "| world_size 1 |" in log_text(single)
    for it, loss in ref.items():
        assert job[it] == pytest.approx(loss, rel=2e-6), (it, job[it], loss)
    assert ref[ITERS] != ref[1]  # the optimizer moved: equal curves are not two copies of one value
