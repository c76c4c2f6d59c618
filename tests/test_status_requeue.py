"""A job Slurm requeues itself (scontrol requeue, preemption, a node failure under --requeue): the same job id, its
restart count one up, no `attempt-base` written. Until the new attempt's trainer logs, the newest log is the attempt
before's: status must not take its verdicts for the job's, and GPU-hours count each attempt that ran once."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from primus_slurm.experiments import cost
from primus_slurm.jobs import slurm_executor
from primus_slurm.jobs.status import collect, derive_state


def _attempt(run_dir, attempt: int, events: list[dict]) -> None:
    from primus_contract import run_files
    folder = run_dir / "logs" / "rank-0"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / run_files.events_name(attempt)).write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / run_files.log_name(attempt)).write_text(f"[2026-12-07 00:00:00] primus-trainer start | attempt "
                                                      f"{attempt}\n")


ATTEMPT_0 = [{"event": "start", "t": 1000.0, "attempt": 0, "world_size": 1},
             {"event": "metrics", "t": 1001.0, "iteration": 40, "train_iters": 500, "lm_loss": 1.2, "ms_per_iter": 9.0},
             {"event": "diverged", "t": 1002.0, "iteration": 41, "lm_loss": "nan"},
             {"event": "outcome", "t": 1003.0, "status": "error", "exit": 1, "message": "CUDA error on node1"}]


@pytest.fixture
def requeued(tmp_path, monkeypatch):
    """(run dir, registry entry, set_state(state)): Slurm job 41, whose attempt 0 logged a divergence and an error
    (a faulty GPU), requeued by the job script away from its node; sacct/squeue answer `state`."""
    run_dir = tmp_path / "run"
    _attempt(run_dir, 0, ATTEMPT_0)
    (run_dir / "logs" / "slurm-41.out").write_text("primus-slurm: run r job 41 attempt 0 on 1 node(s), rendezvous x\n"
                                                   "primus-slurm: job 41 requeued with ExcNodeList=node1\n")
    now = {}
    monkeypatch.setattr(slurm_executor, "slurm_states",
                        lambda ids, runner=None: {"41": {"state": now["state"], "exit_code": None, "nodes": "node2",
                                                         "source": "squeue", "reason": now.get("reason")}})
    entry = {"run_id": "r", "run_dir": str(run_dir), "executor": "slurm", "job_id": "41", "stall_minutes": 30}
    return run_dir, entry, lambda state, reason=None: now.update(state=state, reason=reason)


def test_a_requeued_job_waiting_to_start_again_has_no_verdict_of_the_attempt_before(requeued):
    run_dir, entry, set_state = requeued
    for state in ("REQUEUED", "PENDING"):
        set_state(state, "pending: BeginTime, starts 2026-12-07T22:06:04")
        row = collect([entry])[0]
        assert row["state"] == state and row["iteration"] == 40  # where it got to, not how it ended
        assert not row["diverged"] and row["error"] is None and row["trainer_exit_code"] is None
        assert row["reason"] == "pending: BeginTime, starts 2026-12-07T22:06:04"


def test_a_requeued_job_running_is_judged_by_its_new_attempt(requeued):
    run_dir, entry, set_state = requeued
    set_state("RUNNING")
    assert collect([entry])[0]["state"] == "DIVERGED"  # attempt 0 itself, still running: its own verdict
    with open(run_dir / "logs" / "slurm-41.out", "a") as out:  # the requeued job's script has started attempt 1
        out.write("primus-slurm: run r job 41 attempt 1 on 1 node(s), rendezvous y\n")
    row = collect([entry])[0]
    assert row["state"] == "RUNNING" and not row["diverged"] and row["error"] is None
    _attempt(run_dir, 1, [{"event": "start", "t": 2000.0, "attempt": 1, "world_size": 1},
                          {"event": "metrics", "t": 2001.0, "iteration": 45, "train_iters": 500, "lm_loss": 1.1,
                           "ms_per_iter": 9.0}])
    row = collect([entry])[0]
    assert (row["state"], row["iteration"], row["restarts"]) == ("RUNNING", 45, 1)
    set_state("FAILED")  # an ended job's last attempt is its own
    with open(run_dir / "logs" / "rank-0" / "events.attempt-1.jsonl", "a") as events:
        events.write(json.dumps(ATTEMPT_0[2]) + "\n")
    assert collect([entry])[0]["state"] == "DIVERGED"


def test_derive_state_of_a_job_the_scheduler_forgot_still_trusts_the_log(requeued):
    """(unchanged: with no scheduler state, the newest attempt's last word is the job's)"""
    from primus_slurm.jobs.progress import read_progress
    run_dir, _, _ = requeued
    assert derive_state(None, read_progress(run_dir), None, 30) == "DIVERGED"


def test_gpu_hours_of_a_requeued_job_count_each_attempt_that_ran(tmp_path):
    """sacct --duplicates -X of a job requeued twice and now waiting (the local cluster's rows, 2026-12-07): one
    REQUEUED record an attempt that ran, and the waiting one, which has no allocation (no AllocTRES), is none."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump({"cluster": {"gpus_per_node": 8, "nodes": 1}}))
    rows = "\n".join(["41|41|1800|billing=8,cpu=8,gres/gpu=8,node=1",  # REQUEUED
                      "41|41|900|billing=8,cpu=8,gres/gpu=8,node=1",  # REQUEUED
                      "41|41|0|"])  # PENDING (or CANCELLED while it waited)

    def runner(cmd, **_):
        return subprocess.CompletedProcess(cmd, 0, rows, "")
    row = cost.costs([(run_dir, {"executor": "slurm", "job_id": "41"})], runner)[0]
    assert (row["gpu_hours"], row["attempts"], row["elapsed_s"]) == (pytest.approx(6.0), 2, 2700)
    assert cost.line(row).startswith("cost: 6.000 GPU-hours over 2 attempt(s), 2700 s elapsed")
    named_twice = {"executor": "slurm", "job_id": "41", "jobs": [{"job_id": "41"}]}  # (a run.json edited by hand)
    assert cost.costs([(run_dir, named_twice)], runner)[0]["gpu_hours"] == pytest.approx(6.0)  # its records once
