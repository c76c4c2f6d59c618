"""`python -m trainer.runtime.launch TORCHRUN-ARGS`: torchrun (torch.distributed.run, in this process) whose exit code is
the trainer's.

torchrun turns every failed worker into exit 1 with a ChildFailedError traceback, and a launcher stopped by a
signal (a cancel, the job script's forwarded warning) into a SignalException traceback; the trainer's own codes
(trainer/runtime/signals.py: 2 config or data, 3 diverged, 4 checkpoint failed, 75 stopped after saving) are the job's API
(`status` EXIT, `submit --follow`, the job script's requeue decision). This exits with:

  - 0 when every worker finished;
  - the first failed worker's own code (a worker killed by signal N: 128 + N);
  - after a stop signal (torchrun passes it to its workers and waits for them): the workers' own codes, which each
    records in PRIMUS_EXIT_DIR (trainer.runtime.signals.record_exit): the first non-zero one by local rank, else 128 + N;

and prints one `launch | ...` line instead of the traceback (torchrun's own failures, a rendezvous timeout, keep
theirs).
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import time

from trainer.runtime.signals import EXIT_DIR_ENV, exit_process

WAIT_WORKERS_S = 60.0  # a second stop signal cuts torchrun's own wait for its workers short: wait here instead


def _code(exitcode: int) -> int:
    return 128 - exitcode if exitcode < 0 else exitcode  # Popen's -N: killed by signal N


def _children() -> list[int]:
    """Live (non-zombie) child processes of this one."""
    me, found = str(os.getpid()), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[1] == me and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def recorded(folder: str) -> dict[int, int]:
    """{local rank: exit code} the workers wrote."""
    out = {}
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name)) as fh:
                out[int(name)] = int(fh.read().strip())
        except (OSError, ValueError):
            continue
    return out


def after_signal(folder: str, signum: int, workers: int, wait_s: float = WAIT_WORKERS_S) -> int:
    """The node's code once the workers are gone (this process's children, waited for up to `wait_s`): the first
    non-zero recorded code by local rank; 0 when all `workers` local ranks recorded 0; else 128 + signum (a worker
    that never said: killed, or not started)."""
    end = time.monotonic() + wait_s
    while _children() and time.monotonic() < end:
        time.sleep(0.1)
    codes = recorded(folder)
    nonzero = [codes[r] for r in sorted(codes) if codes[r]]
    if nonzero:
        return nonzero[0]
    return 0 if set(codes) >= set(range(workers)) else 128 + signum


def _drop_failed_line(record: logging.LogRecord) -> bool:
    """torchrun's `failed (exitcode: N) local_rank: ...` error line: the `launch |` line below says it once."""
    return not str(record.msg).startswith("failed (exitcode")


def quiet_logging_errors() -> None:
    """A second stop signal can land while torchrun's agent is logging the first ("Received SIGTERM death signal,
    shutting down workers"): its handler raises SignalException inside the log call, and logging would print a
    `--- Logging error ---` traceback into the job's output (seen in CI, 2026-12-05). The agent is already stopping
    the workers then; the record is dropped without the traceback."""
    logging.raiseExceptions = False


def main(argv=None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import determine_local_world_size, parse_args, run

    quiet_logging_errors()
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_drop_failed_line)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    folder = tempfile.mkdtemp(prefix="primus-exit-")
    os.environ[EXIT_DIR_ENV] = folder  # the workers inherit it
    try:
        run(args)
        return 0
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        code = _code(failure.exitcode)
        print(f"launch | rank {rank} exited with code {code}", file=sys.stderr, flush=True)
        return code
    except SignalException as err:
        code = after_signal(folder, int(err.sigval), determine_local_world_size(args.nproc_per_node))
        print(f"launch | stopped by {signal.Signals(err.sigval).name}; workers exited with code {code}",
              file=sys.stderr, flush=True)
        return code
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    exit_process(main())
