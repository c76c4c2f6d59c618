"""`logs`: print or follow a run's trainer log (or its job stdout) until the job ends."""
from __future__ import annotations

import codecs
import re
import sys
import time
from pathlib import Path

from primus_slurm.jobs import runs
from primus_slurm.errors import UserError
from primus_slurm.jobs.executor_base import TERMINAL
from primus_slurm.jobs.executors import executor_for
from primus_slurm.jobs.progress import attempt_of, rank_logs, read_progress
from primus_slurm.jobs.status import derive_state

POLL_S = 0.5


def pick_log(run_dir: Path, info: dict, stdout: bool, min_attempt: int = 0) -> Path | None:
    """--stdout: the job's stdout; else the newest attempt (>= min_attempt) of the rank-0 trainer log (None until
    it exists)."""
    if stdout:
        return executor_for(info.get("executor")).stdout_path(run_dir, info)
    found = [p for p in rank_logs(run_dir) if attempt_of(p) >= min_attempt]
    return found[-1] if found else None


def show(entry: dict, stdout: bool, attempt: int | None = None, out=sys.stdout) -> None:
    run_dir = Path(entry["run_dir"])
    info = {**entry, **runs.read_run_json(run_dir)}
    run_id = entry["run_id"]
    if attempt is not None:
        logs = {attempt_of(p): p for p in rank_logs(run_dir)}
        if attempt not in logs:
            have = ", ".join(str(k) for k in sorted(logs)) or "none yet"
            raise UserError(f"run {run_id} has no trainer log of attempt {attempt} (attempts: {have})")
        path = logs[attempt]
    else:
        path = pick_log(run_dir, info, stdout)
    if path is None or not path.exists():
        what = "job stdout" if stdout else "rank 0 trainer log"
        if not run_dir.is_dir():
            raise UserError(f"run {run_id}'s run directory {run_dir} no longer exists")
        state = executor_for(info.get("executor")).state(run_dir, info).get("state")
        if state in TERMINAL:
            hint = "" if stdout else f"; its job stdout: `primus-slurm logs {run_id} --stdout`"
            raise UserError(f"run {run_id} ended ({state}) without a {what}{hint}")
        raise UserError(f"run {run_id} has no {what} yet (try `logs {run_id} -f`"
                        f"{'' if stdout else ' or --stdout'})")
    out.write(path.read_text(errors="replace"))
    out.flush()


ARG_LINE = re.compile(r"^\[[^\]]*\] arg ")


class _Printer:
    """Writes a followed log: bytes decoded incrementally (a character split across reads stays whole); for a
    trainer log, line by line with the resolved-settings (`arg …`) lines folded into one note per file."""

    def __init__(self, out, fold_args: bool):
        self.out, self.fold_args = out, fold_args
        self.decoder, self.partial, self.args = codecs.getincrementaldecoder("utf-8")("replace"), "", 0

    def write(self, data: bytes, path: Path) -> None:
        text = self.decoder.decode(data)
        if not self.fold_args:
            self.out.write(text)
            self.out.flush()
            return
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
        """End of a file: what is left, then a fresh decoder and note for the next one."""
        rest = self.partial + self.decoder.decode(b"", final=True)
        if rest:
            self.out.write(rest + ("\n" if self.fold_args else ""))
            self.out.flush()
        self.decoder, self.partial, self.args = codecs.getincrementaldecoder("utf-8")("replace"), "", 0


def _read_from(path: Path, offset: int) -> bytes:
    if not path.exists():
        return b""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read()


def follow(entry: dict, stdout: bool = False, out=sys.stdout, err=sys.stderr, min_attempt: int = 0) -> int:
    """Stream the log as it grows (switching to a newer attempt's file) until the job ends; min_attempt skips
    earlier attempts' logs (a resumed run's).

    Returns the job's exit code (1 when it ended badly without one); Ctrl-C stops following, not the job (130)."""
    run_dir = Path(entry["run_dir"])
    info = {**entry, **runs.read_run_json(run_dir)}
    executor = executor_for(info.get("executor"))
    current, offset, state = None, 0, {"state": "PENDING"}
    printer = _Printer(out, fold_args=not stdout)
    start = int(info.get("stdout_offset") or 0) if stdout else 0  # a resumed local job appends to its stdout
    try:
        while True:
            ended = state.get("state") in TERMINAL
            path = pick_log(run_dir, info, stdout, min_attempt)
            if path is not None and path != current:
                if current is not None:  # the old attempt's last lines first
                    printer.write(_read_from(current, offset), current)
                printer.close()
                current, offset = path, start
            if current is not None:
                data = _read_from(current, offset)
                if data:
                    offset += len(data)
                    printer.write(data, current)
            if ended:
                break
            time.sleep(POLL_S)
            state = executor.state(run_dir, info)
            if state.get("state") == "UNKNOWN":  # scheduler forgot the job (no accounting): ask the trainer log
                progress = read_progress(run_dir)
                if progress.final_state:
                    state = {"state": progress.final_state, "exit_code": progress.exit_code}
    except KeyboardInterrupt:
        printer.close()
        run_id = entry["run_id"]
        err.write(f"\nprimus-slurm: stopped following; run {run_id} keeps running. Re-attach: "
                  f"primus-slurm logs {run_id} -f; stop it: primus-slurm cancel {run_id}\n")
        return 130
    printer.close()
    if current is None and not stdout:  # the trainer never started: show why
        tail = executor.stdout_path(run_dir, info)
        if tail.exists():
            err.write("".join(tail.read_text(errors="replace").splitlines(True)[-40:]))
    code = state.get("exit_code")
    shown = derive_state(state, read_progress(run_dir), None, 0)  # the state `status` shows (DIVERGED)
    if shown == "COMPLETED":
        return code or 0
    err.write(f"primus-slurm: run {entry['run_id']} ended {shown}"
              f"{'' if code is None else f' (exit {code})'}\n")
    return code if code else 1
