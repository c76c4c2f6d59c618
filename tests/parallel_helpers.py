"""Helpers for the parallel-equivalence tests (no tests here): a loop-ready tiny recipe, synthetic
packed samples with uneven documents, the real trainer.step.train.Trainer step, and gloo rank setup."""
from __future__ import annotations

import os

import numpy as np
import torch

from tests.model_helpers import tiny_cfg

LOOP = {"schedule": {"train_iters": 10, "micro_batch_size": 1, "global_batch_size": 4, "lr": 2e-2,
                     "min_lr": 0.0, "warmup_iters": 0, "lr_decay": "constant", "weight_decay": 0.0,
                     "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8, "clip_grad": 1.0,
                     "eval_interval": None, "eval_iters": 1, "target_eval_loss": None},
        "data": {"shuffle": True, "seq_length": 32},
        "logging": {"log_interval": 1, "log_avg_skip_iterations": 0, "tensorboard": False}}


def loop_cfg(model: dict | None = None, **trainer):
    """tiny_cfg plus the schedule/data/logging sections the Trainer reads; `trainer` overrides
    sections (e.g. parallelism={"pipeline": 2})."""
    sections = {k: dict(v) for k, v in LOOP.items()}
    sections.update(trainer)
    if model:
        sections["model"] = model
    return tiny_cfg(trainer=sections)


def layout_cfg(par: dict, model: dict | None = None, **sections):
    """loop_cfg of a 4-layer tiny model for the parallel layout `par` (e.g. {"pipeline": 2}); global
    batch 4 = 2 micro-batches of 2 packs (DP=2: one per rank; PP=2: a real 1F1B pipeline)."""
    schedule = {**LOOP["schedule"], "micro_batch_size": 2}
    parallelism = {"tensor": 1, "pipeline": 1, "context": 1, "expert": 1, "sequence_parallel": False, **par}
    return loop_cfg(model={"num_layers": 4, **(model or {})}, parallelism=parallelism, schedule=schedule,
                    **sections)


def synthetic_packs(n: int, seq: int, vocab: int, seed: int = 0, active: int = 8) -> list[dict]:
    """Packs as trainer.data builds them: 1-3 documents per pack, the rest padding, so loss-token
    counts differ a lot between packs (a mean of per-pack means would differ from the token mean).
    Tokens come from the first `active` ids only, so a few LoRA steps visibly lower the loss."""
    rng = np.random.default_rng(seed)
    packs = []
    for _ in range(n):
        lengths = []
        while sum(lengths) < seq // 2 or (len(lengths) < 3 and rng.random() < 0.5):
            room = seq - sum(lengths)
            if room < 4:
                break
            lengths.append(int(rng.integers(3, min(room, seq // 2) + 1)))
        ids = rng.integers(0, min(active, vocab), seq).astype(np.int64)
        labels = np.full(seq, -100, dtype=np.int64)
        mask = np.zeros(seq, dtype=np.float32)
        pos = np.zeros(seq, dtype=np.int64)
        cu, start = [0], 0
        for length in lengths:
            labels[start:start + length - 1] = ids[start + 1:start + length]
            mask[start:start + length - 1] = 1.0
            pos[start:start + length] = np.arange(length)
            start += length
            cu.append(start)
        packs.append({"input_ids": ids, "labels": labels, "loss_mask": mask, "position_ids": pos,
                      "cu_seqlens": np.asarray(cu, dtype=np.int64), "num_tokens": start})
    return packs


def make_trainer(cfg, info, model, run_dir: str, packs):
    """The real trainer.step.train.Trainer around `model` (AdamW over its adapters)."""
    from trainer.observability.logger import TrainLogger
    from trainer.model import adapter_state_dict, forward_losses
    from trainer.step.optim import build_optimizer, trainable_parameters
    from trainer.runtime.signals import StopSignal
    from trainer.step.train import Trainer

    params = trainable_parameters(model)
    optimizer = build_optimizer(params, cfg.trainer.schedule)
    logger = TrainLogger(run_dir, info.rank, 0, stream=open(os.devnull, "w"))
    return Trainer(cfg, run_dir, info, model, optimizer, params, packs, None, forward_losses, logger,
                   StopSignal(), adapter_state_dict)


def trajectory(trainer, steps: int) -> list[tuple[float, float]]:
    """(global token-mean loss, grad norm) of `steps` real optimizer steps from trainer.iteration."""
    out = []
    for _ in range(steps):
        it = trainer.iteration
        result = trainer.step(trainer.micro_batches(it), trainer.schedule.lr_at(it + 1))
        trainer.iteration = it + 1
        out.append((float(result.loss_sum) / result.num_loss_tokens, float(result.grad_norm)))
    return out


def save_checkpoint(trainer) -> str:
    """Trainer.save (the real collective atomic checkpoint) of the current iteration; returns its dir."""
    from trainer.checkpointing.checkpoint import iter_name
    from trainer.step.train import Meter

    assert trainer.save(Meter(trainer.device, 0, trainer.iteration)) is None
    return os.path.join(trainer.ckpt_dir, iter_name(trainer.iteration))


def set_rank_env(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def arch_layout_cfg(arch: dict, par: dict, num_layers: int = 2):
    """layout_cfg for a tiny architecture from tests.model_helpers (QWEN3_MOE, DEEPSEEK_MLA, ...)."""
    from tests.model_helpers import arch_sections

    sections = arch_sections(arch)
    return layout_cfg(par, model={**sections.pop("model"), "num_layers": num_layers}, **sections)


def _spawned(rank: int, world: int, ports, runs: dict, run_one, out: str) -> None:
    results = {}
    for (run, par), port in zip(runs.items(), ports):
        set_rank_env(rank, world, port)
        results[run] = run_one(run, par)
    torch.save(results, f"{out}.{rank}")


def run_on_ranks(world: int, runs: dict, run_one, out) -> list[dict]:
    """run_one(run, par) for every (run, par) of `runs`, in order, on `world` spawned gloo ranks (a fresh
    rendezvous port per run); returns each rank's {run: result}. run_one must be picklable (a module-level
    function, or functools.partial of one)."""
    import torch.multiprocessing as mp

    from tests.model_helpers import free_port

    mp.start_processes(_spawned, args=(world, [free_port() for _ in runs], runs, run_one, str(out)),
                       nprocs=world, join=True, start_method="spawn")
    return [torch.load(f"{out}.{rank}") for rank in range(world)]


def probe_losses(model, packs) -> torch.Tensor:
    """Per-token losses of the first two packs without autograd (the evaluation path)."""
    from trainer.data.batching import collate
    from trainer.model import forward_losses

    with torch.no_grad():
        return forward_losses(model, collate(packs[:2]))


def run_layout(cfg, full: dict, packs, run_dir: str, steps: int, resume: str | None = None,
               save_at: int | None = None, export_dir: str | None = None) -> dict:
    """Build the model for cfg's layout in the current (gloo) world, load the global full state
    dict `full` (base + adapters), optionally restore checkpoint `resume` (trainer.checkpointing.reshard), run
    `steps` Trainer steps, saving a checkpoint after `save_at` of them, then export the PEFT adapter
    to `export_dir` (trainer.model.export_peft, collective). Returns trajectory, probe
    (eval losses before training), the checkpoint dir, the reshard note and the layout sizes."""
    from tests.model_helpers import dist_session
    from trainer.model import build_model
    from trainer.model.layout import load_full_global_state_dict
    from trainer.checkpointing.reshard import restore

    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        load_full_global_state_dict(model, full)
        probe = probe_losses(model, packs)
        trainer = make_trainer(cfg, info, model, run_dir, packs)
        note = None
        if resume is not None:
            trainer.iteration, note = restore(resume, model, trainer.optimizer, info)
            trainer.last_saved = trainer.iteration
        traj = trajectory(trainer, save_at if save_at is not None else steps)
        saved = save_checkpoint(trainer) if save_at is not None else None
        traj += trajectory(trainer, steps - len(traj))
        if export_dir is not None:
            from trainer.model import export_peft

            export_peft(model, cfg, export_dir)
        return {"trajectory": traj, "probe": probe, "checkpoint": saved, "note": note,
                "tp": info.tp_size, "pp": info.pp_size, "dp": info.dp_size}


def initial_state(cfg, perturb_seed: int = 7) -> dict:
    """Global full state dict (base + random non-zero adapters) of a single-process build of cfg."""
    from tests.model_helpers import dist_session, perturb_adapters
    from trainer.model import build_model
    from trainer.model.layout import full_global_state_dict

    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        perturb_adapters(model, seed=perturb_seed)
        return {k: v.clone() for k, v in full_global_state_dict(model).items()}


def single_process_references(names, cfg_for, packs, root, steps: int, perturb_seed: int, export=()):
    """For each run name: its initial global state (cfg_for(name, {}) built in one process, adapters
    perturbed) and the single-process trajectory from it ({name: state}, {name: trajectory}); the
    runs named in `export` also export their adapter to <root>/<name>/adapter."""
    states, refs = {}, {}
    for name in names:
        cfg = cfg_for(name, {})
        states[name] = initial_state(cfg, perturb_seed=perturb_seed)
        export_dir = f"{root}/{name}/adapter" if name in export else None
        refs[name] = run_layout(cfg, states[name], packs, f"{root}/{name}", steps, export_dir=export_dir)["trajectory"]
    return states, refs


def assert_same_trajectory(got, ref, rtol: float, label: str, falls: bool = True) -> None:
    assert len(got) == len(ref), label
    for i, ((loss, norm), (rloss, rnorm)) in enumerate(zip(got, ref)):
        assert abs(loss - rloss) <= rtol * abs(rloss), f"{label} step {i + 1}: loss {loss} vs {rloss}"
        assert abs(norm - rnorm) <= 10 * rtol * abs(rnorm), f"{label} step {i + 1}: grad norm {norm} vs {rnorm}"
    if falls:
        assert ref[-1][0] < ref[0][0], f"reference loss did not fall: {ref}"
