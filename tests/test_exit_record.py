"""The trainer records its exit code where the launcher reads it (trainer.runtime.signals.record_exit) before its
teardown: torchrun forwards a second SIGTERM, which the restored default handler turns into 143 while
destroy_distributed runs, and the launcher must still report the code the run ended with (seen under load in
test_exit_codes[slurm]: the log said exit 75, the job 143)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import ROOT

SCRIPT = """
import os, signal, sys
import trainer.runtime.distributed as dist
from trainer.__main__ import main

real = dist.destroy_distributed
def destroy():  # a SIGTERM arrives during the teardown, after the run's handlers are gone
    real()
    os.kill(os.getpid(), signal.SIGTERM)
dist.destroy_distributed = destroy
sys.exit(main(["--config", sys.argv[1], "--run-dir", sys.argv[2]]))
"""


def test_the_exit_code_is_recorded_before_the_teardown(tmp_path):
    from primus_slurm.config.recipe import dump, load_recipe
    from trainer.runtime.signals import EXIT_DIR_ENV

    r = load_recipe(str(ROOT / "recipes" / "quickstart.yaml"),  # a data path that is not there: a config error
                    [f"trainer.data.train.path={tmp_path / 'missing.jsonl'}", "trainer.checkpoint.pretrained=null",
                     f"experiment.workspace={tmp_path / 'ws'}"], env={})
    config = tmp_path / "recipe.resolved.yaml"
    config.write_text(dump(r.resolved))
    exits = tmp_path / "exits"
    exits.mkdir()
    env = {**os.environ, EXIT_DIR_ENV: str(exits), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(config), str(tmp_path / "run")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stderr[-2000:])  # killed in the teardown
    assert (exits / "0").read_text().strip() == "2", done.stderr[-2000:]  # EXIT_CONFIG, recorded before it
