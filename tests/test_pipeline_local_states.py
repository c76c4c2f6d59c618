"""A local pipeline's steps settle to the truth (issue 39): the local queue killed leaves no step PENDING for ever,
a failed step says why, a `resume` runs the chain again behind the resumed training. The job is the tiny test job
(tests/slurm_jobs/primus_testjob.py, a few seconds), not a training."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CLI_ARGS, cli, status_json, wait_state

ENDED = {"COMPLETED", "FAILED", "CANCELLED"}


def submit(env: dict, recipe: Path, *then: str) -> dict:
    out = cli(env, "submit", str(recipe), "--json", *then)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


WATCHING = "watching: every 1 s until every run and step has ended"


def redraws(env: dict, run_id: str, count: int, deadline: float = 60) -> str:
    """`status RUN --watch 1` until it has drawn `count` times (or `deadline` s passed: a loaded machine starts the
    CLI slowly, so no wall-clock bound on the redraws), then stopped by the pid this test started."""
    proc = subprocess.Popen([*CLI_ARGS, "status", run_id, "--watch", "1"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    seen, end = [], time.monotonic() + deadline
    try:
        for line in proc.stdout:
            seen.append(line)
            if "".join(seen).count(WATCHING) >= count or time.monotonic() > end:
                break
    finally:
        proc.kill()
        proc.wait()
    return "".join(seen)


def chain_ended(env: dict, run_id: str, timeout: float = 240) -> dict:
    end = time.monotonic() + timeout
    while True:
        row = status_json(env, run_id)
        if row["pipeline"] and all(s["state"] in ENDED for s in row["pipeline"]):
            return row
        assert time.monotonic() < end, row
        time.sleep(1)


def test_steps_of_a_killed_queue_settle(job_env, job_recipe):
    """kill -9 of the local queue while the training runs: its step can never run, and reads so at once."""
    entry = submit(job_env, job_recipe("sleep:60", nodes=1, executor="local"), "--then", "eval")
    wait_state(job_env, entry["run_id"], {"RUNNING"}, timeout=60)
    queue_pid = json.loads((Path(entry["run_dir"]) / "run.json").read_text())["queue_pid"]
    try:
        watched = redraws(job_env, entry["run_id"], 2)  # --watch redraws while the run runs
        assert watched.count(WATCHING) >= 2, watched
        os.kill(queue_pid, signal.SIGKILL)  # the queue this test's submit started, by its pid
        end = time.monotonic() + 10
        while Path(f"/proc/{queue_pid}").exists() and "zombie" not in Path(f"/proc/{queue_pid}/status").read_text():
            assert time.monotonic() < end
            time.sleep(0.1)
        (step,) = status_json(job_env, entry["run_id"])["pipeline"]
        assert step["state"] == "CANCELLED" and f"the local queue (pid {queue_pid}) ended" in step["reason"], step
        text = cli(job_env, "status", entry["run_id"]).stdout
        assert "-> eval local-" not in text and "eval - CANCELLED" in text, text
    finally:
        assert cli(job_env, "cancel", entry["run_id"]).returncode == 0
    out = cli(job_env, "status", entry["run_id"], "--watch", "1")  # and stops once everything has ended
    assert out.returncode == 0 and out.stdout.endswith("every run and step has ended\n"), out


@pytest.mark.slow  # two short jobs and two eval steps: ~30 s
def test_failed_step_says_why_and_resume_runs_the_chain_again(job_env, job_recipe):
    entry = submit(job_env, job_recipe("fail:3", nodes=1, executor="local"), "--then", "eval", "--afterany")
    row = chain_ended(job_env, entry["run_id"])
    assert row["state"] == "FAILED" and row["exit_code"] == 3
    (step,) = row["pipeline"]  # afterany: it ran, and failed: no checkpoint
    assert step["state"] == "FAILED" and "has no checkpoint yet" in step["reason"], step
    (post,) = row["post"]
    assert post["state"] == "FAILED" and "has no checkpoint yet" in post["reason"]
    assert "FAILED    error: " in cli(job_env, "status", entry["run_id"]).stdout

    out = cli(job_env, "resume", entry["run_id"])
    assert out.returncode == 0 and "then: eval (afterany, the local queue)" in out.stdout, out
    assert "note:" not in out.stdout
    row = chain_ended(job_env, entry["run_id"])
    info = json.loads((Path(entry["run_dir"]) / "run.json").read_text())
    assert [s["dir"] for s in info["pipeline_before"]] == [step["dir"]]
    (again,) = row["pipeline"]
    assert again["dir"] != step["dir"] and again["state"] == "FAILED", again  # ran again, behind the new job
    assert [p["state"] for p in row["post"]] == ["FAILED", "FAILED"]
    assert "queue done" in (Path(entry["run_dir"]) / "logs" / "queue.out").read_text()


def test_a_job_that_ended_before_the_trainer_spoke_says_why(tmp_path):
    """A run whose trainer never logged (two slow starts: the job script gave up, exit 15) shows the script's own
    last line as its reason. A crafted local run directory: no job runs."""
    run_dir = tmp_path / "ws" / "x" / "20261204-000000-aaaaaa"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_dir.name, "executor": "local", "job_id": "local-1",
                                                  "run_dir": str(run_dir)}))
    (run_dir / "exit_code").write_text("15\n")
    said = ("primus-slurm: time limit near, and the trainer has not started logging in this attempt nor the one "
            "before (container or launcher stuck? see above); not requeueing.")
    (run_dir / "logs" / "local.out").write_text(f"primus-slurm: run {run_dir.name} job 1 attempt 1 on 1 node(s), "
                                                f"rendezvous 127.0.0.1:1\n{said}\nprimus-slurm: training exited with "
                                                "code 15\n")
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"))
    row = status_json(env, str(run_dir))
    assert row["state"] == "FAILED" and row["exit_code"] == 15 and row["reason"] == said, row
    assert f"{run_dir.name}: {said}" in cli(env, "status", str(run_dir)).stdout
