"""Helpers for tests/test_reliability_*.py (no tests here): recipes whose Slurm job runs the real trainer,
Slurm job control through scontrol, the trainer's worker processes, waiting on files, inotify."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, cli, wait_state
from test_train_support import SMALL

QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
STAMP = "%Y-%m-%d %H:%M:%S"


def trainer_recipe(tmp_path: Path, name: str, **cluster) -> Path:
    """A quickstart recipe for the Slurm executor: one node, one rank, the real `trainer` entrypoint."""
    body = {
        "extends": str(QUICKSTART),
        "experiment": {"name": name, "workspace": str(tmp_path / "ws")},
        "cluster": {"executor": "slurm", "nodes": 1, "nproc_per_node": 1, "exclusive": False,
                    "time": "00:10:00", "signal_grace_s": 10, "python": sys.executable,
                    "env": {"OMP_NUM_THREADS": "1"}, **cluster},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(body))
    return path


def submit(env: dict, recipe: Path, *sets: str) -> dict:
    """`primus-slurm submit RECIPE --json` with the small-trainer settings of test_train_support plus `sets`."""
    args = [x for s in (*SMALL, *sets) for x in ("--set", s)]
    out = cli(env, "submit", str(recipe), "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll `predicate()` until it returns something truthy; that value is returned."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def read(path: Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def wait_text(path: Path, needle: str, timeout: float) -> str:
    """The file's text once it contains `needle`."""
    return wait_for(lambda: (lambda t: t if needle in t else "")(read(path)), timeout, f"{needle!r} in {path}")


def job_info(job_id: str) -> dict:
    """`scontrol show job -o` as {key: value} (empty once Slurm has forgotten the job)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True)
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", out.stdout)) if out.returncode == 0 else {}


def scontrol(*args: str) -> None:
    out = subprocess.run(["scontrol", *args], capture_output=True, text=True)
    assert out.returncode == 0, f"scontrol {' '.join(args)}: {out.stderr}"


def wait_requeued(job_id: str, restarts: int, timeout: float = 120) -> dict:
    """Wait until the job is PENDING again after its `restarts`-th requeue."""
    return wait_for(lambda: (lambda i: i if i.get("JobState") == "PENDING" and i.get("Restarts") == str(restarts)
                             else None)(job_info(job_id)), timeout, f"job {job_id} requeued ({restarts})")


def release(job_id: str) -> None:
    """Skip the scheduler's delay (~120 s) before a requeued job may start again.

    Not in the same second as the requeue: slurmd revokes the old incarnation's credential with a
    one-second timestamp and refuses ("Job credential revoked") a new one issued in that second."""
    time.sleep(2)
    scontrol("update", f"JobId={job_id}", "StartTime=now")


def run_to_end(job_id: str, env: dict, run_id: str) -> dict:
    """Release a held (requeued) job and wait for it to end; status's row of the run."""
    release(job_id)
    return wait_state(env, run_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300, key="scheduler_state")


def thaw_and_cancel(job_id: str, frozen: int | None) -> None:
    """A test's cleanup: continue a rank it stopped (SIGSTOP) and cancel its job unless it completed."""
    if frozen is not None:
        os.kill(frozen, signal.SIGCONT)
    if job_info(job_id).get("JobState") not in (None, "COMPLETED"):
        cancel(job_id)


def cancel(*job_ids: str) -> None:
    if job_ids:
        subprocess.run(["scancel", *map(str, job_ids)], capture_output=True)


def worker_pids(run_dir: Path, entrypoint: str = "trainer") -> dict[int, int]:
    """{rank: pid} of the `python -m <entrypoint> ... --run-dir RUN_DIR` workers that torchrun started."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "trainer.runtime.launch" in argv or "torch.distributed.run" in argv or not _follows(argv, "-m", entrypoint):
            continue
        if not _follows(argv, "--run-dir", str(run_dir)):
            continue
        env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        found[int(env.get(b"RANK", b"0"))] = int(entry)
    return found


def _follows(argv: list[str], flag: str, value: str) -> bool:
    return any(a == flag and b == value for a, b in zip(argv, argv[1:]))


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def fingerprint(folder: Path) -> dict[str, tuple]:
    """{relative path: (sha256, mtime_ns, inode)} of every file under `folder`."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(folder))] = (sha256(p), st.st_mtime_ns, st.st_ino)
    return out


def stamp_seconds(line: str) -> float:
    """Epoch seconds of a `[YYYY-mm-dd HH:MM:SS] ...` log line (local time)."""
    return time.mktime(time.strptime(line[1:20], STAMP))


class Inotify:
    """Names created in one directory (Linux inotify through libc), to act within microseconds of a creation."""

    IN_CREATE = 0x100

    def __init__(self, folder: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init()
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(folder), self.IN_CREATE) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")

    def created(self, timeout: float) -> list[str]:
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        data, names, offset = os.read(self.fd, 65536), [], 0
        while offset < len(data):
            _, _, _, size = struct.unpack_from("iIII", data, offset)
            names.append(data[offset + 16:offset + 16 + size].rstrip(b"\0").decode())
            offset += 16 + size
        return names

    def close(self) -> None:
        os.close(self.fd)
