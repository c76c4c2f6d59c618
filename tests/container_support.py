"""Helpers for tests/test_container_*.py (no tests here): the local CPU image (scripts/container-image.sh builds it
once and caches it), recipes whose Slurm job runs the real trainer inside it, and what podman knows of a job."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from reliability_support import trainer_recipe

DATA = ROOT / "recipes" / "data"  # the quickstart's tokenizer, data and base: the recipe's `mounts` bring them in
IMAGE_SCRIPT = ROOT / "scripts" / "container-image.sh"
SECRET_NAME = "HF_TOKEN"


def _build() -> str:
    if os.geteuid() != 0:
        pytest.skip("container tests need root (podman, /etc/containers, debootstrap)")
    if not shutil.which("apt-get") and not shutil.which("podman"):
        pytest.skip("container tests need podman, and apt-get is unavailable to install it")
    out = subprocess.run([str(IMAGE_SCRIPT)], capture_output=True, text=True, timeout=850)
    assert out.returncode == 0, f"scripts/container-image.sh failed:\n{out.stdout}\n{out.stderr[-3000:]}"
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def image() -> str:
    """localhost/primus-cpu:<hash>: Debian, python3 and the trainer's pinned stack."""
    return _build()


@pytest.fixture(scope="session")
def nomcore_image(image) -> str:
    """The same image without megatron-core (the preflight's negative case)."""
    return image.replace("primus-cpu:", "primus-cpu-nomcore:")


@pytest.fixture(scope="session")
def notorch_image(image) -> str:
    """The same image without torch, PyYAML and the rest kept: the commonest wrong image. Derived here in seconds
    (pip uninstall in a container, podman commit) rather than built; older hashes' copies are removed."""
    tag = image.replace("primus-cpu:", "primus-cpu-notorch:")
    listed = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                            text=True, timeout=60).stdout.split()
    for old in listed:
        if old.startswith("localhost/primus-cpu-notorch:") and old != tag:
            subprocess.run(["podman", "rmi", "-f", old], capture_output=True, timeout=120)
    if tag not in listed:
        box = f"primus-notorch-build-{os.getpid()}"
        subprocess.run(["podman", "run", "--name", box, "--network", "none", image, "python3", "-m", "pip",
                        "uninstall", "-q", "-y", "torch"], check=True, capture_output=True, timeout=300)
        subprocess.run(["podman", "commit", "-q", box, tag], check=True, capture_output=True, timeout=300)
        subprocess.run(["podman", "rm", "-f", box], capture_output=True, timeout=60)
    return tag


def container_recipe(tmp_path: Path, name: str, image: str, runtime: str = "podman", **cluster) -> Path:
    """trainer_recipe (one node, one rank, the real trainer) run inside IMAGE by RUNTIME: the image's python3,
    the quickstart's data mounted read-only at the same path."""
    container = {"runtime": runtime, "image": image, "mounts": [f"{DATA}:{DATA}:ro"], **cluster.pop("container", {})}
    return trainer_recipe(tmp_path, name, python="python3", container=container, **cluster)


def job_containers(job_id: str, everything: bool = True) -> list[dict]:
    """[{name, state, labels}] of the containers podman has for Slurm job JOB_ID (running or not)."""
    out = subprocess.run(["podman", "ps", *(["-a"] if everything else []), "--filter",
                          f"label=primus-slurm.job={job_id}", "--format", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout or "[]")
    return [{"name": (r.get("Names") or ["?"])[0], "state": r.get("State"), "labels": r.get("Labels") or {}}
            for r in rows]


def host_pid_namespace() -> str:
    return os.readlink("/proc/self/ns/pid").strip("pid:[]")


def remove_job_containers(*job_ids: str) -> None:
    """Test cleanup: whatever a failed test left behind."""
    for job in job_ids:
        for c in job_containers(job):
            subprocess.run(["podman", "rm", "-f", c["name"]], capture_output=True, timeout=60)
