"""The Slurm executor: sbatch through submitit (the file sbatch gets is our rendered script, byte for byte),
states from sacct (squeue where accounting lags or is off), scancel."""
from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import time
from pathlib import Path

import click
import submitit
import yaml

from primus_contract import run_files

from primus_slurm.errors import UserError
from primus_slurm.jobs.executor_base import ACTIVE, STOPPING, TERMINAL, Executor, NothingToCancel
from primus_slurm.nodes import ledger as nodes_ledger

POLL_S = 1.0  # a post job's output and state, polled


class _RawScriptExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor, but the sbatch file is our rendered script, byte for byte."""

    def __init__(self, folder: Path, script: str, args: list[str] = ()):
        super().__init__(folder)
        self._script, self._args = script, list(args)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["sbatch", *self._args, str(submission_file_path)]  # command-line options beat the script's

    def _num_tasks(self) -> int:
        return 1  # one batch script; torchrun inside it starts the ranks


def submit_script(script: str, run_dir: Path, args: list[str] = ()) -> tuple[str, Path]:
    """sbatch `script` via submitit (`args`: sbatch options before it); returns (job id, path of the file
    submitit handed to sbatch)."""
    folder = run_dir / ".submitit"
    folder.mkdir(parents=True, exist_ok=True)
    executor = _RawScriptExecutor(folder, script, args)
    excluded = nodes_ledger.excluded_in(script, list(args))
    if excluded:
        nodes_ledger.announce(excluded)
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


def cancel_jobs(job_ids: list[str]) -> None:
    """scancel by id: the jobs a submission that failed part-way had queued (each held, or behind one that is)."""
    if job_ids:
        subprocess.run(["scancel", *map(str, job_ids)], capture_output=True, text=True)


def release_jobs(job_ids: list[str]) -> None:
    """`scontrol release` of jobs submitted held (sbatch --hold), once everything behind them is queued."""
    if job_ids:
        ids = ",".join(map(str, job_ids))
        out = subprocess.run(["scontrol", "release", ids], capture_output=True, text=True)
        if out.returncode != 0:
            raise UserError(f"scontrol release {ids} failed: {' '.join(out.stderr.split())}")


def _exit_code(text: str) -> int | None:
    """sacct's `3:0` → 3; `0:15` (killed by signal 15) → 128+15."""
    try:
        code, sig = (int(x) for x in text.split(":"))
    except ValueError:
        return None
    return 128 + sig if sig and not code else code


SETTLE_S = 120  # how long after a cancelled job's script ended sacct may still lack its exit code
STOP_CAP_S = 900  # a batch step accounting still shows running: how long after the cancel it may take to stop


def _within(end: str, window: float, now: float | None = None) -> bool:
    """sacct's End (local time, `2026-12-05T05:50:58`) lies less than `window` seconds ago; False when not a time."""
    try:
        t = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return False
    return (time.time() if now is None else now) - t < window


def _unsettled(alloc_end: str, batch_end: str) -> bool:
    """A cancelled job whose batch step is still sacct's placeholder: within SETTLE_S of the script's end (the later
    End), or, while accounting gives the step no End, within STOP_CAP_S of the cancel (the allocation's End)."""
    if _within(batch_end, 0, 0) or batch_end[:1].isdigit():  # the step has an End: count from the later one
        return _within(max(alloc_end, batch_end), SETTLE_S)
    return _within(alloc_end, STOP_CAP_S)


def slurm_states(job_ids: list[str], runner=subprocess.run) -> dict[str, dict]:
    """State of many jobs in ONE sacct call (allocations and their batch steps).

    squeue is asked (once, for all of them) only about jobs sacct does not know (every job when accounting is
    off, or a job slurmdbd has not recorded yet), reports as still active (slurmdbd lags the controller, so a job
    that has started can still read PENDING there) or as cancelled: a cancelled job the controller still lists
    (COMPLETING: its processes run, the trainer checkpoints) is STOPPING, and its exit code, once it has ended, is
    its batch script's (sacct's allocation line says 0:0). A cancelled job whose batch step sacct still holds as
    `CANCELLED 0:0` (what the controller records at the cancel, before the script ends) is STOPPING too, for up to
    SETTLE_S after the script's end (_unsettled): slurmdbd lags the controller, so the controller can have forgotten
    the job before sacct has the script's exit code (seen in the CI simulation of 2026-12-05: CANCELLED with no exit
    code, then 75). Returns {job_id: {'state', 'exit_code', 'nodes', 'source'}}; jobs neither tool knows are absent.
    """
    wanted = sorted(set(map(str, job_ids)))
    if not wanted:
        return {}
    states: dict[str, dict] = {}
    batch: dict[str, tuple[str, int | None]] = {}
    # (the array's own id too: sacct lists an array's unstarted tasks only under it, as `111_[2-3%2]`)
    asked = sorted({*wanted, *(j.split("_")[0] for j in wanted if "_" in j)})
    out = runner(["sacct", "--parsable2", "--noheader", "-j", ",".join(asked),
                  "-o", "JobIDRaw,JobID,State,ExitCode,NodeList,End"], capture_output=True, text=True)
    ended: dict[str, str] = {}  # the allocation's End, of the cancelled jobs
    if out.returncode == 0:
        for line in out.stdout.splitlines():
            parts = line.split("|")
            if len(parts) < 6:
                continue
            end = parts.pop()
            raw, array_id = parts.pop(0), parts[0]  # a job array's task is known by <array>_<task> (a sweep's)
            for task in array_tasks(array_id):  # tasks that never started: one row `111_[2-3%2]` holds them all
                if task in wanted and task not in states:
                    states[task] = {"state": parts[1].split()[0] if parts[1] else "UNKNOWN", "exit_code": None,
                                    "nodes": parts[3], "source": "sacct"}
            if array_id.split(".")[0] not in wanted:
                parts[0] = raw
            state, code = parts[1].split()[0] if parts[1] else "UNKNOWN", _exit_code(parts[2])
            if parts[0].endswith(".batch") and parts[0][:-len(".batch")] in wanted:
                batch[parts[0][:-len(".batch")]] = (state, code)
                ended[parts[0]] = end
            elif parts[0] in wanted:
                states[parts[0]] = {"state": state, "exit_code": code, "nodes": parts[3], "source": "sacct"}
                ended[parts[0]] = end
    for job, row in states.items():
        if row["state"] == "CANCELLED":  # the batch script's own exit code (the trainer's, trainer/runtime/launch.py)
            state, code = batch.get(job, ("CANCELLED", None))
            row["exit_code"] = None if state == "CANCELLED" and not code else code  # 0:0: not ended, or none
            if batch.get(job) == ("CANCELLED", 0) and _unsettled(ended.get(job, ""), ended.get(f"{job}.batch", "")):
                row.update(state=STOPPING, exit_code=None)  # the script's end is not in accounting yet
    missing = {j for j in wanted if states.get(j, {}).get("state") in (None, "CANCELLED", *ACTIVE)}
    if not missing:
        return states
    out = runner(["squeue", "--noheader", "--array", "--states=all", "-o", "%i|%T|%N|%r|%S"], capture_output=True,
                 text=True)
    if out.returncode == 0:
        for line in out.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 5 or parts[0] not in missing:
                continue
            why, start = parts.pop(3), parts.pop(3)
            known = states.get(parts[0], {}).get("state")
            if known in ("CANCELLED", STOPPING):
                if parts[1] in ACTIVE:
                    states[parts[0]].update(state=STOPPING, exit_code=None)
                continue
            # A job sacct knows as active: take the controller's word only while it is active too. An end state
            # waits for sacct (a moment later), which also has the exit code squeue lacks.
            if known is not None and parts[1] not in ACTIVE:
                continue
            states[parts[0]] = {"state": parts[1], "exit_code": None, "nodes": parts[2], "source": "squeue"}
            if parts[1] == "PENDING":  # why it waits, e.g. a requeued job's BeginTime hold of about two minutes
                states[parts[0]]["reason"] = _pending_reason(why, start)
    return states


_ARRAY_ROW = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")


def array_tasks(job_id: str) -> list[str]:
    """The tasks of sacct's row for an array's unstarted tasks: `111_[2-3,5%2]` -> 111_2, 111_3, 111_5."""
    m = _ARRAY_ROW.match(job_id)
    if not m:
        return []
    tasks = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi or lo).isdigit():
            tasks += [f"{m.group(1)}_{k}" for k in range(int(lo), int(hi or lo) + 1)]
    return tasks


def _pending_reason(why: str, start: str) -> str:
    """`pending: BeginTime, starts 2026-12-03T16:10:00` from squeue's %r and %S."""
    starts = f", starts {start}" if start and start not in ("N/A", "Unknown", "None") else ""
    return f"pending: {why or 'None'}{starts}"


def slurm_listed(job_id: str, runner=subprocess.run) -> str | None:
    """The controller's state of a job it still lists (PENDING, RUNNING, COMPLETING, ...), else None: a job
    squeue no longer shows has no process left, whatever accounting says or lacks."""
    out = runner(["squeue", "--noheader", "--states=all", "-j", str(job_id), "-o", "%T"], capture_output=True,
                 text=True)
    state = out.stdout.strip().split("\n")[0].strip() if out.returncode == 0 else ""
    return state if state and state not in TERMINAL else None


def _job_state(job_id: str) -> dict:
    return slurm_states([job_id]).get(str(job_id), {})


class SlurmExecutor(Executor):
    name = "slurm"
    runs_here = False  # a compute node: a path is checked here only where its filesystem is mounted here too
    sbatch = True
    post_output = "slurm-*.out"

    def check_usable(self) -> None:
        if not shutil.which("sbatch"):
            raise UserError("cluster.executor is 'slurm' but `sbatch` is not on PATH; use --executor local")

    def submit(self, run_dir: Path, args: list[str] = ()) -> dict:
        """`args`: sbatch options before the script (--hold: a pipeline's training job, until its steps are queued)."""
        job_id, submitted = submit_script((run_dir / "job.sbatch").read_text(), run_dir, args)
        return {"job_id": job_id, "submitted_file": str(submitted)}

    def resubmit(self, run_dir: Path, args: list[str] = ()) -> dict:
        """The run's script again, with the node ledger's exclusions as they are now (its #SBATCH --exclude line
        holds those of its first submission); `args`: more sbatch options (a dependency, --hold)."""
        resolved = yaml.safe_load((run_dir / run_files.RESOLVED).read_text())
        now = nodes_ledger.check_placement(resolved).nodes
        # (--exclude= empty: the script's line no longer holds)
        return self.submit(run_dir, [f"--exclude={','.join(now)}", *args])

    def state(self, run_dir: Path, info: dict) -> dict:
        return self.states([(run_dir, info)])[0] or {"state": "UNKNOWN"}

    def states(self, runs: list[tuple[Path, dict]]) -> list[dict | None]:
        ids = [str(info["job_id"]) for _, info in runs if info.get("job_id")]
        found = slurm_states(ids) if ids else {}
        return [found.get(str(info.get("job_id"))) for _, info in runs]

    def busy(self, run_dir: Path, info: dict, state: dict) -> str | None:
        # ended only once the controller stops listing it (COMPLETING: its processes still run)
        return slurm_listed(str(info.get("job_id")))

    def cancel(self, run_dir: Path, info: dict) -> None:
        if not info.get("job_id"):
            raise NothingToCancel("no Slurm job id is recorded for it")
        job_id = str(info["job_id"])
        # --verbose: Slurm 22.05's plain scancel of an id the controller does not know says nothing and exits 0
        out = subprocess.run(["scancel", "--verbose", job_id], capture_output=True, text=True)
        if "Invalid job id specified" in out.stderr:
            raise NothingToCancel(f"Slurm does not know job {job_id} (it ended and was purged, or it belongs to "
                                  "another cluster)")
        if out.returncode != 0:
            raise UserError(f"scancel {job_id} failed: {' '.join(out.stderr.split())}")

    def stdout_path(self, run_dir: Path, info: dict) -> Path:
        return run_dir / "logs" / f"slurm-{info.get('job_id')}.out"

    def run_post(self, job_dir: Path, out, submitted) -> tuple[str, int]:
        job_id, _ = submit_script((job_dir / "job.sh").read_text(), job_dir)
        submitted(job_id)
        return job_id, _follow(job_dir, job_id, out)

    def run_check(self, run_dir: Path, timeout: float, submitted) -> tuple[int, str]:
        job_id, _ = submit_script((run_dir / "job.sbatch").read_text(), run_dir)
        submitted(job_id)
        end = time.monotonic() + timeout
        state = {}
        while time.monotonic() < end:
            state = _job_state(job_id)
            if state.get("state") in TERMINAL:
                break
            time.sleep(1)
        else:
            subprocess.run(["scancel", str(job_id)], capture_output=True)
            raise UserError(f"Slurm job {job_id} did not finish within {timeout:.0f} s (last state "
                            f"{state.get('state', 'unknown')}); it was cancelled")
        path = run_dir / "logs" / f"slurm-{job_id}.out"
        for _ in range(50):  # the output file can trail the accounting record
            if path.exists():
                break
            time.sleep(0.1)
        text = path.read_text(errors="replace") if path.exists() else ""
        return (0 if state.get("state") == "COMPLETED" else 1), text


def _follow(d: Path, job_id: str, out) -> int:
    """Stream a post job's output until Slurm says it ended; its exit code (1 when accounting has none)."""
    path, pos, grace = d / f"slurm-{job_id}.out", 0, 10
    while True:
        state = _job_state(job_id)
        if path.exists():
            with open(path, errors="replace") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos = fh.tell()
            out.write(chunk)
            out.flush()
        if state.get("state") in TERMINAL:
            if grace > 0 and (not path.exists() or path.stat().st_size > pos):
                grace -= 1
                time.sleep(POLL_S)  # the file system may lag the scheduler
                continue
            code = state.get("exit_code")
            return code if code is not None else (0 if state["state"] == "COMPLETED" else 1)
        try:
            time.sleep(POLL_S)
        except KeyboardInterrupt:
            out.write(f"stopped following; Slurm job {job_id} keeps running (scancel {job_id} stops it), its "
                      f"result lands in {d}\n")
            raise click.Abort() from None
