"""`primus-slurm nodes check`'s job entrypoint: one task per node (srun), run as

    python -m trainer.runtime.node_check --out CHECK_DIR [--seconds S]

Per node it times a GEMM on every visible GPU (BF16, 8192^3; on CPU float32 512^3), reads each GPU's free memory,
the vendor's error counters (trainer.runtime.gpu_counters), the local disk (free space, a write) and the shared
filesystem (a 1 MiB write + fsync + read back in CHECK_DIR, timed), and writes `CHECK_DIR/reports/<node>.json`.
Then, across the job's tasks (torch.distributed, NCCL on GPU, gloo on CPU): a timed all-reduce, and a ring in which
each task sends to the next one, so each link's bandwidth is measured on its own; rank 0 writes
`CHECK_DIR/reports/cross.json`. The launcher judges the figures (primus_contract.node_health); nothing here
decides ok or slow. A fault injected for tests (primus_contract.node_faults: check-slow NODE FACTOR) stretches the
timed GEMM by FACTOR.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from primus_contract.node_faults import injected, node_name
from trainer.runtime import gpu_counters
from trainer.runtime.preflight_comm import timed_all_reduce
from trainer.runtime.signals import exit_process

GEMM_REPS = 5
RING_REPS = 3


def _gemm_tflops(device: torch.device, n: int, dtype: torch.dtype, stretch: float) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up (cuBLAS heuristics, CPU thread pool)
    sync()
    t0 = time.perf_counter()
    for _ in range(GEMM_REPS):
        a @ b
    sync()
    seconds = time.perf_counter() - t0
    if stretch > 1:  # an injected slow node (tests): the GEMM took `stretch` times as long
        time.sleep(seconds * (stretch - 1))
        seconds *= stretch
    return 2.0 * n**3 * GEMM_REPS / seconds / 1e12


def _disk(path: str) -> dict:
    out = {"path": path}
    try:
        out["free_gib"] = round(shutil.disk_usage(path).free / 2**30, 2)
        with tempfile.NamedTemporaryFile(dir=path, prefix="primus-check-") as fh:
            fh.write(b"\0" * 2**20)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        out["error"] = f"{type(err).__name__}: {err.strerror or err}"
    return out


def _shared_fs(folder: Path, node: str) -> dict:
    out = {"path": str(folder)}
    path = folder / f".fs-{node}"
    try:
        t0 = time.perf_counter()
        with open(path, "wb") as fh:
            fh.write(os.urandom(2**20))
            fh.flush()
            os.fsync(fh.fileno())
        ok = len(path.read_bytes()) == 2**20
        out["write_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        path.unlink()
        if not ok:
            out["error"] = "the file read back is not the one written"
    except OSError as err:
        out["error"] = f"{type(err).__name__}: {err.strerror or err}"
    return out


def probe(out_dir: Path, node: str) -> dict:
    """This node's report (see primus_contract.node_health for the fields)."""
    stretch = float(injected("check-slow", node) or 1)
    report: dict = {"node": node, "notes": [], "gpus": []}
    if torch.cuda.is_available():
        report["device"], report["gpu_name"] = "cuda", torch.cuda.get_device_name(0)
        tool, counts, note = gpu_counters.counters()
        report["vendor_tool"] = tool
        # the vendor tool numbers every GPU of the node, torch only the visible ones (CUDA_VISIBLE_DEVICES /
        # HIP_VISIBLE_DEVICES, as Slurm sets them): the counters are judged per node, by the tool's numbering, and
        # a GPU row carries its own only where both number alike (nothing hidden)
        report["counters"] = {str(k): v for k, v in counts.items()} if tool else None
        same = not any(os.environ.get(v) for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                                     "ROCR_VISIBLE_DEVICES"))
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            rate = _gemm_tflops(torch.device("cuda", i), 8192, torch.bfloat16, stretch)
            report["gpus"].append({"index": i, "gemm_tflops": round(rate, 2), "free_gib": round(free / 2**30, 2),
                                   "total_gib": round(total / 2**30, 2),
                                   "errors": counts.get(i) if tool and same else None})
        report["gemm_tflops"] = min(g["gemm_tflops"] for g in report["gpus"])
    else:
        report["device"], report["gpu_name"], report["vendor_tool"] = "cpu", None, None
        note = "no GPU: GEMM on the CPU (float32), no GPU memory or error counters"
        report["gemm_tflops"] = round(_gemm_tflops(torch.device("cpu"), 512, torch.float32, stretch), 4)
    if note:
        report["notes"].append(note)
    report["disk"] = _disk(os.environ.get("TMPDIR") or tempfile.gettempdir())
    report["shared_fs"] = _shared_fs(out_dir, node)
    return report


def _ring(device: torch.device, mib: int, rank: int, world: int) -> float:
    """GB/s of this rank's receive from the previous rank while it sends to the next (a ring of all ranks)."""
    send = torch.ones(mib * 2**18, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    times = []
    for _ in range(1 + RING_REPS):  # the first warms the connections up
        dist.barrier()
        t0 = time.perf_counter()
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return mib * 2**20 / min(times[1:]) / 1e9  # the best of the timed ones: what the link can do


def cross(out_dir: Path, node: str, timeout_s: float) -> None:
    """The all-reduce and the ring across every task; rank 0 writes reports/cross.json."""
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    mib = 256 if cuda else 8
    seconds, ok = timed_all_reduce(mib, device.type, world)
    link = _ring(device, mib, rank, world)
    nodes = [None] * world
    dist.all_gather_object(nodes, (node, link))
    if rank == 0:
        algbw = mib * 2**20 / seconds / 1e9
        result = {"allreduce": {"ranks": world, "mib": mib, "ms": round(seconds * 1e3, 3), "correct": ok,
                                "busbw_gb_s": round(algbw * 2 * (world - 1) / world, 4)},
                  "ring": [{"src": nodes[(r - 1) % world][0], "dst": nodes[r][0], "gb_s": round(nodes[r][1], 4)}
                           for r in range(world)]}
        (out_dir / "reports" / "cross.json").write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.runtime.node_check")
    ap.add_argument("--out", required=True, help="the check's directory (on the shared filesystem)")
    ap.add_argument("--seconds", type=float, default=120.0, help="how long the cross-node part may wait")
    args = ap.parse_args(argv)
    out_dir, node = Path(args.out), node_name()
    (out_dir / "reports").mkdir(parents=True, exist_ok=True)
    try:
        report = probe(out_dir, node)
    except Exception as err:  # noqa: BLE001 - the node's failure is the report
        report = {"node": node, "error": f"the check raised {type(err).__name__}: {err}"}
    (out_dir / "reports" / f"{node}.json").write_text(json.dumps(report, indent=1))
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        cross(out_dir, node, args.seconds)
    return 0


if __name__ == "__main__":
    exit_process(main())
