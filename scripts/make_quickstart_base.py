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
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (HERE, ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

from make_quickstart_data import make_record  # noqa: E402  (the SFT data generator, reused)

QUICKSTART = os.path.join(ROOT, "recipes", "data", "quickstart")
PRESET = os.path.join(ROOT, "recipes", "models", "tiny_llama.yaml")
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


def tokenize(docs: list[list[str]], tok, answers_only: bool = False):
    """(ids, supervised flags) per document, tokenized exactly like the trainer tokenizes SFT segments; with
    `answers_only` only the last segment of two-segment documents is supervised (task answers)."""
    from trainer.data.segments import Segment
    from trainer.data.tokenize import tokenize_documents, tokenizer_info

    segs = [[Segment(t, not answers_only or (len(d) > 1 and i == len(d) - 1)) for i, t in enumerate(d)]
            for d in docs if not answers_only or len(d) > 1]
    tokens, sup, off = tokenize_documents(segs, tok, tokenizer_info(tok))
    return [(tokens[off[i]:off[i + 1]].tolist(), sup[off[i]:off[i + 1]].tolist()) for i in range(len(segs))]


def llama_config(preset_path: str = PRESET):
    import yaml
    from transformers import LlamaConfig

    with open(preset_path) as f:
        m = yaml.safe_load(f)
    heads = int(m["num_attention_heads"])
    return LlamaConfig(
        vocab_size=int(m["vocab_size"]), hidden_size=int(m["hidden_size"]),
        intermediate_size=int(m["ffn_hidden_size"]), num_hidden_layers=int(m["num_layers"]),
        num_attention_heads=heads, num_key_value_heads=int(m.get("num_query_groups") or heads),
        head_dim=int(m.get("kv_channels") or int(m["hidden_size"]) // heads),
        max_position_embeddings=int(m["max_position_embeddings"]), rms_norm_eps=float(m["norm_epsilon"]),
        rope_theta=float(m["rotary_base"]), tie_word_embeddings=not bool(m.get("untie_embeddings", True)),
        attention_bias=False, mlp_bias=False, hidden_act="silu", initializer_range=0.02,
        bos_token_id=0, eos_token_id=1, pad_token_id=2)


def batch(docs: list[list[int]], idx: list[int], pad: int):
    """Right-padded [B, L] input ids, labels (-100 on padding and unsupervised tokens), attention mask."""
    import torch

    rows = [docs[i] for i in idx]
    width = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for j, (r, sup) in enumerate(rows):
        ids[j, :len(r)] = torch.tensor(r)
        labels[j, :len(r)] = torch.where(torch.tensor(sup, dtype=torch.bool), ids[j, :len(r)], -100)
        mask[j, :len(r)] = 1
    return ids, labels, mask


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def evaluate(model, docs, pad: int, bs: int = 256) -> float:
    import torch

    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for s in range(0, len(docs), bs):
            ids, labels, mask = batch(docs, list(range(s, min(s + bs, len(docs)))), pad)
            n = int((labels[:, 1:] != -100).sum())
            total += float(model(input_ids=ids, attention_mask=mask, labels=labels).loss) * n
            count += n
    model.train()
    return total / max(count, 1.0)


def train(args) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    from trainer.data.tokenize import load_tokenizer

    torch.manual_seed(args.seed)
    tok = load_tokenizer(args.tokenizer)
    docs = tokenize(corpus(args.records, args.seed), tok)
    held = tokenize(corpus(1024, args.seed + 1), tok, answers_only=True)  # reverse/sort answers
    config = llama_config()
    if len(tok) > config.vocab_size:
        raise SystemExit(f"tokenizer has {len(tok)} tokens, the preset's vocab_size is {config.vocab_size}")
    config.bos_token_id, config.eos_token_id, config.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    model = LlamaForCausalLM(config).float()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    start_eval = evaluate(model, held, tok.pad_token_id)
    t0, log = time.perf_counter(), []
    for step in range(args.steps):
        idx = torch.randint(len(docs), (args.batch,), generator=gen).tolist()
        ids, labels, mask = batch(docs, idx, tok.pad_token_id)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            log.append((step, round(loss.item(), 4)))
            held_loss = f" | held-out answer loss {evaluate(model, held, tok.pad_token_id):.4f}" if step % 500 == 0 \
                else ""
            print(f"step {step} | loss {loss.item():.4f}{held_loss} | {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    end_eval = evaluate(model, held, tok.pad_token_id)
    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16 if args.bf16 else torch.float32).save_pretrained(args.out, safe_serialization=True)
    if os.path.exists(os.path.join(args.out, "generation_config.json")):  # config.json + weights only
        os.remove(os.path.join(args.out, "generation_config.json"))
    return {"out": os.path.abspath(args.out), "documents": len(docs), "steps": args.steps,
            "held_out_answer_loss": [round(start_eval, 4), round(end_eval, 4)], "train_loss": log[-1][1],
            "seconds": round(time.perf_counter() - t0, 1),
            "params": sum(p.numel() for p in model.parameters())}


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
