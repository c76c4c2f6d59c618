"""Hangs on the real local cluster: a job whose trainer stops logging shows STALLED after
`cluster.stall_minutes`, and a rank that never joins a collective makes the real trainer fail after
`trainer.distributed.timeout_minutes` instead of hanging until the time limit."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import cli, status_json, wait_state
from reliability_support import cancel, read, stamp_seconds, submit, trainer_recipe, wait_for, wait_text, worker_pids

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_silent_job_shows_stalled_after_stall_minutes(local_slurm, job_env, job_recipe):
    # tests/slurm_jobs/primus_testjob.py logs `iteration 1/4`, then sleeps 100 s
    out = cli(job_env, "submit", str(job_recipe("sleep:400", nodes=1, stall_minutes=0.1)), "--json")
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout)["run_id"]
    try:
        row = wait_for(lambda: (lambda r: r if r["iteration"] == 1 else None)(status_json(job_env, run_id)), 180,
                       "iteration 1 in status")
        assert row["state"] == "RUNNING" and row["seconds_since_log"] < 6  # fresh: not stalled yet
        row = wait_state(job_env, run_id, {"STALLED"}, timeout=60)
        assert row["scheduler_state"] == "RUNNING" and row["seconds_since_log"] > 0.1 * 60 and row["iteration"] == 1
        assert "STALLED" in cli(job_env, "status").stdout
    finally:
        cli(job_env, "cancel", run_id)
    assert wait_state(job_env, run_id, {"CANCELLED"}, timeout=60)["scheduler_state"] == "CANCELLED"


def test_rank_that_never_joins_fails_the_job_after_the_collective_timeout(local_slurm, job_env, tmp_path):
    recipe = trainer_recipe(tmp_path, "hang", nodes=2)  # rank 0 on node1, rank 1 on node2
    entry = submit(job_env, recipe, "trainer.schedule.train_iters=3000", "trainer.distributed.timeout_minutes=0.1")
    run_dir, log = Path(entry["run_dir"]), Path(entry["run_dir"]) / "logs" / "rank-0" / "debug.log"
    try:
        wait_text(log, "] iteration 5/", 240)
        ranks = worker_pids(run_dir)
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGSTOP)  # rank 1 stops dead: it never reaches the next collective
        stopped = time.time()
        row = wait_state(job_env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=180,
                         key="scheduler_state")
        ended = time.time() - stopped
    finally:
        if status_json(job_env, entry["run_id"])["scheduler_state"] in ("RUNNING", "PENDING"):
            cancel(entry["job_id"])
    text = read(log)
    assert row["state"] == "FAILED" and row["exit_code"] not in (None, 0), row
    assert "] arg distributed.timeout_minutes = 0.1" in text
    error = next(line for line in text.splitlines() if "] error | " in line)
    assert "Timed out waiting 6000ms" in error, error  # 0.1 minutes, from the recipe
    last_iteration = [line for line in text.splitlines() if re.search(r"\] iteration \d+/", line)][-1]
    waited = stamp_seconds(error) - stamp_seconds(last_iteration)
    assert 4 <= waited <= 20, (waited, last_iteration, error)
    assert ended < 120, f"the job took {ended:.0f} s to end after the rank stopped"
    # the node ledger's view (primus_contract/node_faults.py): rank 0 timed out waiting, so rank 1's node hung
    records = [json.loads(line) for line in read(run_dir / "logs" / "nodes.jsonl").splitlines()]
    node_of = {r["rank"]: r["node"] for r in records if r["event"] == "rank"}
    end = [r for r in records if r["event"] == "attempt"][-1]
    assert end["node"] == node_of[1] != node_of[0] and end["why"].startswith("hang: its ranks [1] never timed out"), \
        "\n".join(json.dumps(r) for r in records)
    print(f"collective timeout 6 s: error logged {waited:.0f} s after the last iteration, job ended {ended:.0f} s "
          "after the rank stopped")
