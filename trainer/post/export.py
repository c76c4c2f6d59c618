"""`export`: the PEFT adapter of a checkpoint, and/or a merged Hugging Face checkpoint (base + LoRA deltas).

The adapter comes from the checkpoint through the training model (trainer.model.peft_export, the same writer
the trainer ends with); the merge is trainer.model.hf.merge.merge_adapter (tensor by tensor, base dtype), with
the training precision stated in its note and the run's tokenizer next to the weights (the base's tokenizer files
are copied only where they are the run's: trainer.tokenizer.path is the base directory)."""
from __future__ import annotations

import os
from typing import Optional

from trainer.data.tokenize import load_tokenizer
from trainer.post.runstate import PostError, checkpoint_dir, load_model, precision_note, say

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def export_adapter(cfg, run_dir: str, iteration: Optional[int], out_dir: str) -> int:
    """Write checkpoint `iteration`'s (default latest) adapter to out_dir in PEFT format; returns its iteration."""
    from trainer.runtime.distributed import destroy_distributed
    from trainer.model import export_peft

    path = checkpoint_dir(run_dir, iteration)
    model, _, it = load_model(cfg, path)
    try:
        export_peft(model, cfg, out_dir)
    finally:
        del model
        destroy_distributed()
        _free_device_memory()  # generate/merge load another model next, into the same memory
    say(f"adapter exported | iteration {it} | path {out_dir}")
    return it


def _free_device_memory() -> None:
    """The megatron model is held in a reference cycle (chunked_loss binds its loss to the model), so `del` alone
    frees nothing until a later cyclic collection: collect now and give the allocator's cache back."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def tokenizer_is_base(cfg) -> bool:
    """The run's tokenizer is the pretrained base directory's own (trainer.tokenizer.path names it), or the run has
    none (mlperf_npy data, pre-tokenized)."""
    tok, base = cfg.trainer.tokenizer.path, cfg.trainer.checkpoint.pretrained
    return not tok or len({os.path.realpath(os.path.expanduser(str(p))) for p in (tok, base)}) == 1


def save_tokenizer(cfg, out_dir: str) -> bool:
    """The run's tokenizer into out_dir unless a tokenizer is already there (or the run has none); True when
    written."""
    if not cfg.trainer.tokenizer.path or any(os.path.exists(os.path.join(out_dir, f)) for f in TOKENIZER_FILES):
        return False
    load_tokenizer(cfg.trainer.tokenizer.path).save_pretrained(out_dir)
    return True


def save_generation_config(out_dir: str) -> bool:
    """generation_config.json from the merged config.json when the base had none; True when written."""
    if os.path.exists(os.path.join(out_dir, "generation_config.json")):
        return False
    from transformers import AutoConfig, GenerationConfig

    GenerationConfig.from_model_config(AutoConfig.from_pretrained(out_dir)).save_pretrained(out_dir)
    return True


def merge(cfg, adapter_dir: str, out_dir: str, iteration: int) -> dict:
    base = cfg.trainer.checkpoint.pretrained
    if not base:
        raise PostError("--merged needs a pretrained base (trainer.checkpoint.pretrained); this run trained "
                        "adapters on randomly initialised weights")
    from trainer.model.hf.merge import merge_adapter

    note = f"{precision_note(cfg)} (LoRA of primus-slurm run {cfg.experiment.name}, checkpoint iteration {iteration})."
    say(f"merge | base {base} | adapter {adapter_dir} | out {out_dir}")
    info = dict(merge_adapter(base, adapter_dir, out_dir, note=note, base_tokenizer=tokenizer_is_base(cfg)) or {})
    if save_tokenizer(cfg, out_dir):
        say(f"merge | tokenizer saved from {cfg.trainer.tokenizer.path}")
    if save_generation_config(out_dir):
        say("merge | generation_config.json made from config.json (the base has none)")
    say(f"merged model written | path {out_dir}")
    return {**info, "note": note}


def run(cfg, run_dir: str, out: str, iteration: Optional[int], adapter: Optional[str], merged: Optional[str]) -> dict:
    if not adapter and not merged:
        raise PostError("export needs --adapter OUT and/or --merged OUT")
    if merged and not cfg.trainer.checkpoint.pretrained:
        merge(cfg, "", merged, 0)  # raises the one-line refusal before any work
    adapter_dir = adapter or os.path.join(out, "adapter")
    it = export_adapter(cfg, run_dir, iteration, adapter_dir)
    result = {"iteration": it, "adapter": adapter_dir, "precision": precision_note(cfg)}
    summary = f"export iteration {it} | adapter {adapter_dir}"
    if merged:
        result["merged"] = merged
        result["merge"] = merge(cfg, adapter_dir, merged, it)
        summary += f" | merged {merged}"
    result["summary"] = summary
    return result
