"""What the host did beside the steps of a timed window (bench/interleaved.py's blocks): Python's garbage collections
(how many and their milliseconds, by generation) and this process's descendant processes at the window's end (e.g.
inductor's compile workers). The candidate causes of a block slower than its repeats: on 2026-12-07 a process's first
block ran 10-23 % slow on an H100 (bench/results/2026-12-07c_h100_speed/), cause not known. On this CPU machine a
full collection over the tiny trainer's ~480 k tracked objects took ~250 ms, and 400 steady steps ran no full
collection of their own (the twenty-first session's measurement).

    with GcPauses() as pauses:
        ...timed steps...
    kids = descendants()  # (None where /proc cannot say)
    row.update(pauses.row(), child_processes=None if kids is None else len(kids))
"""
from __future__ import annotations

import gc
import os
import time
from typing import Optional


class GcPauses:
    """Collections that ran inside the `with` block: counts and milliseconds for generations 0, 1, 2."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self._start: Optional[float] = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            g = int(info["generation"])
            self.count[g] += 1
            self.ms[g] += 1000.0 * (time.perf_counter() - self._start)
            self._start = None

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def row(self) -> dict:
        return {"gc_collections": list(self.count), "gc_ms": [round(v, 1) for v in self.ms]}


def descendants(pid: Optional[int] = None) -> Optional[set[int]]:
    """The processes that descend from `pid` (this one by default), from /proc; None where /proc has no children
    files (not Linux, or a kernel without them)."""
    root = os.getpid() if pid is None else pid
    if not os.path.isdir(f"/proc/{root}/task"):
        return None
    seen: set[int] = set()
    todo = [root]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            todo += [k for k in kids if k not in seen]
            seen.update(kids)
    return seen
