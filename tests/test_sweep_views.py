"""What a user reads about a sweep (issue 39): `list --sweeps` finds them, the leaderboard fits 100 columns and
ends with the winner and its export command, each trial's chain is in the table, `status --json` has every run's
GPU-hours. Pure CLI on a crafted two-trial local sweep (finished runs, their event streams): under a second each."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import cli
from primus_contract import run_files

SWEEP_ID = "sweep-20261204-120000-abcdef"
KEYS = ["trainer.schedule.lr", "trainer.lora.dim"]


def _trial(root: Path, k: int, evals: list[float], chain: list[dict]) -> dict:
    run_id = f"20261204-120000-00000{k}"
    run_dir = root / run_id
    logs = run_dir / "logs" / "rank-0"
    logs.mkdir(parents=True)
    (run_dir / "recipe.resolved.yaml").write_text("cluster: {gpus_per_node: 0, nodes: 1, gpu_hour_price: 2.5, "
                                                   "currency: EUR}\n")
    events = [run_files.event_line("start", attempt=0, world_size=1, device="cpu", resumed_from=None)]
    events += [run_files.event_line("metrics", iteration=10 * (i + 1), train_iters=20, lm_loss=1.0,
                                    tokens_per_s_gpu=1000.0, ms_per_iter=10.0) for i in range(2)]
    events += [run_files.event_line("eval", iteration=10 * (i + 1), eval_loss=v) for i, v in enumerate(evals)]
    events += [run_files.event_line("outcome", status="training finished", exit=0, message="iterations 20")]
    (logs / "events.jsonl").write_text("\n".join(events) + "\n")
    (logs / "debug.log").write_text("[2026-12-04 12:00:00] training finished | iterations 20 | exit 0\n")
    (run_dir / "exit_code").write_text("0\n")
    (run_dir / "checkpoints" / "iter_0000010").mkdir(parents=True)
    (run_dir / "adapter").mkdir()
    info = {"run_id": run_id, "name": "quickstart", "executor": "local", "job_id": f"local-{k}", "pid": 1,
            "pid_start": -1, "run_dir": str(run_dir), "submit_time": "2026-12-04T12:00:00+00:00",
            "sweep": SWEEP_ID, "sweep_dir": str(root / SWEEP_ID), "pipeline": chain}
    (run_dir / "run.json").write_text(json.dumps(info))
    return info


@pytest.fixture
def swept(tmp_path) -> tuple[dict, Path]:
    root = tmp_path / "ws" / "quickstart"
    failed = root / "20261204-120000-000001" / "exports" / "x"
    chains = [[{"step": "eval", "when": "afterok", "job_id": "local", "dir": None, "state": "COMPLETED"}],
              [{"step": "eval", "when": "afterok", "job_id": "local", "dir": None, "state": "COMPLETED"},
               {"step": "export", "when": "afterok", "job_id": "local", "dir": str(failed), "state": "FAILED"}]]
    infos = [_trial(root, 0, [1.9, 1.7], chains[0]), _trial(root, 1, [1.5, 1.6], chains[1])]
    failed.mkdir(parents=True)
    (failed / "job.out").write_text("loading\nerror: the run has no pretrained base for --merged\n")
    trials = [{"index": k, "values": {"trainer.schedule.lr": lr, "trainer.lora.dim": "16"}, "task": k, "error": None,
               "run_id": i["run_id"], "run_dir": i["run_dir"]} for k, (i, lr) in enumerate(zip(infos, ("2e-3", "5e-3")))]
    (root / SWEEP_ID).mkdir()
    (root / SWEEP_ID / "sweep.json").write_text(json.dumps({"sweep_id": SWEEP_ID, "recipe": "quickstart",
                                                            "executor": "local", "max_parallel": 1,
                                                            "keys": KEYS, "trials": trials}))
    state = tmp_path / "state"
    state.mkdir()
    (state / "runs.jsonl").write_text("".join(json.dumps({**{k: i[k] for k in ("run_id", "name", "executor",
                                                                                "job_id", "run_dir", "submit_time",
                                                                                "sweep", "sweep_dir")},
                                                          "submit_dir": str(tmp_path)}) + "\n" for i in infos))
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(state))
    return env, tmp_path


def test_list_sweeps_finds_them(swept):
    env, where = swept
    out = cli(env, "list", "--sweeps", "--all")
    assert out.returncode == 0, out.stderr
    head, row = out.stdout.splitlines()
    assert head.split() == ["SWEEP", "EXEC", "TRIALS", "SUBMITTED", "SWEEP", "DIR"]
    assert row.split()[:3] == [SWEEP_ID, "local", "2"]
    (data,) = json.loads(cli(env, "list", "--sweeps", "--all", "--json").stdout)
    assert data["sweep"] == SWEEP_ID and data["trials"] == 2
    assert f"sweeps: {SWEEP_ID} (2 trials); `primus-slurm status SWEEP` shows one" in cli(env, "status", "--all").stdout


def test_the_board_fits_100_columns_and_names_the_winner(swept):
    env, where = swept
    out = cli(env, "status", SWEEP_ID)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines[:4]) <= 100, out.stdout  # the table (a path on a line of its own may not)
    assert lines[1].split()[:3] == ["TRIAL", "lr", "dim"] and "THEN" in lines[1] and "COST EUR" in lines[1]
    assert lines[2].split()[0] == "1" and "eval ok, export FAILED" in lines[2]  # best first, its chain
    assert "eval ok" in lines[3] and "export" not in lines[3]
    assert "trial 1 export: FAILED: error: the run has no pretrained base for --merged" in out.stdout
    run = "20261204-120000-000001"
    assert "best: trial 1 (lr=5e-3, dim=16), eval loss 1.5000 at iteration 10, run " + run in out.stdout
    # the end-of-run adapter is iteration 20's model (eval 1.6), not the best's: no adapter line points at it
    assert "  adapter: none of that iteration" in out.stdout and "note:" not in out.stdout
    assert f"  export:  primus-slurm export {run} --checkpoint 10 --merged" in out.stdout
    (where / "ws" / "quickstart" / run / "checkpoints" / "latest").write_text("iter_0000010\n")
    assert f"  export:  primus-slurm export {run} --merged" in cli(env, "status", SWEEP_ID).stdout  # the default
    wide = cli(env, "status", SWEEP_ID, "--wide").stdout.splitlines()
    assert wide[1].split()[:5] == ["TRIAL", "trainer.schedule.lr", "trainer.lora.dim", "RUN", "JOB"]
    board = json.loads(cli(env, "status", SWEEP_ID, "--json").stdout)
    assert board["best"]["run_id"] == run and board["best"]["iteration"] == 10
    assert [s["state"] for s in board["trials"][0]["then"]] == ["COMPLETED", "FAILED"]


def test_the_winner_is_a_model_that_was_kept(swept):
    """An eval loss whose checkpoint was not kept names no model: the winner is the best loss of a kept model (that
    iteration's checkpoint, or the end-of-run adapter of the last iteration), and a note says which lower loss has no
    model (audit, 2026-12-07: the lower loss was shown beside another iteration's adapter and export)."""
    env, where = swept
    root = where / "ws" / "quickstart"
    t0, t1 = root / "20261204-120000-000000", root / "20261204-120000-000001"
    (t1 / "checkpoints" / "iter_0000010").rmdir()  # trial 1's 1.5 at iteration 10: gone; its end adapter (1.6) kept
    best = json.loads(cli(env, "status", SWEEP_ID, "--json").stdout)["best"]
    assert (best["trial"], best["eval_loss"], best["iteration"]) == (1, 1.6, 20), best
    assert best["adapter"] == str(t1 / "adapter") and best["export"] is None
    assert best["note"] == "trial 1 logged eval loss 1.5000 at iteration 10, but no checkpoint of that iteration was kept"
    out = cli(env, "status", SWEEP_ID).stdout
    assert "export:  none (no checkpoint of that iteration kept)" in out and "note:    trial 1 logged" in out
    (t1 / "adapter").rmdir()  # trial 1 keeps nothing: trial 0's end adapter (1.7 at 20) wins
    best = json.loads(cli(env, "status", SWEEP_ID, "--json").stdout)["best"]
    assert (best["trial"], best["eval_loss"], best["iteration"]) == (0, 1.7, 20), best
    assert best["adapter"] == str(t0 / "adapter") and "trial 1 logged eval loss 1.5000" in best["note"]
    (t0 / "checkpoints" / "iter_0000020").mkdir()
    (t0 / "checkpoints" / "latest").write_text("iter_0000020\n")
    best = json.loads(cli(env, "status", SWEEP_ID, "--json").stdout)["best"]
    assert best["export"] == "primus-slurm export 20261204-120000-000000 --merged", best


def test_status_json_has_every_runs_gpu_hours(swept):
    env, where = swept
    rows = json.loads(cli(env, "status", "--all", "--json").stdout)
    assert len(rows) == 2
    for r in rows:
        assert r["gpu_hours"] == 0.0 and r["currency"] == "EUR" and r["cost"] == 0.0 and r["elapsed_s"] >= 0, r


def test_a_three_step_chain_keeps_the_board_in_100_columns():
    """`--then eval --then generate --then export` made the THEN cell 31 characters and the table ~109 columns: in
    the narrow table a chain of three or more shows how many steps are done and the first one not done; --wide, every step."""
    from primus_slurm.experiments import board_table, chain_state

    def row(trial, states):
        then = [{"step": s, "state": st} for s, st in zip(("eval", "generate", "export"), states)]
        return {"trial": trial, "values": {"trainer.schedule.lr": "5e-3", "trainer.lora.dim": "16"},
                "run_id": "20261204-120000-00000%d" % trial, "state": "COMPLETED", "iteration": 500,
                "train_iters": 500, "best_eval_loss": 1.5, "tokens_per_s_gpu": 12345.0, "gpu_hours": 0.123,
                "cost": 1.23, "currency": "EUR", "then": then, "then_summary": chain_state.summary(then)}

    data = {"sweep_id": SWEEP_ID, "executor": "slurm", "keys": KEYS}
    board = [row(0, ["COMPLETED"] * 3), row(1, ["COMPLETED", "FAILED", "CANCELLED"]),
             row(2, ["RUNNING", "PENDING", "PENDING"])]
    narrow = board_table.table(data, board).splitlines()
    assert max(len(line) for line in narrow) <= 100, narrow
    assert narrow[2].endswith("  3/3 ok") and narrow[3].endswith("  1/3 generate FAILED")
    assert narrow[4].endswith("  0/3 eval running")
    wide = board_table.table(data, board, wide=True).splitlines()
    assert wide[2].endswith("eval ok, generate ok, export ok")
