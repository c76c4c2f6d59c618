"""Training progress from the rank-0 trainer log (docs/contract.md §3), for `status`.

Only the tail of the newest attempt's log is read, so status over hundreds of runs stays cheap.
"""
from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

TAIL_BYTES = 256 * 1024
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (.*)$")
_ATTEMPT_FILE = re.compile(r"^debug\.attempt-(\d+)\.log$")


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


def attempt_of(log: Path) -> int:
    """The attempt a trainer log belongs to: 0 for debug.log, N for debug.attempt-N.log."""
    m = _ATTEMPT_FILE.match(Path(log).name)
    return int(m.group(1)) if m else 0


def rank_logs(run_dir: Path, rank: int = 0) -> list[Path]:
    """The trainer logs of `rank`, attempt 0 first."""
    folder = Path(run_dir) / "logs" / f"rank-{rank}"
    found = []
    if (folder / "debug.log").exists():
        found.append((0, folder / "debug.log"))
    if folder.is_dir():
        for p in folder.iterdir():
            m = _ATTEMPT_FILE.match(p.name)
            if m:
                found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


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


# the trainer's one-line failures (trainer/__main__.py) and their exit codes (docs/contract.md section 4)
ERROR_HEADS = {"error": 1, "config error": 2, "resume refused": 2}


def parse_lines(lines: list[str], progress: Progress) -> Progress:
    for raw in lines:
        m = _STAMP.match(raw.rstrip("\n"))
        if not m:
            continue
        stamp, body = m.groups()
        progress.last_event = stamp
        head = body.split(" | ", 1)[0]
        f = _fields(body)
        if head.startswith("iteration "):
            it, _, total = head.split(" ", 1)[1].partition("/")
            progress.iteration = int(it) if it.isdigit() else progress.iteration
            progress.train_iters = int(total) if total.isdigit() else progress.train_iters
            progress.lm_loss = _num(f.get("lm loss"))
            progress.tokens_per_s_gpu = _num(f.get("tokens/s/GPU"))
            progress.tflops_gpu = _num(f.get("TFLOP/s/GPU"))
            progress.mem_peak_gib = _num(f.get("mem peak GiB"))
            progress.ms_per_iter = _num(f.get("ms/iter"))
            if progress.lm_loss is not None and not math.isfinite(progress.lm_loss):
                progress.diverged = True
        elif head.startswith("eval iteration"):
            progress.eval_loss = _num(f.get("eval loss"))
        elif head == "checkpoint saved":
            progress.last_checkpoint = f.get("path")
        elif head == "diverged":
            progress.diverged = True
        elif head == "training finished":
            progress.finished = True
            code = f.get("exit")
            progress.exit_code = int(code) if code and code.lstrip("-").isdigit() else None
        elif head.startswith("primus-trainer start"):
            progress.attempt = int(f.get("attempt", progress.attempt))
        elif head == "training summary":
            progress.avg_tokens_per_s_gpu = _num(f.get("tokens/s/GPU"))
        elif head in ERROR_HEADS:
            progress.error = body[:300]
            if progress.exit_code is None:
                progress.exit_code = ERROR_HEADS[head]
    return progress


def _tail(path: Path, size: int = TAIL_BYTES) -> list[str]:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        end = fh.tell()
        fh.seek(max(0, end - size))
        data = fh.read()
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if end > size else lines  # the first line of a tail may be cut


def read_progress(run_dir: Path) -> Progress:
    """Progress of the newest attempt; the last checkpoint falls back to checkpoints/latest."""
    progress = Progress()
    logs = rank_logs(run_dir, 0)
    if logs:
        newest = logs[-1]
        m = _ATTEMPT_FILE.match(newest.name)
        progress.attempt = int(m.group(1)) if m else 0
        progress.log = str(newest)
        progress.log_mtime = newest.stat().st_mtime
        parse_lines(_tail(newest), progress)
    latest = Path(run_dir) / "checkpoints" / "latest"
    if progress.last_checkpoint is None and latest.is_file():
        name = latest.read_text().strip()
        progress.last_checkpoint = f"checkpoints/{name}" if name else None
    return progress


def seconds_since(timestamp: float | None, now: float | None = None) -> float | None:
    if timestamp is None:
        return None
    now = now if now is not None else _dt.datetime.now().timestamp()
    return max(0.0, now - timestamp)
