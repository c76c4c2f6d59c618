"""Training progress of the newest attempt, for `status`: from the trainer's event stream
(primus_contract/run_files.py), or, for an entrypoint that writes only the human rank-0 log (docs/contract.md §3;
cluster.entrypoint, runs from before the stream), from that log's lines.

Only the tail of the newest attempt's file is read, so status over hundreds of runs stays cheap: TAIL_BYTES, or
more (doubled, up to MAX_TAIL_BYTES) while the tail holds no metrics event, whose `losses` grow with the log
interval (about 30 bytes an iteration: a log interval of 10,000 writes lines of ~300 KB).
"""
from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from primus_contract import run_files

TAIL_BYTES = 256 * 1024
MAX_TAIL_BYTES = 64 * 1024 * 1024
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (.*)$")


@dataclass
class Progress:
    log: str | None = None              # the file read
    attempt: int = 0                    # = restart count
    iteration: int | None = None
    train_iters: int | None = None
    lm_loss: float | None = None
    tokens_per_s_gpu: float | None = None
    tflops_gpu: float | None = None
    mem_peak_gib: float | None = None
    ms_per_iter: float | None = None
    eval_loss: float | None = None
    last_checkpoint: str | None = None
    diverged: bool = False
    finished: bool = False
    exit_code: int | None = None        # from `training finished | ... | exit N` (or an error line: 2 / 1)
    error: str | None = None            # the last `error |`, `config error |` or `resume refused |` line
    avg_tokens_per_s_gpu: float | None = None  # from `training summary` (the run's average, not the last window)
    last_event: str | None = None       # timestamp of the last line (local time, as logged)
    log_mtime: float | None = None

    @property
    def final_state(self) -> str | None:
        """COMPLETED / FAILED when the log says the trainer ended (a finish line or an error line), else None:
        the state of a job the scheduler no longer knows."""
        if not (self.finished or self.error is not None):
            return None
        return "COMPLETED" if self.finished and self.exit_code == 0 else "FAILED"

    @property
    def eta_s(self) -> float | None:
        if self.finished or None in (self.iteration, self.train_iters, self.ms_per_iter):
            return None
        return max(0, self.train_iters - self.iteration) * self.ms_per_iter / 1000.0

    def as_dict(self) -> dict:
        return {**asdict(self), "eta_s": self.eta_s}


attempt_of = run_files.attempt_of  # (the run directory's files are named in primus_contract/run_files.py)


def rank_logs(run_dir: Path, rank: int = 0) -> list[Path]:
    """The trainer logs of `rank`, attempt 0 first."""
    return run_files.attempt_files(run_dir, "log", rank)


def _fields(body: str) -> dict[str, str]:
    """`a 1 | b c 2` → {'a': '1', 'b c': '2'}: each field's last word is its value."""
    out = {}
    for part in body.split(" | "):
        key, _, value = part.strip().rpartition(" ")
        if key:
            out[key] = value
    return out


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


# Progress attribute = metrics event field -> the field's name in the `iteration ...` log line
METRICS = {"lm_loss": "lm loss", "tokens_per_s_gpu": "tokens/s/GPU", "tflops_gpu": "TFLOP/s/GPU",
           "mem_peak_gib": "mem peak GiB", "ms_per_iter": "ms/iter"}


def _set_metrics(progress: Progress, values: dict) -> None:
    for attr, value in values.items():
        setattr(progress, attr, value)
    if progress.lm_loss is not None and not math.isfinite(progress.lm_loss):
        progress.diverged = True


# the trainer's one-line failures (trainer/__main__.py) and their exit codes (docs/contract.md section 4)
ERROR_HEADS = {"error": 1, "config error": 2, "resume refused": 2}


def _int(text: str | None) -> int | None:
    return int(text) if text and text.lstrip("-").isdigit() else None


def line_event(body: str) -> dict | None:
    """The event a human log line stands for (an entrypoint that writes only the log), or None."""
    head = body.split(" | ", 1)[0]
    f = _fields(body)
    if head.startswith("iteration "):
        it, _, total = head.split(" ", 1)[1].partition("/")
        return {"event": "metrics", "iteration": _int(it), "train_iters": _int(total),
                **{attr: f.get(name) for attr, name in METRICS.items()}}
    if head.startswith("eval iteration"):
        return {"event": "eval", "eval_loss": f.get("eval loss")}
    if head == "checkpoint saved":
        return {"event": "checkpoint", "path": f.get("path")}
    if head == "diverged":
        return {"event": "diverged"}
    if head == "training finished":
        return {"event": "outcome", "status": head, "exit": _int(f.get("exit"))}
    if head.startswith("primus-trainer start"):
        return {"event": "start", "attempt": _int(f.get("attempt"))}
    if head == "training summary":
        return {"event": "summary", "tokens_per_s_gpu": f.get("tokens/s/GPU")}
    if head in ERROR_HEADS:
        return {"event": "outcome", "status": head, "exit": None, "message": body.partition(" | ")[2]}
    return None


def parse_lines(lines: list[str], progress: Progress) -> Progress:
    events = []
    for raw in lines:
        m = _STAMP.match(raw.rstrip("\n"))
        if m:
            stamp, body = m.groups()
            events.append({**(line_event(body) or {"event": None}), "stamp": stamp})
    return apply_events(events, progress)


def apply_events(events: list[dict], progress: Progress) -> Progress:
    """Progress from the event stream (run_files.EVENTS; `stamp`: the log line's time, as logged)."""
    num = run_files.number
    for e in events:
        kind = e["event"]
        if "stamp" in e:
            progress.last_event = e["stamp"]
        elif (t := run_files.event_time(e)) is not None:
            progress.last_event = _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
        if kind == "metrics":
            for key in ("iteration", "train_iters"):
                if isinstance(e.get(key), int):
                    setattr(progress, key, e[key])
            _set_metrics(progress, {attr: num(e.get(attr)) for attr in METRICS})
        elif kind == "eval":
            progress.eval_loss = num(e.get("eval_loss"))
        elif kind == "checkpoint":
            progress.last_checkpoint = e.get("path")
        elif kind == "diverged":
            progress.diverged = True
        elif kind == "start" and isinstance(e.get("attempt"), int):
            progress.attempt = e["attempt"]
        elif kind == "summary":
            progress.avg_tokens_per_s_gpu = num(e.get("tokens_per_s_gpu"))
        elif kind == "outcome":
            _outcome(progress, e)
    return progress


def _outcome(progress: Progress, e: dict) -> None:
    status, code = e.get("status"), e.get("exit")
    if status == "training finished":
        progress.finished, progress.exit_code = True, code if isinstance(code, int) else None
        return
    progress.error = f"{status} | {e.get('message', '')}"[:300]
    if progress.exit_code is None:
        progress.exit_code = code if isinstance(code, int) else ERROR_HEADS.get(status)


def _tail(path: Path, size: int = TAIL_BYTES) -> list[str]:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        end = fh.tell()
        fh.seek(max(0, end - size))
        data = fh.read()
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if end > size else lines  # the first line of a tail may be cut


def attempt_base(run_dir: Path) -> int:
    """The first attempt of the run's current job: `attempt-base` (written by `resume`), 0 without one, as the job
    script reads it."""
    try:
        text = (Path(run_dir) / run_files.ATTEMPT_BASE).read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def forget_verdicts(progress: Progress) -> Progress:
    """The progress of an attempt of the job before (the current one has not logged yet): where it got to, without
    its ending (diverged, finished, an error), which says nothing of the current job."""
    progress.diverged = progress.finished = False
    progress.error = progress.exit_code = None
    return progress


def stream_tail(path: Path) -> list[dict]:
    """The events of the stream's tail: TAIL_BYTES, doubled while it holds no metrics event (a line longer than
    the tail), up to the whole file or MAX_TAIL_BYTES."""
    size, window = path.stat().st_size, TAIL_BYTES
    while True:
        events = run_files.read_events(path, window)
        if window >= min(size, MAX_TAIL_BYTES) or any(e["event"] == "metrics" for e in events):
            return events
        window *= 2


def read_progress(run_dir: Path) -> Progress:
    """Progress of the newest attempt; the last checkpoint falls back to checkpoints/latest."""
    progress = Progress()
    logs = rank_logs(run_dir, 0)
    if logs:
        newest = logs[-1]
        progress.attempt = attempt_of(newest)
        progress.log = str(newest)
        progress.log_mtime = newest.stat().st_mtime
        events = newest.parent / run_files.events_name(progress.attempt)
        if events.is_file():
            apply_events(stream_tail(events), progress)
        else:
            parse_lines(_tail(newest), progress)
    latest = Path(run_dir) / run_files.LATEST
    if progress.last_checkpoint is None and latest.is_file():
        name = latest.read_text().strip()
        progress.last_checkpoint = f"checkpoints/{name}" if name else None
    return progress

