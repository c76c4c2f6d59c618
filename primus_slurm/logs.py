"""`logs`: print or follow a run's trainer log (or its job stdout) until the job ends."""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from . import executors, runs
from .errors import UserError
from .progress import rank_logs, read_progress
from .status import TERMINAL

POLL_S = 0.5


def job_stdout(run_dir: Path, info: dict) -> Path:
    if info.get("executor") == "local":
        return run_dir / executors.LOCAL_OUT
    return run_dir / "logs" / f"slurm-{info.get('job_id')}.out"


def scheduler_state(run_dir: Path, info: dict) -> dict:
    if info.get("executor") == "local":
        return executors.local_state(run_dir, info)
    return executors.slurm_states([str(info["job_id"])]).get(str(info["job_id"]), {"state": "UNKNOWN"})


def pick_log(run_dir: Path, info: dict, rank: int | None, stdout: bool) -> Path | None:
    """--stdout: the job's stdout; else the newest attempt of rank N's trainer log (None until it exists)."""
    if stdout:
        return job_stdout(run_dir, info)
    found = rank_logs(run_dir, rank or 0)
    return found[-1] if found else None


def show(entry: dict, rank: int | None, stdout: bool, out=sys.stdout) -> None:
    run_dir = Path(entry["run_dir"])
    info = {**entry, **runs.read_run_json(run_dir)}
    path = pick_log(run_dir, info, rank, stdout)
    if path is None or not path.exists():
        run_id = entry["run_id"]
        what = "job stdout" if stdout else f"rank {rank or 0} trainer log"
        if not run_dir.is_dir():
            raise UserError(f"run {run_id}'s run directory {run_dir} no longer exists")
        state = scheduler_state(run_dir, info).get("state")
        if state in TERMINAL:
            hint = "" if stdout else f"; its job stdout: `primus-slurm logs {run_id} --stdout`"
            raise UserError(f"run {run_id} ended ({state}) without a {what}{hint}")
        raise UserError(f"run {run_id} has no {what} yet (try `logs {run_id} -f`"
                        f"{'' if stdout else ' or --stdout'})")
    out.write(path.read_text(errors="replace"))
    out.flush()


ARG_LINE = re.compile(r"^\[[^\]]*\] arg ")


class _Printer:
    """Writes a followed trainer log line by line, the resolved-settings (`arg …`) lines folded into one note."""

    def __init__(self, out, run_dir: Path):
        self.out, self.run_dir, self.partial, self.args = out, run_dir, "", 0

    def write(self, text: str, path: Path) -> None:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        shown = []
        for line in lines:
            if ARG_LINE.match(line):
                if not self.args:
                    shown.append(f"(the resolved settings, `arg …` lines, are in {path}; not shown here)")
                self.args += 1
                continue
            shown.append(line)
        if shown:
            self.out.write("\n".join(shown) + "\n")
            self.out.flush()

    def close(self) -> None:
        if self.partial:
            self.out.write(self.partial + "\n")
            self.out.flush()
            self.partial = ""


def follow(entry: dict, rank: int | None = None, stdout: bool = False, out=sys.stdout,
           err=sys.stderr) -> int:
    """Stream the log as it grows (switching to a newer attempt's file) until the job ends.

    Returns the job's exit code (1 when it ended badly without one); Ctrl-C stops following, not the job (130)."""
    run_dir = Path(entry["run_dir"])
    info = {**entry, **runs.read_run_json(run_dir)}
    current, offset, state = None, 0, {"state": "PENDING"}
    printer = _Printer(out, run_dir)
    try:
        while True:
            ended = state.get("state") in TERMINAL
            path = pick_log(run_dir, info, rank, stdout)
            if path is not None and path != current:
                printer.close()
                current, offset = path, 0
            if current is not None and current.exists():
                with open(current, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
                if data:
                    offset += len(data)
                    text = data.decode("utf-8", "replace")
                    if stdout:
                        out.write(text)
                        out.flush()
                    else:
                        printer.write(text, current)
            if ended:
                break
            time.sleep(POLL_S)
            state = scheduler_state(run_dir, info)
            if state.get("state") == "UNKNOWN":  # scheduler forgot the job (no accounting): ask the trainer log
                progress = read_progress(run_dir)
                if progress.finished:
                    state = {"state": "COMPLETED" if progress.exit_code == 0 else "FAILED",
                             "exit_code": progress.exit_code}
    except KeyboardInterrupt:
        printer.close()
        run_id = entry["run_id"]
        err.write(f"\nprimus-slurm: stopped following; run {run_id} keeps running. Re-attach: "
                  f"primus-slurm logs {run_id} -f; stop it: primus-slurm cancel {run_id}\n")
        return 130
    printer.close()
    if current is None and not stdout:  # the trainer never started: show why
        tail = job_stdout(run_dir, info)
        if tail.exists():
            err.write("".join(tail.read_text(errors="replace").splitlines(True)[-40:]))
    code = state.get("exit_code")
    if state["state"] == "COMPLETED":
        return code or 0
    err.write(f"primus-slurm: run {entry['run_id']} ended {state['state']}"
              f"{'' if code is None else f' (exit {code})'}\n")
    return code if code else 1
