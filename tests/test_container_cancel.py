"""`cancel` of a container job works as on bare metal, every time, for podman and for docker (the docker CLI against
podman's API service): the trainer inside the container logs `stop signal` within 5 s of the cancel, saves a
checkpoint and exits 75 before the job ends, long before Slurm's KillWait (30 s); `status` says STOPPING, not
CANCELLED, while the job still runs, then CANCELLED with the trainer's exit code 75; no container is left.

One run per runtime is cancelled twice (four cancels in all; three a runtime until 2026-12-06, cut for CI time), each
time at another iteration: the first attempt is a submit, the second a `resume` (it starts from the checkpoint the
first cancel saved). Before the fix the SIGTERM was lost in 3 of 4 cancels here (podman's signal proxy forwards through a `runc kill` child that Slurm's same SIGTERM
kills), and KillWait ended the job ~31 s later, with training going on meanwhile.
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import cli, status_json
from container_support import container_recipe, image, job_containers, remove_job_containers  # noqa: F401
from reliability_support import read, submit, wait_for
from trainer.runtime.signals import EXIT_PREEMPTED

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
# iterations each attempt trains past its start before it is cancelled: four cancels in all, each at another iteration
AFTER = {"podman": (3, 17), "docker": (5, 12)}
STOP_WITHIN_S = 5.0
KILL_WAIT_S = 30.0


def _attempt_log(run_dir: Path, attempt: int) -> Path:
    name = "debug.log" if attempt == 0 else f"debug.attempt-{attempt}.log"
    return run_dir / "logs" / "rank-0" / name


def _iteration(text: str) -> int:
    found = re.findall(r"\] iteration (\d+)/", text)
    return int(found[-1]) if found else -1


def _listed(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "--states=all", "-j", str(job_id), "-o", "%T"], capture_output=True,
                         text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def _cancel_and_watch(env: dict, run_id: str, job_id: str, log: Path) -> dict:
    """Cancel; until the job has ended, poll the attempt's log, `status` and then squeue (in that order: a status
    that said CANCELLED before squeue still listed the job as running would be wrong)."""
    t0 = time.monotonic()
    out = cli(env, "cancel", run_id)
    assert out.returncode == 0, out.stderr
    seen, stop_s, wrong = [], None, []
    while time.monotonic() - t0 < 90:
        text = read(log)
        if stop_s is None and "] stop signal | signal SIGTERM" in text:
            stop_s = time.monotonic() - t0
        row = status_json(env, run_id)
        listed = _listed(job_id)
        seen.append(row["state"])
        if row["state"] == "CANCELLED" and listed in ("RUNNING", "COMPLETING"):
            wrong.append(listed)
        if row["state"] == "CANCELLED":
            return {"stop_s": stop_s, "end_s": time.monotonic() - t0, "seen": seen, "wrong": wrong, "row": row,
                    "log_at_end": text}
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end within 90 s of the cancel; states seen {seen}")


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_cancel_checkpoints_inside_the_container_every_time(runtime, image, local_slurm, job_env, tmp_path):  # noqa: F811
    recipe = container_recipe(tmp_path, f"cancel-{runtime}", image, runtime=runtime)
    entry = submit(job_env, recipe, "trainer.schedule.train_iters=100000", "trainer.checkpoint.keep_last=1")
    run_id, run_dir, jobs, start, results = entry["run_id"], Path(entry["run_dir"]), [entry["job_id"]], 0, []
    try:
        for attempt, after in enumerate(AFTER[runtime]):
            if attempt:
                out = cli(job_env, "resume", run_id)
                assert out.returncode == 0, out.stderr
                jobs.append(status_json(job_env, run_id)["job_id"])
            log = _attempt_log(run_dir, attempt)
            target = start + after
            wait_for(lambda: _iteration(read(log)) >= target, 300, f"attempt {attempt} at iteration {target}")
            got = _cancel_and_watch(job_env, run_id, jobs[-1], log)
            text = got["log_at_end"]
            stopped = int(re.search(r"\] stop signal \| signal SIGTERM \| iteration (\d+)", text).group(1))
            results.append((attempt, target, stopped, round(got["stop_s"], 2), round(got["end_s"], 1)))
            assert got["stop_s"] is not None and got["stop_s"] <= STOP_WITHIN_S, (results, text[-1500:])
            # saved and ended by the trainer itself before the job ended, well before KillWait
            assert f"] checkpoint saved | iteration {stopped} |" in text, text[-1500:]
            assert f"] training finished | iterations {stopped} | exit {EXIT_PREEMPTED}" in text, text[-1500:]
            assert got["end_s"] < KILL_WAIT_S, results
            assert "STOPPING" in got["seen"] and not got["wrong"], got["seen"]
            row = got["row"]
            assert row["scheduler_state"] == "CANCELLED" and row["exit_code"] == EXIT_PREEMPTED, row
            assert row["last_checkpoint"] == f"checkpoints/iter_{stopped:07d}", row
            if attempt:  # the resume started where the previous cancel saved
                assert f"resumed_from checkpoints/iter_{start:07d}" in text, text[:2000]
            stdout = read(run_dir / "logs" / f"slurm-{jobs[-1]}.out")
            assert "Traceback" not in stdout and f"training exited with code {EXIT_PREEMPTED}" in stdout, stdout[-3000:]
            wait_for(lambda: not job_containers(jobs[-1]), 30, f"no container of job {jobs[-1]}")
            start = stopped
        print(f"{runtime} cancels (attempt, cancelled after, stopped at, stop s, end s): {results}")
    finally:
        subprocess.run(["scancel", *map(str, jobs)], capture_output=True)
        remove_job_containers(*jobs)
