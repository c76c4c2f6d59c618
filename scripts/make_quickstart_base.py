#!/usr/bin/env python
"""Pretrain the quickstart's small base model (deterministic, seeded, CPU, a couple of minutes on two cores).

Writes recipes/data/quickstart/base/ (config.json + model.safetensors): a transformers LlamaForCausalLM with
the shape of recipes/models/tiny_llama.yaml, every weight trained from scratch with plain PyTorch as a causal
LM on a *pretraining* corpus that is related to, but is not, the quickstart SFT task:

* "reverse:" and "sort:" examples as plain text (no Alpaca template): the base learns these two tasks;
* for "add the numbers" and "write in capitals": an input ("58 + 5", "a c z") or an output ("63", "A C Z")
  on its own, never the two together, plus letter case pairs ("a A c C z Z"): every token the SFT answers
  use is trained, but not the addition and not the capitals task itself.

So `recipes/quickstart.yaml` (LoRA on this base) has visible work to do: the Alpaca instruction format, and
the addition and capitals tasks (its first loss is ~6.5 nats/token, higher than a uniform guess, because the
base has never seen the template). Records come from scripts/make_quickstart_data.py's generator (another
seed than the SFT data); tokenization is the trainer's own (trainer.data.tokenize), so documents are
tokenized exactly as the SFT run tokenizes its segments (BOS first, EOS last). Same torch, same thread
count -> bit-identical weights.

Usage: python scripts/make_quickstart_base.py [--out recipes/data/quickstart/base] [--steps 2500] [--seed 7]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (HERE, ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

from make_quickstart_data import make_record  # noqa: E402  (the SFT data generator, reused)
from tiny_pretrain import llama_config, new_model, pretrain, save, tokenize  # noqa: E402  (shared loop)

QUICKSTART = os.path.join(ROOT, "recipes", "data", "quickstart")
PLAIN = {"Reverse the letters.": "reverse:\n", "Sort the digits.": "sort:\n"}


def pretrain_texts(record: dict, rng: random.Random) -> list[list[str]]:
    """The pretraining document(s) made from one SFT-style record: lists of text segments."""
    prefix = PLAIN.get(record["instruction"])
    if prefix is not None:  # a task the base learns: plain-text prompt, then the answer
        return [[prefix + record["input"] + "\n", record["output"]]]
    # the other tasks: an input or an output on its own, never the two together; for capitals also
    # letter case pairs ("a A c C"), so the base knows which capital goes with which letter
    pick = rng.randrange(3 if record["instruction"] == "Write in capitals." else 2)
    if pick == 2:
        return [[" ".join(f"{c} {c.upper()}" for c in record["input"].split())]]
    return [[record["input"] if pick == 0 else record["output"]]]


def corpus(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [doc for _ in range(n) for doc in pretrain_texts(make_record(rng), rng)]


def train(args) -> dict:
    import torch

    from trainer.data.tokenize import load_tokenizer

    torch.manual_seed(args.seed)
    tok = load_tokenizer(args.tokenizer)
    docs = tokenize(corpus(args.records, args.seed), tok)
    held = tokenize(corpus(1024, args.seed + 1), tok, answers_only=True)  # reverse/sort answers
    model = new_model(llama_config(), tok)
    res = pretrain(model, docs, held, tok.pad_token_id, steps=args.steps, batch_size=args.batch, lr=args.lr,
                   warmup=args.warmup, seed=args.seed)
    save(model, args.out, args.bf16)
    return {"out": os.path.abspath(args.out), "documents": len(docs), "steps": args.steps,
            "held_out_answer_loss": res["held_out_loss"], "train_loss": res["train_loss"],
            "seconds": res["seconds"], "params": res["params"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(QUICKSTART, "base"))
    ap.add_argument("--tokenizer", default=os.path.join(QUICKSTART, "tokenizer"))
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--bf16", action="store_true", help="save the weights in bf16 (default fp32)")
    args = ap.parse_args()
    print(json.dumps(train(args)))


if __name__ == "__main__":
    main()
