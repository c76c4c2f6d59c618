"""Graceful stop on SIGTERM / SIGUSR2 (forwarded by the sbatch trap before preemption or the time
limit). The handler only records the signal; the training loop finishes the current iteration, agrees
with all ranks (trainer.step.loss.reduce_count_and_flag) to stop at the same iteration, saves a checkpoint
and exits with EXIT_PREEMPTED.

SIGUSR1 is never touched (Slurm and other tooling use it).

Exit codes of `python -m trainer`:
    0   finished (train_iters reached or target_eval_loss met)
    1   unexpected error (traceback on stderr)
    2   configuration / precision not runnable here (one line on stderr)
    3   diverged: loss NaN/Inf; nothing saved after the last good checkpoint
    4   checkpoint save failed (previous checkpoint and `latest` left intact)
    75  stopped by SIGTERM/SIGUSR2 after saving a checkpoint: EX_TEMPFAIL from sysexits.h, i.e.
        "temporary failure, retry later": the job is incomplete but resumable, so it is neither 0
        (Slurm would call it COMPLETED) nor a crash code; the sbatch script requeues the job.

These codes are the job's exit code too (trainer/runtime/launch.py passes them through torchrun): each worker records its
code in PRIMUS_EXIT_DIR (record_exit), which the launcher reads when torchrun itself was stopped by a signal.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import NoReturn, Optional

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_DIVERGED = 3
EXIT_SAVE_FAILED = 4
EXIT_PREEMPTED = 75

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
WOKEN_S = 5.0  # StopSignal.woken: an error this soon after a SIGCONT came from being stopped, not from waiting
EXIT_DIR_ENV = "PRIMUS_EXIT_DIR"  # set by trainer/runtime/launch.py: one file per local rank, holding its exit code


def record_exit(code: int) -> None:
    """Write this worker's exit code where its launcher reads it (nothing outside trainer/runtime/launch.py)."""
    folder = os.environ.get(EXIT_DIR_ENV)
    if not folder:
        return
    try:
        with open(os.path.join(folder, os.environ.get("LOCAL_RANK", "0")), "w") as fh:
            fh.write(f"{int(code)}\n")
    except OSError:
        pass  # the launcher falls back to what torchrun knows


def exit_process(code: int) -> NoReturn:
    """sys.exit(code) without the interpreter's finalization: what it does first, then os._exit. Its last garbage
    collections over every object took ~1.2 s of CPU at each exit of a process with torch and megatron-core
    imported (trainer, post command, launcher), before the job could end; 0.05 s this way. What still runs, in
    sys.exit's order: the wait for non-daemon threads (and thread pools' exit hooks: threading's own shutdown), the
    atexit handlers (logging, multiprocessing, trackers, weakref finalizers, temporary folders), stdout and stderr
    flushed. Files are the callers' to close (the run's logs are: TrainLogger.close). Not gc.freeze and sys.exit:
    Triton's nanobind bindings then report their objects as leaked, into the job's output."""
    shutdown = getattr(threading, "_shutdown", None)  # CPython's own first step of finalization
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass  # closed or replaced: nothing of ours is buffered there
    os._exit(0 if code is None else code if isinstance(code, int) else 1)  # (sys.exit's codes: None is 0)


class StopSignal:
    """Records the first SIGTERM/SIGUSR2 received, and when the process was last continued (SIGCONT); restores
    previous handlers on uninstall().

    SIGCONT: Slurm ends a step with SIGCONT, then SIGTERM. A rank that was stopped (SIGSTOP: a hung rank, as
    tests/test_reliability_stalls.py makes one) wakes on the SIGCONT, finds its collective's deadline long past and
    raises a timeout, sometimes before its SIGTERM handler has run (CI under load, 2026-12-06). `woken` tells that
    rank it was not one that waited (trainer/observability/stragglers.record_error). The kernel continues the process
    whatever the handler; the handler only notes the time."""

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self.continued_at: Optional[float] = None
        self._previous: dict[int, object] = {}

    def _handler(self, signum, frame) -> None:  # noqa: ARG002
        if self.received is None:
            self.received = signum

    def _continued(self, signum, frame) -> None:  # noqa: ARG002
        self.continued_at = time.monotonic()

    def install(self) -> "StopSignal":
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        self._previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._continued)
        return self

    @property
    def woken(self) -> bool:
        """Continued (SIGCONT) within the last WOKEN_S seconds: an error now is the wake-up's, not a wait's."""
        return self.continued_at is not None and time.monotonic() - self.continued_at < WOKEN_S

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else "none"
