"""torch.distributed + megatron-core parallel state setup for the trainer.

    info = init_distributed(cfg)      # once per process, before build_model
    ...
    destroy_distributed()

Works under torchrun (env:// rendezvous from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) and as a
plain single process (RANK unset: a one-rank group on a free local port). The backend is nccl on
CUDA and gloo on CPU unless the recipe forces one. On CPU, trainer.model.cpu_compat is installed
first so megatron-core's CUDA-only spots work; on GPU it is never touched.
"""
from __future__ import annotations

import datetime
import os
import random
import socket
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    tp_size: int
    tp_rank: int
    pp_size: int
    pp_rank: int
    cp_size: int
    ep_size: int
    dp_size: int
    dp_rank: int
    is_first_stage: bool
    is_last_stage: bool
    dp_group: Any
    tp_group: Any
    pp_group: Any

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_device(choice: str, local_rank: int) -> torch.device:
    """'auto' picks cuda when available; 'cuda' binds this process to its local GPU."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("trainer.distributed.device=cuda but no CUDA device is visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if choice != "cpu":
        raise ValueError(f"trainer.distributed.device must be auto|cpu|cuda, got {choice!r}")
    return torch.device("cpu")


def resolve_backend(choice: str | None, device_type: str) -> str:
    """trainer.distributed.backend: 'auto' (or unset) is nccl (RCCL on ROCm) on a GPU, gloo on the CPU."""
    if choice in (None, "", "auto"):
        return "nccl" if device_type == "cuda" else "gloo"
    return choice


def init_kwargs(backend: str, device: torch.device, nccl_eager: bool) -> dict:
    """init_process_group's device binding: NCCL bound to this rank's GPU (trainer.distributed.nccl_eager_init)
    makes every communicator eagerly, each new group's too; unbound, a group's at its first collective."""
    return {"device_id": device} if backend == "nccl" and nccl_eager else {}


def seed_everything(seed: int, rank_offset: int = 0) -> None:
    random.seed(seed + rank_offset)
    np.random.seed((seed + rank_offset) % (2**32))
    torch.manual_seed(seed)


def seed_streams(seed: int, pp_rank: int, dp_rank: int, iteration: int = 0) -> None:
    """Seed every random stream: different per pipeline stage (different layers) but equal across TP/DP, like
    Megatron (the model-parallel tracker then differs per TP rank). iteration > 0: a resume whose saved streams
    do not fit this layout (trainer.checkpointing.reshard) continues from a stream of its own, not the run's first one again."""
    from megatron.core import tensor_parallel

    base = (seed + 100 * pp_rank + 1_000_003 * iteration) % 2**31
    seed_everything(base, rank_offset=dp_rank)
    tensor_parallel.model_parallel_cuda_manual_seed(base)


def init_distributed(cfg) -> DistInfo:
    """Initialise the process group, megatron parallel state and the RNG trackers."""
    from megatron.core import parallel_state as ps

    dcfg = cfg.trainer.distributed
    par = cfg.trainer.parallelism
    if "RANK" not in os.environ:  # plain `python -m trainer`: a world of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        os.environ.setdefault("LOCAL_RANK", "0")
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    device = resolve_device(dcfg.device, local_rank)
    if device.type == "cpu":
        from trainer.model import cpu_compat

        cpu_compat.install()
    backend = resolve_backend(dcfg.backend, device.type)
    timeout = datetime.timedelta(minutes=float(dcfg.timeout_minutes or 30))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=timeout, **init_kwargs(backend, device, bool(dcfg.nccl_eager_init)))

    tp, pp = int(par.tensor), int(par.pipeline)
    cp, ep = int(par.context), int(par.expert)
    if world_size % (tp * pp * cp) != 0:
        raise ValueError(f"world size {world_size} is not divisible by tensor*pipeline*context "
                         f"= {tp}*{pp}*{cp}")
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=1,  # experts are never tensor-parallel (trainer.model.arch)
            # a float: int() would turn a sub-minute timeout (schema min 0.05) into 0 ms for every subgroup
            distributed_timeout_minutes=float(dcfg.timeout_minutes or 30),
            create_gloo_process_groups=backend == "gloo",
        )
    if backend == "nccl" and not dcfg.nccl_eager_init and world_size > 1:
        from trainer.runtime.nccl_groups import make_used_communicators

        make_used_communicators(device, moe=bool(cfg.trainer.model.num_moe_experts),
                                fp8=bool(cfg.trainer.precision.fp8))

    pp_rank = ps.get_pipeline_model_parallel_rank()
    seed_streams(int(cfg.experiment.seed), pp_rank, ps.get_data_parallel_rank())

    return DistInfo(
        rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend,
        tp_size=tp, tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_size=pp, pp_rank=pp_rank, cp_size=cp, ep_size=ep,
        dp_size=ps.get_data_parallel_world_size(), dp_rank=ps.get_data_parallel_rank(),
        is_first_stage=ps.is_pipeline_first_stage(), is_last_stage=ps.is_pipeline_last_stage(),
        dp_group=ps.get_data_parallel_group(), tp_group=ps.get_tensor_model_parallel_group(),
        pp_group=ps.get_pipeline_model_parallel_group(),
    )


def destroy_distributed() -> None:
    """Tear down megatron parallel state and the process group (safe to call twice)."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(group: Optional[Any] = None) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)
