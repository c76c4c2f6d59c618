"""`status`: Slurm (or local) state of many runs in one batched query, plus progress from their logs."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import yaml

from primus_slurm.errors import UserError
from primus_slurm.jobs import registry, runs
from primus_slurm.jobs.executor_base import ACTIVE, TERMINAL
from primus_slurm.jobs.executors import executor_for
from primus_slurm.jobs.progress import attempt_base, forget_verdicts, read_progress

DEFAULT_STALL_MINUTES = 30.0
# the states a run (or step) stays in: `status --watch` stops once every one shown is in one
ENDED = {*TERMINAL, "DIVERGED", "REFUSED", "UNKNOWN"}


def _stall_minutes(info: dict, run_dir: Path) -> float:
    if info.get("stall_minutes"):
        return float(info["stall_minutes"])
    try:  # runs submitted before run.json carried it
        resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
        return float(resolved["cluster"].get("stall_minutes") or DEFAULT_STALL_MINUTES)
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return DEFAULT_STALL_MINUTES


def _last_activity(run_dir: Path, progress) -> float | None:
    """Newest sign of life: the trainer log's or the job's stdout's last write, whichever is later (a resumed or
    requeued job writes its stdout before its trainer's first line, while the newest log is the job before's)."""
    outs = list((run_dir / "logs").glob("*.out")) if (run_dir / "logs").is_dir() else []
    times = [p.stat().st_mtime for p in outs] + ([progress.log_mtime] if progress.log_mtime is not None else [])
    return max(times, default=None)


# a job not yet (or not again) in its batch script: queued, resumed, requeued (Slurm's REQUEUED: ending, to be queued
# again), its nodes booting: every attempt logged is one before the attempt it will run
NOT_STARTED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING")
# the job script's first line of each attempt (templates/job.sh.j2): `attempt N` is the attempt's number
_ATTEMPT_LINE = re.compile(rb"^primus-slurm: run \S+ job \S+ attempt (\d+) on ", re.M)


def _stdout_tail(run_dir: Path, info: dict, size: int = 65536) -> bytes:
    """The last `size` bytes of the job's stdout (b"" where it has none)."""
    try:
        path = executor_for(info.get("executor")).stdout_path(run_dir, info)
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read()
    except (OSError, ValueError, UserError):
        return b""


def _before_this_attempt(run_dir: Path, info: dict, state: str | None, progress) -> bool:
    """Whether the newest attempt logged is one before the attempt the job is on, so that its verdicts (diverged,
    finished, an error) are not the job's: a job that has not started (again) (NOT_STARTED), or a running one whose
    trainer has not logged yet: the job's current attempt is its script's last `attempt N` line (a requeue by Slurm
    keeps the job and its stdout; SLURM_RESTART_COUNT counts on), or, before the script says it, `attempt-base` (the
    first attempt of a resumed job)."""
    if state in NOT_STARTED:
        return True
    if state not in ACTIVE or not (progress.diverged or progress.finished or progress.error is not None):
        return False  # (an ended job's last attempt is its own; a verdict-free one has nothing to forget)
    said = [int(n) for n in _ATTEMPT_LINE.findall(_stdout_tail(run_dir, info))]
    return progress.attempt < max([attempt_base(run_dir), *said[-1:]])


# the job script's lines that say why it ended (templates/job.sh.j2, array.sh.j2); its other lines only inform
_JOB_REASONS = ("primus-slurm: time limit near", "primus-slurm: no exit code from container",
                "primus-slurm: node check exited with code", "primus-slurm: array task ")


def job_says(run_dir: Path, info: dict) -> str | None:
    """The job script's last own line (`primus-slurm: ...`, but not its closing `exited with code`) in the job's
    stdout: why a job that never reached the trainer's own error line ended."""
    tail = _stdout_tail(run_dir, info).decode("utf-8", errors="replace").splitlines()
    said = [line.strip() for line in tail if line.startswith(_JOB_REASONS)]
    return said[-1][:300] if said else None


def derive_state(base: dict | None, progress, stalled_for_s: float | None, stall_minutes: float,
                 cancelled: bool = False) -> str:
    """The state shown to users: the scheduler's, refined by DIVERGED and STALLED."""
    state = (base or {}).get("state")
    if state is None:  # scheduler has forgotten the job (no accounting): trust the trainer's last word, or a cancel
        state = progress.final_state or ("CANCELLED" if cancelled else "UNKNOWN")
    if progress.diverged and state not in ("CANCELLED",):
        return "DIVERGED"
    if state == "RUNNING" and stalled_for_s is not None and stalled_for_s > stall_minutes * 60:
        return "STALLED"
    return state


def scheduler_states(found: list[tuple[Path, dict]]) -> list[dict | None]:
    """Each run's executor state (None where nothing knows its job): one query per executor."""
    bases: list[dict | None] = [None] * len(found)
    for name in dict.fromkeys(info.get("executor") for _, info in found):
        picked = [i for i, (_, info) in enumerate(found) if info.get("executor") == name]
        for i, base in zip(picked, executor_for(name).states([found[i] for i in picked])):
            bases[i] = base
    return bases


def collect(entries: list[dict] | None = None, now: float | None = None) -> list[dict]:
    """One row per run: scheduler state (one sacct/squeue call for all Slurm runs) + log progress."""
    entries = registry.entries() if entries is None else entries
    now = time.time() if now is None else now
    found = [(Path(e["run_dir"]), {**e, **runs.read_run_json(Path(e["run_dir"]))}) for e in entries]
    bases = scheduler_states(found)
    rows = []
    for (run_dir, info), base in zip(found, bases):
        progress = read_progress(run_dir)
        if _before_this_attempt(run_dir, info, (base or {}).get("state"), progress):
            forget_verdicts(progress)  # the job's trainer has not logged yet: its newest log is an attempt before
        stall_minutes = _stall_minutes(info, run_dir)
        activity = _last_activity(run_dir, progress)
        stalled_for = (now - activity) if activity is not None else None
        # sacct reports 0:0 for jobs that have not ended; an exit code only means something at the end
        exit_code = (base or {}).get("exit_code") if (base or {}).get("state") in TERMINAL else None
        rows.append({
            "run_id": info["run_id"], "name": info.get("name"), "executor": info.get("executor"),
            "job_id": info.get("job_id"), "run_dir": str(run_dir), "submit_time": info.get("submit_time"),
            "state": derive_state(base, progress, stalled_for, stall_minutes, bool(info.get("cancel_time"))),
            "scheduler_state": (base or {}).get("state"), "state_source": (base or {}).get("source"),
            "exit_code": exit_code, "trainer_exit_code": progress.exit_code, "nodes": (base or {}).get("nodes"),
            "reason": (base or {}).get("reason"),
            "restarts": progress.attempt, "seconds_since_log": stalled_for, "stall_minutes": stall_minutes,
            **{k: v for k, v in progress.as_dict().items() if k not in ("attempt", "log_mtime", "exit_code")},
        })
        if rows[-1]["state"] not in ("RUNNING", "COMPLETED", "PENDING") and not (
                progress.finished or rows[-1]["error"] or rows[-1]["reason"]):
            rows[-1]["reason"] = job_says(run_dir, info)  # e.g. the job script's own word on two slow starts
        if base is None and rows[-1]["state"] == "CANCELLED" and not rows[-1]["reason"]:
            rows[-1]["reason"] = (f"cancelled at {info['cancel_time']} before it started (the scheduler kept no "
                                  f"record of job {info.get('job_id')})")
        if rows[-1]["state"] == "UNKNOWN" and not rows[-1]["reason"]:
            rows[-1]["reason"] = f"neither the scheduler nor the run's logs know job {info.get('job_id')}'s state"
        if (base or {}).get("state") in TERMINAL or rows[-1]["state"] == "STALLED":
            rows[-1]["eta_s"] = None  # an ended or stalled job: its last log line's pace says nothing of the end
    return rows


def _fmt(value, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def to_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=2, sort_keys=True)


COLUMNS = ("RUN", "NAME", "EXEC", "JOB", "STATE", "EXIT", "ITER", "LOSS", "TOK/S/GPU", "TFLOP/S/GPU", "PEAK GiB", "ETA",
           "CHECKPOINT", "RESTARTS")
NARROW = ("RUN", "NAME", "STATE", "EXIT", "ITER", "LOSS", "TOK/S/GPU", "ETA")  # fits 100 columns; --wide: all


def render_table(rows: list[dict], console=None, wide: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    shown = COLUMNS if wide else NARROW
    table = Table(box=None, pad_edge=False)
    for col in shown:
        table.add_column(col, no_wrap=True)
    for r in rows:
        it = f"{r['iteration']}/{r['train_iters']}" if r["iteration"] is not None else "-"
        # a finished run shows its average (`training summary`), a running one its last logged window
        tokens = r.get("avg_tokens_per_s_gpu") if r.get("finished") and r.get("avg_tokens_per_s_gpu") else \
            r["tokens_per_s_gpu"]
        cells = dict(zip(COLUMNS, (
            r["run_id"], _fmt(r["name"]), _fmt(r["executor"]), _fmt(r["job_id"]), r["state"], _fmt(r["exit_code"]),
            it, _fmt(r["lm_loss"], ".4f"), _fmt(tokens, ".1f"), _fmt(r["tflops_gpu"], ".2f"),
            _fmt(r["mem_peak_gib"], ".2f"),
            _eta(r["eta_s"]), _fmt(r["last_checkpoint"]), str(r["restarts"]))))
        table.add_row(*(cells[col] for col in shown))
    console = console or Console(width=250 if wide else 100)
    console.print(table)
    for r in rows:  # why a run failed, from its trainer log (else what the executor knows), or why it waits
        why = r.get("error") or r.get("reason")
        if why and r["state"] not in ("RUNNING", "COMPLETED"):
            console.print(f"{r['run_id']}: {why}", markup=False, highlight=False, soft_wrap=True)
