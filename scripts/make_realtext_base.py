#!/usr/bin/env python
"""Pretrain the small base model of the real-text precision comparison (deterministic, seeded, CPU, a few minutes).

Writes recipes/data/realtext/base/ (config.json + model.safetensors): a transformers LlamaForCausalLM with the
shape of recipes/models/tiny_llama.yaml and the realtext tokenizer's vocab (1536), every weight trained from
scratch with plain PyTorch (scripts/tiny_pretrain.py, the quickstart base's loop) as a causal LM on English text
of the same kind as, but disjoint from, recipes/data/realtext/{train,validation}.jsonl: docstrings and source
comments of the standard-library modules the SFT set does not use, plus the language-reference topics pydoc
ships (scripts/make_realtext_data.py's pretrain_documents; no paragraph of the SFT train or validation files).
The corpus is small (~120k tokens), so the defaults stop early and decay weights hard: the loss on
validation.jsonl bottoms out near 200 steps (4.37; 600 steps at weight decay 0.1 overfit it back to 8.5).

So recipes/compare_realtext.yaml (LoRA on this base) starts from a model that already writes Python-docs
English and adapts it to the SFT modules' text, instead of LoRA on random weights. Documents are tokenized by
the trainer's own code with the realtext tokenizer (BOS first, EOS last, every token supervised), one document
per row as in the SFT packs. The held-out loss logged and returned is on validation.jsonl (never trained on).
Generated from the running Python's standard library: README.txt records the version the committed base
came from (this script rewrites its base/ paragraph). Same Python, torch and thread count -> bit-identical
weights.

Usage: python scripts/make_realtext_base.py [--out recipes/data/realtext/base] [--steps 200] [--seed 11] [--heads N]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from scripts.make_realtext_data import VOCAB_SIZE, pretrain_documents  # noqa: E402  (the SFT data generator)
from scripts.tiny_pretrain import llama_config, new_model, pretrain, save, tokenize  # noqa: E402  (shared loop)

REALTEXT = os.path.join(ROOT, "recipes", "data", "realtext")


def sft_texts(data: str, split: str) -> list[str]:
    with open(os.path.join(data, f"{split}.jsonl")) as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def corpus(data: str) -> tuple[list[str], list[str]]:
    """(pretraining documents, SFT validation documents): the former share no paragraph with the SFT files."""
    train, val = sft_texts(data, "train"), sft_texts(data, "validation")
    return pretrain_documents({p for text in train + val for p in text.split("\n\n")}), val


def train(args) -> dict:
    import torch

    from trainer.data.tokenize import load_tokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = load_tokenizer(os.path.join(args.data, "tokenizer"))
    texts, val = corpus(args.data)
    docs, held = tokenize([[t] for t in texts], tok), tokenize([[t] for t in val], tok)
    config = llama_config(vocab_size=VOCAB_SIZE)
    if args.heads:  # the same widths, other attention heads (e.g. 1: head dim 128, what TE's FP8 attention takes)
        config.num_attention_heads = config.num_key_value_heads = args.heads
        config.head_dim = config.hidden_size // args.heads
    model = new_model(config, tok)
    res = pretrain(model, docs, held, tok.pad_token_id, steps=args.steps, batch_size=args.batch, lr=args.lr,
                   warmup=args.warmup, seed=args.seed, eval_every=args.eval_every, weight_decay=args.weight_decay)
    save(model, args.out, args.bf16)
    res = {"out": os.path.abspath(args.out), "documents": len(docs), "tokens": sum(len(d) for d, _ in docs),
           "characters": sum(map(len, texts)), "steps": args.steps, "python": platform.python_version(),
           "torch": torch.__version__, "threads": args.threads, **res}
    if os.path.abspath(args.out) == os.path.join(os.path.abspath(args.data), "base"):
        note_in_readme(args, res)
    return res


def note_in_readme(args, res: dict) -> None:
    """Replace the base/ paragraph of the data's README.txt (the rest is make_realtext_data.py's)."""
    path = os.path.join(args.data, "README.txt")
    with open(path) as f:
        head = f.read().split("\nbase/:")[0].rstrip("\n")
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    with open(path, "w") as f:
        f.write(f"{head}\nbase/: the base of compare_realtext.yaml, made by scripts/make_realtext_base.py "
                f"(CPython {res['python']}, torch {res['torch']}, {res['threads']} threads, {res['seconds']:.0f} s): "
                f"tiny_llama shape with vocab {VOCAB_SIZE}, {res['params']} parameters, "
                f"{'bf16' if args.bf16 else 'fp32'} ({size / 1e6:.1f} MB);\n"
                f"pretrained for {res['steps']} steps of {args.batch} documents on {res['documents']} documents "
                f"({res['tokens']} tokens) of docstrings and source comments of the other standard-library modules "
                f"and pydoc's language-reference topics (no paragraph, no module shared with train/validation).\n"
                f"Final train loss {res['train_loss']:.2f}; loss on validation.jsonl {res['held_out_loss'][0]:.2f} "
                f"(random init) -> {res['held_out_loss'][1]:.2f} (uniform: ln {VOCAB_SIZE} = "
                f"{math.log(VOCAB_SIZE):.2f}). LoRA on it: see recipes/compare_realtext.yaml.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REALTEXT, "base"))
    ap.add_argument("--data", default=REALTEXT, help="the realtext set: tokenizer/, train.jsonl, validation.jsonl")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.5)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (part of what makes the weights exact)")
    ap.add_argument("--heads", type=int, help="attention heads (one key/value group each; default: tiny_llama's 4 "
                    "heads in 2 groups); a base with --heads 1 runs bench/gpu_suite.sh fp8attn-realtext")
    ap.add_argument("--bf16", action="store_true", help="save the weights in bf16 (default fp32)")
    args = ap.parse_args()
    print(json.dumps(train(args)))


if __name__ == "__main__":
    main()
