"""`trainer.logging.profile_start` .. `profile_end`: torch.profiler over a window of training steps.

    prof = StepProfiler.from_cfg(cfg.trainer.logging, run_dir, rank, device, log)
    ...  prof.before_step(next_iteration); step(); prof.after_step(iteration)  ...
    prof.close()

Profiles iterations start..end (inclusive, 1-based) on the ranks in `profile_ranks` and writes
<run_dir>/profile/rank-<r>/summary.txt: the top operators and kernels by self time on the device (CPU
time on a CPU run), with shapes grouped off, then on a GPU the device timeline (busy vs idle time and
kernel time by kind, trainer.observability.profile_timeline), and, when `profile_trace` is true, trace.json for
chrome://tracing / Perfetto (large for big models). Given the model, the first profiled step also
writes saved_tensors.txt: what its forwards before the first backward keep for it, by module
(trainer.observability.saved_census). The profiled steps' throughput in the log includes
the profiler's overhead (writing the results does not: the caller pauses its clock for it). A run resumed
inside the window profiles the rest of it; a window the run never reaches is logged as skipped. Nothing is
imported or recorded when no window is set.
"""
from __future__ import annotations

import os
import time
from typing import Optional

import torch

ROWS = 40


class StepProfiler:
    def __init__(self, start: Optional[int], end: Optional[int], out_dir: str, device: torch.device,
                 trace: bool, log=None, model=None):
        self.start, self.end = start, end
        self.out_dir, self.device, self.trace, self.log = out_dir, device, trace, log
        self.model = model
        self._prof = None
        self._census = None
        self._done = False

    @classmethod
    def from_cfg(cls, logging_cfg, run_dir: str, rank: int, device: torch.device, log=None,
                 model=None) -> "StepProfiler":
        start, end = logging_cfg.profile_start, logging_cfg.profile_end
        ranks = logging_cfg.profile_ranks or [0]
        if start is None or rank not in ranks:
            start = end = None
        elif end is None:
            end = start
        return cls(start, end, os.path.join(run_dir, "profile", f"rank-{rank}"), device,
                   bool(logging_cfg.profile_trace), log, model)

    @property
    def active(self) -> bool:
        return self._prof is not None

    def before_step(self, iteration: int) -> None:
        """Call with the iteration about to run (1-based); starts at the first one inside the window (a run
        resumed inside the window profiles its remaining iterations)."""
        if self.start is None or self._prof is not None or self._done or not self.start <= iteration <= self.end:
            return
        self.start = iteration
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._prof = profile(activities=activities, record_shapes=False)
        self._prof.__enter__()
        if self.model is not None:
            from trainer.observability.saved_census import SavedTensorCensus

            self._census = SavedTensorCensus(self.model, self.device)
            self._census.start()

    def after_step(self, iteration: int) -> float:
        """Seconds spent writing the results (census after the first profiled step, profile at the end of
        the window; else 0): not training time."""
        spent = 0.0
        if self._census is not None:
            t0 = time.perf_counter()
            self._write_census(iteration)
            spent = time.perf_counter() - t0
        if self._prof is not None and iteration >= self.end:
            spent += self.close(iteration)
        return spent

    def _rel(self, path: str) -> str:
        """path relative to the run directory (out_dir is <run_dir>/profile/rank-R)."""
        return os.path.relpath(path, os.path.dirname(os.path.dirname(self.out_dir)))

    def _write_census(self, iteration: int) -> None:
        census, self._census = self._census, None
        census.close()
        text = census.report()
        if text is None:
            return
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, "saved_tensors.txt")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f"iteration {iteration}\n{text}")
        if self.log is not None:
            self.log.line(f"saved tensors | iteration {iteration} | {census.total_mib():.2f} MiB | micro-batches "
                          f"{census.forwards} | path {self._rel(path)}")

    def _timeline(self, prof, iterations: str) -> tuple[str, str]:
        """Busy/idle device time of the window (trainer.observability.profile_timeline); nothing on a CPU run."""
        if self.device.type != "cuda":
            return "", ""
        from trainer.observability.profile_timeline import device_intervals, timeline_report

        try:
            return timeline_report(device_intervals(prof), iterations)
        except Exception as err:  # noqa: BLE001 - a diagnostic must not end the run; say why it is missing
            why = f"device timeline unavailable | {type(err).__name__}: {err}"
            return why + "\n", why

    def close(self, iteration: Optional[int] = None) -> float:
        """Stop and write the results (also when training ends inside the window); returns the seconds it
        took. A window the run never reached is logged as skipped."""
        if self._census is not None:  # the run ended inside the census step
            self._census.close()
            self._census = None
        if self._prof is None:
            if self.start is not None and not self._done and self.log is not None:
                self.log.line(f"profile skipped | iterations {self.start}-{self.end} | run ended at iteration "
                              f"{iteration}")
            self._done = True
            return 0.0
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        os.makedirs(self.out_dir, exist_ok=True)
        key = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=ROWS)
        last = self.end if iteration is None else iteration
        path = os.path.join(self.out_dir, "summary.txt")
        timeline, line = self._timeline(prof, f"{self.start}-{last}")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f"iterations {self.start}-{last}, sorted by {key}\n{table}\n{timeline}")
        if line and self.log is not None:
            self.log.line(line)
        if self.trace:
            prof.export_chrome_trace(os.path.join(self.out_dir, "trace.json"))
        if self.log is not None:
            self.log.line(f"profile written | iterations {self.start}-{last} | path {self._rel(path)}")
        self._done = True
        return time.perf_counter() - t0
