"""The real `python -m trainer` on the quickstart data (tiny Llama, CPU, one process)."""
from __future__ import annotations

import signal
import subprocess
import time

import pytest
import torch

from tests.test_train_support import (ROOT, beside, log_text, losses, run_trainer, trainer_cmd, trainer_env,
                                      write_recipe)
from trainer.checkpointing import checkpoint as ckpt


def _adapter(run_dir, iteration):
    state, _ = ckpt.load(str(run_dir / "checkpoints" / ckpt.iter_name(iteration)), rank=0, coords=(0, 0, 0))
    return state


SETS = {"loss": ("trainer.schedule.train_iters=40", "trainer.schedule.eval_interval=20",
                 "trainer.schedule.eval_iters=2", "trainer.logging.log_interval=5",
                 "trainer.checkpoint.save_interval=20"),
        "nan": ("trainer.schedule.train_iters=20", "trainer.schedule.warmup_iters=0",
                "trainer.schedule.lr_decay=constant", "trainer.schedule.clip_grad=0.0",
                "trainer.checkpoint.save_interval=1", "trainer.logging.log_interval=4",
                "trainer.schedule.lr=10", "trainer.schedule.min_lr=10")}  # (the schema's largest LR)
TESTS = {"loss": "test_loss_goes_down_and_log_format",
         "nan": "test_nan_loss_stops_with_exit_3_without_overwriting_checkpoint"}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict:
    """The runs of the TESTS that this session selected (`make check` leaves the slow one out), started at once
    when the first of them comes (one trainer thread each: test_train_support.beside): {case: (run dir, future of
    run_trainer's result)}."""
    selected = {item.originalname for item in request.session.items if item.module is request.module}
    tmp = {case: tmp_path_factory.mktemp(case) for case in SETS if TESTS[case] in selected}
    return {case: (tmp[case] / "run", beside(run_trainer, write_recipe(tmp[case], *SETS[case]), tmp[case] / "run"))
            for case in tmp}


@pytest.mark.slow  # ~11 s on two cores under load: `make test` runs it, `make check` does not
def test_loss_goes_down_and_log_format(runs):
    run, started = runs["loss"]
    res = started.result()
    assert res.returncode == 0, res.stderr[-3000:]
    text = log_text(run)
    curve = losses(text)
    assert sorted(curve) == list(range(5, 41, 5))
    first, last = float(curve[5]), float(curve[40])
    assert last < first - 0.5, curve
    assert "] primus-trainer start | attempt 0 | world_size 1 | device cpu | resumed_from none" in text
    assert "] arg model.num_layers = 2" in text
    assert "] precision | " in text
    assert "] eval iteration 20 | eval loss " in text and "] eval iteration 40 | eval loss " in text
    assert "] checkpoint saved | iteration 40 | path checkpoints/iter_0000040" in text
    # an iteration that evaluates and saves evaluates first: FP8 delayed scaling's amax history, which the
    # checkpoint holds, then has the eval's amaxes in it, as the run that goes on has (trainer/step/train.py)
    assert text.index("] eval iteration 20 |") < text.index("] checkpoint saved | iteration 20 |")
    assert text.rstrip().endswith("training finished | iterations 40 | exit 0")
    assert (run / "checkpoints" / "latest").read_text() == "iter_0000040"


@pytest.mark.slow  # ~23 s on two cores under load: `make test` runs it, `make check` does not
def test_signal_checkpoint_then_resume_matches_uninterrupted(tmp_path):
    iters = 8
    cfg = write_recipe(tmp_path, f"trainer.schedule.train_iters={iters}")
    straight = tmp_path / "straight"
    uninterrupted = beside(run_trainer, cfg, straight)  # the reference, while attempt 0 runs

    # attempt 0: SIGUSR2 (what the sbatch trap forwards) once iteration 2 is logged
    run = tmp_path / "interrupted"
    proc = subprocess.Popen(trainer_cmd(cfg, run), env=trainer_env(0), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if "] iteration 2/" in line:
            proc.send_signal(signal.SIGUSR2)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    first = log_text(run, 0)
    stopped = max(losses(first))
    assert 2 <= stopped < iters, first
    assert f"stop signal | signal SIGUSR2 | iteration {stopped}" in first
    assert f"checkpoint saved | iteration {stopped}" in first
    assert first.rstrip().endswith(f"training finished | iterations {stopped} | exit 75")
    res = uninterrupted.result()
    assert res.returncode == 0, res.stderr[-3000:]
    ref = losses(log_text(straight))

    # attempt 1 (requeue): resumes from latest, writes its own log, finishes
    res = run_trainer(cfg, run, attempt=1)
    assert res.returncode == 0, res.stderr[-3000:]
    second = log_text(run, 1)
    assert f"resumed_from checkpoints/{ckpt.iter_name(stopped)}" in second
    assert log_text(run, 0) == first  # attempt 0's log untouched
    resumed = losses(second)
    assert sorted(resumed) == list(range(stopped + 1, iters + 1))
    for it in resumed:
        assert resumed[it] == ref[it], (it, resumed[it], ref[it])
    a, b = _adapter(straight, iters), _adapter(run, iters)
    for name, tensor in a["adapter"].items():
        torch.testing.assert_close(b["adapter"][name], tensor, rtol=0, atol=1e-6)
    assert b["data"]["consumed_samples"] == iters * 4


def test_nan_loss_stops_with_exit_3_without_overwriting_checkpoint(runs):
    run, started = runs["nan"]
    res = started.result()
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    text = log_text(run)
    diverged = [ln for ln in text.splitlines() if "] diverged | iteration " in ln]
    assert len(diverged) == 1, text
    bad = int(diverged[0].split("iteration ")[1].split(" ")[0])
    assert "lm loss nan" in diverged[0] or "lm loss inf" in diverged[0] or "grad norm" in diverged[0]
    saved = sorted(int(ln.split("iteration ")[1].split(" ")[0]) for ln in text.splitlines() if "checkpoint saved" in ln)
    assert all(it < bad for it in saved)
    latest = (run / "checkpoints" / "latest").read_text() if saved else None
    assert latest == (ckpt.iter_name(saved[-1]) if saved else None)
    assert not (run / "checkpoints" / ckpt.iter_name(bad)).exists()
    assert text.rstrip().endswith(f"exit 3")
