"""The trainer's event stream (primus_contract/run_files.py): a real quickstart run writes start, precision, one
metrics event a log interval, eval, checkpoint and the outcome; `status`'s progress and `compare`'s curve read from
it say what the human log says; a refusal before distributed init is an outcome event too."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from primus_contract import run_files
from primus_slurm.post_training.compare import load_run
from primus_slurm.jobs.progress import Progress, parse_lines, read_progress
from test_train_support import beside, log_text, run_trainer, write_recipe


RUNS = {"test_a_run_writes_its_events_and_the_readers_agree_with_the_log": dict(sets=(
            "trainer.schedule.train_iters=6", "trainer.logging.log_interval=2", "trainer.schedule.eval_interval=3",
            "trainer.schedule.eval_iters=1", "trainer.checkpoint.save_interval=3")),
        # the trainer's start check refuses FP8 on CPU
        "test_a_refusal_is_the_outcome_event": dict(raw={"trainer.precision.fp8": "hybrid"})}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict:
    """The trainer runs of the RUNS tests this session selected, started at once when the first of them comes (one
    trainer thread each: test_train_support.beside): {test: (recipe, run dir, future of run_trainer's result)}."""
    selected = {item.originalname for item in request.session.items if item.module is request.module}
    started = {}
    for name, how in RUNS.items():
        if name in selected:
            tmp = tmp_path_factory.mktemp("run")
            cfg = write_recipe(tmp, *how.get("sets", ()), raw=how.get("raw"))
            started[name] = (cfg, tmp / "run", beside(run_trainer, cfg, tmp / "run"))
    return started


def test_a_run_writes_its_events_and_the_readers_agree_with_the_log(runs):
    cfg, run, started = runs["test_a_run_writes_its_events_and_the_readers_agree_with_the_log"]
    res = started.result()
    assert res.returncode == 0, res.stderr[-3000:]
    events = run_files.read_events(run / "logs" / "rank-0" / "events.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "outcome", kinds
    assert {"precision", "eval", "checkpoint", "summary"} <= set(kinds), kinds
    metrics = [e for e in events if e["event"] == "metrics"]
    assert [e["iteration"] for e in metrics] == [2, 4, 6]
    assert [e["iteration"] for e in events if e["event"] == "checkpoint"] == [3, 6]
    assert events[-1]["status"] == "training finished" and events[-1]["exit"] == 0

    from_events = read_progress(run)  # the events file exists: read from it
    from_log = parse_lines(log_text(run).splitlines(), Progress())
    for key in ("iteration", "train_iters", "last_checkpoint", "finished", "exit_code", "error", "diverged"):
        assert getattr(from_events, key) == getattr(from_log, key), key
    for key in ("lm_loss", "eval_loss", "tokens_per_s_gpu", "ms_per_iter", "avg_tokens_per_s_gpu"):
        a, b = getattr(from_events, key), getattr(from_log, key)
        assert a is not None and math.isclose(a, b, rel_tol=1e-3, abs_tol=0.051), (key, a, b)  # the log rounds
    assert from_events.final_state == "COMPLETED"

    shutil.copy(cfg, run / run_files.RESOLVED)  # (what submit writes beside the logs)
    loaded = load_run(str(run))
    curve = loaded.series("lm loss")
    logged_args = dict(ln.split("] arg ", 1)[1].split(" = ", 1) for ln in log_text(run).splitlines() if "] arg " in ln)
    assert loaded.args == logged_args and loaded.precision_line.startswith("precision | ")
    logged = {int(ln.split("iteration ")[1].split("/")[0]): float(ln.split("lm loss ")[1].split(" ")[0])
              for ln in log_text(run).splitlines() if "] iteration " in ln}
    assert sorted(curve) == sorted(logged) == [2, 4, 6]
    assert all(math.isclose(curve[i], logged[i], rel_tol=1e-6) for i in curve)  # 7 digits logged


def test_a_refusal_is_the_outcome_event(runs):
    _, run, started = runs["test_a_refusal_is_the_outcome_event"]
    res = started.result()
    assert res.returncode == 2, res.stderr[-2000:]
    (outcome,) = run_files.read_events(run / "logs" / "rank-0" / "events.jsonl")
    assert (outcome["event"], outcome["status"], outcome["exit"]) == ("outcome", "config error", 2)
    assert outcome["message"].startswith("`trainer.precision.fp8` needs a GPU")
    progress = read_progress(run)
    assert progress.final_state == "FAILED" and progress.exit_code == 2
    assert progress.error.startswith("config error | `trainer.precision.fp8`")


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(run_files.event_line("metrics", iteration=1, lm_loss=float("nan")) + "\n" + '{"event": "outc')
    (only,) = run_files.read_events(path)
    assert only["iteration"] == 1 and math.isnan(run_files.number(only["lm_loss"]))


@pytest.mark.parametrize("t", [1e300, -1.0, "abc", None, True, [1]])
def test_an_event_whose_time_is_no_time_is_skipped(tmp_path, t):
    """One corrupt (but JSON) line used to break bare `status` for every run: fromtimestamp(1e300) overflowed in
    the progress, a string or null `t` was subtracted in the cost."""
    from primus_slurm.experiments import cost
    rank0 = run_files.rank_dir(tmp_path)
    rank0.mkdir(parents=True)
    lines = [run_files.event_line("start", attempt=0, world_size=1, device="cuda"),
             run_files.event_line("metrics", iteration=5, train_iters=10, lm_loss=1.0),
             json.dumps({"event": "metrics", "t": t, "iteration": 6, "train_iters": 10, "lm_loss": float("nan")}),
             json.dumps({"event": "outcome", "t": t, "status": "training finished", "exit": 0})]
    (rank0 / run_files.events_name(0)).write_text("\n".join(lines) + "\n")
    (rank0 / run_files.log_name(0)).write_text("")
    assert cost.costs([(tmp_path, {"executor": "local"})])[0]["attempts"] == 1
    p = read_progress(tmp_path)
    assert (p.iteration, p.lm_loss, p.diverged, p.finished) == (5, 1.0, False, False)
