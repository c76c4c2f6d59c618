"""Progress parsing (contract §3 log format) and the derived states, on real log files."""
from __future__ import annotations

import os
import time

from primus_slurm.jobs.progress import Progress, parse_lines, read_progress
from primus_slurm.jobs.status import collect, derive_state

CONTRACT_LOG = """\
[2026-11-30 01:02:03] primus-trainer start | attempt 0 | world_size 2 | device cpu | resumed_from none
[2026-11-30 01:02:03] arg model.num_layers = 2
[2026-11-30 01:02:05] iteration 10/100 | lm loss 2.345678E+00 | lr 1.000000E-04 | grad norm 1.234E-01 | tokens/s/GPU 1234.5 | TFLOP/s/GPU 12.34 | mem alloc GiB 1.23 | mem peak GiB 2.34 | ms/iter 123.4
[2026-11-30 01:02:06] eval iteration 10 | eval loss 2.100000E+00
[2026-11-30 01:02:07] checkpoint saved | iteration 20 | path checkpoints/iter_0000020
"""


def _write(run_dir, name, text):
    path = run_dir / "logs" / "rank-0" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_contract_example_parses(tmp_path):
    _write(tmp_path, "debug.log", CONTRACT_LOG)
    p = read_progress(tmp_path)
    assert (p.iteration, p.train_iters, p.lm_loss) == (10, 100, 2.345678)
    assert (p.tokens_per_s_gpu, p.tflops_gpu, p.mem_peak_gib) == (1234.5, 12.34, 2.34)
    assert p.eval_loss == 2.1 and p.last_checkpoint == "checkpoints/iter_0000020"
    assert p.eta_s == 90 * 0.1234 and not p.diverged and not p.finished


def test_newest_attempt_wins_and_counts_restarts(tmp_path):
    _write(tmp_path, "debug.log", CONTRACT_LOG)
    _write(tmp_path, "debug.attempt-2.log", "[2026-11-30 02:00:00] iteration 50/100 | lm loss nan | ms/iter 1.0\n")
    _write(tmp_path, "debug.attempt-10.log",
           "[2026-11-30 03:00:00] iteration 60/100 | lm loss 1.5E+00 | ms/iter 1.0\n"
           "[2026-11-30 03:00:01] training finished | iterations 100 | exit 0\n")
    p = read_progress(tmp_path)
    assert p.attempt == 10 and p.iteration == 60 and p.finished and p.exit_code == 0 and p.eta_s is None


def test_nan_loss_or_diverged_line_is_diverged():
    assert parse_lines(["[2026-11-30 01:00:00] iteration 3/9 | lm loss nan | ms/iter 1"], Progress()).diverged
    assert parse_lines(["[2026-11-30 01:00:00] diverged | iteration 3 | lm loss inf"], Progress()).diverged
    assert not parse_lines(["[2026-11-30 01:00:00] iteration 3/9 | lm loss 1.0E+00"], Progress()).diverged


def test_derived_states():
    running = {"state": "RUNNING"}
    assert derive_state(running, Progress(), 10 * 60, 30) == "RUNNING"
    assert derive_state(running, Progress(), 31 * 60, 30) == "STALLED"
    assert derive_state({"state": "PENDING"}, Progress(), 99 * 60, 30) == "PENDING"
    assert derive_state(running, Progress(diverged=True), 0, 30) == "DIVERGED"
    assert derive_state(None, Progress(finished=True, exit_code=0), 0, 30) == "COMPLETED"
    assert derive_state(None, Progress(), 0, 30) == "UNKNOWN"


def test_stall_uses_log_mtime_for_a_live_local_job(tmp_path):
    """A real background process stands in for a running local job whose log stopped moving."""
    import subprocess
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        from primus_slurm.jobs.local_executor import proc_start_ticks
        run_dir = tmp_path / "run"
        log = _write(run_dir, "debug.log", CONTRACT_LOG)
        entry = {"run_id": "r", "run_dir": str(run_dir), "executor": "local", "job_id": f"local-{proc.pid}",
                 "pid": proc.pid, "pid_start": proc_start_ticks(proc.pid), "stall_minutes": 1}
        row = collect([entry])[0]
        assert row["state"] == "RUNNING" and row["eta_s"] > 0
        old = time.time() - 120
        os.utime(log, (old, old))
        row = collect([entry])[0]
        assert row["state"] == "STALLED" and row["seconds_since_log"] >= 119
    finally:
        proc.kill()
        proc.wait()
    row = collect([entry])[0]
    assert row["state"] == "FAILED" and row["eta_s"] is None  # gone without an exit code: no ETA either


def test_failures_and_the_run_average_reach_status(tmp_path):
    """The trainer's one-line failures give status a reason and the exit code (no `training finished` line
    follows them); a finished run's TOK/S/GPU is its `training summary` average, not the last window."""
    import io

    from rich.console import Console

    from primus_slurm.jobs.status import render_table

    p = parse_lines(["[2026-11-30 01:02:03] config error | trainer.tokenizer.path: no tokenizer.json in /x"], Progress())
    assert (p.error, p.exit_code, p.finished) == ("config error | trainer.tokenizer.path: no tokenizer.json in /x", 2,
                                                 False)
    p = parse_lines(["[2026-11-30 01:02:03] error | RuntimeError: boom",
                     "[2026-11-30 01:02:04] training finished | iterations 3 | exit 4"], Progress())
    assert (p.error, p.exit_code) == ("error | RuntimeError: boom", 4)  # the finish line's code wins
    summary = CONTRACT_LOG + ("[2026-11-30 01:03:00] training summary | iterations averaged 80 | tokens/s/GPU 999.5 | "
                              "TFLOP/s/GPU 9.99 | ms/iter 130.0 | mem peak GiB 2.34\n"
                              "[2026-11-30 01:03:01] training finished | iterations 100 | exit 0\n")
    _write(tmp_path, "debug.log", summary)
    p = read_progress(tmp_path)
    assert p.avg_tokens_per_s_gpu == 999.5 and p.tokens_per_s_gpu == 1234.5
    base = {"run_id": "r1", "name": "n", "executor": "local", "job_id": 1, "exit_code": 0, "restarts": 0,
            **p.as_dict()}
    out = io.StringIO()
    render_table([{**base, "state": "COMPLETED"},
                  {**base, "run_id": "r2", "state": "FAILED", "error": "config error | bad tokenizer"}],
                 Console(file=out, width=250))
    text = out.getvalue()
    assert "999.5" in text and "1234.5" not in text
    assert "r2: config error | bad tokenizer" in text and "r1: " not in text


def test_logs_says_why_there_is_no_log(tmp_path):
    """`logs RUN` on a run that ended before its trainer logged, and on a run whose directory is gone."""
    import pytest

    from primus_slurm.jobs import local_executor
    from primus_slurm.errors import UserError
    from primus_slurm.jobs.logs import show

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / local_executor.LOCAL_EXIT).write_text("1\n")  # the local wrapper's record of the script's exit
    entry = {"run_id": "20261130-000000-abcdef", "run_dir": str(run_dir), "executor": "local"}
    with pytest.raises(UserError, match=r"ended \(FAILED\) without a rank 0 trainer log; its job stdout: "
                                        r"`primus-slurm logs 20261130-000000-abcdef --stdout`"):
        show(entry, False)
    with pytest.raises(UserError, match=r"ended \(FAILED\) without a job stdout$"):
        show(entry, True)
    with pytest.raises(UserError, match="run directory .* no longer exists"):
        show({**entry, "run_dir": str(tmp_path / "gone")}, True)


def test_follow_printer_keeps_characters_and_lines_whole_and_notes_each_file():
    import io
    from pathlib import Path

    from primus_slurm.jobs.logs import _Printer

    out = io.StringIO()
    printer = _Printer(out, fold_args=True)
    text = "[t] arg a = 1\n[t] iteration 1/2 | lm loss 1 | note é\n[t] arg b = 2\n[t] last".encode()
    cut = text.index("é".encode()) + 1  # inside the two-byte é
    printer.write(text[:cut], Path("debug.log"))
    printer.write(text[cut:], Path("debug.log"))
    printer.close()  # the partial last line comes out at the file's end
    printer.write(b"[t] arg c = 3\n[t] iteration 2/2\n", Path("debug.attempt-1.log"))
    printer.close()
    assert out.getvalue() == ("(the resolved settings, `arg …` lines, are in debug.log; not shown here)\n"
                              "[t] iteration 1/2 | lm loss 1 | note é\n[t] last\n"
                              "(the resolved settings, `arg …` lines, are in debug.attempt-1.log; not shown here)\n"
                              "[t] iteration 2/2\n")


def test_a_local_run_whose_directory_is_gone_is_unknown_not_failed(tmp_path):
    """Its state (exit code, cancel marker) lived in the run directory: without it status used to say FAILED."""
    entry = {"run_id": "r", "run_dir": str(tmp_path / "moved-away"), "executor": "local", "job_id": "local-1",
             "pid": 1, "pid_start": -1}
    row = collect([entry])[0]
    assert row["state"] == "UNKNOWN" and row["exit_code"] is None
    assert row["reason"] == f"run directory {tmp_path / 'moved-away'} no longer exists"


def _events(run_dir, attempt, events, age_s=0.0):
    import json

    from primus_contract import run_files
    path = _write(run_dir, run_files.events_name(attempt), "".join(json.dumps(e) + "\n" for e in events))
    log = _write(run_dir, run_files.log_name(attempt), "[2026-12-07 00:00:00] primus-trainer start | attempt 0\n")
    old = time.time() - age_s
    for p in (path, log):
        os.utime(p, (old, old))
    return path


def test_a_resumed_job_is_judged_by_itself_not_by_the_job_before(tmp_path):
    """After `resume`, until the new trainer logs, the newest attempt log is the job before's: its age is no stall
    of the new job (whose stdout is fresh), and its divergence or end is not the new job's."""
    import subprocess

    from primus_slurm.jobs.local_executor import LOCAL_OUT, proc_start_ticks
    run_dir = tmp_path / "run"
    _events(run_dir, 0, [{"event": "start", "t": 1000.0, "attempt": 0},
                         {"event": "metrics", "t": 1001.0, "iteration": 40, "train_iters": 500, "lm_loss": 1.2,
                          "ms_per_iter": 100.0},
                         {"event": "diverged", "t": 1002.0, "iteration": 41, "lm_loss": "nan"},
                         {"event": "outcome", "t": 1003.0, "status": "training finished", "exit": 3}], age_s=7200)
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)  # the resumed job, running
    try:
        entry = {"run_id": "r", "run_dir": str(run_dir), "executor": "local", "job_id": f"local-{proc.pid}",
                 "pid": proc.pid, "pid_start": proc_start_ticks(proc.pid), "stall_minutes": 30}
        assert collect([entry])[0]["state"] == "DIVERGED"  # (no attempt-base: the same job)
        (run_dir / "attempt-base").write_text("1\n")
        (run_dir / LOCAL_OUT).write_text("primus-slurm: run r job 1 attempt 1 on 1 node(s)\n")
        row = collect([entry])[0]
        assert row["state"] == "RUNNING" and row["iteration"] == 40 and row["seconds_since_log"] < 600
        assert not row["diverged"] and not row["finished"] and row["trainer_exit_code"] is None
        old = time.time() - 7200  # a resumed job silent for two hours stalls all the same
        os.utime(run_dir / LOCAL_OUT, (old, old))
        assert collect([entry])[0]["state"] == "STALLED"
    finally:
        proc.kill()
        proc.wait()
    assert collect([entry])[0]["state"] == "DIVERGED"  # ended: the last attempt's word stands


def test_a_metrics_line_longer_than_the_tail_is_still_read(tmp_path):
    """`losses` holds one pair an iteration: a log interval of 12,000 writes a metrics line of ~300 KB, longer
    than the 256 KiB tail status reads first."""
    from primus_slurm.jobs import progress
    losses = [[i, 1 + i / 7] for i in range(1, 12001)]  # (a float of 17 digits, as a real loss)
    path = _events(tmp_path, 0, [{"event": "start", "t": 1000.0, "attempt": 0},
                                 {"event": "metrics", "t": 1001.0, "iteration": 12000, "train_iters": 24000,
                                  "lm_loss": 1.5, "ms_per_iter": 2.0, "losses": losses}])
    assert path.stat().st_size > progress.TAIL_BYTES
    p = read_progress(tmp_path)
    assert (p.iteration, p.train_iters, p.lm_loss, p.eta_s) == (12000, 24000, 1.5, 24.0)
