"""`resume RUN` and `resume SWEEP` (jobs_cli's `resume` command): the run's job again, then its unfinished steps.

`resume SWEEP` submits every trial that ended unfinished again, within the sweep's `max_parallel` (N):
- Slurm: each trial a job of its own, the K-th behind the job N before it (`--dependency=afterany`), after the
  sweep's trials still active: N lanes, never more than N of them running at once.
- local: one local queue for the resumed trials (in the sweep's folder), N at a time, counting the sweep's trials
  that still run or wait in its first queue.
"""
from __future__ import annotations

from pathlib import Path

import click

from primus_slurm.errors import UserError
from primus_slurm.jobs import registry, runs
from primus_slurm.jobs import resume as resume_mod
from primus_slurm.jobs import status as status_mod
from primus_slurm.jobs.executor_base import ACTIVE
from primus_slurm.jobs.local_executor import LocalExecutor
from primus_slurm.jobs.slurm_executor import SlurmExecutor
from primus_slurm.experiments import leaderboard, local_queue, pipeline
from primus_slurm.experiments import sweep as sweep_mod


def resume_run(ref: str, after: str | None = None) -> dict:
    """`resume RUN`: its job again (on Slurm behind job `after`, where given; held while its steps are queued
    again behind it), then its steps; prints what it did. The registry entry, with `attempt` and `note`."""
    run_dir = Path(registry.find(ref)["run_dir"])
    pipeline.check_resumable(run_dir)
    args = [*([f"--dependency=afterany:{after}"] if after else []), *pipeline.resume_args(run_dir)]
    entry = resume_mod.resume(ref, (lambda d: SlurmExecutor().resubmit(d, args)) if args else None,
                              steps=lambda d: pipeline.after_resume(d, held=pipeline.HOLD in args))
    _say(entry, entry["steps"])
    return entry


def _say(entry: dict, again: str | None) -> None:
    click.echo(f"resumed run {entry['run_id']} as {entry['executor']} job {entry['job_id']} "
               f"(attempt {entry['attempt']}, {entry['note']})")
    if again:
        click.echo(again)


def resume_sweep(ref: str) -> None:
    """`resume SWEEP`: every trial that ended unfinished, within the sweep's max_parallel; a `not resumed:` line
    for each other trial; UserError when none was resumed."""
    sweep_dir = leaderboard.find(ref)
    data = sweep_mod.read(sweep_dir)
    found = [(Path(e["run_dir"]), {**e, **runs.read_run_json(Path(e["run_dir"]))})
             for e in leaderboard.trial_entries(sweep_dir)]
    states = status_mod.scheduler_states(found)
    active = [(run_dir, info) for (run_dir, info), s in zip(found, states) if (s or {}).get("state") in ACTIVE]
    limit = data.get("max_parallel")
    if data["executor"] == "local":
        resumed = _local(sweep_dir, found, limit, [run_dir for run_dir, _ in active])
    else:
        resumed = _slurm(found, limit, [str(info["job_id"]) for _, info in active])
    if not resumed:  # exit 0 only when something was resumed
        raise UserError(f"resume {ref}: no trial was resumed (each one's reason above)")


def _present(run_dir: Path, info: dict) -> None:
    if not run_dir.is_dir():
        raise UserError(f"run {info['run_id']}'s run directory {run_dir} no longer exists")


def _slurm(found: list, limit: int | None, tails: list[str]) -> int:
    """Each trial behind the job `limit` before it (`tails`: the active trials' jobs, then the resumed ones)."""
    resumed = 0
    for run_dir, info in found:
        try:
            _present(run_dir, info)
            entry = resume_run(info["run_id"], tails[-limit] if limit and len(tails) >= limit else None)
        except UserError as exc:
            click.echo(f"not resumed: {exc}")
            continue
        tails.append(str(entry["job_id"]))
        resumed += 1
    return resumed


def _local(sweep_dir: Path, found: list, limit: int | None, busy: list[Path]) -> int:
    """The trials made ready again as runs of one new local queue, which starts them `limit` at a time (the `busy`
    trials counting against it while they are active). The queue is spawned before the first trial is resumed, so
    that each trial's run.json names a live queue from its first write (with the sweep's first queue, long ended,
    a resumed trial read CANCELLED until every trial was resumed); it starts them once released."""
    ready = []
    for run_dir, info in found:
        try:
            _present(run_dir, info)
            pipeline.check_resumable(run_dir)
            ready.append(info["run_id"])
        except UserError as exc:
            click.echo(f"not resumed: {exc}")
    if not ready:
        return 0
    queue, queued = local_queue.spawn(sweep_dir), []
    for run_id in ready:
        try:
            entry = resume_mod.resume(run_id, lambda d: _queued(d, local_queue.run_fields(queue, len(queued))))
        except UserError as exc:
            click.echo(f"not resumed: {exc}")
            continue
        queued.append(Path(entry["run_dir"]))
        again = any(s.get("state") != "COMPLETED" for s in runs.read_run_json(queued[-1]).get("pipeline") or ())
        _say(entry, pipeline.submitted_line(queued[-1]) if again else None)
    local_queue.gate(sweep_dir, queued, limit or 1, others=busy)  # (none: the queue ends at once)
    local_queue.release(sweep_dir)
    return len(queued)


def _queued(run_dir: Path, fields: dict) -> dict:
    """A trial's run.json fields as a run of the new queue (`fields`): ready to start again, its steps again where
    they did not all complete."""
    info = runs.read_run_json(run_dir)
    pipeline.requeue_local(run_dir, info)
    steps = {k: info[k] for k in ("pipeline", "pipeline_before") if k in info}
    return {**LocalExecutor.requeue(run_dir), **fields, **steps}
