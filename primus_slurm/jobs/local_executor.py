"""The local executor: the script runs with bash in a session of its own on this machine; its state is read from
the run directory (an exit-code file the wrapper writes, a cancel marker) and the live process."""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

import click

from primus_slurm.errors import UserError
from primus_slurm.jobs.executor_base import STOPPING, TERMINAL, Executor
from primus_slurm.jobs.runs import read_run_json

SHARING_ENV = "PRIMUS_LOCAL_SHARING"  # read by templates/job.sh.j2 (a local job's part of the CPUs)
LOCAL_OUT = "logs/local.out"        # stdout/stderr of a local job (the analogue of slurm-<jobid>.out)
LOCAL_EXIT = "exit_code"            # written by the local wrapper when the script ends
LOCAL_CANCELLED = "cancelled"       # written by `cancel` before it signals the process group
QUEUE_LOCK = ".queue.lock"          # a queued run (a local sweep's): its start and a cancel, one at a time

# >>: a resumed run appends; the trap: `cancel` TERMs this wrapper too, which must live to record the script's code
_WRAPPER = 'trap : TERM INT; bash "$1" >>"$2" 2>&1; rc=$?; echo $rc >"$3.tmp"; mv "$3.tmp" "$3"'


def _stat(pid) -> list | None:
    """/proc/<pid>/stat fields after the command name (state, ppid, pgrp, ...), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def proc_start_ticks(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, to tell it apart from a later process with the same pid."""
    fields = _stat(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


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
    return [pid for pid, start in tree.items() if proc_start_ticks(pid) == start]


def _signal_all(tree: dict, sig) -> None:
    for pid in _alive(tree):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def queue_lock(run_dir: Path):
    """Held while a local sweep's queue starts this run, and while `cancel` decides whether it has started."""
    with open(Path(run_dir) / QUEUE_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _alive_pid(pid, start) -> bool:
    return bool(pid) and proc_start_ticks(pid) is not None and proc_start_ticks(pid) == start


def _mark_cancelled(run_dir: Path) -> None:
    (run_dir / LOCAL_CANCELLED).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class LocalExecutor(Executor):
    name = "local"
    runs_here = True
    sbatch = False
    post_output = "job.out"
    cancel_grace_s = 30.0  # TERM, then KILL what is left after this long

    def container_unused(self, runtime: str) -> bool:
        """A pyxis image: pyxis is srun's plugin, so the local job runs on the host."""
        return runtime == "pyxis"

    def submit(self, run_dir: Path, sharing: int = 1) -> dict:
        """{'job_id', 'pid', 'pid_start'} of the detached wrapper around `<run_dir>/job.sbatch`. `sharing`: how many
        runs the local queue runs at once on this machine (the job script gives each its part of the CPUs,
        PRIMUS_LOCAL_SHARING)."""
        env = {**os.environ, SHARING_ENV: str(sharing)} if sharing > 1 else None
        proc = subprocess.Popen(
            ["bash", "-c", _WRAPPER, "primus-local", str(run_dir / "job.sbatch"),
             str(run_dir / LOCAL_OUT), str(run_dir / LOCAL_EXIT)],
            cwd=run_dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, env=env)
        return {"job_id": f"local-{proc.pid}", "pid": proc.pid, "pid_start": proc_start_ticks(proc.pid)}

    def resubmit(self, run_dir: Path) -> dict:
        return {**self.requeue(run_dir), **self.submit(run_dir)}

    @staticmethod
    def requeue(run_dir: Path) -> dict:
        """A resumed run made ready to start again (now, or by a local queue): the previous job's end markers
        removed; its run.json fields until it starts (no process yet)."""
        for name in (LOCAL_EXIT, LOCAL_CANCELLED):
            (run_dir / name).unlink(missing_ok=True)
        out = run_dir / LOCAL_OUT  # the new job appends to it: `logs --stdout -f` starts here
        return {"stdout_offset": out.stat().st_size if out.exists() else 0, "pid": None, "pid_start": None}

    def state(self, run_dir: Path, info: dict) -> dict:
        """From the run dir: exit_code file, cancel marker, or the live process group."""
        run_dir = Path(run_dir)
        if not run_dir.is_dir():  # its state lived there (status and cancel alike)
            return {"state": "UNKNOWN", "exit_code": None, "source": "local",
                    "reason": f"run directory {run_dir} no longer exists"}
        exit_file = run_dir / LOCAL_EXIT
        pid = info.get("pid")
        if not pid and info.get("queue_pid"):  # a local sweep's trial its queue has not started yet
            return self._queued(run_dir, info)
        alive = _alive_pid(pid, info.get("pid_start"))
        if (run_dir / LOCAL_CANCELLED).exists():  # STOPPING while the cancelled script still runs (a checkpoint)
            code = _read_int(exit_file)
            state = STOPPING if code is None and alive else "CANCELLED"
            return {"state": state, "exit_code": code, "nodes": "localhost", "source": "local"}
        if exit_file.exists():
            code = _read_int(exit_file)
            return {"state": "COMPLETED" if code == 0 else "FAILED", "exit_code": code,
                    "nodes": "localhost", "source": "local"}
        if alive:
            return {"state": "RUNNING", "exit_code": None, "nodes": "localhost", "source": "local"}
        return {"state": "FAILED", "exit_code": None, "nodes": "localhost", "source": "local",
                "reason": "process gone without an exit code (killed?)"}

    @staticmethod
    def _queued(run_dir: Path, info: dict) -> dict:
        row = {"state": "PENDING", "exit_code": None, "nodes": None, "source": "local"}
        if (run_dir / LOCAL_CANCELLED).exists():
            row["state"] = "CANCELLED"
        elif not _alive_pid(info["queue_pid"], info.get("queue_pid_start")):
            row.update(state="CANCELLED", reason="the sweep's local queue ended before it started this trial")
        return row

    def states(self, runs: list[tuple[Path, dict]]) -> list[dict | None]:
        return [self.state(run_dir, info) for run_dir, info in runs]

    def busy(self, run_dir: Path, info: dict, state: dict) -> str | None:
        return state.get("state") if state.get("state") not in TERMINAL else None

    def cancel(self, run_dir: Path, info: dict) -> None:
        """Mark the run cancelled, TERM its processes, KILL what is left after `cancel_grace_s`.

        "Its processes" is the launcher's process tree, taken before anything is signalled: torchrun starts each
        worker in a session of its own, so a worker is not in the launcher's process group, and one that cannot
        act on TERM in time (stopped, or in a long save) would outlive a group kill and keep writing into the
        run."""
        run_dir = Path(run_dir)
        info = {**info, **read_run_json(run_dir)}
        queued = info.get("queue_pid") is not None  # a local sweep's or pipeline's run: its queue may start it now
        with queue_lock(run_dir) if queued else contextlib.nullcontext():
            info = {**info, **read_run_json(run_dir)}
            state = self.state(run_dir, info)["state"]
            if state == "PENDING":  # marked, so its queue never starts it
                _mark_cancelled(run_dir)
        if state != "RUNNING":
            return
        tree = _process_tree(info.get("pid"))
        _mark_cancelled(run_dir)
        _signal_all(tree, signal.SIGTERM)
        deadline = time.monotonic() + self.cancel_grace_s
        while time.monotonic() < deadline:
            if not _alive(tree):
                return
            time.sleep(0.1)
        _signal_all(tree, signal.SIGKILL)
        # a KILL takes effect when the process next runs (later on a loaded machine, CI 2026-12-06): return once the
        # processes are gone, so that a `resume` right after cannot run beside them
        deadline = time.monotonic() + 10.0
        while _alive(tree) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stdout_path(self, run_dir: Path, info: dict) -> Path:
        return run_dir / LOCAL_OUT

    def run_post(self, job_dir: Path, out, submitted) -> tuple[str, int]:
        """In the foreground: the job is this process's child and ends with the command (Ctrl-C)."""
        with open(job_dir / self.post_output, "w") as log:
            proc = subprocess.Popen(["bash", str(job_dir / "job.sh")], cwd=job_dir, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
            try:
                for line in proc.stdout:
                    log.write(line)
                    log.flush()
                    out.write(line)
                    out.flush()
                return "local", proc.wait()
            except KeyboardInterrupt:
                proc.terminate()
                proc.wait()
                raise click.Abort() from None

    def run_check(self, run_dir: Path, timeout: float, submitted) -> tuple[int, str]:
        path = run_dir / "logs" / "preflight.out"
        with open(path, "wb") as fh:
            proc = subprocess.Popen(["bash", str(run_dir / "job.sbatch")], cwd=run_dir, stdin=subprocess.DEVNULL,
                                    stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)  # the job script passes it on; containers are reaped
                proc.wait()
                raise UserError(f"the preflight did not finish within {timeout:.0f} s; see {path}") from None
        return rc, path.read_text(errors="replace")
