"""The job registry: one JSON object per line in `<state dir>/runs.jsonl`, guarded by an flock.

A line is appended per submit; a later line for the same run id updates it (last one wins), so the file
is only ever appended to and concurrent submits cannot lose each other's entries.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Iterator

from primus_slurm.errors import UserError

FILE_NAME = "runs.jsonl"


def state_dir() -> Path:
    """$PRIMUS_SLURM_STATE_DIR, else $XDG_STATE_HOME/primus-slurm, else ~/.local/state/primus-slurm."""
    if os.environ.get("PRIMUS_SLURM_STATE_DIR"):
        return Path(os.environ["PRIMUS_SLURM_STATE_DIR"]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "primus-slurm"


def registry_path() -> Path:
    return state_dir() / FILE_NAME


@contextlib.contextmanager
def _locked(path: Path, exclusive: bool) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def record(entry: dict) -> None:
    """Append (or update, by `run_id`) one run. `entry` must be JSON-serialisable and have `run_id`."""
    if not entry.get("run_id"):
        raise ValueError("registry entry needs a run_id")
    line = json.dumps(entry, sort_keys=True) + "\n"
    path = registry_path()
    with _locked(path, exclusive=True):
        with open(path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def check_writable() -> None:
    """Refuse before anything is submitted when the registry cannot be written (a job it does not record would
    run unseen, and be submitted again): opens it for appending, as record() will."""
    path = registry_path()
    try:
        with _locked(path, exclusive=False):
            with open(path, "a"):
                pass
    except OSError as exc:
        raise UserError(f"cannot write the run registry {path} ($PRIMUS_SLURM_STATE_DIR, else $XDG_STATE_HOME or "
                        f"~/.local/state): {exc.strerror or exc}; nothing submitted") from None


def entries() -> list[dict]:
    """All runs, oldest submit first, each the merge of its lines (later lines win)."""
    path = registry_path()
    if not path.exists():
        return []
    with _locked(path, exclusive=False):
        text = path.read_bytes().decode("utf-8", errors="replace")  # a bad byte spoils one line, not the list
    merged: dict[str, dict] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line from a crashed writer; the others still count
        if not isinstance(item, dict) or not isinstance(item.get("run_id"), str):
            continue  # not a run entry (edited by hand?): skip it like a torn line
        merged.setdefault(item["run_id"], {}).update(item)
    return list(merged.values())


def here() -> Path:
    """Where `status` and `list` look by default: the git checkout holding the current directory (its nearest
    ancestor with a `.git`), else the current directory."""
    try:
        cwd = Path(os.getcwd()).resolve()
    except OSError:  # the current directory was removed
        raise UserError("the current directory no longer exists: cd somewhere, or give --all") from None
    return next((d for d in (cwd, *cwd.parents) if (d / ".git").exists()), cwd)


def belongs(entry: dict, root: Path) -> bool:
    """Whether a run is `root`'s: it was submitted from `root` or below (`submit_dir`), or its run directory
    lies there (all a run recorded before `submit_dir` existed has)."""
    places = (entry.get("submit_dir"), entry.get("run_dir"))
    return any(isinstance(p, str) and Path(os.path.realpath(p)).is_relative_to(root) for p in places)


def scoped(everything: bool = False) -> tuple[list[dict], str]:
    """The runs a bare `status`/`list` shows (`here()`'s; every run with `everything`), and the one line that
    says how many it left out ("" when none)."""
    runs = entries()
    if everything:
        return runs, ""
    root = here()
    shown = [r for r in runs if belongs(r, root)]
    hidden = len(runs) - len(shown)
    if not hidden:
        return shown, ""
    return shown, (f"{hidden} run{'s' if hidden != 1 else ''} submitted outside {root} not shown "
                   f"(--all lists every run)")


def check_ref(ref: str, sweep: bool = False) -> None:
    """A RUN (`sweep`: or SWEEP) that names nothing is refused: an empty or blank one is a prefix of every run id
    (`RUN=""; primus-slurm cancel "$RUN"` cancelled the only run there was)."""
    if not ref.strip():
        what = "a run id, job id, run directory or sweep id" if sweep else "a run id, job id or run directory"
        raise UserError(f"RUN is empty; give {what}")


def find(ref: str) -> dict:
    """The run named by `ref`: a run id, a unique run-id prefix, a job id, or a run directory path."""
    check_ref(ref)
    runs = entries()
    for key in ("run_id", "job_id"):
        hits = [r for r in runs if str(r.get(key)) == ref]
        if hits:
            return hits[-1]
    hits = [r for r in runs if ref in (str(j) for j in r.get("jobs") or ())]  # a job before a `resume`
    if hits:
        return hits[-1]
    as_path = os.path.abspath(os.path.expanduser(ref))
    hits = [r for r in runs if r.get("run_dir") == as_path]
    if hits:
        return hits[-1]
    hits = [r for r in runs if r["run_id"].startswith(ref)]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise UserError(f"RUN '{ref}' matches {len(hits)} runs; give more of the run id")
    unrecorded = _from_run_dir(as_path) if os.path.isdir(as_path) else None
    if unrecorded:
        return unrecorded
    raise UserError(f"RUN '{ref}' is not a known run id, job id or run directory (see `primus-slurm list --all`)")


def _from_run_dir(run_dir: str) -> dict | None:
    """A run directory the registry does not list (another state dir, a lost registry): its own run.json."""
    try:
        with open(os.path.join(run_dir, "run.json")) as fh:
            info = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("run_id"), str) or not info.get("job_id"):
        return None
    return {**{k: info.get(k) for k in ("run_id", "name", "executor", "job_id", "submit_time")}, "run_dir": run_dir}
