"""Helpers for conftest's early start of the session's quickstart run (no tests here): a command started in a thread
of its own under SCHED_IDLE, so that it runs on the CPU the tests leave idle; normal priority again for its processes
once a test waits for it; a cancel by run id when the session ends first."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path


def start_idle(pool: ThreadPoolExecutor, fn, *args) -> Future:
    """fn(*args) in a thread of `pool` under SCHED_IDLE, which the processes it starts inherit (Linux: a thread's
    policy is its own, and a fork copies the forking thread's)."""
    def idle():
        try:
            os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            pass  # not Linux, or a sandbox that refuses it: at normal priority, as it ran before
        return fn(*args)
    return pool.submit(idle)


def result_at_normal_priority(future: Future, every: float = 5.0):
    """The future's result; meanwhile, every `every` seconds, SCHED_OTHER again for this process's SCHED_IDLE threads
    and descendants (start_idle's thread and what it started): behind other load, SCHED_IDLE would starve them."""
    while not future.done():
        _idle_descendants_to_normal()
        wait([future], timeout=every)
    return future.result()


def cancel_started_run(cli, env: dict, future: Future, workspace: Path, timeout: float = 60) -> None:
    """`primus-slurm cancel RUN` for the run the unfinished `future` submitted under `workspace` (by its id, once
    its run directory exists)."""
    end = time.monotonic() + timeout
    while not future.done() and time.monotonic() < end:
        for run_json in workspace.glob("*/*/run.json"):
            cli(env, "cancel", run_json.parent.name)
            return
        time.sleep(0.5)


def _idle_descendants_to_normal() -> None:
    parent = {}
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit():
                parent[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass  # ended meanwhile

    def ours(pid: int) -> bool:
        seen = 0
        while pid > 1 and seen < 64:
            pid, seen = parent.get(pid, 0), seen + 1
            if pid == os.getpid():
                return True
        return False

    for pid in [os.getpid(), *filter(ours, parent)]:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                pass  # ended meanwhile
