"""pytest plugin of the GPU lifecycle suite (`-p lifecycle_report`, scripts/gpu-test.sh): a `record` fixture for
what a test measured, and one JSON document at the end (--lifecycle-json PATH): the commit, date, device and
versions, and each test's outcome, duration and records."""
from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

_RESULTS: dict[str, dict] = {}


def pytest_addoption(parser):
    parser.addoption("--lifecycle-json", default=None, help="write the suite's JSON result here")


@pytest.fixture
def record(request):
    """record(**measured): kept with this test's outcome in the suite's JSON."""
    entry = _RESULTS.setdefault(request.node.nodeid, {})

    def add(**measured):
        entry.setdefault("measured", {}).update(measured)
    return add


_CONFIG: list = []


def pytest_configure(config):
    _CONFIG[:] = [config]
    signal.signal(signal.SIGINT, _interrupt_once)


def _interrupt_once(signum, frame):
    """GNU timeout sends its signal to pytest and then to pytest's process group, pytest included: the second
    SIGINT interrupted pytest's handling of the first, before the JSON was written (seen on the CPU, 2026-12-05)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def pytest_runtest_logreport(report):
    _record(report)
    if _CONFIG:  # after every test too: a suite killed at a device call's limit still leaves what had run
        _write(_CONFIG[0], None)


def _record(report):
    entry = _RESULTS.setdefault(report.nodeid, {})
    if report.when == "call" or report.outcome != "passed":
        entry.setdefault("outcome", report.outcome)
        if report.outcome == "failed":
            entry["outcome"] = "failed"
            entry["error"] = str(report.longrepr)[-2000:]
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            entry["reason"] = report.longrepr[2]
    entry["duration_s"] = round(entry.get("duration_s", 0) + report.duration, 1)


def _versions() -> dict:
    """Package versions from their metadata and the GPU's name from nvidia-smi: nothing imported, no CUDA context in
    pytest's process (the JSON is written while the fixture's runs still hold the GPU)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for label, dists in (("torch", ("torch",)), ("megatron.core", ("megatron-core", "megatron_core")),
                         ("transformer_engine", ("transformer-engine", "transformer_engine", "transformer-engine-cu13",
                                                 "transformer-engine-cu12")),
                         ("transformers", ("transformers",)), ("peft", ("peft",))):
        for dist in dists:
            try:
                out[label] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                out[label] = "absent"
    try:  # for the stretch goal of a Slurm cluster on the device machine: which distribution's packages fit it
        out["os"] = next(line.split("=", 1)[1].strip().strip('"') for line in open("/etc/os-release")
                         if line.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        out["os"] = "unknown"
    out["slurm_on_path"] = bool(shutil.which("slurmd") or shutil.which("sbatch"))
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30)
        out["device"] = smi.stdout.strip() or "cpu"
    except (OSError, subprocess.TimeoutExpired):
        out["device"] = "cpu (no nvidia-smi)"
    return out


_PROGRESS: dict[str, str] = {}


def progress(key: str, what: str) -> None:
    """What the lifecycle fixture's threads have done so far, in the JSON at once (a suite stopped inside its
    fixture has no test report yet)."""
    with _WRITING:
        _PROGRESS[key] = f"{time.strftime('%H:%M:%S')} {what}"
    if _CONFIG:
        _write(_CONFIG[0], None)


def pytest_sessionfinish(session, exitstatus):
    _write(session.config, int(exitstatus))


_VERSIONS: dict = {}


_WRITING = threading.Lock()  # the fixture's threads report progress at once


def _write(config, exitstatus) -> None:
    """The suite's JSON; exit_status None while it is still running (or was killed)."""
    path = config.getoption("--lifecycle-json")
    if not path:
        return
    with _WRITING:
        _write_locked(path, exitstatus)


def _write_locked(path: str, exitstatus) -> None:
    if not _VERSIONS:
        _VERSIONS.update(_versions())
    root = Path(__file__).resolve().parents[2]
    commit = os.environ.get("PRIMUS_COMMIT") or _git_head(root)  # the device's copy of the tree has no .git
    doc = {"suite": "gpu lifecycle (tests/gpu)", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "commit": commit.strip() or "unknown (no git here)", "exit_status": exitstatus,
           "versions": _VERSIONS, "fixture": _PROGRESS, "tests": _RESULTS}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")  # replaced whole: a kill mid-write leaves the previous JSON
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def _git_head(root) -> str:
    """HEAD's commit, or "" where git or the repository is missing."""
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    except OSError:
        return ""
