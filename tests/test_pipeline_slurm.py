"""Pipelines on the real local Slurm cluster (issue 32): `submit --then eval --then export --merged` makes three
jobs, each behind the one before (afterok, --kill-on-invalid-dep=yes); a failed training leaves no step pending."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import JOBS_DIR, ROOT, cli
from primus_contract import run_files
from reliability_support import trainer_recipe
from test_train_support import SMALL

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def chain_when(env, run_id: str, done, timeout: float = 600) -> dict:
    end = time.monotonic() + timeout
    row = {}
    while time.monotonic() < end:
        out = cli(env, "status", run_id, "--json")
        assert out.returncode == 0, out.stderr
        row = json.loads(out.stdout)
        if done(row):
            return row
        time.sleep(1)
    raise AssertionError(f"run {run_id}: {row.get('state')} {row.get('pipeline')}")


def chain_ended(row: dict) -> bool:
    return bool(row["pipeline"]) and all(s["state"] in ("COMPLETED", "FAILED", "CANCELLED") for s in row["pipeline"])


@pytest.fixture(scope="module", autouse=True)
def chain(request, tmp_path_factory):
    """test_train_eval_export_chain's train -> eval -> export, submitted when the module starts if that test is
    selected: its three jobs (one trainer thread each, and Slurm's waits between them) run beside
    test_failed_training_leaves_no_pending_step (the tiny test job, mostly waiting on Slurm too), which comes first
    and no longer after them. The module's end cancels the chain if its test left it running (by its run id).
    (env, the submit's JSON entry), or None when that test is not selected."""
    if not any(item.originalname == "test_train_eval_export_chain" for item in request.session.items
               if item.module is request.module):
        yield None
        return
    request.getfixturevalue("local_slurm")
    tmp_path = tmp_path_factory.mktemp("chain")
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=str(JOBS_DIR))  # as job_env
    sets = [x for s in (*SMALL, "trainer.schedule.train_iters=8", "trainer.schedule.eval_interval=8",
                        "trainer.checkpoint.save_interval=8") for x in ("--set", s)]
    out = cli(env, "submit", str(trainer_recipe(tmp_path, "pipe")), *sets, "--json",
              "--then", "eval", "--then", "export", "--merged")
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)
    yield env, entry
    row = json.loads(cli(env, "status", entry["run_id"], "--json").stdout or "{}")
    if not (row.get("state") in ("COMPLETED", "FAILED", "CANCELLED") and chain_ended(row)):
        cli(env, "cancel", entry["run_id"])


def test_failed_training_leaves_no_pending_step(local_slurm, job_env, job_recipe):
    out = cli(job_env, "submit", str(job_recipe("fail:3", nodes=1)), "--json", "--then", "eval", "--then", "export")
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)
    row = chain_when(job_env, entry["run_id"], lambda r: r["scheduler_state"] == "FAILED", timeout=120)
    ended = time.monotonic()
    steps = [s["job_id"] for s in row["pipeline"]]
    while True:  # Slurm removes both steps at once (--kill-on-invalid-dep=yes)
        queued = subprocess.run(["squeue", "--noheader", "-j", ",".join(steps), "-o", "%i %T"], capture_output=True,
                                text=True).stdout.split()
        if not queued:
            break
        assert time.monotonic() - ended < 10, queued
        time.sleep(0.5)
    row = chain_when(job_env, entry["run_id"], lambda r: all(s["state"] == "CANCELLED" for s in r["pipeline"]), 30)
    assert row["exit_code"] == 3

    # `resume` queues the chain again behind the new job (Slurm removed the old steps with the job they waited on)
    out = cli(job_env, "resume", entry["run_id"])
    assert out.returncode == 0 and "then: eval job " in out.stdout, out
    new = json.loads((Path(entry["run_dir"]) / "run.json").read_text())
    assert [s["job_id"] for s in new["pipeline"]] != steps and len(new["pipeline_before"]) == 2
    assert f"--dependency=afterok:{new['job_id']}" in (Path(new["pipeline"][0]["dir"]) / "job.sh").read_text()
    row = chain_when(job_env, entry["run_id"], lambda r: all(s["state"] == "CANCELLED" for s in r["pipeline"]), 120)
    # the steps Slurm removed before the resume read CANCELLED too, never RUNNING (issue 39)
    posts = {p["path"]: p["state"] for p in row["post"]}
    assert len(posts) == 4 and set(posts.values()) == {"CANCELLED"}, row["post"]
    assert {s["dir"] for s in new["pipeline_before"]} <= set(posts)


def test_train_eval_export_chain(local_slurm, chain):
    job_env, entry = chain
    row = chain_when(job_env, entry["run_id"], chain_ended)
    assert row["state"] == "COMPLETED" and [s["step"] for s in row["pipeline"]] == ["eval", "export"]
    assert [s["state"] for s in row["pipeline"]] == ["COMPLETED", "COMPLETED"], row["pipeline"]
    train, ev, ex = entry["job_id"], *(s["job_id"] for s in row["pipeline"])
    for step, after in ((ev, train), (ex, ev)):  # each behind the one before, never left pending
        script = next(Path(entry["run_dir"]).glob(f"*/*/slurm-{step}.out")).parent / "job.sh"
        assert f"#SBATCH --dependency=afterok:{after}\n#SBATCH --kill-on-invalid-dep=yes\n" in script.read_text()

    run_dir = Path(entry["run_dir"])
    logged = [e["eval_loss"] for e in run_files.read_events(run_dir / "logs/rank-0/events.jsonl")
              if e["event"] == "eval" and e["iteration"] == 8]
    result = json.loads((Path(row["pipeline"][0]["dir"]) / "result.json").read_text())
    assert result["iteration"] == 8 and abs(result["eval_loss"] - logged[0]) <= 2e-6 * logged[0], (result, logged)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    export = json.loads((Path(row["pipeline"][1]["dir"]) / "result.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(ROOT / "recipes" / "data" / "quickstart" / "base")
    PeftModel.from_pretrained(base, export["adapter"])  # loads in peft
    assert (Path(export["merged"]) / "config.json").is_file()
    assert "pipeline: train" in cli(job_env, "status", entry["run_id"]).stdout
