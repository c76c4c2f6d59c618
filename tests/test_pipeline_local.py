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


def run_pipeline(tmp_path: Path, *sets: str) -> tuple[dict, dict]:
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PRIMUS_WORKSPACE=str(tmp_path / "ws"),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    args = [x for s in (*SMALL, "trainer.schedule.train_iters=6", "trainer.schedule.eval_interval=6",
                        "trainer.checkpoint.save_interval=6", f"trainer.data.cache_dir={tmp_path / 'cache'}", *sets)
            for x in ("--set", s)]
    out = cli(env, "submit", str(ROOT / "recipes" / "quickstart.yaml"), "--executor", "local", *args, "--json",
              "--then", "eval", "--then", "export")
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)
    end = time.monotonic() + 600
    while True:
        row = json.loads(cli(env, "status", entry["run_id"], "--json").stdout)
        if row["pipeline"] and all(s["state"] in ("COMPLETED", "FAILED", "CANCELLED") for s in row["pipeline"]):
            return entry, row
        assert time.monotonic() < end, row
        time.sleep(2)


@pytest.mark.slow  # trains the quickstart: `make test` runs it, `make check` does not
def test_local_pipeline_steps_in_order(tmp_path):
    entry, row = run_pipeline(tmp_path)
    assert row["state"] == "COMPLETED" and [s["state"] for s in row["pipeline"]] == ["COMPLETED", "COMPLETED"]
    ev, ex = (Path(s["dir"]) for s in row["pipeline"])
    logged = [e["eval_loss"] for e in run_files.read_events(Path(entry["run_dir"]) / "logs/rank-0/events.jsonl")
              if e["event"] == "eval" and e["iteration"] == 6]
    result = json.loads((ev / "result.json").read_text())
    assert abs(result["eval_loss"] - logged[0]) <= 2e-6 * logged[0]
    assert (Path(json.loads((ex / "result.json").read_text())["adapter"]) / "adapter_config.json").is_file()
    assert (ev / "post.json").stat().st_mtime <= (ex / "job.sh").stat().st_mtime  # eval ended before export began


@pytest.mark.slow  # trains the quickstart: `make test` runs it, `make check` does not
def test_local_pipeline_stops_after_a_failed_training(tmp_path):
    entry, row = run_pipeline(tmp_path / "bad", "trainer.schedule.lr=10", "trainer.schedule.min_lr=10",
                              "trainer.schedule.warmup_iters=0", "trainer.schedule.clip_grad=0",
                              "trainer.schedule.lr_decay=constant")
    assert row["state"] == "DIVERGED" and row["exit_code"] == 3
    assert [s["state"] for s in row["pipeline"]] == ["CANCELLED", "CANCELLED"]
    assert not (Path(entry["run_dir"]) / "evals").exists()
