"""A sweep with the local executor (issue 32): the trials run one after another (--max-parallel 1) from the
local queue; a trial cancelled while it waits never starts; the leaderboard shows them all; with W&B on, the
trials are one W&B group, the sweep id (offline W&B, read back by wandb itself)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli
from primus_contract import run_files
from primus_slurm.jobs.local_executor import proc_start_ticks
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


def _stopped_local_sweep(tmp_path: Path, order: Path, trials: int, max_parallel: int) -> Path:
    """A local sweep whose trials were all cancelled (exit 75) and whose queue has ended; each trial's job script
    writes `start K` and, a second later, `end K` to `order` (no training). Its sweep directory."""
    from primus_slurm.jobs import registry

    sweep_dir = tmp_path / "ws" / "x" / "sweep-20261207-000000-cccccc"
    (sweep_dir / "logs").mkdir(parents=True)
    rows = []
    for k in range(trials):
        run_dir = tmp_path / "ws" / "x" / f"20261207-000000-cccc0{k}"
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "job.sbatch").write_text(f"#!/bin/bash\necho start {k} >> {order}\nsleep 1\n"
                                            f"echo end {k} >> {order}\n")
        (run_dir / "exit_code").write_text("75\n")
        info = {"run_id": run_dir.name, "name": "x", "executor": "local", "job_id": f"local-queue-1-{k}",
                "run_dir": str(run_dir), "submit_time": "2026-12-07T00:00:00+00:00", "pid": 999999999,
                "queue_pid": 999999999, "sweep": sweep_dir.name, "sweep_dir": str(sweep_dir)}
        (run_dir / "run.json").write_text(json.dumps(info))
        registry.record(info)
        rows.append({"index": k, "values": {"trainer.lora.dim": str(4 << k)}, "run_id": run_dir.name,
                     "run_dir": str(run_dir), "error": None, "task": k})
    (sweep_dir / "sweep.json").write_text(json.dumps({"sweep_id": sweep_dir.name, "executor": "local", "trials": rows,
                                                      "max_parallel": max_parallel, "keys": ["trainer.lora.dim"]}))
    return sweep_dir


def test_resume_sweep_keeps_to_max_parallel(tmp_path, monkeypatch):
    """resume SWEEP started every unfinished trial at once, whatever --max-parallel said: the resumed trials now go
    through a local queue of their own, one at a time here, after a trial of the sweep that still runs (started
    by this test: it ends by itself)."""
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"))
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", env["PRIMUS_SLURM_STATE_DIR"])
    order = tmp_path / "order"
    sweep_dir = _stopped_local_sweep(tmp_path, order, 4, max_parallel=1)
    running = tmp_path / "ws" / "x" / "20261207-000000-cccc03"  # trial 3 still runs: it counts against the limit
    (running / "exit_code").unlink()
    proc = subprocess.Popen(["bash", "-c", f"sleep 3; echo end 3 >> {order}"], start_new_session=True)
    info = json.loads((running / "run.json").read_text())
    (running / "run.json").write_text(json.dumps({**info, "pid": proc.pid, "pid_start": proc_start_ticks(proc.pid)}))
    try:
        out = cli(env, "resume", str(sweep_dir))
        assert out.returncode == 0 and out.stdout.count("resumed run") == 3 and "not resumed" in out.stdout, out
        end = time.monotonic() + 120
        while len(lines(order)) < 7:
            assert time.monotonic() < end, lines(order)
            time.sleep(0.2)
        assert lines(order) == ["end 3", "start 0", "end 0", "start 1", "end 1", "start 2", "end 2"]
        while "queue done" not in lines(sweep_dir / "logs" / "queue.out"):  # (and its queue ends)
            assert time.monotonic() < end
            time.sleep(0.2)
    finally:
        proc.wait()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_trial_being_resumed_never_reads_cancelled(tmp_path, monkeypatch):
    """resume SWEEP wrote each trial's run.json (no process, the sweep's first queue, long ended) and only then
    started the new queue: until every trial was resumed, status read each resumed trial as CANCELLED ("the sweep's
    local queue ended before it started this trial"). Now the queue is spawned first: a resumed trial is PENDING from
    its first write, then runs."""
    from primus_slurm.experiments import sweep_resume
    from primus_slurm.jobs import registry, status

    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "state"))
    order = tmp_path / "order"
    sweep_dir = _stopped_local_sweep(tmp_path, order, 3, max_parallel=1)
    seen, real = [], sweep_resume.resume_mod.resume

    def resume(ref, *args, **kwargs):  # what status shows of every trial right after each one is resumed
        entry = real(ref, *args, **kwargs)
        seen.append({r["run_id"][-1]: r["state"] for r in status.collect(registry.entries())})
        return entry
    monkeypatch.setattr(sweep_resume.resume_mod, "resume", resume)
    sweep_resume.resume_sweep(str(sweep_dir))
    assert seen == [{"0": "PENDING", "1": "FAILED", "2": "FAILED"}, {"0": "PENDING", "1": "PENDING", "2": "FAILED"},
                    {"0": "PENDING", "1": "PENDING", "2": "PENDING"}]
    end = time.monotonic() + 120
    while "queue done" not in lines(sweep_dir / "logs" / "queue.out"):  # (the queue this test started ends)
        assert time.monotonic() < end, lines(order)
        time.sleep(0.2)
    assert lines(order) == ["start 0", "end 0", "start 1", "end 1", "start 2", "end 2"]
    assert {r["state"] for r in status.collect(registry.entries())} == {"COMPLETED"}
