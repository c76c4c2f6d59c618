"""pytest plugin of the GPU lifecycle suite (`-p lifecycle_report`, scripts/gpu-test.sh): a `record` fixture for
what a test measured, and one JSON document at the end (--lifecycle-json PATH): the commit, date, device and
versions, and each test's outcome, duration and records."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
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
    out = {"python": platform.python_version()}
    for name in ("torch", "megatron.core", "transformer_engine", "transformers", "peft"):
        try:
            module = __import__(name, fromlist=["__version__"])
            out[name] = getattr(module, "__version__", "?")
        except Exception as err:  # noqa: BLE001  (absent here: say so)
            out[name] = f"absent ({type(err).__name__})"
    try:  # for the stretch goal of a Slurm cluster on the device machine: which distribution's packages fit it
        out["os"] = next(line.split("=", 1)[1].strip().strip('"') for line in open("/etc/os-release")
                         if line.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        out["os"] = "unknown"
    out["slurm_on_path"] = bool(shutil.which("slurmd") or shutil.which("sbatch"))
    try:
        import torch

        out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        out["device"] = "unknown"
    return out


def pytest_sessionfinish(session, exitstatus):
    _write(session.config, int(exitstatus))


_VERSIONS: dict = {}


def _write(config, exitstatus) -> None:
    """The suite's JSON; exit_status None while it is still running (or was killed)."""
    path = config.getoption("--lifecycle-json")
    if not path:
        return
    if not _VERSIONS:
        _VERSIONS.update(_versions())
    root = Path(__file__).resolve().parents[2]
    commit = os.environ.get("PRIMUS_COMMIT") or _git_head(root)  # the device's copy of the tree has no .git
    doc = {"suite": "gpu lifecycle (tests/gpu)", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "commit": commit.strip() or "unknown (no git here)", "exit_status": exitstatus,
           "versions": _VERSIONS, "tests": _RESULTS}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")


def _git_head(root) -> str:
    """HEAD's commit, or "" where git or the repository is missing."""
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    except OSError:
        return ""
