"""The commonest wrong setting, an interpreter without torch (`cluster.python` pointing at the system Python): the
job's preflight, `primus-slurm preflight` and `submit --follow` each give one `interpreter PATH lacks torch` line
and exit 2, and `status` shows it. The interpreter is real: a venv holding PyYAML (so the preflight reads the
recipe, the path that once imported torch through trainer.precision) and nothing of the trainer's stack."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from conftest import ROOT, cli, status_json

QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")
LACKS = "lacks torch (needs torch >=2.6)"


def _python_without_torch(tmp_path: Path) -> str:
    venv = tmp_path / "no-torch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "yaml").symlink_to(Path(yaml.__file__).parent)  # PyYAML only (pure Python without its C loader)
    return str(venv / "bin" / "python")


def test_an_interpreter_without_torch_is_one_line_everywhere(tmp_path):
    python = _python_without_torch(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PRIMUS_SLURM_STATE_DIR": str(tmp_path / "state"),
           "PRIMUS_WORKSPACE": str(tmp_path / "ws")}
    direct = subprocess.run([python, "-m", "trainer.runtime.preflight", "--config", QUICKSTART], cwd=ROOT, text=True,
                            capture_output=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert direct.returncode == 2 and direct.stdout == "", direct.stderr
    assert direct.stderr.startswith(f"preflight: interpreter {python} {LACKS}") and direct.stderr.count("\n") == 1

    sets = ("--executor", "local", "--set", f"cluster.python={python}")
    pre = cli(env, "preflight", QUICKSTART, *sets)
    assert pre.returncode == 2 and pre.stdout == "", pre.stdout + pre.stderr
    assert pre.stderr.startswith(f"error: interpreter {python} {LACKS}") and pre.stderr.count("\n") == 1

    run = cli(env, "submit", QUICKSTART, "--follow", *sets)
    assert run.returncode == 2 and "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert f"config error | interpreter {python} {LACKS}" in run.stdout
    run_id = run.stdout.split()[2]
    row = status_json(env, run_id)
    assert row["state"] == "FAILED" and row["trainer_exit_code"] == 2, row
    assert row["error"].startswith(f"config error | interpreter {python} {LACKS}"), row
    assert f"{run_id}: config error | interpreter {python} {LACKS}" in cli(env, "status", run_id).stdout
