"""The preflight's all-reduce entrypoint (trainer/runtime/preflight_comm.py) on the CPU, world size 1: the
recipe's `trainer.distributed.backend` as the trainer reads it. `auto` (every GPU preset's value) reached
init_process_group as the string "auto" and failed (AssertionError: Unknown backend type auto; audit, 2026-12-05)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from tests.model_helpers import free_port


@pytest.mark.parametrize("backend", ["auto", None])
def test_the_all_reduce_runs_with_the_trainers_backend_rule(tmp_path, backend):
    dist = {"device": "cpu", **({} if backend is None else {"backend": backend})}
    config = tmp_path / "recipe.resolved.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"distributed": dist}}))
    env = {"PATH": "/usr/bin:/bin", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "trainer.runtime.preflight_comm", "--config", str(config),
                          "--run-dir", str(tmp_path), "--mib", "1"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("all-reduce | backend gloo | ranks 1 |") and "result ok" in out.stdout, out.stdout
