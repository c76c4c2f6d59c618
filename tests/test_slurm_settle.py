"""A cancelled job's state while accounting settles (primus_slurm.jobs.slurm_executor.slurm_states): the controller
can forget a job before slurmdbd has its batch script's exit code. The sacct lines are the ones the local cluster
printed around a cancel of a job whose script traps SIGTERM and exits 75 two seconds later (2026-12-05; the race
itself, where squeue has let go first, showed once in a CI simulation as CANCELLED with no exit code, then 75)."""
from __future__ import annotations

import subprocess
import time

from primus_slurm.jobs.slurm_executor import SETTLE_S, slurm_states


def _runner(sacct: str, squeue: str = ""):
    def run(cmd, **_):
        out = sacct if cmd[0] == "sacct" else squeue
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")
    return run


def _end(ago_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - ago_s))


def test_cancelled_before_the_script_ended_in_accounting_is_stopping_then_settles():
    def lines(batch: str, ago_s: float) -> str:
        return (f"1237|1237|CANCELLED by 0|0:0|node1|{_end(ago_s)}\n"
                f"1237.batch|1237.batch|{batch}|node1|{_end(ago_s - 4)}\n")

    completing = "1237|COMPLETING|node1|None|2026-12-05T06:59:18\n"  # squeue: the script still runs
    row = slurm_states(["1237"], _runner(lines("CANCELLED|0:0", 1), completing))["1237"]
    assert row["state"] == "STOPPING" and row["exit_code"] is None, row
    gone = "1237|CANCELLED|node1|None|2026-12-05T06:59:18\n"  # squeue --states=all: the controller has let go
    row = slurm_states(["1237"], _runner(lines("CANCELLED|0:0", 3), gone))["1237"]
    assert row["state"] == "STOPPING" and row["exit_code"] is None, row
    row = slurm_states(["1237"], _runner(lines("FAILED|75:0", 3), gone))["1237"]
    assert row["state"] == "CANCELLED" and row["exit_code"] == 75, row
    # a placeholder that outlives SETTLE_S is taken as the end (no exit code), never STOPPING for ever
    row = slurm_states(["1237"], _runner(lines("CANCELLED|0:0", SETTLE_S + 30), gone))["1237"]
    assert row["state"] == "CANCELLED" and row["exit_code"] is None, row


def test_cancelled_before_it_started_has_no_batch_step_and_is_cancelled():
    row = slurm_states(["1240"], _runner(f"1240|1240|CANCELLED by 0|0:0|None assigned|{_end(2)}\n"))["1240"]
    assert row["state"] == "CANCELLED" and row["exit_code"] is None, row


def test_a_script_killed_after_killwait_is_cancelled_with_the_signal():
    out = f"966|966|CANCELLED by 0|0:0|node1|{_end(40)}\n966.batch|966.batch|CANCELLED|0:9|node1|{_end(5)}\n"
    row = slurm_states(["966"], _runner(out))["966"]
    assert row["state"] == "CANCELLED" and row["exit_code"] == 137, row


def test_a_script_still_stopping_long_after_the_cancel_stays_stopping():
    """A script whose stop outlasts SETTLE_S (a long checkpoint, a large KillWait) has no End in accounting yet: the
    window counts from the script's end, so the job is STOPPING, not CANCELLED without a code."""
    out = (f"1300|1300|CANCELLED by 0|0:0|node1|{_end(SETTLE_S + 200)}\n"
           "1300.batch|1300.batch|CANCELLED|0:0|node1|Unknown\n")
    row = slurm_states(["1300"], _runner(out, "1300|CANCELLED|node1|None|2026-12-05T06:59:18\n"))["1300"]
    assert row["state"] == "STOPPING" and row["exit_code"] is None, row
    ended = (f"1300|1300|CANCELLED by 0|0:0|node1|{_end(SETTLE_S + 200)}\n"
             f"1300.batch|1300.batch|CANCELLED|0:0|node1|{_end(SETTLE_S + 100)}\n")  # ended long ago, never recorded
    assert slurm_states(["1300"], _runner(ended))["1300"]["state"] == "CANCELLED"
