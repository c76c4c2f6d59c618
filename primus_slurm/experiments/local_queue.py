"""The local executor's queue: a detached process that starts runs (a sweep's trials) N at a time, and runs
each run's pipeline steps after it (`after:`, each only when the step before succeeded).

`start` spawns it before the runs are recorded; it waits for `release` (queue.json in the queue's folder), so
its writes to a run's run.json never race the submit's. Its own output: `<folder>/logs/queue.out`.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from primus_slurm.jobs import registry, runs
from primus_slurm.jobs.executor_base import ACTIVE, TERMINAL
from primus_slurm.jobs.local_executor import LOCAL_CANCELLED, LocalExecutor, proc_start_ticks, queue_lock

QUEUE_JSON = "queue.json"
GATE_S = 120.0  # how long the queue waits for its runs to be recorded (a failed submit never releases it)
# how often the queue looks for a run's end (an exit_code file, /proc): a few file reads, so that the next trial
# or a pipeline's step starts within 0.2 s of it (1.0 until 2026-12-07: 0.5 s of idle machine per step)
POLL_S = 0.2


def start(folder: Path, run_dirs: list[Path], parallel: int, watch: bool = False,
          others: list[Path] = ()) -> list[dict]:
    """Spawn the queue for `run_dirs`; returns each run's run.json fields (PENDING until the queue starts it).
    `watch`: the runs are already started (a resumed run): the queue only waits for their end, then runs their
    steps. `others`: runs outside this queue that count against `parallel` while they are active (a resumed
    sweep's trials that still run, or wait in the sweep's first queue)."""
    fields = spawn(folder)
    gate(folder, run_dirs, parallel, watch, others)
    return [run_fields(fields, i) for i in range(len(run_dirs))]


def spawn(folder: Path) -> dict:
    """The queue process of `folder`, which waits for its gate (gate(), then release()); its run.json fields."""
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    (folder / QUEUE_JSON).unlink(missing_ok=True)  # an earlier queue's gate, in this folder: not this queue's
    with open(folder / "logs" / "queue.out", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "primus_slurm.experiments.queue_main", str(folder)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    return {"queue_pid": proc.pid, "queue_pid_start": proc_start_ticks(proc.pid), "queue": str(folder)}


def run_fields(queue: dict, i: int) -> dict:
    """The run.json fields of the queue's `i`-th run (spawn's fields and its job id)."""
    return {"job_id": f"local-queue-{queue['queue_pid']}-{i}", **queue}


def gate(folder: Path, run_dirs: list[Path], parallel: int, watch: bool = False, others: list[Path] = ()) -> None:
    """What the spawned queue runs (start() says how), held back until release()."""
    spec = {"run_dirs": [str(d) for d in run_dirs], "parallel": parallel, "watch": watch,
            "others": [str(d) for d in others]}
    (folder / (QUEUE_JSON + ".pending")).write_text(json.dumps(spec))


def release(folder: Path) -> None:
    """The runs are recorded: the queue may start them."""
    (folder / (QUEUE_JSON + ".pending")).replace(folder / QUEUE_JSON)


def _start_run(run_dir: Path, executor: LocalExecutor, sharing: int = 1) -> dict | None:
    """Start one queued run (None when it was cancelled while it waited); `sharing` runs share the machine."""
    with queue_lock(run_dir):
        if (run_dir / LOCAL_CANCELLED).exists():
            return None
        info = runs.read_run_json(run_dir)
        info.update(executor.submit(run_dir, sharing))
        runs.write_run_json(run_dir, info)
    registry.record({k: info[k] for k in ("run_id", "job_id")})
    print(f"started {run_dir} as {info['job_id']}", flush=True)
    return info


def run_queue(folder: Path, after=None) -> None:
    """Start the runs N at a time; `after(run_dir, info)` runs once each started run has ended."""
    gate = folder / QUEUE_JSON
    end = time.monotonic() + GATE_S
    while not gate.exists():
        if time.monotonic() > end:
            print("the runs were never recorded (the submit failed?); nothing started", flush=True)
            return
        time.sleep(0.2)
    spec = json.loads(gate.read_text())
    pending = [Path(d) for d in spec["run_dirs"]]
    executor, running, others = LocalExecutor(), [], [Path(d) for d in spec.get("others", ())]
    if spec.get("watch"):  # started already (a resume): wait for their end
        running, pending = [(d, runs.read_run_json(d)) for d in pending], []
    while pending or running:
        still = []
        for run_dir, info in running:
            state = executor.state(run_dir, info)
            if state["state"] in TERMINAL:
                print(f"{run_dir}: {state['state']} (exit {state.get('exit_code')})", flush=True)
                if after is not None:
                    after(run_dir, state)
            else:
                still.append((run_dir, info))
        running = still
        busy = sum(executor.state(d, runs.read_run_json(d))["state"] in ACTIVE for d in others) if pending else 0
        while pending and len(running) + busy < spec["parallel"]:
            run_dir = pending.pop(0)
            info = _start_run(run_dir, executor, min(spec["parallel"], len(spec["run_dirs"])))
            if info is not None:
                running.append((run_dir, info))
        if pending or running:
            time.sleep(POLL_S)
    print("queue done", flush=True)
