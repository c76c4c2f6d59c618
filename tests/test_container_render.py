"""Host options of a docker/podman job are decided per node and per vendor, not hard-coded: infiniband only where
/dev/infiniband exists, rlimits only where the runtime may set them, the GPU options of the profile's vendor in the
runtime's own syntax, the shm size the recipe asks for; secrets never as `-e`. (The container tests run these
scripts for real on a node without infiniband or CAP_SYS_RESOURCE, which the old fixed options could not start on.)"""
from __future__ import annotations

import re

import pytest

from primus_slurm.config.recipe import load_recipe
from primus_slurm.config.render import render_script

RUN = "/tmp/ws/x/20261130-000000-abcdef"


def _script(runtime: str, profile: str, *sets: str) -> str:
    gpus = 0 if profile == "cpu" else 8
    r = load_recipe("quickstart", [f"cluster.container.runtime={runtime}", "cluster.container.image=localhost/i:1",
                                   f"cluster.env_profile={profile}", f"cluster.gpus_per_node={gpus}",
                                   "cluster.exclusive=true", "cluster.executor=slurm",
                                   "trainer.distributed.device=" + ("cpu" if profile == "cpu" else "cuda"),
                                   "trainer.distributed.backend=" + ("gloo" if profile == "cpu" else "nccl"),
                                   *sets], env={})
    return render_script(r.resolved, RUN, "20261130-000000-abcdef", "slurm")


def _container_args(script: str) -> str:
    return re.search(r"^CONTAINER=\($(.*?)^\)$", script, re.M | re.S).group(1)


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_node_decides_infiniband_and_rlimits(runtime):
    script = _script(runtime, "cpu", "cluster.container.shm_size=7g")
    args = _container_args(script)
    assert "infiniband" not in args and "--ulimit" not in args and "--ipc" not in args
    assert "[ -e /dev/infiniband ] && host+=(--device /dev/infiniband)" in script
    assert re.search(r"CapEff.*>> 24 & 1 .*host\+=\(--ulimit memlock=-1 --ulimit stack=67108864\)", script)
    assert "--shm-size 7g" in args
    assert "-e HF_TOKEN" not in args and "-e WANDB_API_KEY" not in args and "-e PYTHONPATH" in args
    assert "--env-stdin --" in script


@pytest.mark.parametrize("runtime,profile,wanted,unwanted", [
    ("podman", "h100", ["--device nvidia.com/gpu=all"], ["--gpus", "/dev/kfd"]),
    ("docker", "h200", ["--gpus all"], ["nvidia.com/gpu", "/dev/kfd"]),
    ("podman", "mi300x", ["--device /dev/kfd --device /dev/dri --group-add video"], ["--gpus", "nvidia.com"]),
    ("docker", "mi355x", ["--device /dev/kfd --device /dev/dri --group-add video"], ["--gpus", "nvidia.com"]),
    ("podman", "cpu", [], ["--gpus", "nvidia.com", "/dev/kfd"]),
])
def test_gpu_options_follow_the_vendor_and_runtime(runtime, profile, wanted, unwanted):
    args = _container_args(_script(runtime, profile))
    for flag in wanted:
        assert flag in args, args
    for flag in unwanted:
        assert flag not in args, args
