"""The preflight (trainer/runtime/preflight.py): before training, every job checks its interpreter's stack; a missing or
unsupported package is one line that `status` shows, exit 2, no traceback. `primus-slurm preflight RECIPE` runs
the same check in the recipe's container or interpreter (locally or as a short Slurm job) plus a timed all-reduce.

Real interpreters throughout: the project image, its twin without megatron-core (scripts/container-image.sh), an
empty venv, and a venv holding a real (installed-metadata) megatron-core of an unsupported version."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, cli, status_json, wait_state
from container_support import DATA, container_recipe, image, nomcore_image, notorch_image  # noqa: F401 (fixtures)
from reliability_support import read, submit, trainer_recipe

pytestmark = [pytest.mark.slurm]
PODMAN = ["--set", "cluster.container.runtime=podman", "--set", "cluster.python=python3",
          "--set", f'cluster.container.mounts=["{DATA}:{DATA}:ro"]', "--set", "cluster.env.OMP_NUM_THREADS=1"]


def _venv(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder


def _fake_dist(venv: Path, dist: str, module: str, version: str) -> None:
    """An installed distribution as importlib sees one: the package and its .dist-info METADATA."""
    site = next(venv.glob("lib/python*/site-packages"))
    pkg = site.joinpath(*module.split("."))
    pkg.mkdir(parents=True)
    for parent in [pkg, *pkg.relative_to(site).parents]:
        if str(parent) != ".":
            (site / parent / "__init__.py").touch()
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")


def _preflight(python: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "trainer.runtime.preflight", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, timeout=120)


def test_checks_versions_and_te_from_the_recipe(tmp_path):
    venv = _venv(tmp_path, "old-mcore")
    _fake_dist(venv, "megatron-core", "megatron.core", "0.15.0")
    _fake_dist(venv, "torch", "torch", "2.13.0")
    rep = _preflight(str(venv / "bin" / "python"), "--report")
    assert rep.returncode == 2 and "Traceback" not in rep.stderr
    lines = {line.split()[2]: line for line in rep.stdout.splitlines()}
    assert lines["torch"].endswith(" ok") and "PROBLEM: has megatron-core 0.15.0 (needs megatron-core >=0.16,<0.20)" \
        in lines["megatron-core"], rep.stdout
    assert rep.stderr.count("\n") == 1 and "has megatron-core 0.15.0" in rep.stderr  # one line

    fp8 = tmp_path / "fp8.yaml"
    fp8.write_text(json.dumps({"trainer": {"precision": {"bf16": True, "fp8": "hybrid"}}}))
    out = _preflight(sys.executable, "--config", str(fp8))  # the suite's venv: torch + megatron-core, no TE
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == f"preflight: interpreter {sys.executable} lacks transformer-engine (needs " \
                                 "transformer-engine >=2.9 for fp8: hybrid)", out.stderr
    ok = _preflight(sys.executable, "--", sys.executable, "-c", "print('exec ok')")
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == "exec ok"
    assert "megatron-core 0.16.1 | transformer-engine not needed" in ok.stdout


def test_bare_metal_job_without_torch_fails_in_one_line(local_slurm, job_env, tmp_path):
    venv = _venv(tmp_path, "empty")
    recipe = trainer_recipe(tmp_path, "bare-empty", python=str(venv / "bin" / "python"))
    entry = submit(job_env, recipe)
    row = wait_state(job_env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180,
                     key="scheduler_state")
    out = read(Path(entry["run_dir"]) / "logs" / f"slurm-{entry['job_id']}.out")
    assert row["state"] == "FAILED" and row["trainer_exit_code"] == 2, row
    assert row["error"].startswith(f"config error | interpreter {venv}/bin/python lacks torch (needs torch >=2.6)"), row
    assert "Traceback" not in out and "torch.distributed.run" not in out, out[-2000:]


def test_job_in_an_image_without_megatron_core(nomcore_image, local_slurm, job_env, tmp_path):  # noqa: F811
    recipe = container_recipe(tmp_path, "nomcore", nomcore_image)
    entry = submit(job_env, recipe)
    row = wait_state(job_env, entry["run_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240,
                     key="scheduler_state")
    out = read(Path(entry["run_dir"]) / "logs" / f"slurm-{entry['job_id']}.out")
    assert row["state"] == "FAILED", (row, out[-2000:])
    assert row["error"] == f"config error | image {nomcore_image} lacks megatron-core (needs megatron-core " \
                           ">=0.16,<0.20)", row
    assert "Traceback" not in out, out[-3000:]
    shown = cli(job_env, "status", entry["run_id"]).stdout
    assert f"image {nomcore_image} lacks megatron-core" in shown, shown
    assert status_json(job_env, entry["run_id"])["trainer_exit_code"] == 2


def test_an_image_without_torch_is_one_line(notorch_image, job_env, tmp_path):  # noqa: F811
    """The commonest wrong image: PyYAML and the rest, no torch. The preflight read the recipe through
    trainer.precision, which imported torch: a 17-line traceback and FAILED 1 with no reason (issue 33 item 1)."""
    recipe = container_recipe(tmp_path, "notorch", notorch_image, executor="local")
    run = cli(job_env, "submit", str(recipe), "--follow", timeout=300)
    line = f"config error | image {notorch_image} lacks torch (needs torch >=2.6)"
    assert run.returncode == 2 and line in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stdout + run.stderr
    row = status_json(job_env, run.stdout.split()[2])
    assert row["state"] == "FAILED" and row["trainer_exit_code"] == 2 and row["error"] == line, row


@pytest.mark.slow
def test_preflight_command_in_the_image_on_two_nodes_and_without_megatron_core(image, nomcore_image, local_slurm,  # noqa: F811
                                                                               job_env, tmp_path):
    env = {**job_env, "PRIMUS_WORKSPACE": str(tmp_path / "ws")}
    good = cli(env, "preflight", "quickstart", "--executor", "slurm", *PODMAN, "--set", f"cluster.container.image={image}",
               "--set", "cluster.nodes=2", "--set", "cluster.exclusive=false", timeout=400)
    assert good.returncode == 0, good.stdout + good.stderr
    lines = good.stdout.splitlines()
    pre = [line for line in lines if line.startswith("preflight | ")]
    assert len(pre) == 2 and all(f"container podman (/run/.containerenv) | image {image}" in p for p in pre), lines
    assert all("torch 2.13.0+cpu | megatron-core 0.16.1 | transformer-engine not needed" in p for p in pre)
    reduce = [line for line in lines if line.startswith("all-reduce | ")]
    assert len(reduce) == 1 and "backend gloo | ranks 2 | nodes 2 |" in reduce[0] and "result ok" in reduce[0]
    assert float(reduce[0].split("busbw ")[1].split()[0]) > 0

    bad = cli(env, "preflight", "quickstart", "--executor", "local", *PODMAN,
              "--set", f"cluster.container.image={nomcore_image}", timeout=300)
    assert bad.returncode == 2 and bad.stdout == "", bad.stdout + bad.stderr
    assert bad.stderr == f"error: image {nomcore_image} lacks megatron-core (needs megatron-core >=0.16,<0.20)\n"
