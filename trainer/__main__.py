"""`python -m trainer --config <run_dir>/recipe.resolved.yaml --run-dir <run_dir>` (torchrun or single process).

Order: config -> precision capability check (exit 2, one line) -> distributed init -> log start
(+ resume decision) -> data -> model (trainer.model.transforms, FP4 emulation last; the precision resolved
at the check is passed down) -> optimizer -> resume state -> loop.
Exit codes: trainer/runtime/signals.py.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from primus_contract import run_files
from primus_contract.hf_config import HFConfigError
from primus_contract.rules_dependent import inert_keys, with_device
from trainer.checkpointing import checkpoint as ckpt
from trainer import precision
from trainer.observability import quiet
from trainer.config import ConfigError, load_config
from trainer.runtime.signals import EXIT_CONFIG, EXIT_ERROR, StopSignal, exit_process, record_exit


class SetupError(Exception):
    """A one-line, user-facing reason to exit with EXIT_CONFIG."""


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _say(msg: str, logger=None) -> None:
    """A refusal (exit EXIT_CONFIG): the log's last line and the event stream's outcome."""
    if logger is not None and logger.enabled:
        logger.outcome(msg, EXIT_CONFIG)
    if _rank() == 0:
        print(msg, file=sys.stderr, flush=True)


def _check_at_start(cfg) -> "precision.Precision":
    """Refuse (one line, exit 2) a recipe the contract refuses or this machine cannot run; never fall back
    silently (trainer/runtime/start_check.py: the same rules `submit` ran, then the machine's). The run's precision,
    resolved here once and passed down."""
    os.environ.update(precision.te_environment(cfg))  # read by TE at import: set before anything imports it
    from trainer.runtime.start_check import StartRefused, pre_start

    try:
        return pre_start(cfg)
    except StartRefused as err:
        raise SetupError(f"config error | {err}") from None


def find_resume(cfg, run_dir: str, rhash: str) -> tuple:
    """(checkpoint dir or None, schedule note or '') to resume from; SetupError when the recipe hash differs or
    the LR schedule would jump (trainer.step.schedule.resume_change)."""
    if cfg.trainer.checkpoint.resume != "auto":
        return None, ""
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    try:
        path = ckpt.read_latest(ckpt_dir)
    except ckpt.CheckpointError as err:
        raise SetupError(f"resume refused | {err}") from None
    if path is None:
        return None, ""
    import json

    from trainer.step.schedule import resume_change

    with open(os.path.join(path, "metadata.json")) as fh:
        meta = json.load(fh)
    if meta.get("recipe_hash") != rhash:
        raise SetupError(f"resume refused | {os.path.relpath(path, run_dir)} was written by a different recipe "
                         f"(hash {meta.get('recipe_hash')} != {rhash}); use a new run directory or "
                         f"checkpoint.resume: never")
    try:
        note = resume_change(cfg.trainer.schedule, meta.get("lr_decay_iters"), ckpt.iteration_of(path))
    except ValueError as err:
        raise SetupError(f"resume refused | {err}") from None
    return path, note


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer")
    ap.add_argument("--config", required=True, help="resolved recipe YAML")
    ap.add_argument("--run-dir", required=True, help="run directory (logs/, checkpoints/, adapter/)")
    args = ap.parse_args(argv)
    quiet.install()  # before anything imports megatron-core
    run_dir = os.path.abspath(args.run_dir)
    attempt = run_files.current_attempt()
    try:
        try:
            cfg = load_config(args.config)
            prec = _check_at_start(cfg)
        except (ConfigError, OSError) as err:
            raise SetupError(f"config error | {err}") from None
        return _train(cfg, prec, run_dir, attempt)
    except SetupError as err:  # before the run's logger exists: rank 0 still writes its log, which status reads
        _say(str(err), _early_logger(run_dir, attempt))
        return EXIT_CONFIG


def _early_logger(run_dir: str, attempt: int):
    """This attempt's rank-0 log for a refusal before distributed init (None elsewhere, or if it cannot open)."""
    if _rank() != 0:
        return None
    from trainer.observability.logger import TrainLogger

    try:
        return TrainLogger(run_dir, 0, attempt)
    except OSError:
        return None


def _on_device(r: dict, device) -> dict:
    """The resolved recipe with the device this rank got in place of auto: the notes then judge the node as it is
    (on a profile that names no GPU, `validate` judged auto on both)."""
    return r if r["trainer"]["distributed"]["device"] != "auto" else with_device(r, device.type)


def _train(cfg, prec, run_dir: str, attempt: int) -> int:
    from trainer.data.errors import DataError
    from trainer.runtime.distributed import destroy_distributed, init_distributed
    from trainer.observability.logger import TrainLogger
    from trainer.observability.tracking import TrackerError

    info = init_distributed(cfg)
    logger = TrainLogger(run_dir, info.rank, attempt)
    stop = StopSignal().install()
    code = None
    try:
        rhash = ckpt.recipe_hash(cfg.trainer.to_dict(), seed=cfg.experiment.seed)
        resume_path, schedule_note = find_resume(cfg, run_dir, rhash)
        logger.start(attempt, info.world_size, info.device,
                     os.path.relpath(resume_path, run_dir) if resume_path else None)
        logger.args(cfg)
        for line in inert_keys(_on_device(cfg.to_dict(), info.device)):  # (validate and submit printed them)
            logger.line(f"note | {line}")
        logger.open_trackers(cfg, run_dir, attempt)
        if schedule_note:
            logger.line(schedule_note)
        trainer = _build(cfg, prec, run_dir, info, logger, stop, rhash, resume_path)
        code = trainer.run()
    except (SetupError, DataError, ConfigError, TrackerError, ckpt.CheckpointError, HFConfigError) as err:
        # (CheckpointError: a checkpoint this run cannot resume from, e.g. a random base at another TP size on a GPU;
        # HFConfigError: trainer.checkpoint.pretrained is not the checkpoint the recipe describes, or not one at all)
        _say(str(err) if isinstance(err, SetupError) else f"config error | {err}", logger)
        code = EXIT_CONFIG
    except Exception as err:  # noqa: BLE001
        from trainer.observability.stragglers import record_error

        # a CUDA/HIP error or a collective timeout, for the node ledger; `stopping` is read inside, once the signal
        # handlers pending since the error (SIGCONT, SIGTERM) have run
        record_error(run_dir, err, lambda: stop.requested or stop.woken)
        logger.outcome(f"error | {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", EXIT_ERROR)
        traceback.print_exc()
        code = EXIT_ERROR
    finally:
        # the exit code where the launcher reads it BEFORE the teardown: torchrun forwards a second SIGTERM, which the
        # restored default handler turns into 143 during destroy_distributed (test_exit_codes[slurm] under load: the
        # log said exit 75, the job 143)
        if code is not None:
            record_exit(code)
        stop.uninstall()
        logger.close()
        destroy_distributed()
    return code


def _build(cfg, prec, run_dir, info, logger, stop, rhash, resume_path):
    from trainer.data import build_datasets
    from trainer.model import adapter_state_dict, build, export_peft, forward_losses
    from trainer.step.optim import build_optimizer, trainable_parameters
    from trainer.step.train import Trainer

    train_packs, val_packs, stats = build_datasets(cfg, info.rank, info.world_size)
    for split, st in (stats or {}).items():
        if isinstance(st, dict):
            logger.line(f"data | split {split} | " + " | ".join(
                f"{k} {v}" for k, v in st.items() if isinstance(v, (int, float, str)) and k != "cache_path"))
    one_doc = train_packs is not None and train_packs.max_pack_documents() <= 1
    by_data = precision.follow_data(prec, cfg, one_doc)  # FP8 attention null on packed rows of one document
    if by_data is not prec:
        prec = by_data
        logger.line("note | fp8 attention | on: every row of the train split holds one document (precision."
                    "fp8_dot_product_attention null; `validate` and `plan` cannot see the data and say off)")
    built = build(cfg, info.device, prec)  # the model transforms, in order (trainer.model.transforms)
    model = built.model
    line = precision.describe(prec, model)
    logger.record("precision", line, line=line)
    coverage = precision.fp8_attention_coverage(model, train_packs)
    if coverage:
        logger.line(coverage)
    for line in built.log_lines:
        logger.line(line)
    if quiet.summary():  # megatron-core is imported by now
        logger.line(quiet.summary())
    params = trainable_parameters(model)
    optimizer = build_optimizer(params, cfg.trainer.schedule)
    start = 0
    if resume_path is not None:
        from trainer.checkpointing.reshard import restore  # same layout: this rank's file; else resharded adapters + AdamW

        start, note = restore(resume_path, model, optimizer, info,
                              random_base=not cfg.trainer.checkpoint.pretrained)
        if note:  # another layout: the saved RNG streams do not map onto these ranks (dropout would replay step 1's)
            from trainer.runtime.distributed import seed_streams

            seed_streams(int(cfg.experiment.seed), info.pp_rank, info.dp_rank, iteration=start)
        logger.line(f"checkpoint loaded | iteration {start} | path {os.path.relpath(resume_path, run_dir)}"
                    + (f" | {note}" if note else ""))
    return Trainer(cfg, run_dir, info, model, optimizer, params, train_packs, val_packs, forward_losses, logger, stop,
                   adapter_state_dict, start_iteration=start, last_saved=start if resume_path else 0,
                   export_peft=export_peft, recipe_hash=rhash, ub_tokens=built.ub_tokens)


if __name__ == "__main__":
    code = main()
    record_exit(code)
    exit_process(code)
