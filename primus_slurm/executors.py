"""Where a rendered script runs: `slurm` (sbatch through submitit) or `local` (a detached process group).

Both take the exact script text and return a job id; both answer state queries and cancel. Nothing here
knows about recipes: the caller renders, this module only runs and watches.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import submitit

from .errors import UserError
from .render import concrete_executor

LOCAL_OUT = "logs/local.out"        # stdout/stderr of a local job (the analogue of slurm-<jobid>.out)
LOCAL_EXIT = "exit_code"            # written by the local wrapper when the script ends
LOCAL_CANCELLED = "cancelled"       # written by `cancel` before it signals the process group


def resolve_executor(name: str) -> str:
    """`auto` → slurm when `sbatch` is on PATH, else local."""
    name = concrete_executor(name)
    if name not in ("slurm", "local"):
        raise UserError(f"cluster.executor must be one of auto, slurm, local (got '{name}')")
    if name == "slurm" and not shutil.which("sbatch"):
        raise UserError("cluster.executor is 'slurm' but `sbatch` is not on PATH; use --executor local")
    return name


# ---------------------------------------------------------------- slurm (submitit)

class _RawScriptExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor, but the sbatch file is our rendered script, byte for byte."""

    def __init__(self, folder: Path, script: str):
        super().__init__(folder)
        self._script = script

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script

    def _num_tasks(self) -> int:
        return 1  # one batch script; torchrun inside it starts the ranks


def submit_slurm(script: str, run_dir: Path) -> tuple[str, Path]:
    """sbatch `script` via submitit; returns (job id, path of the file submitit handed to sbatch)."""
    folder = run_dir / ".submitit"
    folder.mkdir(parents=True, exist_ok=True)
    executor = _RawScriptExecutor(folder, script)
    try:
        # submitit's own path from text to sbatch to job id; it echoes sbatch's stderr on failure, which
        # we fold into our one error line instead
        with contextlib.redirect_stderr(io.StringIO()):
            job = executor._submit_command("primus-slurm")
    except (subprocess.CalledProcessError, submitit.core.utils.FailedJobError,
            submitit.core.utils.FailedSubmissionError) as exc:
        detail = " ".join(str(getattr(exc, "stderr", "") or exc).split())
        raise UserError(f"sbatch rejected the job: {detail}") from None
    return str(job.job_id), Path(job.paths.submission_file)


def cancel_slurm(job_id: str) -> None:
    out = subprocess.run(["scancel", str(job_id)], capture_output=True, text=True)
    if out.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {' '.join(out.stderr.split())}")


def _exit_code(text: str) -> int | None:
    """sacct's `3:0` → 3; `0:15` (killed by signal 15) → 128+15."""
    try:
        code, sig = (int(x) for x in text.split(":"))
    except ValueError:
        return None
    return 128 + sig if sig and not code else code


_ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}


def slurm_states(job_ids: list[str], runner=subprocess.run) -> dict[str, dict]:
    """State of many jobs in ONE sacct call (allocations only).

    squeue is asked (once, for all of them) only about jobs sacct does not know (every job when accounting is
    off, or a job slurmdbd has not recorded yet) or reports as still active: slurmdbd lags the controller, so
    a job that has started can still read PENDING there. Returns {job_id: {'state', 'exit_code', 'nodes',
    'source'}}; jobs neither tool knows are absent.
    """
    wanted = sorted(set(map(str, job_ids)))
    if not wanted:
        return {}
    states: dict[str, dict] = {}
    out = runner(["sacct", "--parsable2", "--noheader", "-X", "-j", ",".join(wanted),
                  "-o", "JobIDRaw,State,ExitCode,NodeList"], capture_output=True, text=True)
    if out.returncode == 0:
        for line in out.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 4 and parts[0] in wanted:
                state, code = parts[1].split()[0] if parts[1] else "UNKNOWN", _exit_code(parts[2])
                if state == "CANCELLED" and code == 0:  # sacct's 0:0 for a cancelled allocation is no exit code
                    code = None
                states[parts[0]] = {"state": state, "exit_code": code, "nodes": parts[3], "source": "sacct"}
    missing = {j for j in wanted if states.get(j, {}).get("state") in (None, *_ACTIVE)}
    if not missing:
        return states
    out = runner(["squeue", "--noheader", "--states=all", "-o", "%i|%T|%N"], capture_output=True, text=True)
    if out.returncode == 0:
        for line in out.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 3 or parts[0] not in missing:
                continue
            # A job sacct knows as active: take the controller's word only while it is active too. An end state
            # waits for sacct (a moment later), which also has the exit code squeue lacks.
            if parts[0] in states and parts[1] not in _ACTIVE:
                continue
            states[parts[0]] = {"state": parts[1], "exit_code": None, "nodes": parts[2], "source": "squeue"}
    return states


def slurm_listed(job_id: str, runner=subprocess.run) -> str | None:
    """The controller's state of a job it still lists (PENDING, RUNNING, COMPLETING, ...), else None: a job
    squeue no longer shows has no process left, whatever accounting says or lacks."""
    out = runner(["squeue", "--noheader", "--states=all", "-j", str(job_id), "-o", "%T"], capture_output=True,
                 text=True)
    state = out.stdout.strip().split("\n")[0].strip() if out.returncode == 0 else ""
    return state if state and state not in TERMINAL else None


# ---------------------------------------------------------------- local (setsid bash)

_WRAPPER = 'bash "$1" >>"$2" 2>&1; rc=$?; echo $rc >"$3.tmp"; mv "$3.tmp" "$3"'  # >>: a resumed run appends


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, to tell it apart from a later process with the same pid."""
    fields = _stat(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def submit_local(run_dir: Path) -> dict:
    """Run `<run_dir>/job.sbatch` with bash in a new session; returns {'job_id', 'pid', 'pid_start'}."""
    proc = subprocess.Popen(
        ["bash", "-c", _WRAPPER, "primus-local", str(run_dir / "job.sbatch"),
         str(run_dir / LOCAL_OUT), str(run_dir / LOCAL_EXIT)],
        cwd=run_dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)
    return {"job_id": f"local-{proc.pid}", "pid": proc.pid, "pid_start": _proc_start_ticks(proc.pid)}


def local_state(run_dir: Path, info: dict) -> dict:
    """State of a local job from its run dir: exit_code file, cancel marker, or the live process group."""
    run_dir = Path(run_dir)
    exit_file = run_dir / LOCAL_EXIT
    if (run_dir / LOCAL_CANCELLED).exists():
        code = _read_int(exit_file)
        return {"state": "CANCELLED", "exit_code": code, "nodes": "localhost", "source": "local"}
    if exit_file.exists():
        code = _read_int(exit_file)
        return {"state": "COMPLETED" if code == 0 else "FAILED", "exit_code": code,
                "nodes": "localhost", "source": "local"}
    pid = info.get("pid")
    if pid and _proc_start_ticks(pid) is not None and _proc_start_ticks(pid) == info.get("pid_start"):
        return {"state": "RUNNING", "exit_code": None, "nodes": "localhost", "source": "local"}
    return {"state": "FAILED", "exit_code": None, "nodes": "localhost", "source": "local",
            "reason": "process gone without an exit code (killed?)"}


def cancel_local(run_dir: Path, info: dict, grace_s: float = 30.0) -> None:
    """Mark the run cancelled, TERM its processes, KILL what is left after `grace_s`.

    "Its processes" is the launcher's process tree, taken before anything is signalled: torchrun starts each
    worker in a session of its own, so a worker is not in the launcher's process group, and one that cannot act
    on TERM in time (stopped, or in a long save) would outlive a group kill and keep writing into the run."""
    run_dir = Path(run_dir)
    pid = info.get("pid")
    if local_state(run_dir, info)["state"] != "RUNNING":
        return
    tree = _process_tree(pid)
    (run_dir / LOCAL_CANCELLED).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
    _signal_all(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _alive(tree):
            return
        time.sleep(0.1)
    _signal_all(tree, signal.SIGKILL)


def _stat(pid) -> list | None:
    """/proc/<pid>/stat fields after the command name (state, ppid, pgrp, ...), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _process_tree(root: int) -> dict:
    """{pid: start ticks} of `root` and all its live descendants (one pass over /proc)."""
    children, starts = {}, {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry))
            starts[int(entry)] = int(fields[19])
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in starts and pid not in tree:
            tree[pid] = starts[pid]
            todo.extend(children.get(pid, ()))
    return tree


def _alive(tree: dict) -> list:
    """The processes of `tree` still running (same pid and start time: not a later process reusing the pid)."""
    return [pid for pid, start in tree.items() if _proc_start_ticks(pid) == start]


def _signal_all(tree: dict, sig) -> None:
    for pid in _alive(tree):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
