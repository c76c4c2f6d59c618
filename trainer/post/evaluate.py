"""`eval`: eval loss and token accuracy of a checkpoint on the run's validation split (or another dataset),
formatted and packed as the run's, batched as the trainer's evaluation (trainer.step.evaluate.evaluate: the first
eval_iters global batches of the unshuffled validation stream), without training.

The loss is the trainer's own per-token loss (trainer.model.forward_losses), so the result equals the eval
loss the trainer logged at that iteration; token accuracy is the share of supervised positions whose argmax
prediction (a second forward pass, logits kept) is the label."""
from __future__ import annotations

import math
from typing import Optional

from trainer.data import check_vocab, mlperf
from trainer.data.build import build_split
from trainer.data.options import DataOptions
from trainer.data.tokenize import load_tokenizer, tokenizer_info
from trainer.post.runstate import PostError, checkpoint_dir, load_model, say


def validation_packs(cfg):
    """The validation split only (the train split is neither read nor packed)."""
    opts = DataOptions.from_config(cfg)
    if not opts.validation.enabled:
        raise PostError("the run has no validation split (trainer.data.validation); give --data PATH")
    if opts.format == "mlperf_npy":
        pad = tokenizer_info(load_tokenizer(opts.tokenizer)).pad_id if opts.tokenizer else 0
        packs, stats = mlperf.load_split(opts, opts.validation, "validation", pad)
    else:
        tok = load_tokenizer(opts.tokenizer)
        packs, stats = build_split(opts, opts.validation, "validation", tok, tokenizer_info(tok))
    check_vocab({"validation": packs}, cfg.trainer.model.vocab_size)
    return packs, stats


class AccuracyForward:
    """forward_losses(model, batch), counting argmax hits on supervised positions on the way."""

    def __init__(self, num_batches: int) -> None:
        self.correct = self.counted = 0
        self.calls, self.num_batches = 0, num_batches

    def __call__(self, model, batch):
        from trainer.step.evaluate import token_hits
        from trainer.model import forward_losses

        per_token = forward_losses(model, batch)
        hits, positions = token_hits(model, batch).tolist()
        self.correct += int(hits)
        self.counted += int(positions)
        self.calls += 1
        say(f"eval | micro-batch {self.calls} | tokens {self.counted} | accuracy so far "
            f"{self.correct / max(self.counted, 1):.4f}")
        return per_token


def run(cfg, run_dir: str, iteration: Optional[int], data: Optional[str]) -> dict:
    from trainer.runtime.distributed import destroy_distributed
    from trainer.step.evaluate import evaluate, num_eval_batches

    path = checkpoint_dir(run_dir, iteration)  # (a run without one fails before its validation data is built)
    packs, stats = validation_packs(cfg)
    s = cfg.trainer.schedule
    gbs, mbs, iters = int(s.global_batch_size), int(s.micro_batch_size), int(s.eval_iters)
    batches = num_eval_batches(len(packs), gbs, iters)
    say(f"eval | data {data or 'validation split'} | packs {len(packs)} | global batches {batches}")
    model, info, it = load_model(cfg, path)
    fwd = AccuracyForward(batches)
    try:
        loss = evaluate(model, fwd, packs, global_batch_size=gbs, micro_batch_size=mbs, eval_iters=iters,
                        seed=int(cfg.experiment.seed), dp_rank=0, dp_size=1, device=info.device, accuracy=False).loss
    finally:
        destroy_distributed()
    acc = fwd.correct / max(fwd.counted, 1)
    result = {"iteration": it, "eval_loss": loss, "token_accuracy": acc, "loss_tokens": fwd.counted,
              "global_batches": batches, "data": data or "validation", "perplexity": math.exp(min(loss, 700.0)),
              "data_stats": {k: v for k, v in (stats or {}).items() if isinstance(v, (int, float, str))}}
    result["summary"] = (f"eval iteration {it} | eval loss {loss:.6E} | token accuracy {acc:.4f} | "
                         f"tokens {fwd.counted} | data {result['data']}")
    return result
