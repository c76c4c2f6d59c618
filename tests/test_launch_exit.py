"""trainer.runtime.launch: the node's exit code after torchrun was stopped by a signal (the job script's forwarded
time-limit warning, a cancel) is the workers' own, read from what each recorded. (wait_s=0: the launcher waits for
its own children, the workers; pytest's children are other tests' processes.)"""
import os
import signal

from trainer.runtime.launch import after_signal

TERM = int(signal.SIGTERM)


def _record(folder, codes: dict) -> None:
    for rank, code in codes.items():
        with open(os.path.join(folder, str(rank)), "w") as fh:
            fh.write(f"{code}\n")


def test_every_worker_finished_before_the_signal_is_success(tmp_path):
    # the warning landed while torchrun tore down a finished run: the job read FAILED (143) before this
    _record(tmp_path, {0: 0, 1: 0})
    assert after_signal(str(tmp_path), TERM, workers=2, wait_s=0) == 0


def test_a_stopped_worker_gives_its_own_code(tmp_path):
    _record(tmp_path, {0: 0, 1: 75})
    assert after_signal(str(tmp_path), TERM, workers=2, wait_s=0) == 75


def test_a_worker_that_never_said_gives_the_signal(tmp_path):
    _record(tmp_path, {0: 0})  # local rank 1 was killed before it could record
    assert after_signal(str(tmp_path), TERM, workers=2, wait_s=0) == 128 + TERM
    empty = tmp_path / "empty"
    empty.mkdir()
    assert after_signal(str(empty), TERM, workers=1, wait_s=0) == 128 + TERM


def test_signal_during_teardown_of_a_finished_worker(tmp_path):
    """A real torchrun: the worker records 0 (training finished), then lingers as in teardown; the stop signal
    reaches the launcher then. The node's code is 0, not 143."""
    import subprocess
    import sys
    import time

    worker = tmp_path / "worker.py"
    flag = tmp_path / "recorded"
    worker.write_text(
        "import pathlib, sys, time\n"
        "from trainer.runtime.signals import record_exit\n"
        f"record_exit(0); pathlib.Path({str(flag)!r}).touch()\n"
        "time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "trainer.runtime.launch", "--standalone", "--nproc-per-node", "1",
                             str(worker)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert flag.exists(), proc.stdout.read() if proc.poll() is not None else "worker never recorded"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopped by SIGTERM; workers exited with code 0" in out


def test_a_second_signal_inside_a_log_call_prints_no_traceback():
    """The second SIGTERM of a cancel can land while torchrun's agent logs the first: the signal handler raises
    inside the log call. After the launcher's setting, logging drops that record without a traceback (a fresh
    interpreter: the setting is process-wide)."""
    import subprocess
    import sys

    code = """
import logging, signal, sys
from trainer.runtime.launch import quiet_logging_errors
class Stop(Exception):
    pass
def handler(signum, frame):
    raise Stop(signum)
signal.signal(signal.SIGTERM, handler)
class Raising(logging.Formatter):
    def format(self, record):
        signal.raise_signal(signal.SIGTERM)  # the second signal, inside the log call
        return super().format(record)
h = logging.StreamHandler(sys.stderr)
h.setFormatter(Raising())
log = logging.getLogger("agent")
log.addHandler(h)
if sys.argv[1] == "quiet":
    quiet_logging_errors()
log.warning("Received %s death signal, shutting down workers", 15)
print("continued")
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, cwd=root,
                                 timeout=60) for mode in ("loud", "quiet")}
    assert "Traceback" in runs["loud"].stderr  # what the job output showed (the test can fail)
    assert runs["quiet"].returncode == 0 and "continued" in runs["quiet"].stdout
    assert "Traceback" not in runs["quiet"].stderr and "Logging error" not in runs["quiet"].stderr
