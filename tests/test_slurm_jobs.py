"""submit/status/logs/cancel against the project's real local Slurm cluster (scripts/local-slurm.sh).

Each job is a real 2-node torchrun (node1 + node2) of tests/slurm_jobs/primus_testjob.py; starting torch
in four processes on two cores takes ~15-25 s, so there are few jobs and each test checks a lot.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import CLI, cli, status_json, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def submit(env, recipe, *extra) -> dict:
    out = cli(env, "submit", str(recipe), "--json", *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_two_node_job_runs_streams_and_completes(local_slurm, job_env, job_recipe):
    recipe = job_recipe("sleep:4")
    run_id = "20260101-000000-abc123"
    dry = cli(job_env, "submit", str(recipe), "--dry-run", "--run-id", run_id)
    assert dry.returncode == 0, dry.stderr
    entry = submit(job_env, recipe, "--run-id", run_id)
    assert entry["executor"] == "slurm" and entry["job_id"].isdigit()

    # the file submitit handed to sbatch is the --dry-run script, byte for byte
    run_dir = Path(entry["run_dir"])
    info = json.loads((run_dir / "run.json").read_text())
    submitted = Path(info["submitted_file"]).read_text()
    assert dry.stdout.startswith(submitted) and "#SBATCH --nodes=2" in submitted
    assert (run_dir / "job.sbatch").read_text() == submitted
    assert (run_dir / "code" / "trainer" / "__init__.py").is_file()
    assert not list((run_dir / "code").rglob("__pycache__"))
    for key in ("git_sha", "git_dirty", "recipe_hash", "user", "submit_time", "job_id", "executor"):
        assert key in info, key
    assert len(info["recipe_hash"]) == 64 and info["job_id"] == entry["job_id"]

    running = wait_state(job_env, run_id, {"RUNNING"})
    assert running["nodes"] == "node[1-2]"
    # logs -f: a line arrives while the job still runs (streaming), then it exits with the job's code
    proc = subprocess.Popen([str(CLI), "logs", run_id, "-f"], env=job_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = ""
    while "iteration 1/4" not in line:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "logs -f ended before any iteration line"
    assert status_json(job_env, run_id)["state"] == "RUNNING"
    rest, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0 and "training finished | iterations 4 | exit 0" in rest

    done = wait_state(job_env, run_id, {"COMPLETED", "FAILED"}, key="scheduler_state")
    assert done["state"] == "COMPLETED" and done["exit_code"] == 0, done
    assert done["iteration"] == 4 and done["train_iters"] == 4 and done["lm_loss"] == pytest.approx(0.5)
    assert done["last_checkpoint"] == "checkpoints/iter_0000004" and done["restarts"] == 0
    log = cli(job_env, "logs", run_id).stdout
    # the rendezvous really spanned both slurmd nodes and the all-reduce summed both ranks
    allreduce = next(l for l in log.splitlines() if "allreduce" in l)
    assert "sum 3 | expected 3" in allreduce and "node1" in allreduce and "node2" in allreduce
    assert (run_dir / "logs" / f"slurm-{entry['job_id']}.out").exists()


def test_failed_and_cancelled_jobs(local_slurm, job_env, job_recipe):
    failing = submit(job_env, job_recipe("fail:3"))
    sleeper = submit(job_env, job_recipe("sleep:300"))
    wait_state(job_env, sleeper["run_id"], {"RUNNING"})
    out = cli(job_env, "cancel", sleeper["run_id"])
    assert out.returncode == 0, out.stderr
    cancelled = wait_state(job_env, sleeper["run_id"], {"CANCELLED"}, timeout=30)
    assert cancelled["scheduler_state"] == "CANCELLED"
    assert cancelled["exit_code"] != 0  # sacct's 0:0 for the cancelled allocation is not an exit code (was shown as 0)

    row = wait_state(job_env, failing["run_id"], {"COMPLETED", "FAILED"}, key="scheduler_state")
    # Slurm's exit code is the batch script's (srun's, after a failed torchrun); the trainer's own code
    # comes from its log
    assert row["state"] == "FAILED" and row["exit_code"] not in (None, 0), row
    assert row["trainer_exit_code"] == 3
    follow = cli(job_env, "logs", failing["run_id"], "-f")
    assert follow.returncode == row["exit_code"] and "exit 3" in follow.stdout

    # status over all runs: one table / one JSON list, in submit order; list agrees
    rows = json.loads(cli(job_env, "status", "--json").stdout)
    assert [r["run_id"] for r in rows] == [failing["run_id"], sleeper["run_id"]]
    assert [r["state"] for r in rows] == ["FAILED", "CANCELLED"]
    listed = json.loads(cli(job_env, "list", "--json").stdout)
    assert [e["run_id"] for e in listed] == [failing["run_id"], sleeper["run_id"]]
    table = cli(job_env, "status").stdout
    assert failing["run_id"] in table and "FAILED" in table and "CANCELLED" in table


def test_a_pending_job_says_why_it_waits(local_slurm, job_env, job_recipe):
    """A job held until its begin time, as Slurm holds a requeued job for about two minutes, is PENDING with
    squeue's reason and start time in `status` (it said nothing); the narrow table fits 100 columns, --wide has all."""
    entry = submit(job_env, job_recipe("ok", nodes=1, extra_sbatch=["--begin=now+600"]))
    try:
        row = wait_state(job_env, entry["run_id"], {"PENDING"}, timeout=60)
        assert row["reason"].startswith("pending: BeginTime, starts 20"), row
        table = cli(job_env, "status").stdout
        assert f"{entry['run_id']}: pending: BeginTime, starts 20" in table, table
        assert max(len(line) for line in table.splitlines()[:2]) <= 100 and "RESTARTS" not in table
        assert "RESTARTS" in cli(job_env, "status", "--wide").stdout
    finally:
        subprocess.run(["scancel", str(entry["job_id"])], capture_output=True)
