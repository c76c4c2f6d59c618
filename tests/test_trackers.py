"""Experiment trackers for real (trainer/observability/tracking.py): W&B (offline, the real wandb package, no network) and
TensorBoard, read back with each tool's own reader: `wandb leet inspect RUN_DIR --json` (wandb-core's reader of
the .wandb transaction log; wandb 0.31 has no Python reader) and tensorboard's EventAccumulator.

- the quickstart, local executor, inside a network namespace with no network: the W&B run holds the recipe as its
  config and every scalar the log lines print (train/* at each log line, eval/* at each eval), the loss curve falls;
  TensorBoard's event files hold the same scalars;
- a real Slurm requeue (operator's `scontrol requeue`: SIGTERM to every process of the job, wandb's service
  included): both attempts log into one W&B run id, and the union of its offline files holds every iteration of
  both attempts; each attempt's TensorBoard folder holds that attempt's log lines;
- bad input: keys of the wandb section without a project, names W&B refuses, and an online run without
  WANDB_API_KEY are refused in one line (exit 2).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import local_training_run
from reliability_support import read, run_to_end, scontrol, submit, thaw_and_cancel, trainer_recipe, wait_requeued, \
    wait_text, worker_pids
from test_bad_recipes import _check_error, _write
from test_train_support import ROOT, beside, trainer_cmd, trainer_env, write_recipe

pytestmark = pytest.mark.slow

# a network namespace of its own: loopback only (torchrun's rendezvous), no route out
NO_NETWORK = ("unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "no-network")
WANDB_OFFLINE = ["trainer.logging.wandb.project=primus-tests", "trainer.logging.wandb.mode=offline",
                 "trainer.logging.wandb.tags=[quickstart,ci]", "trainer.logging.tensorboard=true"]
LINE_RE = re.compile(r"\] iteration (\d+)/\d+ \| lm loss (\S+) \| lr (\S+) \| grad norm (\S+) \| tokens/s/GPU (\S+) \| "
                     r"TFLOP/s/GPU (\S+) \| mem alloc GiB (\S+) \| mem peak GiB (\S+) \| ms/iter (\S+)")
EVAL_RE = re.compile(r"\] eval iteration (\d+) \| eval loss (\S+) \| token accuracy (\S+)")
TRAIN_TAGS = ("lm_loss", "lr", "grad_norm", "tokens_per_s_gpu", "tflops_gpu", "mem_alloc_gib", "mem_peak_gib",
              "ms_per_iter")


def printed(log: str) -> dict[int, dict[str, str]]:
    """{iteration: {tag: value as printed}} of every iteration and eval line of a debug log."""
    out: dict[int, dict[str, str]] = {}
    for m in LINE_RE.finditer(log):
        out.setdefault(int(m.group(1)), {}).update({f"train/{k}": v for k, v in zip(TRAIN_TAGS, m.groups()[1:])})
    for m in EVAL_RE.finditer(log):
        out.setdefault(int(m.group(1)), {}).update({"eval/eval_loss": m.group(2), "eval/token_accuracy": m.group(3)})
    return out


def rounds_to(value: float, shown: str) -> bool:
    """`value` is what the log line printed as `shown` (1.234567E+00, 1.234E-01, 12.34, ...): within half a unit
    of its last digit, plus float32's rounding (TensorBoard keeps float32)."""
    mantissa, _, exp = shown.partition("E")
    digits = len(mantissa.partition(".")[2])
    unit = 10.0 ** ((int(exp) if exp else 0) - digits)
    return abs(value - float(shown)) <= 0.5 * unit * (1 + 1e-9) + 1e-7 * abs(value)


def wandb_runs(run_dir: Path) -> list[list[dict]]:
    """The records of each offline W&B run folder under run_dir/wandb, read by wandb itself."""
    runs = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", str(folder), "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        runs.append([json.loads(line) for line in out.stdout.splitlines() if line.strip()])
    return runs


def wandb_history(records: list[dict]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for r in records:
        if r["type"] == "history":
            item = r["history"]["item"]
            out.setdefault(int(item["_step"]), {}).update({k: v for k, v in item.items() if not k.startswith("_")})
    return out


def tensorboard_scalars(folder: Path) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    out: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            out.setdefault(ev.step, {})[tag] = ev.value
    return out


def assert_same(logged: dict[int, dict[str, float]], shown: dict[int, dict[str, str]], what: str) -> None:
    """Every printed iteration/eval value is in the tracker at that step, and the tracker holds nothing else."""
    assert sorted(logged) == sorted(shown), what
    for step, values in shown.items():
        assert set(logged[step]) == set(values), (what, step)
        bad = {k: (logged[step][k], v) for k, v in values.items() if not rounds_to(logged[step][k], v)}
        assert not bad, (what, step, bad)


def events(run_dir: Path, attempt: int = 0) -> list[dict]:
    name = "events.jsonl" if attempt == 0 else f"events.attempt-{attempt}.jsonl"
    return [json.loads(x) for x in (run_dir / "logs" / "rank-0" / name).read_text().splitlines()]


def test_quickstart_logs_to_wandb_offline_and_tensorboard_without_network(tmp_path):
    sets = [*WANDB_OFFLINE, "trainer.schedule.train_iters=60", "trainer.schedule.eval_interval=30",
            "trainer.checkpoint.save_interval=null", "trainer.checkpoint.export_peft=false",
            "experiment.description=the tracker test"]
    no_net = subprocess.run([*NO_NETWORK, sys.executable, "-c",
                             "import socket; socket.create_connection(('1.1.1.1', 443), timeout=3)"],
                            capture_output=True, text=True)
    assert no_net.returncode != 0 and "unreachable" in no_net.stderr.lower(), no_net.stderr  # no route out
    _, _, run_dir = local_training_run(tmp_path, *sets, wrap=NO_NETWORK)
    log = (run_dir / "logs" / "rank-0" / "debug.log").read_text()
    shown = printed(log)
    assert sorted(shown) == [10, 20, 30, 40, 50, 60] and "eval/token_accuracy" in shown[60]

    # W&B: one offline run, its id the one kept in the run directory, the recipe as its config
    (records,) = wandb_runs(run_dir)
    run_id = (run_dir / "wandb" / "run-id").read_text().strip()
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["run_id"] == run_id and run["project"] == "primus-tests" and run["tags"] == ["quickstart", "ci"]
    assert run["display_name"] == run_dir.name and run["notes"] == "the tracker test"  # experiment.description
    assert f"] wandb | run {run_id} | project primus-tests | mode offline | attempt 0 | dir wandb" in log
    config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
    assert config == yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    history = wandb_history(records)
    assert_same(history, shown, "wandb")
    for e in events(run_dir):  # and exactly the numbers of the event stream
        if e["event"] in ("metrics", "eval"):
            prefix = "train" if e["event"] == "metrics" else "eval"
            for k, v in e.items():
                if f"{prefix}/{k}" in history[e["iteration"]]:
                    assert history[e["iteration"]][f"{prefix}/{k}"] == v
    losses = [history[s]["train/lm_loss"] for s in sorted(history)]
    assert losses[-1] < 0.5 * losses[0], losses  # the loss curve
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]

    # TensorBoard: the same scalars, read with tensorboard's own reader
    assert sorted(p.name for p in (run_dir / "tensorboard").iterdir()) == ["attempt-0"]
    assert_same(tensorboard_scalars(run_dir / "tensorboard" / "attempt-0"), shown, "tensorboard")


def test_a_requeued_run_continues_the_same_wandb_run(local_slurm, job_env, tmp_path):
    """attempt 0 is requeued by an operator (Slurm sends SIGCONT + SIGTERM to every process of the job: the
    trainer stops at a checkpoint, wandb's service shuts down); attempt 1 resumes and finishes."""
    iters = 40
    recipe = trainer_recipe(tmp_path, "trackers")
    entry = submit(job_env, recipe, f"trainer.schedule.train_iters={iters}", "trainer.schedule.eval_interval=10",
                   *WANDB_OFFLINE)
    job, run_dir = entry["job_id"], Path(entry["run_dir"])
    frozen = None
    try:
        wait_text(run_dir / "logs" / "rank-0" / "debug.log", "] iteration 3/", 240)
        frozen = worker_pids(run_dir)[0]
        os.kill(frozen, signal.SIGSTOP)  # wherever the CPU is, it stops early: the requeue thaws and stops it
        scontrol("requeue", job)
        wait_requeued(job, 1)
        frozen = None
        row = run_to_end(job, job_env, entry["run_id"])
    finally:
        thaw_and_cancel(job, frozen)
    assert row["state"] == "COMPLETED" and row["restarts"] == 1, row
    first, second = (read(run_dir / "logs" / "rank-0" / n) for n in ("debug.log", "debug.attempt-1.log"))
    stopped = int(re.search(r"\] stop signal \| signal SIG\w+ \| iteration (\d+)", first).group(1))
    assert first.rstrip().endswith(f"training finished | iterations {stopped} | exit 75"), first[-1500:]
    assert f"resumed_from checkpoints/iter_{stopped:07d}" in second
    shown = [printed(first), printed(second)]
    assert sorted(shown[0]) == list(range(1, stopped + 1)) and sorted(shown[1]) == list(range(stopped + 1, iters + 1))

    # one W&B run id for both attempts; wandb's files of the two attempts hold every printed value once
    run_id = (run_dir / "wandb" / "run-id").read_text().strip()
    for n, text in enumerate((first, second)):
        assert f"] wandb | run {run_id} | project primus-tests | mode offline | attempt {n} | dir wandb" in text
    runs = wandb_runs(run_dir)
    assert len(runs) >= 2
    assert {r["run"]["run_id"] for records in runs for r in records if r["type"] == "run"} == {run_id}
    history: dict[int, dict[str, float]] = {}
    for records in runs:
        for step, values in wandb_history(records).items():
            assert all(history.get(step, {}).get(k, v) == v for k, v in values.items()), step  # one value a step
            history.setdefault(step, {}).update(values)
    assert_same(history, {**shown[0], **shown[1]}, "wandb, both attempts")
    exits = sorted(r["exit"]["exit_code"] for records in runs for r in records if r["type"] == "exit")
    assert exits == [0, 75], exits

    # TensorBoard: one folder per attempt, each with that attempt's printed values
    assert sorted(p.name for p in (run_dir / "tensorboard").iterdir()) == ["attempt-0", "attempt-1"]
    for n in (0, 1):
        assert_same(tensorboard_scalars(run_dir / "tensorboard" / f"attempt-{n}"), shown[n], f"tensorboard {n}")


@pytest.mark.parametrize("body,expect", [
    ("trainer: {logging: {wandb: {mode: offline}}}", "`trainer.logging.wandb.mode` is set but "
                                                     "`trainer.logging.wandb.project` is not"),
    ("trainer: {logging: {wandb: {tags: [a]}}}", "`trainer.logging.wandb.tags` is set but"),
    ("trainer: {logging: {wandb: {entity: me}}}", "`trainer.logging.wandb.entity` is set but"),
    ("trainer: {logging: {wandb: {project: 'a/b'}}}", "`trainer.logging.wandb.project` is 'a/b'; expected a W&B "
                                                      "project name"),
    ("trainer: {logging: {wandb: {project: p, mode: cloud}}}", "`trainer.logging.wandb.mode` is 'cloud'; expected "
                                                               "one of online, offline or null"),
    ("trainer: {logging: {wandb: {project: p, tags: ['" + "x" * 65 + "']}}}", "`trainer.logging.wandb.tags[0]`"),
    ("trainer: {logging: {wandb_project: p}}", "it is `trainer.logging.wandb.project` now"),
], ids=["mode-alone", "tags-alone", "entity-alone", "slash", "mode", "long-tag", "old-key"])
def test_bad_wandb_keys_are_refused_by_name(body, expect, tmp_path, capsys):
    _check_error(capsys, ["validate", str(_write(tmp_path, body))], expect)


@pytest.fixture(scope="module", autouse=True)
def online_run(request, tmp_path_factory):
    """test_online_without_an_api_key_is_refused_at_start's trainer (test_train_support.run_trainer's command and
    environment, less WANDB_API_KEY), started when the module starts if that test is selected: its one thread
    runs beside the quickstart tracker test's instead of after the module's other tests. (tmp dir, future of its
    CompletedProcess), or None."""
    if not any(item.originalname == "test_online_without_an_api_key_is_refused_at_start"
               for item in request.session.items if item.module is request.module):
        return None
    tmp_path = tmp_path_factory.mktemp("online")
    config = write_recipe(tmp_path, "trainer.logging.wandb.project=p", "trainer.schedule.train_iters=2")
    env = {k: v for k, v in trainer_env().items() if k != "WANDB_API_KEY"}
    return tmp_path, beside(subprocess.run, trainer_cmd(config, tmp_path / "run"), env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)


def test_online_without_an_api_key_is_refused_at_start(online_run):
    tmp_path, started = online_run
    out = started.result()
    assert out.returncode == 2, out.stderr[-2000:]
    line = ("config error | `trainer.logging.wandb.mode` is online but WANDB_API_KEY is not in the job's environment; "
            "export it where you submit (cluster.secrets passes it on) or set trainer.logging.wandb.mode: offline")
    assert out.stderr.strip().splitlines()[-1] == line
    assert (tmp_path / "run" / "logs" / "rank-0" / "debug.log").read_text().rstrip().endswith("] " + line)
    assert not (tmp_path / "run" / "wandb").exists() and "Traceback" not in out.stderr
