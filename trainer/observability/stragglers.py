"""Slow ranks named: every rank times its steps' data wait (building its micro-batches) and compute (forward and
backward of them: between the step header's all-reduce and the gradient reduce, so no rank's figure includes
waiting for another); at every log point the figures are all-gathered and rank 0 compares each rank with the
median. A rank over the median by THRESHOLD (and by MIN_MS) at INTERVALS log points in a row is named once:
one `slow rank | ...` log line and a `fault` of kind `slow` in logs/nodes.jsonl (primus_contract/node_faults.py),
which `status RUN` shows and the job script settles into the node ledger.

Why these thresholds: in synchronous data parallelism every rank waits at the gradient reduce for the slowest, so a
rank 20 % slower costs the whole job 20 %; ranks on healthy identical GPUs differ by a few percent (the same kernels
on packed micro-batches of equal token counts), so 20 % is well clear of that noise and catches a throttled GPU
(power or thermal capping costs 25 % and more). Three log points in a row keep a one-off hiccup (a GC pause, one
rank's slow file read) from naming a node; MIN_MS keeps tiny CPU steps, whose relative jitter is large, from it.
With tensor or pipeline parallelism a slow GPU's whole TP group or its pipeline neighbours wait inside the compute
(their collectives and sends are in it), so several ranks can be named: the line names each node once.

nvidia-resiliency-ext's straggler detector is not used: its Detector.initialize always loads its CUPTI extension
(nvrx_cupti_module, linked against libcupti.so.12) and generate_report calls torch.cuda.synchronize(), so it needs
CUDA and cannot run on the CPU nodes this trainer also runs on.

PRIMUS_FAULT_FILE (tests): `slow NODE SECONDS` makes the ranks on NODE sleep SECONDS inside each step's compute.
"""
from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager
from typing import Callable

import torch
import torch.distributed as dist

from primus_contract import node_faults, peer_faults, run_files

THRESHOLD = 0.20   # over the median
INTERVALS = 3      # log points in a row
MIN_MS = 5.0       # and by at least this much per step
KINDS = ("compute", "data wait")  # the figures' order


class RankTimes:
    def __init__(self, run_dir: str, rank: int, world: int, device: torch.device, attempt: int, logger) -> None:
        self.run_dir, self.rank, self.world, self.device, self.attempt = run_dir, rank, world, device, attempt
        self.log = logger
        self.node = node_faults.node_name()
        self.sleep_s = float(node_faults.injected("slow", self.node) or 0)
        self.data_s, self.steps = 0.0, 0
        self.compute: list = []  # (start, end) CUDA events, or seconds on the CPU
        self.streak = {kind: [0] * world for kind in KINDS}
        self.named: set[str] = set()
        self.nodes = [self.node] * world
        if world > 1:
            dist.all_gather_object(self.nodes, self.node)
        if rank == 0 or world == 1:  # which node ran which rank, for the run's node faults
            for r, node in enumerate(self.nodes):
                node_faults.record(run_dir, "rank", attempt=attempt, rank=r, node=node)

    @contextmanager
    def data(self):
        t0 = time.perf_counter()
        yield
        self.data_s += time.perf_counter() - t0

    @contextmanager
    def compute_section(self):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._inject()
            yield
            end.record()
            self.compute.append((start, end))
        else:
            t0 = time.perf_counter()
            self._inject()
            yield
            self.compute.append(time.perf_counter() - t0)
        self.steps += 1

    def _inject(self) -> None:
        if self.sleep_s:
            time.sleep(self.sleep_s)

    def _take(self) -> tuple[float, float]:
        """(compute ms, data ms) per step over the interval, and a fresh interval."""
        if self.device.type == "cuda":
            if self.compute:
                self.compute[-1][1].synchronize()
            total_ms = sum(s.elapsed_time(e) for s, e in self.compute)
        else:
            total_ms = 1e3 * sum(self.compute)
        steps = max(self.steps, 1)
        out = (total_ms / steps, 1e3 * self.data_s / steps)
        self.compute, self.data_s, self.steps = [], 0.0, 0
        return out

    def at_log_point(self, iteration: int) -> None:
        """Every rank, at the same iterations: gather the interval's figures; rank 0 names what stays slow."""
        mine = torch.tensor(self._take(), dtype=torch.float64,
                            device=self.device if self.device.type == "cuda" else "cpu")
        if len(set(self.nodes)) < 2:
            return  # one node: nothing to tell apart (its ranks are all on it)
        rows = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(rows, mine)
        if self.rank != 0:
            return
        figures = [tuple(r.tolist()) for r in rows]
        for index, kind in enumerate(KINDS):
            median = statistics.median(f[index] for f in figures)
            for r, f in enumerate(figures):
                slow = f[index] > median * (1 + THRESHOLD) and f[index] - median > MIN_MS
                self.streak[kind][r] = self.streak[kind][r] + 1 if slow else 0
                if slow and self.streak[kind][r] >= INTERVALS and self.nodes[r] not in self.named:
                    self._name(r, kind, f, median, iteration)

    def _name(self, r: int, kind: str, f: tuple, median: float, iteration: int) -> None:
        node = self.nodes[r]
        self.named.add(node)
        value = f[0] if kind == "compute" else f[1]
        why = (f"rank {r}: {kind} {value:.1f} ms/step vs the median {median:.1f} ms "
               f"(+{100 * (value / median - 1) if median else float('inf'):.0f} %) at {INTERVALS} log points in a "
               f"row; its data wait {f[1]:.1f} ms, compute {f[0]:.1f} ms")
        self.log.line(f"slow rank | node {node} | iteration {iteration} | {why}")
        node_faults.record(self.run_dir, "fault", attempt=self.attempt, node=node, kind="slow", why=why, rank=r)


def record_error(run_dir: str, err: BaseException, stopping: bool | Callable[[], bool] = False) -> None:
    """A failure that names this rank's node (a CUDA/HIP error, not out-of-memory), a collective that timed out
    on this rank (primus_contract/node_faults.py: `settle` names the nodes whose ranks did not time out), or this
    rank's own failure (`error`: anything else that is not a lost peer). A timeout
    raised once the rank was told to stop (`stopping`: Slurm ending the step sends SIGCONT, then SIGTERM) is not a
    rank that was waiting: it is the stopped rank, woken to be killed (a callable is asked here, after the call:
    Python runs pending signal handlers at a call, so a SIGCONT/SIGTERM that came with the error has been seen)."""
    stopping = stopping() if callable(stopping) else stopping
    text = f"{type(err).__name__}: {err}"
    low = text.lower()
    attempt = run_files.current_attempt()
    rank = int(os.environ.get("RANK", "0"))
    first = text.splitlines()[0][:300] if text else ""
    if any(k in low for k in ("cuda error", "hip error", "cublas_status", "cudnn_status", "ecc error",
                              "uncorrectable")) and "out of memory" not in low:
        node_faults.record(run_dir, "fault", attempt=attempt, node=node_faults.node_name(), kind="device",
                           why=first, rank=rank)
    elif ("timed out" in low or "timeout" in low) and not stopping:
        node_faults.record(run_dir, "timeout", attempt=attempt, node=node_faults.node_name(), rank=rank, why=first)
    elif not stopping and not peer_faults.from_a_peer(text):  # this rank's own failure: its peers then lose it, through no fault of
        # its node (primus_contract/peer_faults.named does not blame a node that recorded one)
        node_faults.record(run_dir, "error", attempt=attempt, node=node_faults.node_name(), rank=rank, why=first)
