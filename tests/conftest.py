"""Shared fixtures: the project's real local Slurm cluster, an isolated job registry, and job recipes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import early_start

ROOT = Path(__file__).resolve().parent.parent
JOBS_DIR = ROOT / "tests" / "slurm_jobs"          # holds primus_testjob (cluster.entrypoint of job tests)
CLI = Path(sys.executable).parent / "primus-slurm"
# the installed command, else the package run from this tree (the GPU machine's copy, where nothing is pip-installed;
# the environment's PYTHONPATH then names the tree: tests/gpu/lifecycle_support.env_for)
CLI_ARGS = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "primus_slurm"]


# Markers by fixture, so `make check` (-m "not slurm and not container and not slow") cannot drift from what a test
# needs: a test that takes the local Slurm cluster is `slurm`, one that takes the podman image is `container`
# (tests that pick the cluster at run time with request.getfixturevalue mark themselves).
MARK_BY_FIXTURE = {"local_slurm": "slurm", "image": "container", "nomcore_image": "container",
                   "notorch_image": "container"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & MARK_BY_FIXTURE.keys():
            item.add_marker(MARK_BY_FIXTURE[fixture])
    # The modules that read the session's quickstart run (quickstart_started) go last, whole and in their order: the
    # run then has the whole session's idle CPU, not only what the tests before test_post_commands leave (a CI
    # simulation's test_post_commands waited 29 s for it in its setup).
    late = {item.path for item in items if "quickstart_run" in getattr(item, "fixturenames", ())}
    items[:] = [item for item in items if item.path not in late] + [item for item in items if item.path in late]


def _cluster_up() -> bool:
    if not shutil.which("scontrol"):
        return False
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return False
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True).stdout
    return "node1" in nodes and "node2" in nodes


@pytest.fixture(scope="session")
def local_slurm() -> Path:
    """The project's local cluster (scripts/local-slurm.sh), started if it is not running."""
    if not _cluster_up():
        if os.geteuid() != 0:
            pytest.skip("local Slurm cluster not running and starting it needs root")
        if not shutil.which("apt-get") and not shutil.which("slurmctld"):
            pytest.skip("local Slurm cluster not running and apt-get is unavailable to install it")
        up = subprocess.run([str(ROOT / "scripts" / "local-slurm.sh"), "up"], capture_output=True, text=True)
        assert up.returncode == 0, f"scripts/local-slurm.sh up failed:\n{up.stdout}\n{up.stderr}"
        assert _cluster_up(), "cluster started but node1/node2 are not in sinfo"
    return Path(os.environ.get("PRIMUS_SLURM_STATE", "/var/tmp/primus-local-slurm"))


@pytest.fixture
def job_env(tmp_path, monkeypatch) -> dict:
    """Environment for CLI calls: a private registry, and the test job module on PYTHONPATH."""
    state = tmp_path / "state"
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(state))
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(state), PYTHONPATH=str(JOBS_DIR))
    return env


@pytest.fixture
def job_recipe(tmp_path):
    """make(mode, **cluster) -> path of a recipe whose job is tests/slurm_jobs/primus_testjob.py."""
    def make(mode: str = "ok", name: str = "jobtest", **cluster) -> Path:
        body = {
            "extends": str(ROOT / "recipes" / "quickstart.yaml"),
            "experiment": {"name": name, "workspace": str(tmp_path / "ws")},
            "cluster": {"executor": "slurm", "nodes": 2, "nproc_per_node": 1, "exclusive": False,
                        "time": "00:05:00", "signal_grace_s": 10, "entrypoint": "primus_testjob",
                        "python": sys.executable, "env": {"PRIMUS_TEST_MODE": mode}, **cluster},
        }
        path = tmp_path / f"{name}-{mode.replace(':', '_')}-{len(list(tmp_path.glob('*.yaml')))}.yaml"
        path.write_text(json.dumps(body))  # JSON is YAML
        return path
    return make


def cli(env: dict, *args: str, timeout: float = 120, wrap: tuple = ()) -> subprocess.CompletedProcess:
    """`primus-slurm ARGS` (under the command `wrap`, e.g. ("unshare", "--net", "--"), when given)."""
    return subprocess.run([*wrap, *CLI_ARGS, *args], env=env, capture_output=True, text=True, timeout=timeout)


def local_training_run(tmp: Path, *sets: str, timeout: float = 1200, wrap: tuple = ()) -> tuple[dict, dict, Path]:
    """Submit the quickstart with the local executor (`--set` items `sets`; the submit, and so the job, under the
    command `wrap`) and wait until it ends with exit 0: (env, the submit's JSON entry, run directory). State and
    workspace live under `tmp`."""
    env = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp / "state"), PRIMUS_WORKSPACE=str(tmp / "ws"),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    out = cli(env, "submit", str(ROOT / "recipes" / "quickstart.yaml"), "--executor", "local", "--json",
              *[a for item in sets for a in ("--set", item)], "--set", f"trainer.data.cache_dir={tmp / 'cache'}",
              wrap=wrap)
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)
    run_dir = Path(entry["run_dir"])
    end = time.monotonic() + timeout
    while not (run_dir / "exit_code").exists():
        assert time.monotonic() < end, (run_dir / "logs" / "local.out").read_text()[-3000:]
        time.sleep(0.5)
    assert (run_dir / "exit_code").read_text().strip() == "0", (run_dir / "logs" / "local.out").read_text()[-3000:]
    return env, entry, run_dir


@pytest.fixture(scope="session", autouse=True)
def quickstart_started(request, tmp_path_factory):
    """`make quickstart` started when the session starts, if a selected test reads it (test_post_commands,
    test_quickstart_learns): its ~100 s of one-thread training then use the CPU the tests before it leave idle,
    instead of running alone when the first of them comes. Under SCHED_IDLE (early_start.py), so that it never
    slows them (at nice 10 a two-thread torch test beside it took 64 s instead of 28). None when no selected test
    needs it; else (env, a future of make_quickstart's result)."""
    if not any("quickstart_run" in getattr(item, "fixturenames", ()) for item in request.session.items):
        yield None
        return
    sys.path.insert(0, str(ROOT / "scripts"))
    from readme_numbers import job_env, make_quickstart  # what scripts/readme_numbers.py runs

    env = job_env(tmp_path_factory.mktemp("post"))
    with ThreadPoolExecutor(1, thread_name_prefix="quickstart") as pool:
        future = early_start.start_idle(pool, make_quickstart, env)
        yield env, future
        if not future.done():  # the session ended first (-x, an interrupt): stop the run, by its id, and wait
            early_start.cancel_started_run(cli, env, future, Path(env["PRIMUS_WORKSPACE"]))


@pytest.fixture(scope="session")
def quickstart_run(quickstart_started) -> tuple[dict, dict, Path]:
    """`make quickstart` itself, as a newcomer runs it (500 iterations, eval every 25, checkpoints at 250 and 500;
    state and workspace in a temporary folder), trained once per session (started early: quickstart_started, and
    at normal priority from the moment a test waits for it): (env, {run_id, run_dir}, run directory).
    test_post_commands (the README's numbers) and test_quickstart_learns (the curve falls) read this one run."""
    env, future = quickstart_started
    run_id, run_dir = early_start.result_at_normal_priority(future)
    return env, {"run_id": run_id, "run_dir": str(run_dir)}, run_dir


def status_json(env: dict, run_id: str) -> dict:
    out = cli(env, "status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_state(env: dict, run_id: str, states: set, timeout: float = 90, key: str = "state",
               every: float = 0.3, pause=time.sleep) -> dict:
    """Poll `status RUN --json` every `every` seconds until row[key] is in `states`; returns the row. `pause`: how
    to wait between polls (the GPU suite's stops at its deadline)."""
    end = time.monotonic() + timeout
    row = {}
    while time.monotonic() < end:
        row = status_json(env, run_id)
        if row.get(key) in states:
            return row
        pause(every)
    raise AssertionError(f"run {run_id} never reached {states}; last status: {row}")
