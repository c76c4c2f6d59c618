"""20 `primus-slurm submit` processes of the same recipe at once, against the real local cluster (jobs held
with `--hold`, cancelled afterwards): 20 run dirs, 20 job ids, 20 different MASTER_PORTs as the rendered
formula computes them from the job ids, an intact registry, and no run's files mixed into another's."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import CLI, cli
from primus_slurm.jobs import registry
from reliability_support import cancel, trainer_recipe

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
N = 20


def _master_port(script: str, job_id: str) -> int:
    """Run the script's own MASTER_PORT line with JOB_ID set as the job would have it."""
    line = next(ln for ln in script.splitlines() if ln.startswith("MASTER_PORT=$(("))
    out = subprocess.run(["bash", "-c", f"JOB_ID={job_id}\n{line}\necho $MASTER_PORT"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_twenty_parallel_submits(local_slurm, job_env, tmp_path):
    recipe = trainer_recipe(tmp_path, "burst", extra_sbatch=["--hold"])
    procs = [subprocess.Popen([str(CLI), "submit", str(recipe), "--json"], env=job_env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(N)]
    results = [(*p.communicate(timeout=600), p.returncode) for p in procs]
    entries = [json.loads(out) for out, _, rc in results if rc == 0]
    try:
        assert [rc for *_, rc in results] == [0] * N, [err for _, err, rc in results if rc][:3]
        job_ids = [e["job_id"] for e in entries]
        run_ids = [e["run_id"] for e in entries]
        assert len(set(job_ids)) == len(set(run_ids)) == len({e["run_dir"] for e in entries}) == N

        queue = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T %r"], capture_output=True,
                               text=True).stdout.split("\n")
        held = {line.split()[0] for line in queue if line.endswith("PENDING JobHeldUser")}
        assert held == set(job_ids), queue

        # the registry: N intact JSON lines, one per run, agreeing with `list`
        lines = (Path(job_env["PRIMUS_SLURM_STATE_DIR"]) / registry.FILE_NAME).read_text().splitlines()
        assert sorted(json.loads(line)["run_id"] for line in lines) == sorted(run_ids)
        listed = json.loads(cli(job_env, "list", "--json").stdout)
        assert {(e["run_id"], e["job_id"]) for e in listed} == set(zip(run_ids, job_ids))

        # each run dir is its own: run.json, the script and the submitted file name this run and this job
        ports, templates = {}, set()
        for e in entries:
            run_dir = Path(e["run_dir"])
            info = json.loads((run_dir / "run.json").read_text())
            assert (info["run_id"], info["job_id"], info["run_dir"]) == (e["run_id"], e["job_id"], e["run_dir"])
            assert Path(info["submitted_file"]).is_relative_to(run_dir)
            script = (run_dir / "job.sbatch").read_text()
            assert f"RUN_DIR={run_dir}\n" in script and f"PRIMUS_RUN_ID={e['run_id']}\n" in script
            templates.add(script.replace(str(run_dir), "RUN_DIR").replace(e["run_id"], "RUN_ID"))
            ports[e["job_id"]] = _master_port(script, e["job_id"])
        assert len(templates) == 1  # the scripts differ only in their own run id and run dir
        assert ports == {j: 12000 + int(j) % 20000 for j in job_ids}
        assert len(set(ports.values())) == N
    finally:
        cancel(*[e["job_id"] for e in entries])
