"""Crash-safe checkpoints of the LoRA training state (docs/contract.md section 2).

Layout:  checkpoints/iter_0000020/rank-00000_tp0_pp0_dp0.pt ... + metadata.json,  checkpoints/latest

Every rank writes its own file (adapter shard, optimizer, scheduler, data position, RNG states,
iteration, recipe hash), so any TP/PP/DP/CP/EP layout round-trips; a resume on another layout
reshards the adapters and optimizer state (trainer/checkpointing/reshard.py).

Save protocol (collective; every rank calls save()):
 1. rank 0 creates checkpoints/.tmp-iter_N (removing a stale one);
 2. every rank writes + fsyncs its file; the ranks agree by all-reduce whether all writes succeeded;
 3. rank 0 writes + fsyncs metadata.json, fsyncs the directory, renames it to iter_N, fsyncs
    checkpoints/, then replaces `latest` via latest.tmp + fsync + os.replace + fsync of checkpoints/;
 4. directories beyond keep_last (never the one `latest` names) are deleted.
Any failure (disk full, kill -9) before step 3's os.replace leaves the previous iter_* and `latest`
untouched; the temp directory is removed when possible and CheckpointError is raised on every rank.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import shutil
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

LATEST = "latest"
_ITER_RE = re.compile(r"^iter_(\d{7,})$")
# Fields that may change on resume without changing the training trajectory's state (the parallel layout too:
# trainer.checkpointing.reshard reshards adapters and optimizer state on a layout change; the LR decay end is
# checked on its own, trainer.step.schedule.resume_change).
RESUME_MUTABLE = (("schedule", "train_iters"), ("schedule", "lr_decay_iters"), ("logging",), ("parallelism",),
                  ("checkpoint", "save_interval"), ("checkpoint", "keep_last"), ("checkpoint", "resume"),
                  ("checkpoint", "disable_last_saving"), ("checkpoint", "export_peft"), ("distributed", "timeout_minutes"))


class CheckpointError(RuntimeError):
    pass


def iter_name(iteration: int) -> str:
    return f"iter_{int(iteration):07d}"


def recipe_hash(trainer_cfg: dict, seed=None) -> str:
    """sha256 (16 hex) of the trainer section without the RESUME_MUTABLE fields, plus experiment.seed when
    given (it drives the data order and the adapters' init)."""
    d = json.loads(json.dumps(trainer_cfg, sort_keys=True, default=str))
    for path in RESUME_MUTABLE:
        node = d
        for key in path[:-1]:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(path[-1], None)
    if seed is not None:
        d = {"trainer": d, "experiment.seed": seed}
    blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def shard_name(rank: int, tp_rank: int, pp_rank: int, dp_rank: int) -> str:
    return f"rank-{rank:05d}_tp{tp_rank}_pp{pp_rank}_dp{dp_rank}.pt"


# ---------------------------------------------------------------- RNG
# Every generator state is kept as what torch.set_rng_state / Generator.set_state take: a CPU ByteTensor. They are
# saved that way and normalised again at restore, so a shard read onto another device (a GPU, "meta") still
# restores exactly. megatron's tracker may hold graph-safe torch.Generator objects instead of state tensors
# (use_cudagraphable_rng): their states are saved, and restored into the live generators.
def _cpu_bytes(state) -> torch.Tensor:
    if isinstance(state, torch.Generator):
        state = state.get_state()
    if not isinstance(state, torch.Tensor):
        raise CheckpointError(f"an RNG state is a {type(state).__name__}, not a tensor")
    if state.device.type == "meta":
        raise CheckpointError("an RNG state was read onto the meta device: its bytes are lost")
    return state.detach().to(device="cpu", dtype=torch.uint8).clone()


def rng_state(device: torch.device) -> dict:
    """Python, NumPy, torch CPU, this rank's CUDA generator and megatron's tracker (each tensor a CPU ByteTensor)."""
    from megatron.core import tensor_parallel

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None, "device": device.type}
    try:
        tracker = tensor_parallel.get_cuda_rng_tracker().get_states()
    except Exception:  # tracker not initialised (no megatron parallel state)
        tracker = None
    state["tracker"] = {name: _cpu_bytes(s) for name, s in tracker.items()} if tracker else None
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what rng_state saved, whatever device the shard's tensors were read onto. Saved on another kind of
    device (a GPU run's checkpoint evaluated on a CPU, or the reverse), the CUDA generator and megatron's tracker
    keep this process's seeding: a CUDA Philox state (16 bytes) is no CPU generator state (5056) and would fail at
    the tracker's first fork."""
    from megatron.core import tensor_parallel

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(_cpu_bytes(state["torch"]))
    if state.get("device", device.type) != device.type:
        return
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(_cpu_bytes(state["cuda"]), device)
    if state.get("tracker"):
        tracker = tensor_parallel.get_cuda_rng_tracker()
        live = tracker.get_states() if getattr(tracker, "is_initialized", lambda: True)() else {}
        restored = {}
        for name, saved in state["tracker"].items():
            if isinstance(live.get(name), torch.Generator):  # graph-safe tracker: set the generator in place
                live[name].set_state(_cpu_bytes(saved))
                restored[name] = live[name]
            else:
                restored[name] = _cpu_bytes(saved)
        tracker.set_states(restored)


# ---------------------------------------------------------------- filesystem helpers
def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: str, writer: Callable[[Any], None], mode: str = "wb") -> None:
    with open(path, mode) as fh:
        writer(fh)
        fh.flush()
        os.fsync(fh.fileno())


def read_latest(ckpt_dir: str) -> Optional[str]:
    """Directory `latest` names, if it exists and is complete (has metadata.json); else None."""
    try:
        with open(os.path.join(ckpt_dir, LATEST)) as fh:
            name = fh.read().strip()
    except FileNotFoundError:
        return None
    path = os.path.join(ckpt_dir, name)
    if not _ITER_RE.match(name) or not os.path.isfile(os.path.join(path, "metadata.json")):
        raise CheckpointError(f"{ckpt_dir}/latest names '{name}', which is not a complete checkpoint")
    return path


def iteration_of(path: str) -> int:
    """The iteration of a checkpoint directory `.../iter_NNNNNNN`."""
    return int(_ITER_RE.match(os.path.basename(os.path.normpath(path))).group(1))


def list_checkpoints(ckpt_dir: str) -> list[tuple[int, str]]:
    if not os.path.isdir(ckpt_dir):
        return []
    out = [(int(m.group(1)), os.path.join(ckpt_dir, n)) for n in os.listdir(ckpt_dir) if (m := _ITER_RE.match(n))]
    return sorted(out)


def _agree(ok: bool, device) -> int:
    """Number of ranks reporting failure (collective when distributed)."""
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.SUM)
    return int(flag.item())


# ---------------------------------------------------------------- save
def save(ckpt_dir: str, iteration: int, state: dict | Callable[[], dict], *, rank: int, coords: tuple[int, int, int],
         metadata: dict, keep_last: Optional[int], device=torch.device("cpu")) -> str:
    """Collective atomic save of `state` (this rank's shard); returns the final directory path."""
    final = os.path.join(ckpt_dir, iter_name(iteration))
    tmp = os.path.join(ckpt_dir, f".tmp-{iter_name(iteration)}")
    error = None
    if rank == 0:
        try:
            os.makedirs(ckpt_dir, exist_ok=True)
            latest = read_latest(ckpt_dir) if os.path.exists(os.path.join(ckpt_dir, LATEST)) else None
            if os.path.isdir(final) and latest is not None and os.path.samefile(latest, final):
                raise FileExistsError(f"{final} is already the latest checkpoint")
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        except Exception as err:  # noqa: BLE001
            error = err
    if _agree(error is None, device):
        _cleanup(tmp, rank)
        raise CheckpointError(_reason("preparing", error))

    try:
        # serialise in memory first so a failing write surfaces as the OS error (ENOSPC, EFBIG, EDQUOT); a state
        # given as a callable is built here, so that its own failure on one rank goes through the ranks' agreement
        buf = io.BytesIO()
        torch.save(state() if callable(state) else state, buf)
        _write_durable(os.path.join(tmp, shard_name(rank, *coords)), lambda fh: fh.write(buf.getbuffer()))
        del buf
    except Exception as err:  # noqa: BLE001
        error = err
    failed = _agree(error is None, device)
    if failed:
        _cleanup(tmp, rank)
        raise CheckpointError(_reason(f"writing shards ({failed} rank(s) failed)", error))

    if rank == 0:
        try:
            meta = dict(metadata, iteration=int(iteration))
            _write_durable(os.path.join(tmp, "metadata.json"),
                           lambda fh: fh.write(json.dumps(meta, indent=1, sort_keys=True).encode()))
            _fsync_dir(tmp)
            if os.path.isdir(final):  # a complete but un-published leftover of a crashed run
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(ckpt_dir)
            pointer = os.path.join(ckpt_dir, LATEST + ".tmp")
            _write_durable(pointer, lambda fh: fh.write(iter_name(iteration).encode()))
            os.replace(pointer, os.path.join(ckpt_dir, LATEST))
            _fsync_dir(ckpt_dir)
        except Exception as err:  # noqa: BLE001
            error = err
    if _agree(error is None, device):
        _cleanup(tmp, rank)
        raise CheckpointError(_reason("publishing", error))
    if rank == 0 and keep_last:
        prune(ckpt_dir, int(keep_last))
    return final


def _reason(stage: str, error: Optional[BaseException]) -> str:
    detail = f"{type(error).__name__}: {error}" if error is not None else "failed on another rank"
    return f"{stage}: {detail}".replace("\n", " ")


def _cleanup(tmp: str, rank: int) -> None:
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)


def prune(ckpt_dir: str, keep_last: int) -> list[str]:
    """Delete all but the newest keep_last iter_* directories (never the one `latest` names)."""
    latest = read_latest(ckpt_dir)
    removed = []
    for _, path in list_checkpoints(ckpt_dir)[:-keep_last] if keep_last > 0 else []:
        if latest is not None and os.path.samefile(path, latest):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


# ---------------------------------------------------------------- load
def read_metadata(path: str) -> dict:
    """metadata.json of the checkpoint directory `path`."""
    with open(os.path.join(path, "metadata.json")) as fh:
        return json.load(fh)


def load(path: str, *, rank: int, coords: tuple[int, int, int]) -> tuple[dict, dict]:
    """(this rank's shard state, metadata) of the checkpoint directory `path`; every tensor on the CPU."""
    meta = read_metadata(path)
    shard = os.path.join(path, shard_name(rank, *coords))
    if not os.path.isfile(shard):
        raise CheckpointError(f"{path} has no shard for rank {rank} {coords} (saved with world size "
                              f"{meta.get('world_size')}); resume needs the same parallel layout")
    # read onto the CPU: RNG states must stay CPU ByteTensors, and adapters/optimizer state are copied onto the
    # parameters' device by their loaders (load_adapter_state_dict, Optimizer.load_state_dict)
    state = torch.load(shard, map_location="cpu", weights_only=False)
    return state, meta
