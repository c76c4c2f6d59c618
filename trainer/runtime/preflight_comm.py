"""`primus-slurm preflight`'s job entrypoint (under torchrun, after trainer.runtime.preflight passed): one timed all-reduce
across every rank of the job, gloo on CPU and NCCL (RCCL) on GPU, as the recipe's trainer.distributed says.

Rank 0 prints one line: `all-reduce | backend B | ranks N | nodes M | size S MiB | time T ms | algbw A GB/s |
busbw B GB/s` (busbw = algbw * 2(N-1)/N, the ring all-reduce's traffic per rank, as nccl-tests reports it).
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import yaml

from trainer.runtime.distributed import resolve_backend
from trainer.runtime.signals import exit_process

WARMUP, TIMED = 2, 5


def _settings(config: str) -> tuple[str, str]:
    with open(config, encoding="utf-8") as fh:
        d = (yaml.safe_load(fh) or {}).get("trainer", {}).get("distributed", {}) or {}
    device = d.get("device") or "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device, resolve_backend(d.get("backend"), device)  # the trainer's rule: `auto` was passed on as is


def timed_all_reduce(mib: int, device: str, world: int) -> tuple[float, bool]:
    """(seconds per all-reduce of `mib` MiB of float32 across the process group, whether the sum was right)."""
    x = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=torch.device(device, torch.cuda.current_device())
                   if device == "cuda" else "cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(WARMUP):
        dist.all_reduce(x)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(TIMED):
        dist.all_reduce(x)
    sync()
    seconds = (time.perf_counter() - t0) / TIMED
    expected = float(world) ** (WARMUP + TIMED)  # ones, summed over `world` ranks each time
    ok = bool(torch.allclose(x[:16].double().cpu(), torch.full((16,), expected, dtype=torch.float64), rtol=1e-5))
    return seconds, ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.runtime.preflight_comm")
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--mib", type=int, default=None, help="message size (default 8 MiB on CPU, 256 MiB on GPU)")
    args = ap.parse_args(argv)
    device, backend = _settings(args.config)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    mib = args.mib or (256 if device == "cuda" else 8)
    seconds, ok = timed_all_reduce(mib, device, world)
    if rank == 0:
        algbw = mib * 2**20 / seconds / 1e9
        nodes = world // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        print(f"all-reduce | backend {backend} | ranks {world} | nodes {nodes} | size {mib} MiB | "
              f"time {seconds * 1e3:.2f} ms | algbw {algbw:.3f} GB/s | busbw {algbw * 2 * (world - 1) / world:.3f} GB/s"
              f" | result {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    exit_process(main())
