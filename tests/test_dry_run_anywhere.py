"""`submit --dry-run` and `render` work on a machine without Slurm: PATH is rebuilt without the Slurm binaries
(each PATH directory holding one is replaced by a directory of links to its other programs), and the script is the
one a machine with sbatch renders, plus one note line on stderr. Only a real submit needs sbatch."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, cli

SLURM_BINARIES = ("sbatch", "srun", "squeue", "sacct", "scontrol", "scancel", "sinfo")
FP4 = str(ROOT / "recipes" / "llama2_70b_fp4.yaml")
QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")
RUN_ID = "20261202-120000-abcdef"


def path_without_slurm(tmp: Path) -> str:
    """os.environ's PATH with every directory that holds a Slurm binary replaced by links to the rest of it."""
    dirs = []
    for i, d in enumerate(p for p in os.environ.get("PATH", "").split(os.pathsep) if p):
        here = Path(d)
        if not any((here / name).exists() for name in SLURM_BINARIES):
            dirs.append(d)
            continue
        farm = tmp / f"path-{i}"
        farm.mkdir()
        for entry in here.iterdir():
            if entry.name not in SLURM_BINARIES:
                (farm / entry.name).symlink_to(entry)
        dirs.append(str(farm))
    path = os.pathsep.join(dirs)
    for name in SLURM_BINARIES:
        assert shutil.which(name, path=path) is None, name
    assert shutil.which("bash", path=path), "the stripped PATH still has the rest of the machine"
    return path


@pytest.fixture
def envs(tmp_path):
    """(environment without Slurm, ordinary environment), each with a private registry and workspace."""
    base = dict(os.environ, PRIMUS_SLURM_STATE_DIR=str(tmp_path / "state"), PRIMUS_WORKSPACE=str(tmp_path / "ws"))
    return dict(base, PATH=path_without_slurm(tmp_path)), base


def test_dry_run_renders_the_slurm_script_without_sbatch(envs, tmp_path):
    bare, ordinary = envs
    out = cli(bare, "submit", FP4, "--dry-run", "--run-id", RUN_ID)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=llama2-70b-fp4\n")
    assert "srun" in out.stdout
    note = out.stderr.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("note: `sbatch` is not on PATH here"), out.stderr
    # the same text a machine with Slurm renders for that run id (there: no note)
    same = cli(ordinary, "submit", FP4, "--dry-run", "--run-id", RUN_ID)
    assert same.returncode == 0, same.stderr
    assert same.stdout == out.stdout
    if shutil.which("sbatch", path=ordinary["PATH"]):
        assert same.stderr == ""
    assert not (tmp_path / "ws").exists() and not (tmp_path / "state").exists()  # a dry run writes nothing


def test_render_renders_the_slurm_script_without_sbatch(envs):
    bare, ordinary = envs
    out = cli(bare, "render", FP4)
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --signal=B:USR2@" in out.stdout
    assert out.stderr.startswith("note: `sbatch` is not on PATH here") and out.stderr.count("\n") == 1
    assert out.stdout == cli(ordinary, "render", FP4).stdout


def test_auto_executor_without_sbatch_says_which_script_it_renders(envs):
    bare, _ = envs
    out = cli(bare, "submit", QUICKSTART, "--set", "cluster.executor=auto", "--dry-run")  # its data is here
    assert out.returncode == 0, out.stderr
    assert "#SBATCH" not in out.stdout and "(local executor" in out.stdout
    assert out.stderr.count("\n") == 1 and "auto renders the local executor's script" in out.stderr
    slurm = cli(bare, "render", QUICKSTART, "--set", "cluster.executor=auto", "--executor", "slurm")
    assert slurm.returncode == 0 and "#SBATCH --job-name=quickstart" in slurm.stdout, slurm.stderr
    assert slurm.stderr.startswith("note: `sbatch` is not on PATH here; this is the Slurm script")


def test_a_real_submit_still_needs_sbatch(envs, tmp_path):
    bare, _ = envs
    out = cli(bare, "submit", FP4)
    assert out.returncode == 2
    assert out.stderr == "error: cluster.executor is 'slurm' but `sbatch` is not on PATH; use --executor local\n"
    assert out.stdout == ""
    assert not (tmp_path / "ws").exists() and not (tmp_path / "state").exists()  # no run directory, no registry


def test_a_local_job_says_which_slurm_options_it_does_not_apply(envs):
    """Slurm-only cluster keys the recipe sets (not their defaults) have nothing to act on in a local job: the submit
    says so in one note line (the dry run here; a real submit prints the same line after submitting)."""
    _, ordinary = envs
    out = cli(ordinary, "submit", QUICKSTART, "--executor", "local", "--dry-run", "--set", "cluster.time=00:10:00",
              "--set", "cluster.partition=gpu")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ("note: the local executor applies no Slurm option: cluster.time, cluster.partition take "
                          "effect under --executor slurm only\n")
    plain = cli(ordinary, "submit", QUICKSTART, "--executor", "local", "--dry-run")
    assert plain.returncode == 0 and "Slurm option" not in plain.stderr, plain.stderr
