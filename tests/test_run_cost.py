"""What a run cost (issue 32): GPU-hours over every attempt (Slurm: sacct elapsed x AllocTRES gres/gpu; local:
wall time x GPUs), tokens per GPU-hour, and cluster.gpu_hour_price/currency, which the contract checks."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, cli
from primus_slurm.experiments import cost


@pytest.mark.parametrize("tres, gpus", [("billing=8,cpu=64,gres/gpu=8,mem=1T,node=1", 8),
                                        ("cpu=2,gres/gpu:h100=4,node=1", 4),
                                        ("cpu=2,gres/gpu=2,gres/gpu:h100=2,node=1", 2),
                                        ("billing=1,cpu=1,node=1", 0), ("", 0)])
def test_gpus_of_alloc_tres(tres, gpus):
    assert cost.gpus_of(tres) == gpus


def test_slurm_usage_sums_every_attempt():
    rows = "\n".join(["41|41|1800|billing=8,cpu=8,gres/gpu=8,node=1",   # attempt 0 (requeued)
                      "41|41|900|billing=8,cpu=8,gres/gpu=8,node=1",    # attempt 1
                      "7_1|9|3600|cpu=2,gres/gpu:h200=2,node=1",       # an array task, by its <array>_<task> id
                      "50|50|Unknown|cpu=1,node=1"])
    calls = []

    def runner(cmd, **_):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, rows, "")
    usage = cost.slurm_usage(["41", "7_1"], runner)
    assert "--duplicates" in calls[0] and "-X" in calls[0] and len(calls) == 1
    assert usage["41"] == {"elapsed_s": 2700, "gpu_hours": pytest.approx(6.0), "attempts": 2}
    assert usage["7_1"]["gpu_hours"] == pytest.approx(2.0)


def _run(tmp_path: Path, **cluster) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "logs" / "rank-0").mkdir(parents=True)
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump({"cluster": {"gpus_per_node": 8, "nodes": 1,
                                                                              **cluster}}))
    events = [{"event": "start", "t": 1000.0, "attempt": 0, "world_size": 8},
              {"event": "metrics", "t": 2000.0, "iteration": 100, "tokens_per_s_gpu": 1000.0, "ms_per_iter": 500.0},
              {"event": "outcome", "t": 4600.0, "status": "training finished", "exit": 0}]
    (run_dir / "logs" / "rank-0" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run_dir


def test_local_run_cost_uses_the_price(tmp_path):
    run_dir = _run(tmp_path, gpu_hour_price=2.5, currency="EUR")
    row = cost.costs([(run_dir, {"executor": "local"})])[0]
    assert row["gpu_hours"] == pytest.approx(8.0) and row["elapsed_s"] == 3600  # 1 h wall x 8 GPUs
    assert row["tokens"] == pytest.approx(100 * 1000 * 8 * 0.5)
    assert row["tokens_per_gpu_hour"] == pytest.approx(50_000)
    assert row["cost"] == pytest.approx(20.0) and row["currency"] == "EUR"
    assert "8.000 GPU-hours" in cost.line(row) and "20.00 EUR at 2.5/GPU-hour" in cost.line(row)
    unpriced = cost.costs([(_run(tmp_path / "b"), {"executor": "local"})])[0]
    assert unpriced["cost"] is None and "EUR" not in cost.line(unpriced)


def test_local_gpu_run_of_a_cpu_recipe_costs_its_gpus(tmp_path):
    """issue 36: the real-text recipe (gpus_per_node 0) run with trainer.distributed.device=cuda on one H200 reported
    0 GPU-hours and no tokens per GPU-hour. The attempt's start event says cuda and world size 1: one GPU held."""
    run_dir = _run(tmp_path, gpus_per_node=0)
    path = run_dir / "logs" / "rank-0" / "events.jsonl"
    events = [json.loads(x) for x in path.read_text().splitlines()]
    events[0].update(world_size=1, device="cuda")
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    row = cost.costs([(run_dir, {"executor": "local"})])[0]
    assert row["gpu_hours"] == pytest.approx(1.0) and row["tokens_per_gpu_hour"] == pytest.approx(50_000)
    events[0].update(device="cpu")  # the same run on the CPU holds no GPU
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert cost.costs([(run_dir, {"executor": "local"})])[0]["gpu_hours"] == 0


@pytest.mark.parametrize("item, says", [("cluster.gpu_hour_price=-1", "`cluster.gpu_hour_price` is -1.0"),
                                        ("cluster.currency=dollars", "`cluster.currency` is 'dollars'")])
def test_price_keys_are_checked(tmp_path, item, says):
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"))
    out = cli(env, "validate", str(ROOT / "recipes" / "quickstart.yaml"), "--set", item)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr, out.stderr


def test_slurm_run_cost_counts_its_pipeline_steps(tmp_path):
    """An eval or export step job holds a GPU too: the steps of the current chain (run.json `pipeline`) and of the
    chains before a resume (`pipeline_before`) are in the one sacct query and in the run's GPU-hours."""
    run_dir = _run(tmp_path, gpu_hour_price=2.0)
    info = {"executor": "slurm", "job_id": "503", "jobs": [{"job_id": "501"}],
            "pipeline": [{"step": "eval", "job_id": "504"}], "pipeline_before": [{"step": "eval", "job_id": "502"}]}
    asked = []

    def runner(cmd, **_):
        asked.append(cmd[cmd.index("-j") + 1])
        rows = "\n".join(f"{j}|{j}|3600|cpu=8,gres/gpu={n},node=1" for j, n in (("501", 8), ("502", 1),
                                                                              ("503", 8), ("504", 1)))
        return subprocess.CompletedProcess(cmd, 0, rows, "")
    row = cost.costs([(run_dir, info)], runner)[0]
    assert asked == ["501,502,503,504"]
    assert row["gpu_hours"] == pytest.approx(18.0) and row["steps_gpu_hours"] == pytest.approx(2.0)
    assert row["cost"] == pytest.approx(36.0) and row["attempts"] == 2 and row["elapsed_s"] == 7200
    assert row["tokens_per_gpu_hour"] == pytest.approx(400_000 / 16)  # the training's throughput
    assert cost.line(row).startswith("cost: 18.000 GPU-hours (16.000 training over 2 attempt(s), 7200 s elapsed; "
                                     "2.000 in 2 pipeline step job(s))")


def _step(run_dir: Path, name: str, step: str, seconds: float, ended: bool = True) -> dict:
    """A step the local queue ran: job.sh written as it started, its output and (once it ended) post.json after."""
    d = run_dir / "evals" / name
    d.mkdir(parents=True)
    for f in ("job.sh", "post.json", "job.out"):
        (d / f).write_text("x")
    os.utime(d / "job.sh", (1000.0, 1000.0))
    os.utime(d / "job.out", (1000.0 + seconds - 10, 1000.0 + seconds - 10))
    os.utime(d / "post.json", ((1000.0 + seconds),) * 2 if ended else (1000.0, 1000.0))
    return {"step": step, "when": "afterok", "job_id": "local", "dir": str(d), "state": "COMPLETED"}


def test_local_run_cost_counts_the_steps_its_queue_ran(tmp_path):
    """A local pipeline's steps hold a GPU as the Slurm ones do (one, where the training held any): each one's wall
    time, from its job.sh (the queue writes it as it starts the step) to its last write, in the run's GPU-hours;
    a step that never ran (no directory) counts nothing. The training's throughput is its own."""
    run_dir = _run(tmp_path, gpu_hour_price=2.0)
    info = {"executor": "local", "job_id": "local-1",
            "pipeline": [_step(run_dir, "a", "eval", 600), _step(run_dir, "b", "export", 310, ended=False),
                         {"step": "generate", "when": "afterok", "job_id": None, "dir": None, "state": "CANCELLED"}],
            "pipeline_before": [_step(run_dir, "c", "eval", 1800)]}
    row = cost.costs([(run_dir, info)])[0]
    assert row["steps_gpu_hours"] == pytest.approx((600 + 300 + 1800) / 3600) and row["step_jobs"] == 3
    assert row["gpu_hours"] == pytest.approx(8.75) and row["cost"] == pytest.approx(17.5)
    assert row["tokens_per_gpu_hour"] == pytest.approx(50_000) and row["attempts"] == 1
    assert cost.line(row).startswith("cost: 8.750 GPU-hours (8.000 training over 1 attempt(s), 3600 s elapsed; "
                                     "0.750 in 3 pipeline step job(s))")
    cpu = _run(tmp_path / "cpu", gpus_per_node=0)  # a CPU run's steps hold no GPU either
    info["pipeline"] = [_step(cpu, "a", "eval", 600)]
    assert cost.costs([(cpu, {**info, "pipeline_before": []})])[0]["gpu_hours"] == 0
