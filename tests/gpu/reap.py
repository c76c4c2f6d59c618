"""End what the GPU suite started and left running (`python3 tests/gpu/reap.py BASETEMP`; scripts/gpu-test.sh calls it
after pytest): a deadline or a failed test leaves runs, a sweep's queue and its eval/export steps holding the GPU into
the next call on a warm machine. Only the process trees whose root pids (with their start times, so never a later
process reusing a pid) the run.json files under BASETEMP name: the job wrapper (`pid`) and a sweep's or pipeline's
queue (`queue_pid`), whose children are the steps. TERM, then KILL after 10 s. Prints one line."""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from primus_slurm.jobs.local_executor import _alive, _process_tree, _signal_all, proc_start_ticks  # noqa: E402


def roots(base: Path) -> set[int]:
    found = set()
    for path in base.rglob("run.json"):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for key in ("pid", "queue_pid"):
            pid, start = info.get(key), info.get(f"{key}_start")
            if pid and start is not None and proc_start_ticks(int(pid)) == start:
                found.add(int(pid))
    return found


def main(base: Path) -> int:
    tree: dict = {}
    for pid in roots(base):
        tree.update(_process_tree(pid))
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 2.0)):
        _signal_all(tree, sig)  # (the local executor's cancel: only the live processes of the tree)
        end = time.monotonic() + grace
        while _alive(tree) and time.monotonic() < end:
            time.sleep(0.2)
    print(f"reap: {len(tree)} process(es) of the suite's runs ended, {len(_alive(tree))} left")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])) if len(sys.argv) == 2 else 2)
