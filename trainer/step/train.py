"""The LoRA SFT training loop: step function, logging cadence, eval, checkpoints, stop conditions.

`Trainer(...).run()` returns the process exit code (trainer.runtime.signals lists them). One step:

  1. step header: one world all-reduce of [loss tokens N, tokens, sum L_i^2, stop flag]
     (trainer.step.loss.step_header); a stop flag set on any rank ends the loop on every rank at the
     same iteration, before this step's compute;
  2. per micro-batch: forward_losses -> backward of sum(ce*mask)/N (gradient accumulation; with
     pipeline parallelism megatron's 1F1B schedule, trainer.step.pipeline.accumulate_gradients);
  3. TP sum of sequence-parallel grads, DP(+CP) SUM of grads, global-norm clip, AdamW step.

Host syncs: the step header (one small all-reduce read per step; none at a world of one) and the log points (cuda
synchronize + .item() of the interval's losses); NaN/Inf is detected at log points, before every
checkpoint save and at the end, so a poisoned state is never saved.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from primus_contract import run_files

from trainer.checkpointing import checkpoint as ckpt
from trainer.step.evaluate import evaluate
from trainer.step.flops import doc_length_stats, step_flops
from trainer.observability.logger import TrainLogger, device_footprint, fmt_sci, format_iteration, memory_gib
from trainer.step.loss import all_reduce_sum, local_token_count, step_header
from trainer.model.tp_overlap import check_tokens
from trainer.model.levers import fp8_attention_built
from trainer.step.optim import clip_gradients, reduce_gradients
from trainer.step.pipeline import accumulate_gradients
from trainer.precision import fp8_params, weight_cache
from trainer.observability.profiling import StepProfiler
from trainer.observability.stragglers import RankTimes
from trainer.step.schedule import LRSchedule
from trainer.runtime.signals import (EXIT_DIVERGED, EXIT_ERROR, EXIT_OK, EXIT_PREEMPTED, EXIT_SAVE_FAILED, StopSignal)


@dataclass
class StepResult:
    loss_sum: torch.Tensor   # global masked CE sum (device)
    num_loss_tokens: float   # global N
    grad_norm: torch.Tensor  # global norm before clipping (device)
    tokens: float            # global real (non-pad) tokens
    flops: float             # model FLOPs of the step (trainer.step.flops)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Meter:
    """Wall time, tokens and FLOPs of the current log interval and of the run after the skip."""

    def __init__(self, device: torch.device, skip: int, start_iteration: int) -> None:
        self.device, self.skip = device, int(skip)
        self.first = start_iteration
        self.t_interval = time.perf_counter()
        self.interval = [0, 0.0, 0.0, 0.0]  # iters, tokens, flops, paused seconds
        self.run = [0, 0.0, 0.0, 0.0]
        self.t_run: Optional[float] = None if self.skip > 0 else self.t_interval

    def add(self, iteration: int, tokens: float, flops: float) -> None:
        self.interval[0] += 1
        self.interval[1] += tokens
        self.interval[2] += flops
        if self.t_run is not None:
            self.run[0] += 1
            self.run[1] += tokens
            self.run[2] += flops
        if self.t_run is None and iteration - self.first >= self.skip:
            _synchronize(self.device)  # averages start after the skipped iterations
            self.t_run = time.perf_counter()

    def pause(self, seconds: float) -> None:
        """Exclude `seconds` (eval, checkpoint, profiler output) from the interval and, once the run
        average has started, from it too."""
        self.interval[3] += seconds
        if self.t_run is not None:
            self.run[3] += seconds

    def take_interval(self) -> tuple[int, float, float, float]:
        _synchronize(self.device)
        now = time.perf_counter()
        iters, tokens, flops, paused = self.interval
        elapsed = max(now - self.t_interval - paused, 1e-9)
        self.t_interval, self.interval = now, [0, 0.0, 0.0, 0.0]
        return iters, tokens, flops, elapsed

    def run_average(self) -> Optional[tuple[int, float, float, float]]:
        if self.t_run is None or self.run[0] == 0:
            return None
        _synchronize(self.device)
        iters, tokens, flops, paused = self.run
        return iters, tokens, flops, max(time.perf_counter() - self.t_run - paused, 1e-9)


class Trainer:
    def __init__(self, cfg, run_dir: str, info, model, optimizer, params, train_packs, val_packs,
                 forward_losses: Callable, logger: TrainLogger, stop: StopSignal,
                 adapter_state_dict: Callable, start_iteration: int = 0, last_saved: Optional[int] = None,
                 export_peft: Optional[Callable] = None, recipe_hash: str = "",
                 ub_tokens: Optional[int] = None) -> None:
        from megatron.core import parallel_state as ps

        t = cfg.trainer
        self.cfg, self.t, self.run_dir, self.info = cfg, t, run_dir, info
        self.model, self.optimizer, self.params = model, optimizer, params
        self.train_packs, self.val_packs = train_packs, val_packs
        self.forward_losses, self.adapter_state_dict, self.export_peft = forward_losses, adapter_state_dict, export_peft
        self.log, self.stop = logger, stop
        self.iteration, self.last_saved, self.recipe_hash = int(start_iteration), last_saved, recipe_hash
        self.ub_tokens = ub_tokens  # TE userbuffers' token count: every micro-batch's (None: no tp_comm_overlap)
        self.schedule = LRSchedule.from_config(t.schedule)
        self.device = info.device
        self.dp_group = ps.get_data_parallel_group(with_context_parallel=True)
        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_size = ps.get_data_parallel_world_size()
        self.mp_group = ps.get_model_parallel_group()
        self.counts_once = info.tp_rank == 0 and info.pp_rank == 0
        self.steps_in_process = 0  # weight_cache.REFRESH_STEPS: TE's weight copies are redone in the first steps
        self.ckpt_dir = os.path.join(run_dir, "checkpoints")
        self.seed = int(cfg.experiment.seed)
        self.pending: list[tuple[int, torch.Tensor, float, torch.Tensor, float]] = []
        self.checked: list[tuple[int, float, float, float]] = []  # finite (iteration, loss, grad norm, lr)
        self.last_loss = float("nan")
        self.profiler = StepProfiler.from_cfg(t.logging, run_dir, info.rank, self.device, logger, model)
        self.times = RankTimes(run_dir, info.rank, info.world_size, self.device,  # slow ranks named
                               run_files.current_attempt(), logger)

    # ------------------------------------------------------------------ one step
    def micro_batches(self, iteration: int) -> list[dict]:
        from trainer.data.batching import rank_micro_batches

        s = self.t.schedule
        batches = rank_micro_batches(self.train_packs, int(s.global_batch_size), int(s.micro_batch_size), iteration,
                                     self.seed, dp_rank=self.dp_rank, dp_size=self.dp_size,
                                     shuffle=bool(self.t.data.shuffle))
        for mb in batches:
            check_tokens(int(mb["tokens"].numel()), self.ub_tokens)
        return batches

    def step(self, micro_batches: list[dict], lr: float) -> Optional[StepResult]:
        """One optimizer step; None (nothing done) when any rank received a stop signal."""
        tokens = sum(float(mb["num_tokens"]) for mb in micro_batches)
        all_tokens = sum(float(mb["tokens"].numel()) for mb in micro_batches)
        sumsq = sum(doc_length_stats(mb["cu_seqlens"].tolist())[1] for mb in micro_batches)
        n, stop, totals = step_header(local_token_count(micro_batches), self.stop.requested, self.counts_once,
                                      self.device, extras=(tokens, all_tokens, sumsq))
        if stop:
            return None
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        if self.steps_in_process < weight_cache.REFRESH_STEPS:
            weight_cache.refresh_te_weight_copies(self.model)
        self.steps_in_process += 1
        release = (lambda: fp8_params.release_transposes(self.model)) if self.t.precision.fp8_param else None
        with self.times.compute_section():
            loss_sum = accumulate_gradients(self.model, self.forward_losses, micro_batches, n, self.device, release)
        from trainer.model import allreduce_sequence_parallel_grads

        allreduce_sequence_parallel_grads(self.model)
        reduce_gradients(self.params, self.dp_group)
        grad_norm = clip_gradients(self.params, self.t.schedule.clip_grad, self.info.tp_rank, self.mp_group)
        self.optimizer.step()
        all_reduce_sum(loss_sum, self.dp_group)
        flops = step_flops(self.t.model, self.t.lora, totals[2], totals[3])
        return StepResult(loss_sum, totals[0], grad_norm, totals[1], flops)

    # ------------------------------------------------------------------ checks and events
    def check_finite(self) -> Optional[int]:
        """Materialise pending losses; log and return EXIT_DIVERGED at the first NaN/Inf."""
        if not self.pending:
            return None
        sums = torch.stack([p[1] for p in self.pending]).tolist()
        norms = torch.stack([p[3].float() for p in self.pending]).tolist()
        for (it, _, n, _, _), s, g in zip(self.pending, sums, norms):
            loss = s / max(n, 1.0)
            if not (math.isfinite(loss) and math.isfinite(g)):
                extra = "" if math.isfinite(g) else f" | grad norm {g}"
                shown = fmt_sci(loss) if math.isfinite(loss) else str(loss)
                self.log.record("diverged", f"diverged | iteration {it} | lm loss {shown}{extra}", iteration=it,
                                lm_loss=loss, grad_norm=g)
                self.pending.clear()
                return EXIT_DIVERGED
        self.checked += [(it, s / max(n, 1.0), g, lr) for (it, _, n, _, lr), s, g in zip(self.pending, sums, norms)]
        self.last_loss = self.checked[-1][1]
        self.pending.clear()
        return None

    def log_interval(self, meter: Meter) -> None:
        values, self.checked = self.checked, []
        iters, tokens, flops, elapsed = meter.take_interval()
        world = self.info.world_size
        loss = sum(v[1] for v in values) / len(values)
        alloc, peak = memory_gib(self.device)
        it, _, grad_norm, lr = values[-1]
        metrics = dict(iteration=it, train_iters=int(self.t.schedule.train_iters), lm_loss=loss, lr=lr,
                       grad_norm=grad_norm, tokens_per_s_gpu=tokens / elapsed / world,
                       tflops_gpu=flops / elapsed / world / 1e12, mem_alloc_gib=alloc, mem_peak_gib=peak,
                       ms_per_iter=1000.0 * elapsed / max(iters, 1))
        # each iteration's own loss too: an interval cut short by a stop (or begun at a resume) averages fewer
        # iterations than its twin's, so `primus-slurm compare` reads these, which a requeue leaves equal
        self.log.record("metrics", format_iteration(*metrics.values()), **metrics,
                        losses=[[v[0], v[1]] for v in values])
        self.times.at_log_point(it)  # every rank: the interval's data wait and compute, compared on rank 0

    def save(self, meter: Meter) -> Optional[int]:
        """Checkpoint the current iteration (skipped when already saved); EXIT_SAVE_FAILED on error."""
        if self.last_saved == self.iteration:
            return None
        from trainer.checkpointing.checkpoint import rng_state
        from trainer.checkpointing.module_state import extra_state

        t0 = time.perf_counter()
        def state() -> dict:  # built inside save's agreement: a failure here is "checkpoint failed" on every rank
            return {"iteration": self.iteration, "adapter": self.adapter_state_dict(self.model),
                    "optimizer": self.optimizer.state_dict(), "scheduler": self.schedule.state_dict(),
                    "data": {"consumed_samples": self.iteration * int(self.t.schedule.global_batch_size),
                             "iteration": self.iteration},
                    "rng": rng_state(self.device), "extra_state": extra_state(self.model),
                    "recipe_hash": self.recipe_hash}
        meta = {"recipe_hash": self.recipe_hash, "world_size": self.info.world_size,
                "tensor": self.info.tp_size, "pipeline": self.info.pp_size, "data_parallel": self.dp_size,
                "expert": self.info.ep_size, "lm_loss": self.last_loss, "lr_decay_iters": self.schedule.decay_iters,
                "fp8_attention": fp8_attention_built(self.model), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            path = ckpt.save(self.ckpt_dir, self.iteration, state, rank=self.info.rank,
                             coords=(self.info.tp_rank, self.info.pp_rank, self.info.dp_rank), metadata=meta,
                             keep_last=self.t.checkpoint.keep_last, device=self.device)
        except ckpt.CheckpointError as err:
            self.log.line(f"checkpoint failed | iteration {self.iteration} | error {err}")
            return EXIT_SAVE_FAILED
        self.last_saved = self.iteration
        rel = os.path.relpath(path, self.run_dir)
        self.log.record("checkpoint", f"checkpoint saved | iteration {self.iteration} | path {rel}",
                        iteration=self.iteration, path=rel)
        meter.pause(time.perf_counter() - t0)
        return None

    def run_eval(self, meter: Meter) -> float:
        _synchronize(self.device)
        t0 = time.perf_counter()
        s = self.t.schedule
        loss, acc = evaluate(self.model, self.forward_losses, self.val_packs,
                             global_batch_size=int(s.global_batch_size), micro_batch_size=int(s.micro_batch_size),
                             eval_iters=int(s.eval_iters), seed=self.seed, dp_rank=self.dp_rank, dp_size=self.dp_size,
                             device=self.device, dp_group=self.dp_group, ub_tokens=self.ub_tokens)
        shown = "" if acc is None else f" | token accuracy {acc:.4f}"
        self.log.record("eval", f"eval iteration {self.iteration} | eval loss {fmt_sci(loss)}{shown}",
                        iteration=self.iteration, eval_loss=loss, **({} if acc is None else {"token_accuracy": acc}))
        meter.pause(time.perf_counter() - t0)
        return loss

    def finish(self, code: int, meter: Meter) -> int:
        meter.pause(self.profiler.close(self.iteration))
        avg = meter.run_average()
        if avg is not None:
            iters, tokens, flops, elapsed = avg
            w = self.info.world_size
            _, peak = memory_gib(self.device)
            self.log.record("summary", f"training summary | iterations averaged {iters} | tokens/s/GPU "
                            f"{tokens / elapsed / w:.1f} | TFLOP/s/GPU {flops / elapsed / w / 1e12:.2f} | ms/iter "
                            f"{1000.0 * elapsed / iters:.1f} | mem peak GiB {peak:.2f}", iterations=iters,
                            tokens_per_s_gpu=tokens / elapsed / w, tflops_gpu=flops / elapsed / w / 1e12,
                            ms_per_iter=1000.0 * elapsed / iters, mem_peak_gib=peak, **device_footprint(self.device))
        self.log.outcome(f"training finished | iterations {self.iteration} | exit {code}", code)
        return code

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        t = self.t
        train_iters = int(t.schedule.train_iters)
        log_every = max(1, int(t.logging.log_interval or 1))
        save_every = int(t.checkpoint.save_interval or 0)
        eval_every = int(t.schedule.eval_interval or 0) if self.val_packs is not None else 0
        target = t.schedule.target_eval_loss
        meter = Meter(self.device, int(t.logging.log_avg_skip_iterations or 0), self.iteration)
        self.model.train()
        reason = None
        while self.iteration < train_iters:
            lr = self.schedule.lr_at(self.iteration + 1)
            self.profiler.before_step(self.iteration + 1)
            with self.times.data():
                batches = self.micro_batches(self.iteration)
            result = self.step(batches, lr)
            if result is None:
                reason = "signal"
                break
            self.iteration += 1
            meter.pause(self.profiler.after_step(self.iteration))
            self.pending.append((self.iteration, result.loss_sum, result.num_loss_tokens, result.grad_norm, lr))
            meter.add(self.iteration, result.tokens, result.flops)
            last = self.iteration == train_iters
            if self.iteration % log_every == 0 or last:
                if self.check_finite() is not None:
                    return self.finish(EXIT_DIVERGED, meter)
                self.log_interval(meter)
            due_save = save_every and self.iteration % save_every == 0 and not last
            if due_save and self.check_finite() is not None:
                return self.finish(EXIT_DIVERGED, meter)
            # the eval before the save: under FP8 delayed scaling an eval forward's amaxes enter TE's amax history,
            # which the checkpoint holds, so a run resumed from it scales its next step as this run does (audit,
            # 2026-12-06: saved before the eval, the resumed run's step differed)
            loss = self.run_eval(meter) if eval_every and (self.iteration % eval_every == 0 or last) else None
            if due_save and (code := self.save(meter)) is not None:
                return self.finish(code, meter)
            if loss is not None and target is not None and loss <= float(target):
                self.log.line(f"target eval loss reached | iteration {self.iteration} | "
                              f"eval loss {fmt_sci(loss)} | target {fmt_sci(float(target))}")
                reason = "target"
                break
        if self.check_finite() is not None:
            return self.finish(EXIT_DIVERGED, meter)
        if self.checked:  # a stop inside a log interval: its iterations are logged too (a partial interval)
            self.log_interval(meter)
        if reason == "signal":
            self.log.line(f"stop signal | signal {self.stop.name} | iteration {self.iteration}")
            if (code := self.save(meter)) is not None:
                return self.finish(code, meter)
            return self.finish(EXIT_PREEMPTED, meter)
        if not t.checkpoint.disable_last_saving and (code := self.save(meter)) is not None:
            return self.finish(code, meter)
        if t.checkpoint.export_peft and self.export_peft is not None:
            try:
                self.export_peft(self.model, self.cfg, os.path.join(self.run_dir, "adapter"))
            except Exception as err:  # noqa: BLE001  (the checkpoint above is already safe)
                self.log.line(f"adapter export failed | iteration {self.iteration} | error {type(err).__name__}: {err}")
                return self.finish(EXIT_ERROR, meter)
            self.log.line(f"adapter exported | iteration {self.iteration} | path adapter")
        return self.finish(EXIT_OK, meter)
