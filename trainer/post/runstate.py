"""What a post-training job loads from a run directory: its resolved recipe (as one process), a checkpoint,
and the megatron model with that checkpoint's adapters (trainer.checkpointing.reshard restores any saved layout)."""
from __future__ import annotations

import os
import sys
from typing import Optional

from trainer.checkpointing import checkpoint as ckpt
from trainer.config import Config, load_config


class PostError(Exception):
    """A one-line user-facing reason; the job prints `error: <it>` and exits 2."""


def say(msg: str) -> None:
    """A progress line on the job's stdout (the launcher streams it)."""
    print(msg, file=sys.stdout, flush=True)


def run_config(run_dir: str, data_path: Optional[str] = None) -> Config:
    """The run's resolved recipe laid out for one process (every parallel size 1: post jobs are one process;
    checkpoints of any layout load through trainer.checkpointing.reshard). `data_path`: another validation set."""
    path = os.path.join(run_dir, "recipe.resolved.yaml")
    if not os.path.isfile(path):
        raise PostError(f"{run_dir} is not a run directory (no recipe.resolved.yaml)")
    data = load_config(path).to_dict()
    data["trainer"]["parallelism"].update(tensor=1, pipeline=1, context=1, expert=1, sequence_parallel=False,
                                          tp_comm_overlap=False)
    if data_path:  # read with the run's own validation split, as the launcher checked it (post_cli.eval_cmd)
        split = (data["trainer"]["data"].get("validation") or {}).get("split") or "validation"
        data["trainer"]["data"]["validation"] = {"path": data_path, "hf_name": None, "split": split, "limit": None}
    return Config.from_dict(data)


def checkpoint_dir(run_dir: str, iteration: Optional[int] = None) -> str:
    """checkpoints/iter_N (or the one `latest` names); PostError when it is missing or incomplete."""
    root = os.path.join(run_dir, "checkpoints")
    if iteration is None:
        try:
            path = ckpt.read_latest(root)
        except ckpt.CheckpointError as err:
            raise PostError(str(err)) from None
        if path is None:
            raise PostError(f"{root} has no checkpoint yet (no `latest`)")
        return path
    path = os.path.join(root, ckpt.iter_name(iteration))
    if not os.path.isfile(os.path.join(path, "metadata.json")):
        have = ", ".join(str(i) for i, _ in ckpt.list_checkpoints(root)) or "none"
        raise PostError(f"--checkpoint {iteration}: no complete checkpoint {path} (saved iterations: {have})")
    return path


def check_precision(cfg):
    """TE's environment and the capability check of training (a precision this machine lacks: PostError); the
    resolved precision the model is built with."""
    from trainer import precision

    os.environ.update(precision.te_environment(cfg))
    try:
        return precision.resolve(cfg)
    except precision.PrecisionError as err:
        raise PostError(str(err).splitlines()[0] if str(err) else "precision not supported here") from None


def load_model(cfg, path: str):
    """(model in eval mode, DistInfo, iteration): built as in training, adapters of checkpoint `path`."""
    from trainer.runtime.distributed import init_distributed
    from trainer.model import build_model
    from trainer.step.optim import build_optimizer, trainable_parameters
    from trainer.checkpointing.reshard import restore

    from trainer import precision

    # FP8 attention as training ran it: null may have turned it on from the train split (precision.follow_data)
    prec = precision.follow_data(check_precision(cfg), cfg, bool(ckpt.read_metadata(path).get("fp8_attention")))
    if "RANK" not in os.environ:  # one process: a free port, not the job script's (a training job may hold it)
        os.environ.pop("MASTER_PORT", None)
    info = init_distributed(cfg)
    model = build_model(cfg, info.device, prec)  # (FP4 emulation included: trainer.model.transforms)
    say(precision.describe(prec, model))
    optimizer = build_optimizer(trainable_parameters(model), cfg.trainer.schedule)  # restore() fills it too
    try:
        iteration, note = restore(path, model, optimizer, info, random_base=not cfg.trainer.checkpoint.pretrained)
    except ckpt.CheckpointError as err:
        raise PostError(str(err)) from None
    say(f"checkpoint loaded | iteration {iteration} | path {path}" + (f" | {note}" if note else ""))
    model.eval()
    return model, info, iteration


def precision_note(cfg) -> str:
    """The training precision, stated (never baked into exported weights)."""
    p = cfg.trainer.precision
    parts = []
    if p.fp8:
        parts.append(f"FP8 ({p.fp8}, {p.fp8_recipe} scaling{', FP8 weights' if p.get('fp8_param') else ''})")
    if p.fp4:
        parts.append(f"FP4 ({p.fp4}, {p.fp4_recipe}{', emulated' if p.fp4_emulation else ''})")
    base = "BF16" if p.bf16 else "FP32"
    if not parts:
        return f"trained in {base}"
    return f"trained with {' and '.join(parts)} compute on {base} weights; these weights are not quantized"
