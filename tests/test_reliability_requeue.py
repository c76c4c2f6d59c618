"""Preemption and requeue of a real CPU training job on the project's local Slurm cluster.

One job lives through three attempts:
  attempt 0 hits its time limit: slurmctld sends USR2 to the batch shell `signal_grace_s` before the end, the
            job script asks the trainer to stop, the trainer checkpoints and exits 75, the script requeues;
  attempt 1 resumes from `latest` and is requeued by an operator (`scontrol requeue`, i.e. SIGTERM);
  attempt 2 resumes from `latest` and finishes.
The losses of the three attempts together equal an uninterrupted run of the same resolved recipe.

Timing: slurmctld checks time limits every 30 s and sends the warning at the first check less than 30 s before it is
due, so it arrives 20-50 s into a 1-minute job with grace 10 s (30-60 s with a 2-minute job and grace 60 until
2026-12-06, 45-75 s with 45 before that; cut for CI time), after attempt 0's first log point (~7 s idle); the next
check after it, the one that would end the job at its limit, is at least 30 s later. To not
spend that on the CPU, attempt 0's trainer is frozen (SIGSTOP) after a few iterations and thawed (SIGCONT)
as soon as the batch shell reports the signal; the stop request then reaches it through the real path
(trap -> scancel -> every process of the step). Attempt 1 is frozen the same way before the operator's
requeue, which itself sends SIGCONT and SIGTERM, so where each attempt stops does not depend on CPU speed.
A requeued job normally waits ~120 s before it may start again;
`scontrol update StartTime=now` skips that wait.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import cli, status_json, wait_state
from reliability_support import (cancel, fingerprint, job_info, read, release, run_to_end, scontrol, submit,
                                 thaw_and_cancel, trainer_recipe, wait_for, wait_requeued, wait_text, worker_pids)
from test_train_support import losses, run_trainer

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ITERS = 200
REL_TOL = 1e-5  # losses are logged with 7 significant digits; in practice they are identical
LOG_EVERY = 7  # the stops fall inside log intervals, whose means then average fewer iterations than the twin's
STOP_RE = re.compile(r"\] stop signal \| signal (SIG\w+) \| iteration (\d+)")


def _stopped(text: str) -> int:
    """The iteration an attempt stopped at; it must have checkpointed it and exited 75."""
    m = STOP_RE.search(text)
    assert m, text[-2000:]
    it = int(m.group(2))
    assert f"] checkpoint saved | iteration {it} | path checkpoints/iter_{it:07d}" in text
    assert text.rstrip().endswith(f"training finished | iterations {it} | exit 75")
    return it


def test_time_limit_and_requeue_resume_to_the_uninterrupted_curve(local_slurm, job_env, tmp_path):
    recipe = trainer_recipe(tmp_path, "requeue", time="00:01:00", signal_grace_s=10)
    entry = submit(job_env, recipe, f"trainer.schedule.train_iters={ITERS}", "trainer.checkpoint.save_interval=50",
                   "trainer.checkpoint.keep_last=100", f"trainer.logging.log_interval={LOG_EVERY}")
    job, run_dir = entry["job_id"], Path(entry["run_dir"])
    logs = run_dir / "logs"
    out = logs / f"slurm-{job}.out"
    attempt_log = [logs / "rank-0" / "debug.log"] + [logs / "rank-0" / f"debug.attempt-{n}.log" for n in (1, 2)]
    frozen = None
    try:
        # ---- attempt 0: time limit -> USR2 -> checkpoint -> requeue
        wait_text(attempt_log[0], f"] iteration {LOG_EVERY}/", 240)
        frozen = worker_pids(run_dir)[0]
        os.kill(frozen, signal.SIGSTOP)
        reference = run_trainer(run_dir / "recipe.resolved.yaml", tmp_path / "uninterrupted")  # CPU is free now
        assert reference.returncode == 0, reference.stderr[-3000:]
        wait_text(out, "primus-slurm: caught SIGUSR2", 150)
        os.kill(frozen, signal.SIGCONT)
        frozen = None
        wait_requeued(job, 1)
        first = read(attempt_log[0])
        k0 = _stopped(first)
        assert "requeueing job" in read(out)
        kept = {0: (read(attempt_log[0]), fingerprint(run_dir / "checkpoints" / f"iter_{k0:07d}"), read(out))}

        # ---- attempt 1: resumes from latest; an operator requeues it (SIGTERM to every process of the job)
        scontrol("update", f"JobId={job}", "TimeLimit=10")  # later attempts are not cut short by the 2-minute limit
        release(job)
        wait_text(attempt_log[1], f"] iteration {(k0 // LOG_EVERY + 1) * LOG_EVERY}/", 240)  # its first log point
        frozen = worker_pids(run_dir)[0]
        os.kill(frozen, signal.SIGSTOP)  # hold it mid-run however fast the CPU; Slurm sends SIGCONT + SIGTERM
        assert status_json(job_env, entry["run_id"])["restarts"] == 1
        scontrol("requeue", job)
        wait_requeued(job, 2)
        frozen = None
        second = read(attempt_log[1])
        k1 = _stopped(second)
        assert f"resumed_from checkpoints/iter_{k0:07d}" in second and k0 < k1 < ITERS
        kept[1] = (second, fingerprint(run_dir / "checkpoints" / f"iter_{k1:07d}"), read(out))

        # ---- attempt 2: resumes and finishes
        row = run_to_end(job, job_env, entry["run_id"])
    finally:
        thaw_and_cancel(job, frozen)
    third = read(attempt_log[2])
    assert row["state"] == "COMPLETED" and row["trainer_exit_code"] == 0, (row, read(out)[-3000:])
    assert row["exit_code"] == 0 or (row["exit_code"] is None and row["state_source"] == "squeue")  # no accounting
    assert row["restarts"] == 2 and job_info(job).get("Restarts") in ("2", None)
    assert row["iteration"] == ITERS and row["last_checkpoint"] == f"checkpoints/iter_{ITERS:07d}"
    assert f"resumed_from checkpoints/iter_{k1:07d}" in third
    assert third.rstrip().endswith(f"training finished | iterations {ITERS} | exit 0")

    # nothing of attempt N was overwritten by a later attempt: logs byte-identical (Slurm's stdout file only
    # appended to), the checkpoints each attempt stopped at untouched (content, mtime, inode)
    final_out = read(out)
    for n, (log, ckpt_files, out_then) in kept.items():
        assert read(attempt_log[n]) == log
        assert fingerprint(run_dir / "checkpoints" / f"iter_{(k0, k1)[n]:07d}") == ckpt_files
        assert final_out.startswith(out_then)
    assert [int(a) for a in re.findall(r"primus-slurm: run \S+ job \d+ attempt (\d+)", final_out)] == [0, 1, 2]

    # the loss curve: every iteration's loss logged by exactly one attempt, equal to the uninterrupted run's
    parts = [iteration_losses(run_dir, n) for n in range(3)]
    assert sorted(parts[0]) == list(range(1, k0 + 1))
    assert sorted(parts[1]) == list(range(k0 + 1, k1 + 1))
    assert sorted(parts[2]) == list(range(k1 + 1, ITERS + 1))
    resumed = {**parts[0], **parts[1], **parts[2]}
    twin = tmp_path / "uninterrupted"
    ref = iteration_losses(twin, 0)
    assert sorted(ref) == sorted(resumed) == list(range(1, ITERS + 1))
    worst = max(abs(resumed[i] - ref[i]) / abs(ref[i]) for i in ref)
    assert worst <= REL_TOL, f"largest relative loss difference {worst:.3g}"
    same = sum(resumed[i] == ref[i] for i in ref)
    print(f"stopped at {k0} (time limit) and {k1} (requeue); {same}/{ITERS} per-iteration losses identical, "
          f"largest relative difference {worst:.3g}")

    # `compare` says so: the logged interval means differ where a stop cut an interval (k0, k1 not multiples of
    # LOG_EVERY), the per-iteration losses it compares do not
    shutil.copy(run_dir / "recipe.resolved.yaml", twin / "recipe.resolved.yaml")
    cut = [k for k in (k0, k1) if k % LOG_EVERY]
    means = [losses(first) | losses(second) | losses(third), losses(read(twin / "logs" / "rank-0" / "debug.log"))]
    after = [(k // LOG_EVERY + 1) * LOG_EVERY for k in cut]  # the first log point of the attempt that resumed
    assert not cut or any(a in means[0] and means[0][a] != means[1][a] for a in after), (k0, k1)  # (compare's old)
    out = cli(job_env, "compare", str(twin), str(run_dir))
    assert out.returncode == 0, out.stderr
    assert "compared: per-iteration losses" in out.stdout
    equal = rf"reference uninterrupted \(\w+\): equal: max \|d lm loss\| \S+, mean \S+ over {ITERS} iterations"
    assert re.search(equal, out.stdout), out.stdout[-1500:]


def iteration_losses(run_dir: Path, attempt: int) -> dict[int, float]:
    """{iteration: its own lm loss} from an attempt's event stream (metrics events' `losses`)."""
    from primus_contract import run_files

    events = run_files.read_events(run_files.rank_dir(run_dir) / run_files.events_name(attempt))
    return {it: loss for e in events if e["event"] == "metrics" for it, loss in e["losses"]}



def _warned_and_frozen(job_env, tmp_path, name: str):
    """A running Slurm job whose trainer is frozen (SIGSTOP) at iteration 3 and whose batch shell has just had the
    time-limit warning (USR2 to the batch shell only, what slurmctld sends `signal_grace_s` before the end)."""
    entry = submit(job_env, trainer_recipe(tmp_path, name), "trainer.schedule.train_iters=5000")
    run_dir = Path(entry["run_dir"])
    out = run_dir / "logs" / f"slurm-{entry['job_id']}.out"
    wait_text(run_dir / "logs" / "rank-0" / "debug.log", "] iteration 3/", 240)
    pid = worker_pids(run_dir)[0]
    os.kill(pid, signal.SIGSTOP)
    subprocess.run(["scancel", "--batch", "--signal=USR2", entry["job_id"]], check=True)
    wait_text(out, "primus-slurm: caught SIGUSR2", 60)
    return entry, run_dir, out, pid


def test_warning_does_not_requeue_a_trainer_that_ended_for_good(local_slurm, job_env, tmp_path):
    """The warning arrives, but the trainer's stop fails for good (its checkpoint cannot be written: exit 4). The
    script must not requeue; before it requeued after every warning, rerunning finished, diverged or broken runs."""
    entry, run_dir, out, pid = _warned_and_frozen(job_env, tmp_path, "endedforgood")
    job = entry["job_id"]
    try:
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        (run_dir / "checkpoints").rmdir()
        (run_dir / "checkpoints").write_text("not a directory\n")  # the save on stop fails
        os.kill(pid, signal.SIGCONT)
        row = wait_state(job_env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120,
                         key="scheduler_state")
    finally:
        if pid in worker_pids(run_dir).values():
            os.kill(pid, signal.SIGCONT)
        if job_info(job).get("JobState") not in (None, "COMPLETED", "FAILED"):
            cancel(job)
    text, log = read(out), read(run_dir / "logs" / "rank-0" / "debug.log")
    assert re.search(r"\] checkpoint failed \| iteration \d+ \| error", log), log[-2000:]
    assert re.search(r"training finished \| iterations \d+ \| exit 4\n$", log), log[-2000:]
    assert re.search(r"but the trainer ended for good \(training finished \| iterations \d+ \| exit 4\); "
                     r"not requeueing", text), text[-2000:]
    assert "requeueing job" not in text
    assert row["scheduler_state"] == "FAILED" and row["restarts"] == 0, row
    assert job_info(job).get("Restarts") in ("0", None)


def test_warning_requeues_a_trainer_killed_before_it_could_report(local_slurm, job_env, tmp_path):
    """Killed during its stop (SIGKILL, e.g. torchrun's 30 s shutdown limit during a long save): no final line in
    the log, so the job is requeued and the next attempt resumes from the last complete checkpoint."""
    entry, run_dir, out, pid = _warned_and_frozen(job_env, tmp_path, "killedinstop")
    job = entry["job_id"]
    try:
        os.kill(pid, signal.SIGKILL)
        wait_requeued(job, 1)
    finally:
        cancel(job)
    text = read(out)
    assert "requeueing job" in text and "(trainer: no final line)" in text, text[-2000:]
    assert "] training finished" not in read(run_dir / "logs" / "rank-0" / "debug.log")


def test_a_trainer_that_never_starts_is_requeued_once_not_for_ever(local_slurm, job_env, tmp_path):
    """The launcher hangs before any trainer exists (a stuck container start or image pull): the warning comes and
    this attempt's log is empty. The first such attempt is requeued (a slow start, a first image pull, may succeed
    next time); the second in a row is not, or the job would hang from limit to limit for ever: it ends, naming
    the `primus-slurm resume` to run after a fix."""
    hang = tmp_path / "hanging-python"
    hang.write_text("#!/bin/sh\necho launcher stuck\nexec sleep 600\n")
    hang.chmod(0o755)
    entry = submit(job_env, trainer_recipe(tmp_path, "neverstarted", python=str(hang)))
    job, run_dir = entry["job_id"], Path(entry["run_dir"])
    out = run_dir / "logs" / f"slurm-{job}.out"
    try:
        wait_text(out, "launcher stuck", 120)
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
        wait_requeued(job, 1)
        assert "has not started logging in this attempt (slow start?); requeueing job" in read(out)
        release(job)
        wait_for(lambda: read(out).count("launcher stuck") == 2, 120, "the second attempt's launcher")
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
        row = wait_state(job_env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120,
                         key="scheduler_state")
    finally:
        if job_info(job).get("JobState") not in (None, "COMPLETED", "FAILED", "CANCELLED"):
            cancel(job)
    text = read(out)
    assert text.count("primus-slurm: caught SIGUSR2") == 2, text[-2000:]
    assert "has not started logging in this attempt nor the one before" in text and "not requeueing" in text
    assert f"primus-slurm resume {entry['run_id']}" in text
    assert row["scheduler_state"] == "FAILED" and job_info(job).get("Restarts") in ("1", None), row
