"""Pipelines with the local executor (issue 32): the steps run in order after training, each only when the one
before succeeded; a run that fails never starts its steps."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli
from primus_contract import run_files
from test_train_support import SMALL


DIVERGE = ("trainer.schedule.lr=10", "trainer.schedule.min_lr=10", "trainer.schedule.warmup_iters=0",
           "trainer.schedule.clip_grad=0", "trainer.schedule.lr_decay=constant")


def submit_pipeline(tmp_path: Path, *sets: str) -> tuple[dict, dict]:
    """A 6-iteration training with `--then eval --then export`, submitted (the local executor starts it and
    returns): (env, the submit's JSON entry)."""
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PRIMUS_WORKSPACE=str(tmp_path / "ws"),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    args = [x for s in (*SMALL, "trainer.schedule.train_iters=6", "trainer.schedule.eval_interval=6",
                        "trainer.checkpoint.save_interval=6", f"trainer.data.cache_dir={tmp_path / 'cache'}", *sets)
            for x in ("--set", s)]
    out = cli(env, "submit", str(ROOT / "recipes" / "quickstart.yaml"), "--executor", "local", *args, "--json",
              "--then", "eval", "--then", "export")
    assert out.returncode == 0, out.stderr
    return env, json.loads(out.stdout)


def pipeline_ended(env: dict, entry: dict) -> dict:
    """status RUN --json once every step of the run's pipeline has ended."""
    end = time.monotonic() + 600
    while True:
        row = json.loads(cli(env, "status", entry["run_id"], "--json").stdout)
        if row["pipeline"] and all(s["state"] in ("COMPLETED", "FAILED", "CANCELLED") for s in row["pipeline"]):
            return row
        assert time.monotonic() < end, row
        time.sleep(1)


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    """Both tests' pipelines, submitted at once when the module starts (one trainer thread each: the one that
    diverges runs beside the other's chain instead of after it); each test waits for its own, and the module's end
    for both (a test left out leaves no chain running behind the session)."""
    started = {"good": submit_pipeline(tmp_path_factory.mktemp("good")),
               "bad": submit_pipeline(tmp_path_factory.mktemp("bad"), *DIVERGE)}
    yield started
    for env, entry in started.values():
        pipeline_ended(env, entry)


@pytest.mark.slow  # trains the quickstart: `make test` runs it, `make check` does not
def test_local_pipeline_steps_in_order(pipelines):
    env, entry = pipelines["good"]
    row = pipeline_ended(env, entry)
    assert row["state"] == "COMPLETED" and [s["state"] for s in row["pipeline"]] == ["COMPLETED", "COMPLETED"]
    ev, ex = (Path(s["dir"]) for s in row["pipeline"])
    logged = [e["eval_loss"] for e in run_files.read_events(Path(entry["run_dir"]) / "logs/rank-0/events.jsonl")
              if e["event"] == "eval" and e["iteration"] == 6]
    result = json.loads((ev / "result.json").read_text())
    assert abs(result["eval_loss"] - logged[0]) <= 2e-6 * logged[0]
    assert (Path(json.loads((ex / "result.json").read_text())["adapter"]) / "adapter_config.json").is_file()
    assert (ev / "post.json").stat().st_mtime <= (ex / "job.sh").stat().st_mtime  # eval ended before export began


@pytest.mark.slow  # trains the quickstart: `make test` runs it, `make check` does not
def test_local_pipeline_stops_after_a_failed_training(pipelines):
    env, entry = pipelines["bad"]
    row = pipeline_ended(env, entry)
    assert row["state"] == "DIVERGED" and row["exit_code"] == 3
    assert [s["state"] for s in row["pipeline"]] == ["CANCELLED", "CANCELLED"]
    assert not (Path(entry["run_dir"]) / "evals").exists()
