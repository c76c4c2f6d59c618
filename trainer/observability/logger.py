"""Rank-0 trainer log in the format of docs/contract.md section 3 (parsed by `primus-slurm status`).

Lines go to <run_dir>/logs/rank-0/debug.log (attempt 0) or debug.attempt-<N>.log (attempt N =
SLURM_RESTART_COUNT) and to stdout; `record` also writes the line's event to events.jsonl / events.attempt-<N>.jsonl
beside it (primus_contract/run_files.py: the machine-readable stream status, compare, logs and the job read). Files are opened in append mode, so a re-run of the same attempt
never truncates an earlier log. Other ranks log nothing (their errors reach Slurm's stderr).
The `metrics` and `eval` events also go to the experiment trackers the recipe asks for (trainer/observability/tracking.py,
imported only then: TensorBoard, W&B).
"""
from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any, Optional

import torch

from primus_contract import run_files


def log_path(run_dir: str, rank: int, attempt: int) -> str:
    return str(run_files.rank_dir(run_dir, rank) / run_files.log_name(attempt))


def fmt_sci(x: float, digits: int = 6) -> str:
    return f"{x:.{digits}E}"


def format_iteration(iteration: int, train_iters: int, loss: float, lr: float, grad_norm: float,
                     tokens_per_s_gpu: float, tflops_gpu: float, mem_alloc: float, mem_peak: float,
                     ms_per_iter: float) -> str:
    return (f"iteration {iteration}/{train_iters} | lm loss {fmt_sci(loss)} | lr {fmt_sci(lr)} | "
            f"grad norm {grad_norm:.3E} | tokens/s/GPU {tokens_per_s_gpu:.1f} | TFLOP/s/GPU {tflops_gpu:.2f} | "
            f"mem alloc GiB {mem_alloc:.2f} | mem peak GiB {mem_peak:.2f} | ms/iter {ms_per_iter:.1f}")


def memory_gib(device: torch.device) -> tuple[float, float]:
    """(allocated, peak) GiB: CUDA caching-allocator stats on GPU, process RSS / max RSS on CPU."""
    if device.type == "cuda":
        return (torch.cuda.memory_allocated(device) / 2**30, torch.cuda.max_memory_allocated(device) / 2**30)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    try:
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        rss = peak
    return rss, peak


def device_footprint(device: torch.device) -> dict:
    """On CUDA: PyTorch's reserved GiB and the GPU's used GiB (all its processes: where this rank is alone on its GPU,
    the difference is what lives outside the allocator: context, modules, library workspaces, NCCL's communicators;
    on an H100 on 2026-12-05 8.88 GiB with megatron's ~20 communicators made at init, 0.73 made lazily, the default
    since). {} elsewhere."""
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {"mem_reserved_gib": torch.cuda.memory_reserved(device) / 2**30,
            "mem_device_used_gib": (total - free) / 2**30}


class TrainLogger:
    def __init__(self, run_dir: str, rank: int, attempt: int, stream=None) -> None:
        self.enabled = rank == 0
        self.path = log_path(run_dir, 0, attempt)
        self._fh = None
        self._events = None
        self._trackers: list = []
        self._exit_code = 1  # the outcome's, for the trackers' close (1: no outcome was logged)
        self._stream = stream if stream is not None else sys.stdout
        if not self.enabled:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1)
        self._events = open(os.path.join(os.path.dirname(self.path), run_files.events_name(attempt)), "a",
                            encoding="utf-8", buffering=1)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        stamped = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}"
        if self._fh is not None:
            self._fh.write(stamped + "\n")
            self._fh.flush()
        if self._stream is not None:
            try:
                self._stream.write(stamped + "\n")
                self._stream.flush()
            except (BrokenPipeError, ValueError):  # stdout closed under us (a cancelled container's pipe): the
                broken, self._stream = self._stream, None  # log file carries on, so the stop can still checkpoint
                if broken is sys.stdout:  # later prints and the exit-time flush must not raise either
                    sys.stdout = open(os.devnull, "w")

    def record(self, kind: str, text: str, **fields: Any) -> None:
        """The human line and its event (run_files.EVENTS)."""
        self.line(text)
        if self.enabled and self._events is not None:
            self._events.write(run_files.event_line(kind, **fields) + "\n")
            self._events.flush()
        if self._trackers:
            from trainer.observability.tracking import scalars_of

            logged = scalars_of(kind, fields)
            if logged is not None:
                for tracker in self._trackers:
                    tracker.log(*logged)

    def open_trackers(self, cfg, run_dir: str, attempt: int) -> None:
        """Rank 0 starts the trackers the recipe asks for (trainer.observability.tracking.TrackerError if one cannot start)."""
        lg = cfg.trainer.logging
        if self.enabled and (lg.tensorboard or lg.wandb.project is not None):
            from trainer.observability.tracking import open_trackers

            self._trackers = open_trackers(cfg, run_dir, attempt, self.line)

    def outcome(self, text: str, exit_code: int) -> None:
        """The trainer's last word: `training finished | ...`, or an `error |` / `config error |` /
        `resume refused |` line."""
        self._exit_code = exit_code
        head, _, rest = text.partition(" | ")
        if head == "training finished":
            rest = rest.rpartition(" | exit ")[0]
        self.record("outcome", text, status=head, exit=exit_code, message=rest)

    def start(self, attempt: int, world_size: int, device: torch.device, resumed_from: Optional[str]) -> None:
        self.record("start", f"primus-trainer start | attempt {attempt} | world_size {world_size} | "
                    f"device {device.type} | resumed_from {resumed_from or 'none'}", attempt=attempt,
                    world_size=world_size, device=device.type, resumed_from=resumed_from)

    def args(self, cfg) -> None:
        """The resolved args dump: one `arg <dotted key minus 'trainer.'> = <value>` line each."""
        for key, value in cfg.flatten():
            if key.startswith("trainer."):
                key = key[len("trainer."):]
            self.line(f"arg {key} = {value}")

    def close(self) -> None:
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            try:
                tracker.close(self._exit_code)
            except Exception as err:  # noqa: BLE001  (the run's own files are closed all the same)
                print(f"{type(tracker).__name__.lower()} | close failed | {type(err).__name__}: {err}",
                      file=sys.stderr, flush=True)  # stderr: the log's last line stays the outcome
        for name in ("_fh", "_events"):
            if getattr(self, name) is not None:
                getattr(self, name).close()
                setattr(self, name, None)
