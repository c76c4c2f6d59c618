"""Sweeps on the real local Slurm cluster (issue 32): one job array of the accepted trials, a leaderboard of all of
them, cancel and resume of one task alone. The trials are the small quickstart trainer (test_train_support.SMALL)."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import cli
from reliability_support import trainer_recipe
from test_train_support import SMALL

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "DIVERGED", "TIMEOUT", "REFUSED"}


def sweep(env, recipe, *args) -> dict:
    sets = [x for s in SMALL for x in ("--set", s)]
    out = cli(env, "sweep", str(recipe), *sets, *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def board(env, ref: str) -> list[dict]:
    out = cli(env, "status", ref, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["trials"]


def wait_board(env, ref: str, done, timeout: float = 600) -> list[dict]:
    end = time.monotonic() + timeout
    rows = []
    while time.monotonic() < end:
        rows = board(env, ref)
        if done(rows):
            return rows
        time.sleep(1)
    raise AssertionError(f"sweep {ref} never got there: {rows}")


def test_sweep_refused_diverged_completed(local_slurm, job_env, tmp_path):
    """4 trials: TP 3 on one process is refused before submission, lr 10 diverges (exit 3), two complete; each
    trial is followed by its own eval job (--then eval), which Slurm removes behind the diverged one."""
    recipe = trainer_recipe(tmp_path, "sweep")
    data = sweep(job_env, recipe, "--set", "trainer.schedule.train_iters=12",
                 "--set", "trainer.schedule.eval_interval=6",
                 "--set", "trainer.checkpoint.save_interval=6", "--set", "trainer.schedule.clip_grad=0",
                 "--set", "trainer.schedule.warmup_iters=0", "--set", "trainer.schedule.lr_decay=constant",
                 "--zip", "trainer.schedule.lr=5e-3,10,2e-3,5e-3", "--zip", "trainer.parallelism.tensor=1,1,1,3",
                 "--max-parallel", "2", "--then", "eval")
    trials = data["trials"]
    assert [t["task"] for t in trials] == [0, 1, 2, None]
    assert trials[3]["error"].startswith("`trainer.parallelism") and trials[3]["run_id"] is None
    array = data["runs"][0]["job_id"].split("_")[0]
    assert [r["job_id"] for r in data["runs"]] == [f"{array}_{k}" for k in range(3)]
    script = (Path(data["sweep_dir"]) / "array.sbatch").read_text()
    assert "#SBATCH --array=0-2%2\n" in script and script.count(") RUN_DIR=") == 3

    rows = wait_board(job_env, data["sweep_id"], lambda rows: all(r["state"] in ENDED for r in rows))
    by_trial = {r["trial"]: r for r in rows}
    assert [r["trial"] for r in rows][:2] in ([0, 2], [2, 0]) and [r["trial"] for r in rows][2:] == [1, 3]
    assert rows[0]["best_eval_loss"] <= rows[1]["best_eval_loss"]  # best eval loss first
    for k in (0, 2):
        r = by_trial[k]
        assert r["state"] == "COMPLETED" and r["exit_code"] == 0 and r["iteration"] == 12, r
        assert r["last_eval_loss"] is not None and r["best_eval_loss"] <= r["last_eval_loss"]
        assert r["tokens_per_s_gpu"] > 0 and r["gpu_hours"] == 0.0 and r["elapsed_s"] > 0  # CPU: no GPU
    assert by_trial[1]["state"] == "DIVERGED" and by_trial[1]["exit_code"] == 3, by_trial[1]
    assert by_trial[3]["state"] == "REFUSED" and by_trial[3]["error"] == trials[3]["error"]

    ports = set()
    for k, entry in enumerate(data["runs"]):  # no file of any trial lost; each its own rendezvous port
        run_dir = Path(entry["run_dir"])
        for name in ("job.sbatch", "recipe.resolved.yaml", "run.json", "logs/rank-0/debug.log",
                     f"logs/slurm-{array}_{k}.out"):
            assert (run_dir / name).is_file(), (k, name)
        out = (run_dir / f"logs/slurm-{array}_{k}.out").read_text()
        ports.add(re.search(r"rendezvous \S+:(\d+)", out).group(1))
        assert f"lr: {trials[k]['values']['trainer.schedule.lr']}" in (run_dir / "recipe.yaml").read_text()
    for k in (0, 2):
        assert (Path(data["runs"][k]["run_dir"]) / "checkpoints" / "iter_0000012").is_dir()
    assert len(ports) == 3

    def steps(k):  # each trial followed by its own eval job, behind its array task
        return json.loads(cli(job_env, "status", data["runs"][k]["run_id"], "--json").stdout)["pipeline"]
    end = time.monotonic() + 120
    while any(steps(k)[0]["state"] not in ENDED for k in (0, 1, 2)):
        assert time.monotonic() < end, [steps(k) for k in (0, 1, 2)]
        time.sleep(1)
    assert [steps(k)[0]["state"] for k in (0, 1, 2)] == ["COMPLETED", "CANCELLED", "COMPLETED"]
    script = next(Path(data["runs"][0]["run_dir"]).glob("evals/*/job.sh")).read_text()
    assert f"#SBATCH --dependency=afterok:{array}_0\n" in script

    text = cli(job_env, "compare", data["sweep_id"], "--plot", str(tmp_path / "sweep.png"))
    assert text.returncode == 0 and "REFUSED" in text.stdout and (tmp_path / "sweep.png").stat().st_size > 1000
    assert "already ended" in cli(job_env, "cancel", data["sweep_id"]).stdout


def _two_trials_past_a_checkpoint(job_env, tmp_path, name: str, iters: int):
    """A two-trial lr sweep saving every 5 iterations, once both trials are past iteration 6 (a checkpoint each):
    (sweep json, first trial, second trial)."""
    data = sweep(job_env, trainer_recipe(tmp_path, name), "--set", f"trainer.schedule.train_iters={iters}",
                 "--set", "trainer.checkpoint.save_interval=5",
                 "--grid", "trainer.schedule.lr=5e-3,2e-3")
    wait_board(job_env, data["sweep_id"], lambda rows: all((r.get("iteration") or 0) >= 6 for r in rows))
    first, second = data["runs"]
    return data, first, second


def test_sweep_tasks_cancelled_and_requeued_alone(local_slurm, job_env, tmp_path):
    """One two-trial sweep (one sweep for both cases since 2026-12-06, for CI time):
    - trial 0 is cancelled mid-run while trial 1 goes on; `resume SWEEP` restarts trial 0 alone, from its
      checkpoint, as a job of its own;
    - the time-limit warning (USR2, as slurmctld sends it) reaches trial 1's task only: that task checkpoints and
      requeues itself (its own job id, SLURM_RESTART_COUNT 1), resumes, and completes; trial 0 is left alone."""
    # 300 iterations (~10 s at ~30 ms each): at 60 the trial had finished on an idle machine before the warning landed
    data, first, second = _two_trials_past_a_checkpoint(job_env, tmp_path, "sweep2", iters=300)
    try:
        assert cli(job_env, "cancel", first["run_id"]).returncode == 0
        rows = wait_board(job_env, data["sweep_id"], lambda rows: rows and any(r["state"] == "CANCELLED" for r in rows))
        assert {r["run_id"]: r["state"] for r in rows}[second["run_id"]] == "RUNNING"
        subprocess.run(["scancel", "--batch", "--signal=USR2", second["job_id"]], check=True)
        wait_board(job_env, data["sweep_id"],
                   lambda rows: {r["run_id"]: r["state"] for r in rows}[second["run_id"]] in ("PENDING", "REQUEUED"))
        # the requeue of trial 1 leaves trial 0 as it was (the task that starts last keeps the array's own id, which
        # names every task: the job script requeued and signalled the whole array by it until 2026-12-06)
        assert {r["run_id"]: r["state"] for r in board(job_env, data["sweep_id"])}[first["run_id"]] == "CANCELLED"
        out = cli(job_env, "resume", data["sweep_id"])
        assert out.returncode == 0 and out.stdout.count("resumed run") == 1 and first["run_id"] in out.stdout, out
        assert "not resumed" in out.stdout and second["run_id"] in out.stdout  # requeued by Slurm: left alone
        # a requeued job waits ~2.5 min for its begin time here; the test need not
        subprocess.run(["scontrol", "update", f"JobId={second['job_id']}", "StartTime=now"], check=True)
        rows = wait_board(job_env, data["sweep_id"], lambda rows: all(r["state"] in ENDED for r in rows))
        assert all(r["state"] == "COMPLETED" and r["iteration"] == 300 for r in rows), rows
        by_run = {r["run_id"]: r for r in rows}
        resumed, requeued = by_run[first["run_id"]], by_run[second["run_id"]]
        assert resumed["job_id"] != first["job_id"] and "_" not in resumed["job_id"]  # its own job now
        events = Path(first["run_dir"]) / "logs" / "rank-0" / "events.attempt-1.jsonl"
        start = json.loads(events.read_text().splitlines()[0])
        assert start["event"] == "start" and start["resumed_from"], start  # from its own checkpoint
        assert requeued["attempts"] == 2 and requeued["job_id"] == second["job_id"]  # the same task, requeued
        out = (Path(second["run_dir"]) / "logs" / f"slurm-{second['job_id']}.out").read_text()
        assert "requeueing job" in out and "attempt 1" in out
        events = Path(second["run_dir"]) / "logs" / "rank-0" / "events.attempt-1.jsonl"
        assert json.loads(events.read_text().splitlines()[0])["resumed_from"]
    finally:  # this sweep's unfinished trials only, by id
        cli(job_env, "cancel", data["sweep_id"])


def test_cancel_settles_tasks_that_never_started(local_slurm, job_env, job_recipe):
    """cancel SWEEP on an array throttled by --max-parallel (issue 39): the tasks still pending read CANCELLED, as
    the one that ran does (sacct keeps them only as one row `<array>_[1-2%1]`), never UNKNOWN. The tiny test job."""
    out = cli(job_env, "sweep", str(job_recipe("sleep:120", nodes=1)), "--grid", "trainer.schedule.lr=1e-2,2e-2,3e-2",
              "--max-parallel", "1", "--json", "--then", "eval")
    assert out.returncode == 0, out.stderr
    sweep_id = json.loads(out.stdout)["sweep_id"]
    rows = wait_board(job_env, sweep_id, lambda rows: any(r["state"] == "RUNNING" for r in rows))
    running = next(r for r in rows if r["state"] == "RUNNING")  # a CPU trial: threads from the CPUs Slurm gave it
    out_file = Path(running["run_dir"]) / "logs" / f"slurm-{running['job_id']}.out"
    cpus = subprocess.run(["scontrol", "show", "job", running["job_id"]], capture_output=True, text=True).stdout
    n = int(re.search(r"NumCPUs=(\d+)", cpus).group(1))
    assert f"primus-slurm: OMP_NUM_THREADS={n} per rank, from the job's {n} CPU(s)" in out_file.read_text()
    out = cli(job_env, "cancel", sweep_id)
    # each trial's afterok step is cancelled first: Slurm may start a step behind a task cancelled while pending
    assert out.returncode == 0 and out.stdout.count("cancelled run") == 6 and out.stdout.count("eval step") == 3, out
    rows = wait_board(job_env, sweep_id, lambda rows: all(r["state"] in ENDED for r in rows) and
                      all(s["state"] in ENDED for r in rows for s in r["then"]))
    assert [r["state"] for r in sorted(rows, key=lambda r: r["trial"])] == ["CANCELLED"] * 3, rows
    assert [s["state"] for r in rows for s in r["then"]] == ["CANCELLED"] * 3, rows
