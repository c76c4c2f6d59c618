"""Secrets (cluster.secrets: HF_TOKEN, WANDB_API_KEY) reach the job through the environment only: the job
sees them (tests/slurm_jobs/primus_secretjob.py prints their sha256), and no file of the run directory, the
registry, the rendered script, the logs or any CLI output contains their values."""
from __future__ import annotations

import hashlib
import secrets as pysecrets
from pathlib import Path

import pytest

from conftest import cli, wait_state
from reliability_support import submit, trainer_recipe

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_secrets_reach_the_job_but_no_file(executor, local_slurm, job_env, tmp_path):
    values = {"HF_TOKEN": "hf_" + pysecrets.token_hex(20), "WANDB_API_KEY": pysecrets.token_hex(20)}
    env = {**job_env, **values}
    recipe = trainer_recipe(tmp_path, "secrets", executor=executor, entrypoint="primus_secretjob")
    dry = cli(env, "submit", str(recipe), "--dry-run")
    entry = submit(env, recipe)
    row = wait_state(env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180, key="scheduler_state")
    assert row["state"] == "COMPLETED", row

    # the job saw both values
    stdout = cli(env, "logs", entry["run_id"], "--stdout").stdout
    for name, value in values.items():
        assert f"secret {name} sha256 {hashlib.sha256(value.encode()).hexdigest()}" in stdout, stdout[-2000:]

    # ... and nothing the launcher or the job wrote holds them
    run_dir = Path(entry["run_dir"])
    files = [p for folder in (run_dir, Path(env["PRIMUS_SLURM_STATE_DIR"])) for p in folder.rglob("*") if p.is_file()]
    assert len(files) > 10 and any("secret HF_TOKEN sha256" in p.read_text(errors="replace") for p in files)
    outputs = [dry.stdout, stdout, cli(env, "status", "--json").stdout, cli(env, "list", "--json").stdout,
               cli(env, "logs", entry["run_id"]).stdout, *(p.read_bytes().decode(errors="replace") for p in files)]
    assert "HF_TOKEN" in (run_dir / "job.sbatch").read_text()  # the script names the secret, nothing more
    for value in values.values():
        leaks = [i for i, text in enumerate(outputs) if value in text]
        assert not leaks, [str(files[i - 5]) if i >= 5 else f"output {i}" for i in leaks]
