"""The run directory's files, named once, and the trainer's event stream (JSON lines) that the launcher reads.

    <run_dir>/job.sbatch  recipe.yaml  recipe.resolved.yaml  run.json  code/{trainer,primus_contract}/
    <run_dir>/attempt-base   the first attempt of the run's current job (`primus-slurm resume` writes it)
    <run_dir>/logs/rank-0/debug.log | debug.attempt-N.log        the human log (attempt N = SLURM_RESTART_COUNT)
    <run_dir>/logs/rank-0/events.jsonl | events.attempt-N.jsonl  one JSON object a line: the machine-readable API
    <run_dir>/logs/nodes.jsonl   what the job learns about its nodes (primus_contract/node_faults.py)
    <run_dir>/checkpoints/iter_NNNNNNN/  checkpoints/latest
    <run_dir>/tensorboard/attempt-N/   TensorBoard event files (trainer.logging.tensorboard)
    <run_dir>/wandb/run-id  wandb/offline-run-*/  the W&B run id every attempt reuses; wandb's own files

Events (`event` names the kind; `t` is the UTC time, seconds: a line whose `t` is no such time is skipped):
    start       attempt, world_size, device, resumed_from
    precision   line (the human `precision | ...` line) and its fields
    metrics     iteration, train_iters, lm_loss, lr, grad_norm, tokens_per_s_gpu, tflops_gpu, mem_alloc_gib,
                mem_peak_gib, ms_per_iter (the log interval's means), losses ([iteration, lm loss] of each iteration
                in the interval: what `compare` compares, equal across a requeue where the means are not)
    eval        iteration, eval_loss, token_accuracy (share of supervised positions predicted right; absent
                with pipeline parallelism)
    checkpoint  iteration, path (relative to the run directory)
    diverged    iteration, lm_loss
    summary     iterations, tokens_per_s_gpu, tflops_gpu, ms_per_iter, mem_peak_gib; on CUDA mem_reserved_gib
                (PyTorch's) and mem_device_used_gib (the GPU's, all processes): alone on its GPU, the difference is
                what the process holds outside PyTorch's allocator
    outcome     status (training finished | error | config error | resume refused), exit, message (the rest of
                the human line: `iterations N`, or the reason)
The trainer writes the stream; status, compare, logs and the job script's requeue decision read it.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

JOB_SCRIPT = "job.sbatch"
RECIPE = "recipe.yaml"
RESOLVED = "recipe.resolved.yaml"
RUN_JSON = "run.json"
ATTEMPT_BASE = "attempt-base"  # read by templates/job.sh.j2
CODE = "code"
CHECKPOINTS = "checkpoints"
LATEST = "checkpoints/latest"
NODES = "logs/nodes.jsonl"
TENSORBOARD = "tensorboard"
WANDB_DIR = "wandb"
WANDB_RUN_ID = "wandb/run-id"
EVENTS = ("start", "precision", "metrics", "eval", "checkpoint", "diverged", "summary", "outcome")
_ATTEMPT_FILE = re.compile(r"^(debug|events)(?:\.attempt-(\d+))?\.(log|jsonl)$")


def rank_dir(run_dir, rank: int = 0) -> Path:
    return Path(run_dir) / "logs" / f"rank-{rank}"


def current_attempt(environ=None) -> int:
    """This job's attempt: Slurm's SLURM_RESTART_COUNT (0 on the first run, +1 a requeue; unset or empty: 0)."""
    return int((os.environ if environ is None else environ).get("SLURM_RESTART_COUNT", "0") or 0)


def log_name(attempt: int) -> str:
    return "debug.log" if attempt == 0 else f"debug.attempt-{attempt}.log"


def events_name(attempt: int) -> str:
    return "events.jsonl" if attempt == 0 else f"events.attempt-{attempt}.jsonl"


def attempt_of(path) -> int:
    """The attempt a rank log or event file belongs to (0 for debug.log / events.jsonl)."""
    m = _ATTEMPT_FILE.match(Path(path).name)
    return int(m.group(2)) if m and m.group(2) else 0


def attempt_files(run_dir, kind: str = "log", rank: int = 0) -> list[Path]:
    """The rank's human logs (kind 'log') or event files (kind 'jsonl'), attempt 0 first."""
    folder = rank_dir(run_dir, rank)
    if not folder.is_dir():
        return []
    found = [(attempt_of(p), p) for p in folder.iterdir()
             if (m := _ATTEMPT_FILE.match(p.name)) and m.group(3) == kind]
    return [p for _, p in sorted(found)]


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf: "nan", "inf"
    return value


def event_line(kind: str, **fields) -> str:
    if kind not in EVENTS:
        raise ValueError(f"unknown event {kind!r}; one of {', '.join(EVENTS)}")
    record = {"event": kind, "t": round(time.time(), 3), **{k: _clean(v) for k, v in fields.items()}}
    return json.dumps(record, sort_keys=False, default=str)


def number(value):
    """A metric of an event as a float ("nan"/"inf" included); None when absent or not a number."""
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def json_objects(text: str) -> list[dict]:
    """The JSON objects of JSON-lines text; a torn line (the writer was killed mid-line) or another value is
    skipped."""
    out = []
    for raw in text.splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


# an event's `t` is a POSIX time from 1970 up to the year 3000 (what datetime can show in any time zone)
LAST_TIME = 32503680000.0


def event_time(event: dict) -> float | None:
    """The event's `t` when it is a finite number in 0..LAST_TIME, else None (absent, or a corrupt line's)."""
    t = event.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= LAST_TIME:
        return None  # (NaN fails the comparison too)
    return float(t)


def parse_events(text: str) -> list[dict]:
    """The events of a stream's text; an event whose `t` is there but no time (event_time) is skipped, as a torn
    line is."""
    return [record for record in json_objects(text)
            if record.get("event") in EVENTS and ("t" not in record or event_time(record) is not None)]


def read_events(path, tail_bytes: int | None = None) -> list[dict]:
    with open(path, "rb") as fh:
        if tail_bytes is not None:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - tail_bytes))
        data = fh.read().decode("utf-8", "replace")
    return parse_events(data)
