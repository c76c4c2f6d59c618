"""The same job management through `--executor local`: a detached process group on this machine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import CLI, cli, status_json, wait_state
from reliability_support import wait_for, worker_pids

pytestmark = pytest.mark.slow

LOCAL = ("--executor", "local", "--set", "cluster.nodes=1", "--set", "cluster.nproc_per_node=2")


def submit(env, recipe, *extra) -> dict:
    out = cli(env, "submit", str(recipe), "--json", *LOCAL, *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_local_job_completes_with_follow_and_status(job_env, job_recipe):
    recipe = job_recipe("sleep:3")
    run_id = "20260101-000000-def456"
    dry = cli(job_env, "submit", str(recipe), "--dry-run", "--run-id", run_id, *LOCAL)
    assert dry.returncode == 0 and "#SBATCH" not in dry.stdout and "srun" not in dry.stdout
    assert not list((recipe.parent / "ws").rglob(run_id)) and cli(job_env, "list", "--json").stdout.strip() == "[]"
    assert cli(job_env, "list").stdout == "no runs yet (primus-slurm submit RECIPE)\n"
    proc = subprocess.Popen([str(CLI), "submit", str(recipe), "--run-id", run_id, "--follow", *LOCAL],
                            env=job_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line, seen = "", ""
    while "iteration 1/4" not in line:  # --follow streams while the job runs
        line = proc.stdout.readline()
        assert line or proc.poll() is None, proc.stderr.read()
        seen += line
    assert status_json(job_env, run_id)["state"] == "RUNNING"
    rest, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert "training finished | iterations 4 | exit 0" in rest
    assert "(the resolved settings, `arg …` lines, are in " in seen and "] arg " not in seen + rest  # folded
    run_dir = Path(status_json(job_env, run_id)["run_dir"])
    assert "] arg experiment.mode = sleep:3" in (run_dir / "logs" / "rank-0" / "debug.log").read_text()

    row = status_json(job_env, run_id)
    assert row["executor"] == "local" and row["state"] == "COMPLETED" and row["exit_code"] == 0
    assert row["iteration"] == 4 and row["tokens_per_s_gpu"] == pytest.approx(400.0)
    run_dir = Path(row["run_dir"])
    assert (run_dir / "job.sbatch").read_text() == dry.stdout.split("# ---- recipe.resolved.yaml")[0]
    assert "world_size 2" in cli(job_env, "logs", run_id).stdout
    listed = cli(job_env, "list").stdout.splitlines()
    assert listed[0].split() == ["RUN", "NAME", "EXEC", "JOB", "SUBMITTED", "RUN", "DIR"] and run_id in listed[1]
    assert "training exited with code 0" in cli(job_env, "logs", run_id, "--stdout").stdout


def test_local_failed_diverged_stalled_and_cancelled(job_env, job_recipe):
    failing = submit(job_env, job_recipe("fail:5"))
    diverging = submit(job_env, job_recipe("nan"))
    sleeper = submit(job_env, job_recipe("sleep:300"), "--set", "cluster.stall_minutes=0.1")
    row = wait_state(job_env, failing["run_id"], {"COMPLETED", "FAILED"}, timeout=120)
    assert row["state"] == "FAILED" and row["exit_code"] not in (None, 0) and row["trainer_exit_code"] == 5
    follow = cli(job_env, "logs", failing["run_id"], "-f")
    assert follow.returncode == row["exit_code"]
    ended = cli(job_env, "cancel", failing["run_id"])  # a finished run is not "cancelled"
    assert ended.returncode == 0 and "already ended (FAILED); nothing to cancel" in ended.stdout
    assert status_json(job_env, failing["run_id"])["state"] == "FAILED"

    row = wait_state(job_env, diverging["run_id"], {"DIVERGED"}, timeout=120)
    assert row["diverged"] is True
    followed = cli(job_env, "logs", diverging["run_id"], "-f")  # says what status says
    assert f"run {diverging['run_id']} ended DIVERGED" in followed.stderr, followed.stderr

    # iteration 1 is logged, then the job sleeps 75 s: after 6 s without log progress it is STALLED
    row = wait_state(job_env, sleeper["run_id"], {"STALLED"}, timeout=120)
    assert row["scheduler_state"] == "RUNNING" and row["seconds_since_log"] > 6
    assert row["eta_s"] is None  # its last window's pace says nothing of when it ends
    run_dir = Path(row["run_dir"])
    assert len(worker_pids(run_dir, "primus_testjob")) == 2
    assert cli(job_env, "cancel", sleeper["run_id"]).returncode == 0
    row = status_json(job_env, sleeper["run_id"])
    assert row["state"] == "CANCELLED"
    assert worker_pids(run_dir, "primus_testjob") == {}  # torchrun's workers are gone too


def test_cancel_ends_a_worker_that_cannot_act_on_term(job_env, job_recipe, monkeypatch):
    """torchrun starts each worker in a session of its own; a worker that cannot act on SIGTERM in time (here
    stopped; in life, a long save) used to outlive the cancel and keep writing into the run, and a `resume`
    then ran a second trainer in the same directory. Cancel now ends the launcher's whole process tree.
    The cancel runs in this process with a 5 s grace instead of 30 s (the stopped worker waits all of it out;
    the CLI's own cancel of local runs is in the other cancel tests). Asserted: no worker left, CANCELLED."""
    from primus_slurm.cli import run
    from primus_slurm.jobs.local_executor import LocalExecutor

    monkeypatch.setattr(LocalExecutor, "cancel_grace_s", 5.0)
    entry = submit(job_env, job_recipe("sleep:300"))
    run_dir = Path(entry["run_dir"])
    wait_state(job_env, entry["run_id"], {"RUNNING"}, timeout=120)
    workers = wait_for(lambda: (lambda w: w if len(w) == 2 else None)(worker_pids(run_dir, "primus_testjob")), 180,
                       "both workers to start")  # (torch's start on two loaded cores)
    os.kill(workers[1], signal.SIGSTOP)
    # SIGSTOP takes effect when the worker is next scheduled; a TERM that arrives before that kills it at once
    # (the flake under load: the cancel then had nothing to wait for). Cancel only once it is really stopped.
    wait_for(lambda: (Path(f"/proc/{workers[1]}/stat").read_text().rsplit(") ", 1)[1][0] == "T"), 30,
             "the worker to stop")
    assert run(["cancel", entry["run_id"]]) == 0
    assert worker_pids(run_dir, "primus_testjob") == {}  # the stopped one too: it could only end by the KILL
    assert status_json(job_env, entry["run_id"])["state"] == "CANCELLED"


def test_unknown_run_is_a_clean_user_error(job_env):
    out = cli(job_env, "logs", "no-such-run")
    assert out.returncode == 2 and out.stderr.startswith("error: RUN 'no-such-run'")
    assert "Traceback" not in out.stderr


def test_ctrl_c_stops_following_not_the_job(job_env, job_recipe):
    import signal

    # Ctrl-C as a terminal sends it: with SIGINT's default action (a test run started in the background by a
    # non-interactive shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen([str(CLI), "submit", str(job_recipe("sleep:300")), "--follow", *LOCAL],
                            env=job_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = ""
    while "iteration 1/4" not in seen:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, proc.stderr.read()
        seen += line
    assert "(the resolved settings, `arg …` lines, are in " in seen and "] arg " not in seen
    proc.send_signal(signal.SIGINT)
    try:
        rest, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # (once in CI under load, 2026-12-05): say where it was, then fail
        where = {f: Path(f"/proc/{proc.pid}/{f}").read_text(errors="replace")[-500:]
                 for f in ("wchan", "status") if Path(f"/proc/{proc.pid}/{f}").exists()}
        kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        where["children"] = kids.read_text() if kids.exists() else "?"
        proc.kill()
        out, err = proc.communicate()
        leftover = [w for w in seen.split() if w.count("-") == 2 and w[:8].isdigit()]
        if leftover:  # the job this test started, by its run id
            cli(job_env, "cancel", leftover[0])
        raise AssertionError(f"submit --follow did not end 60 s after SIGINT: {where}; stderr {err[-2000:]}")
    run_id = next(w for w in err.split() + seen.split() if w.count("-") == 2 and w[:8].isdigit())
    assert proc.returncode == 130, err
    assert f"stopped following; run {run_id} keeps running. Re-attach: primus-slurm logs {run_id} -f; " \
           f"stop it: primus-slurm cancel {run_id}" in err
    assert status_json(job_env, run_id)["state"] == "RUNNING"
    assert cli(job_env, "cancel", run_id).returncode == 0
