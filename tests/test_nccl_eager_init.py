"""trainer.distributed.nccl_eager_init: the device binding init_process_group gets (torch makes every NCCL
communicator eagerly once the default group is bound to a GPU, megatron's 20 groups' included; unbound, each at its
group's first collective). bench/nccl_groups_memory.py measures the GPU memory either way."""
from __future__ import annotations

import torch

from primus_slurm.config.recipe import deep_merge
from primus_slurm.config.schema import apply_schema
from tests.model_helpers import TINY
from trainer.config import Config
from trainer.runtime.distributed import init_kwargs


def test_the_key_defaults_to_lazy_and_reaches_the_trainer_config():
    """lazy by default: on an H100 the trainer held 8.88 GiB outside PyTorch eagerly, 0.73 lazily (world size 1,
    bench/results/2026-12-05c_h100_levers/nccl_groups.jsonl)."""
    off = Config.from_dict(apply_schema(deep_merge(TINY, {})))
    on = Config.from_dict(apply_schema(deep_merge(TINY, {"trainer": {"distributed": {"nccl_eager_init": True}}})))
    assert on.trainer.distributed.nccl_eager_init is True and off.trainer.distributed.nccl_eager_init is False


def test_only_nccl_with_the_key_on_binds_the_device():
    gpu = torch.device("cuda", 3)
    assert init_kwargs("nccl", gpu, True) == {"device_id": gpu}
    assert init_kwargs("nccl", gpu, False) == {}
    assert init_kwargs("gloo", torch.device("cpu"), True) == {}


def test_validate_refuses_a_non_boolean(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    out = subprocess.run([sys.executable, "-m", "primus_slurm", "validate", "recipes/quickstart.yaml", "--set",
                          "trainer.distributed.nccl_eager_init=sometimes"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 2 and "nccl_eager_init" in out.stderr and "Traceback" not in out.stderr, out.stderr
