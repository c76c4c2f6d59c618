"""Planned against measured: a real local quickstart run (the trainer on CPU) records peak memory and tokens/s in its
events; `status RUN` and `compare` put the plan of its recipe.resolved.yaml next to them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from primus_contract import run_files

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "primus_slurm"]


@pytest.mark.slow  # ~20 s on two cores under load: `make test` runs it, `make check` does not
def test_status_and_compare_show_planned_against_measured(tmp_path):
    env = {"PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_SLURM_STATE_DIR": str(tmp_path / "state"),
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    sets = ["trainer.schedule.train_iters=6", "trainer.schedule.eval_interval=null",
            "trainer.checkpoint.save_interval=null", "trainer.checkpoint.disable_last_saving=true",
            "trainer.checkpoint.export_peft=false", "trainer.logging.log_interval=2",
            "trainer.logging.log_avg_skip_iterations=1"]
    out = subprocess.run([*CLI, "submit", "recipes/quickstart.yaml", "--executor", "local", "--follow", "--json",
                          *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    entry = json.loads(out.stdout[out.stdout.index("{"):out.stdout.rindex("}") + 1])
    run_dir = Path(entry["run_dir"])
    events = run_files.read_events(run_dir / "logs" / "rank-0" / run_files.events_name(0))
    metrics = [e for e in events if e.get("event") == "metrics"]
    summary = [e for e in events if e.get("event") == "summary"]
    assert metrics and all(e["mem_peak_gib"] > 0 and e["tokens_per_s_gpu"] > 0 for e in metrics)
    assert summary and summary[-1]["mem_peak_gib"] > 0 and summary[-1]["tokens_per_s_gpu"] > 0

    status = subprocess.run([*CLI, "status", entry["run_id"]], capture_output=True, text=True, cwd=ROOT, env=env)
    assert status.returncode == 0, status.stderr
    assert "plan" not in status.stdout.lower(), status.stdout  # a CPU run: no GPU plan applies, none is shown
    as_json = json.loads(subprocess.run([*CLI, "status", entry["run_id"], "--json"], capture_output=True, text=True,
                                        cwd=ROOT, env=env).stdout)
    plan = as_json["plan"]
    assert plan["planned_peak_gib"] > 0 and plan["measured_peak_gib"] == metrics[-1]["mem_peak_gib"]
    assert plan["measured_tokens_per_s_gpu"] == summary[-1]["tokens_per_s_gpu"]

    cmp = subprocess.run([*CLI, "compare", entry["run_id"], entry["run_id"]], capture_output=True, text=True,
                         cwd=ROOT, env=env)
    assert cmp.returncode == 0, cmp.stderr
    assert "plan" not in cmp.stdout.lower(), cmp.stdout

    # on a GPU the line is there: the run's own measurements against the plan of a GPU layout of its recipe
    resolved = (run_dir / run_files.RESOLVED).read_text().replace("gpus_per_node: 0", "gpus_per_node: 1")
    (run_dir / run_files.RESOLVED).write_text(resolved.replace("device: cpu", "device: cuda"))
    status = subprocess.run([*CLI, "status", entry["run_id"]], capture_output=True, text=True, cwd=ROOT, env=env)
    line = [x for x in status.stdout.splitlines() if x.startswith("plan vs measured: peak ")]
    assert len(line) == 1 and "planned /" in line[0] and "measured GiB" in line[0], status.stdout
