"""`python -m trainer` under torchrun (2 gloo ranks): DP=2 and TP=2 log the same loss and grad norm
as one process on the same global batches (global token mean, DP grad SUM, TP-aware grad norm)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.test_train_support import ROOT, beside, log_text, run_trainer, trainer_env, write_recipe
from tests.model_helpers import free_port

LINE = re.compile(r"\] iteration (\d+)/\d+ \| lm loss (\S+) \| lr \S+ \| grad norm (\S+) \|")


def _curve(run_dir):
    return {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in LINE.finditer(log_text(run_dir))}


def _torchrun(cfg, run_dir):
    cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "trainer",
           "--config", str(cfg), "--run-dir", str(run_dir)]
    return subprocess.run(cmd, env=trainer_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_dp2_and_tp2_match_single_process(tmp_path):
    sets = ("trainer.schedule.train_iters=3", "trainer.checkpoint.disable_last_saving=true")
    single = tmp_path / "single"
    runs = {"single": beside(run_trainer, write_recipe(tmp_path, *sets, name="one.yaml"), single)}  # all three at once
    for name, extra in (("dp2", ()), ("tp2", ("trainer.parallelism.tensor=2",))):
        cfg = write_recipe(tmp_path, *sets, "cluster.nproc_per_node=2", *extra, name=f"{name}.yaml")
        runs[name] = beside(_torchrun, cfg, tmp_path / name)
    res = runs.pop("single").result()
    assert res.returncode == 0, res.stderr[-3000:]
    ref = _curve(single)
    assert sorted(ref) == [1, 2, 3]
    for name, started in runs.items():
        res = started.result()
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        text = log_text(tmp_path / name)
        assert "| world_size 2 |" in text
        got = _curve(tmp_path / name)
        assert sorted(got) == [1, 2, 3]
        for it, (loss, norm) in ref.items():
            assert got[it][0] == pytest.approx(loss, rel=2e-6), (name, it)
            assert got[it][1] == pytest.approx(norm, rel=2e-3), (name, it)
        assert not (tmp_path / name / "checkpoints").exists()  # disable_last_saving
