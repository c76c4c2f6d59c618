"""A sweep with the local executor (issue 32): the trials run one after another (--max-parallel 1) from the
local queue; a trial cancelled while it waits never starts; the leaderboard shows them all; with W&B on, the
trials are one W&B group, the sweep id (offline W&B, read back by wandb itself)."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli
from primus_contract import run_files
from test_trackers import WANDB_OFFLINE, wandb_runs
from test_train_support import SMALL

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "DIVERGED"}


@pytest.mark.slow  # ~27 s: `make test` runs it, `make check` does not
def test_local_sweep_runs_one_after_another(tmp_path):
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PRIMUS_WORKSPACE=str(tmp_path / "ws"),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    sets = [x for s in (*SMALL, *WANDB_OFFLINE, "trainer.schedule.train_iters=6", "trainer.schedule.eval_interval=3",
                        f"trainer.data.cache_dir={tmp_path / 'cache'}") for x in ("--set", s)]
    out = cli(env, "sweep", str(ROOT / "recipes" / "quickstart.yaml"), "--executor", "local", *sets,
              "--grid", "trainer.lora.dim=4,8,16", "--max-parallel", "1", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    runs = data["runs"]
    assert len(runs) == 3 and all(r["executor"] == "local" for r in runs)
    board = json.loads(cli(env, "status", data["sweep_id"], "--json").stdout)["trials"]
    assert {r["trial"]: r["state"] for r in board}[2] == "PENDING"
    cancel = cli(env, "cancel", runs[2]["run_id"])  # waiting in the queue: marked, never started
    assert cancel.returncode == 0, cancel.stderr

    end = time.monotonic() + 600
    while True:
        board = json.loads(cli(env, "status", data["sweep_id"], "--json").stdout)["trials"]
        if all(r["state"] in ENDED for r in board):
            break
        assert time.monotonic() < end, board
        time.sleep(1)
    states = {r["trial"]: r for r in board}
    for k in (0, 1):
        assert states[k]["state"] == "COMPLETED" and states[k]["exit_code"] == 0 and states[k]["iteration"] == 6
        assert states[k]["best_eval_loss"] is not None
    assert states[2]["state"] == "CANCELLED" and not (Path(runs[2]["run_dir"]) / "logs" / "local.out").exists()
    assert [r["trial"] for r in board][2] == 2  # no eval loss: after those that have one

    def span(run) -> tuple[float, float]:
        events = run_files.read_events(Path(run["run_dir"]) / "logs" / "rank-0" / "events.jsonl")
        return events[0]["t"], events[-1]["t"]
    assert span(runs[0])[1] <= span(runs[1])[0]  # one after another
    for k in (0, 1):
        (records,) = wandb_runs(Path(runs[k]["run_dir"]))
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        assert run["run_group"] == data["sweep_id"], run
    assert "queue done" in (Path(data["sweep_dir"]) / "logs" / "queue.out").read_text()


@pytest.mark.slow  # ~5 s: kept out of `make check`'s 3 minutes
def test_runs_the_queue_starts_together_share_the_cpus(job_env, job_recipe):
    """--max-parallel 2 on this machine: each trial's ranks get nproc / 2 threads (the job script's line), not a
    thread per core each; the tiny test job, no training."""
    env = {k: v for k, v in job_env.items() if k != "OMP_NUM_THREADS"}
    out = cli(env, "sweep", str(job_recipe("ok", nodes=1, executor="local")), "--grid", "trainer.lora.dim=4,8",
              "--max-parallel", "2", "--json")
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    end = time.monotonic() + 120
    for r in runs:
        path = Path(r["run_dir"]) / "logs" / "local.out"
        while "exited with code" not in (path.read_text() if path.exists() else ""):
            assert time.monotonic() < end, path
            time.sleep(0.5)
        text = path.read_text()
        m = re.search(r"OMP_NUM_THREADS=(\d+) per rank: this machine's (\d+) CPU\(s\) shared by 2 runs at once", text)
        assert m and int(m[1]) == max(1, int(m[2]) // 2), text  # (the CPUs nproc counts: the job's affinity)
