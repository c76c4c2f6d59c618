"""`resume RUN`: submit a stopped run's own job script again, as a new job; the trainer resumes from the run's
`checkpoints/latest` (trainer.checkpoint.resume: auto, the recipe hash checked).

The script is the one the run was submitted with (`job.sbatch`), so the resumed job runs the same resolved
recipe and code. It writes the next attempt number to `attempt-base`, which the script adds to Slurm's restart
count, so the new attempt logs to a file of its own (`logs/rank-0/debug.attempt-N.log`). A run that is still
queued or running, that completed, or whose run directory is gone is refused with one line. A resume refused on the
way (sbatch rejects the new job, or a step of its pipeline, which cancels it) leaves the run as it was: its
`attempt-base`, run.json and registry entry.
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from primus_contract import node_faults, run_files
from primus_slurm.jobs import registry, runs
from primus_slurm.errors import UserError
from primus_slurm.jobs.executors import executor_for
from primus_slurm.jobs.progress import attempt_of, rank_logs, read_progress

ATTEMPT_BASE = run_files.ATTEMPT_BASE
LOCK = ".resume.lock"


def next_attempt(run_dir: Path) -> int:
    """One past the highest attempt any rank-0 log or the run's node records (logs/nodes.jsonl: an attempt whose
    preflight failed before the trainer logged has only those) know of; 0 for a run that never started."""
    logs = rank_logs(run_dir, 0)
    seen = [attempt_of(logs[-1])] if logs else []
    seen += [r["attempt"] for r in node_faults.read(run_dir) if isinstance(r.get("attempt"), int)]
    return max(seen) + 1 if seen else 0


def resume(ref: str, start=None, steps=None) -> dict:
    """Submit RUN's job script again (`start(run_dir)`, where given, starts it another way and returns its run.json
    fields: held, behind another job, or queued), then `steps(run_dir)` (what follows the new job: its pipeline's
    steps; a UserError from it means it has cancelled the new job); returns the updated registry entry (with a
    `note` for the user, and steps' answer as `steps`). Refused on the way, the run is left as it was."""
    entry = registry.find(ref)
    run_id, run_dir = entry["run_id"], Path(entry["run_dir"])
    if not (run_dir / "job.sbatch").is_file():
        raise UserError(f"run {run_id}'s run directory {run_dir} (or its job.sbatch) no longer exists")
    progress = read_progress(run_dir)  # (before the lock file: a refusal writes nothing)
    if progress.finished and progress.exit_code == 0:
        raise UserError(f"run {run_id} completed (iteration {progress.iteration}); nothing to resume")
    with open(run_dir / LOCK, "w") as lock:  # two resumes at once would start two jobs in one run directory
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another `primus-slurm resume` of run {run_id} is in progress") from None
        kept, new, undone = _files(run_dir), None, False  # (under the lock: never another resume's writes)
        try:
            new = _resume(entry, run_id, run_dir, start)
            new["steps"] = steps(run_dir) if steps is not None else None
        except UserError:  # nothing was started (or it was cancelled again): nothing about the run changes
            _put_back(run_dir, kept)
            undone = True
            raise
        finally:
            if new is not None and not undone:  # (a job that was started, whatever failed after it)
                registry.record({k: v for k, v in new.items() if k not in ("attempt", "note", "steps")})
        return new  # the lock goes with the file's close


KEPT = (ATTEMPT_BASE, runs.RUN_JSON)  # what a resume writes in the run directory


def _files(run_dir: Path) -> dict[str, bytes | None]:
    """The files of KEPT as they are (None: absent)."""
    out = {}
    for name in KEPT:
        try:
            out[name] = (run_dir / name).read_bytes()
        except FileNotFoundError:
            out[name] = None
    return out


def _put_back(run_dir: Path, kept: dict[str, bytes | None]) -> None:
    for name, data in kept.items():
        if data is None:
            (run_dir / name).unlink(missing_ok=True)
        else:
            (run_dir / f"{name}.tmp").write_bytes(data)
            os.replace(run_dir / f"{name}.tmp", run_dir / name)


def _resume(entry: dict, run_id: str, run_dir: Path, start) -> dict:
    info = {**entry, **runs.read_run_json(run_dir)}
    executor = executor_for(info.get("executor"))
    old = executor.state(run_dir, info)
    busy = executor.busy(run_dir, info, old)
    if busy:
        raise UserError(f"run {run_id} is {busy} (job {info.get('job_id')}); resume it once it has ended, "
                        f"`primus-slurm cancel {run_id}` to end it, or follow it with `primus-slurm logs {run_id} -f`")
    registry.check_writable()  # a new job the registry cannot record would run unseen
    attempt = next_attempt(run_dir)
    (run_dir / ATTEMPT_BASE).write_text(f"{attempt}\n")
    history = [*info.get("jobs", []), {"job_id": info.get("job_id"), "state": old.get("state"),
                                       "exit_code": old.get("exit_code")}]
    info.update((start or executor.resubmit)(run_dir))
    info.update(jobs=history, resume_time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    info.pop("cancel_time", None)  # (the cancel of the job before)
    runs.write_run_json(run_dir, info)
    new = {**entry, "job_id": info["job_id"], "jobs": [j["job_id"] for j in history]}  # `find` knows the old ids
    latest = run_dir / "checkpoints" / "latest"
    note = (f"from {latest.read_text().strip()}" if latest.is_file() else "no checkpoint yet: from iteration 0")
    return {**new, "attempt": attempt, "note": note}
