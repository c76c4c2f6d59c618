"""scripts/local-slurm.sh and the squeue fallback, on the real local cluster."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import ROOT, cli, wait_state

pytestmark = pytest.mark.slurm
SCRIPT = str(ROOT / "scripts" / "local-slurm.sh")


def test_up_is_idempotent_and_status_reports_daemons(local_slurm):
    pids = {p.name: p.read_text() for p in (local_slurm / "run").glob("*.pid")}
    assert {"munged.pid", "slurmctld.pid", "slurmd-node1.pid", "slurmd-node2.pid"} <= set(pids)
    up = subprocess.run([SCRIPT, "up"], capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    assert {p.name: p.read_text() for p in (local_slurm / "run").glob("*.pid")} == pids  # nothing restarted
    status = subprocess.run([SCRIPT, "status"], capture_output=True, text=True)
    assert status.returncode == 0 and "slurmctld: running" in status.stdout
    assert "node1 idle" in status.stdout or "node1 mix" in status.stdout or "node1 alloc" in status.stdout
    for node in ("node1", "node2"):
        assert subprocess.run(["getent", "hosts", node], capture_output=True).returncode == 0


def test_status_falls_back_to_squeue_when_accounting_is_off(local_slurm, job_env, job_recipe, tmp_path):
    out = cli(job_env, "submit", str(job_recipe("ok", nodes=1)), "--json",
              "--set", 'cluster.extra_sbatch=["--hold"]')
    assert out.returncode == 0, out.stderr
    entry = json.loads(out.stdout)
    try:
        # what sacct says on a cluster with AccountingStorageType=accounting_storage/none
        shim = tmp_path / "bin"
        shim.mkdir()
        (shim / "sacct").write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n")
        (shim / "sacct").chmod(0o755)
        env = dict(job_env, PATH=f"{shim}:{job_env['PATH']}")
        row = wait_state(env, entry["run_id"], {"PENDING"}, timeout=20)
        assert row["state_source"] == "squeue"
    finally:
        assert cli(job_env, "cancel", entry["run_id"]).returncode == 0
    row = wait_state(job_env, entry["run_id"], {"CANCELLED"}, timeout=20)
    assert row["state_source"] in ("sacct", "squeue")


def test_sbatch_rejection_is_one_error_line_and_leaves_no_run(local_slurm, job_env, job_recipe):
    recipe = job_recipe("ok", partition="nosuchpartition")
    out = cli(job_env, "submit", str(recipe))
    assert out.returncode == 2, out
    assert out.stderr.startswith("error: sbatch rejected the job:") and len(out.stderr.splitlines()) == 1
    assert not list((recipe.parent / "ws").rglob("job.sbatch"))
    assert cli(job_env, "list", "--json").stdout.strip() == "[]"
