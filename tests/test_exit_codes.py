"""The trainer's exit codes are the job's API (trainer/runtime/signals.py), end to end on the local and the Slurm executor:
`submit --follow` exits with the code, `status` shows it as EXIT, and the job's own exit code (the local wrapper's
record, Slurm's batch step) is it: 2 for a bad data record, 3 for divergence, 4 for a checkpoint that cannot be
written (RLIMIT_FSIZE on the submit, which the local job inherits and Slurm propagates), 75 for a cancel after
which the trainer checkpointed. A clean trainer error leaves one `launch |` line in the job output and no elastic
traceback; torchrun used to turn all of them into exit 1 with a ChildFailedError (or SignalException) traceback.
"""
from __future__ import annotations

import json
import re
import resource
import subprocess
from pathlib import Path

import pytest

from conftest import CLI, ROOT, cli, status_json
from reliability_support import read, trainer_recipe, wait_for
from test_train_support import SMALL
from primus_slurm.first_records import CHECKED
from trainer.runtime.signals import EXIT_CONFIG, EXIT_DIVERGED, EXIT_PREEMPTED, EXIT_SAVE_FAILED

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DIVERGE = ["trainer.schedule.lr=10", "trainer.schedule.min_lr=10", "trainer.schedule.warmup_iters=0",
           "trainer.schedule.lr_decay=constant", "trainer.schedule.clip_grad=0", "trainer.schedule.train_iters=40"]
FSIZE = 128 << 10  # the logs of a 4-iteration run fit; its first checkpoint (LoRA weights + AdamW state) does not


def _bad_data(tmp_path: Path) -> Path:
    """A bad line past the records submit reads (primus_slurm.first_records.CHECKED): only the job finds it."""
    lines = (ROOT / "recipes" / "data" / "quickstart" / "train.jsonl").read_text().splitlines()[:100]
    lines.insert(CHECKED + 10, '{"instruction": "unterminated')
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _limit_fsize():
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))


def _follow(env: dict, recipe: Path, sets: list[str], limit=None) -> subprocess.Popen:
    args = [a for s in (*SMALL, "trainer.logging.log_interval=2", *sets) for a in ("--set", s)]
    return subprocess.Popen([str(CLI), "submit", str(recipe), "--json", "--follow", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)


def _read_entry(proc: subprocess.Popen) -> dict:
    """The submit's JSON entry (with --json the followed log goes to stderr), read while the follow runs."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("}"):
            break
    return json.loads("".join(lines))


def _job_output(row: dict) -> str:
    logs = Path(row["run_dir"]) / "logs"
    return read(logs / ("local.out" if row["executor"] == "local" else f"slurm-{row['job_id']}.out"))


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_trainer_exit_codes_reach_follow_status_and_the_job(executor, local_slurm, job_env, tmp_path):
    recipe = trainer_recipe(tmp_path, f"codes-{executor}", executor=executor)
    cases = {
        EXIT_CONFIG: _follow(job_env, recipe, [f"trainer.data.train.path={_bad_data(tmp_path)}",
                                               "trainer.schedule.train_iters=4"]),
        EXIT_DIVERGED: _follow(job_env, recipe, DIVERGE),
        EXIT_SAVE_FAILED: _follow(job_env, recipe, ["trainer.schedule.train_iters=4",
                                                    "trainer.checkpoint.save_interval=2"], limit=_limit_fsize),
    }
    stopped = _follow(job_env, recipe, ["trainer.schedule.train_iters=100000"])
    entries = {}
    try:
        entries.update((proc, _read_entry(proc)) for proc in (*cases.values(), stopped))
        # a cancel on bare metal, as soon as the 100000-iteration run trains: it stops (checkpoints and exits 75)
        # while the others run, instead of taking a core from them until they have ended; checked after them
        log = Path(entries[stopped]["run_dir"]) / "logs" / "rank-0" / "debug.log"
        wait_for(lambda: re.search(r"\] iteration \d+/", read(log)), 300, "training")
        assert cli(job_env, "cancel", entries[stopped]["run_id"]).returncode == 0
        for want, proc in cases.items():
            _, err = proc.communicate(timeout=400)
            row = status_json(job_env, entries[proc]["run_id"])
            text = _job_output(row)
            assert proc.returncode == want, (want, err[-2000:], text[-3000:])
            assert row["exit_code"] == want and row["trainer_exit_code"] == want, row
            assert row["scheduler_state"] == "FAILED", row
            assert f"launch | rank 0 exited with code {want}" in text, text[-3000:]
            # the follow names the state status shows (DIVERGED for exit 3, FAILED otherwise)
            assert row["state"] == ("DIVERGED" if want == EXIT_DIVERGED else "FAILED"), row
            assert f"ended {row['state']} (exit {want})" in err, err[-2000:]
            assert "Traceback" not in text and "ChildFailedError" not in text, text[-3000:]
            if executor == "local":
                assert (Path(row["run_dir"]) / "exit_code").read_text().strip() == str(want)
            else:
                sacct = subprocess.run(["sacct", "-n", "-P", "-j", f"{row['job_id']}.batch", "-o", "ExitCode"],
                                       capture_output=True, text=True).stdout.split()
                assert sacct == [f"{want}:0"], sacct
        assert "checkpoint failed | iteration 2" in read(Path(row["run_dir"]) / "logs" / "rank-0" / "debug.log")

        # the cancel on bare metal: the trainer checkpointed and exited 75, and so did the job and the follow
        _, err = stopped.communicate(timeout=120)
        row = status_json(job_env, entries[stopped]["run_id"])
        text = _job_output(row)
        assert stopped.returncode == EXIT_PREEMPTED, (err[-2000:], text[-3000:])
        assert row["state"] == "CANCELLED" and row["exit_code"] == EXIT_PREEMPTED, row
        assert "] checkpoint saved | iteration" in read(log) and f"exit {EXIT_PREEMPTED}" in read(log)
        assert "Traceback" not in text and "SignalException" not in text, text[-3000:]
    finally:
        # this test's runs, by their ids: a run whose follow has not ended is cancelled (a local job outlives its
        # follow: a failed assert above would otherwise leave the 100000-iteration run training)
        for proc in (*cases.values(), stopped):
            if proc.poll() is None:
                if proc not in entries:  # an assert before its entry was read (a refused submit's before it)
                    try:
                        entries[proc] = _read_entry(proc)
                    except ValueError:  # this submit printed no entry: nothing of it runs
                        pass
                proc.kill()
                if proc in entries:
                    cli(job_env, "cancel", entries[proc]["run_id"])
