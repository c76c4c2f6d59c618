"""Shared plain-PyTorch pretraining of the tiny bundled base models (scripts/make_quickstart_base.py,
scripts/make_realtext_base.py): a transformers LlamaForCausalLM with the shape of recipes/models/tiny_llama.yaml,
every weight trained from scratch as a causal LM, saved as config.json + model.safetensors (what
trainer.checkpoint.pretrained loads through trainer/model/hf/importer.py). Deterministic: same torch, same thread
count, same seed -> bit-identical weights. Not a script; the make_*_base.py scripts are.
"""
from __future__ import annotations

import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = os.path.join(ROOT, "recipes", "models", "tiny_llama.yaml")


def tokenize(docs: list[list[str]], tok, answers_only: bool = False):
    """(ids, supervised flags) per document (a list of text segments), tokenized exactly like the trainer
    tokenizes SFT segments (BOS first, EOS last); with `answers_only` only the last segment of two-segment
    documents is supervised (task answers) and one-segment documents are left out."""
    from trainer.data.segments import Segment
    from trainer.data.tokenize import tokenize_documents, tokenizer_info

    segs = [[Segment(t, not answers_only or (len(d) > 1 and i == len(d) - 1)) for i, t in enumerate(d)]
            for d in docs if not answers_only or len(d) > 1]
    tokens, sup, off = tokenize_documents(segs, tok, tokenizer_info(tok))
    return [(tokens[off[i]:off[i + 1]].tolist(), sup[off[i]:off[i + 1]].tolist()) for i in range(len(segs))]


def llama_config(preset_path: str = PRESET, vocab_size: int | None = None):
    """The transformers LlamaConfig of a model preset (recipes/models/*.yaml), optionally with another vocab."""
    import yaml
    from transformers import LlamaConfig

    with open(preset_path) as f:
        m = yaml.safe_load(f)
    heads = int(m["num_attention_heads"])
    return LlamaConfig(
        vocab_size=int(vocab_size or m["vocab_size"]), hidden_size=int(m["hidden_size"]),
        intermediate_size=int(m["ffn_hidden_size"]), num_hidden_layers=int(m["num_layers"]),
        num_attention_heads=heads, num_key_value_heads=int(m.get("num_query_groups") or heads),
        head_dim=int(m.get("kv_channels") or int(m["hidden_size"]) // heads),
        max_position_embeddings=int(m["max_position_embeddings"]), rms_norm_eps=float(m["norm_epsilon"]),
        rope_theta=float(m["rotary_base"]), tie_word_embeddings=not bool(m.get("untie_embeddings", True)),
        attention_bias=False, mlp_bias=False, hidden_act="silu", initializer_range=0.02,
        bos_token_id=0, eos_token_id=1, pad_token_id=2)


def new_model(config, tok):
    """A freshly initialised fp32 LlamaForCausalLM for `config`, with the tokenizer's special token ids (draws
    from torch's global RNG: seed it first)."""
    from transformers import LlamaForCausalLM

    if len(tok) > config.vocab_size:
        raise SystemExit(f"tokenizer has {len(tok)} tokens, the model's vocab_size is {config.vocab_size}")
    config.bos_token_id, config.eos_token_id, config.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    return LlamaForCausalLM(config).float()


def batch(docs: list[tuple[list[int], list[int]]], idx: list[int], pad: int):
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
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def evaluate(model, docs, pad: int, bs: int = 256) -> float:
    """Mean loss per supervised (next-)token over `docs`."""
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


def pretrain(model, docs, held, pad: int, *, steps: int, batch_size: int, lr: float, warmup: int, seed: int,
             eval_every: int = 500, weight_decay: float = 0.01) -> dict:
    """AdamW on random batches of `docs` (with replacement, seeded), gradient clipping at 1.0, lr_at schedule;
    logs to stderr every 100 steps and, after every `eval_every`-th step, the loss on `held`. Returns a summary."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    start_eval = evaluate(model, held, pad)
    t0, log, evals = time.perf_counter(), [], []
    for step in range(steps):
        idx = torch.randint(len(docs), (batch_size,), generator=gen).tolist()
        ids, labels, mask = batch(docs, idx, pad)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        held_loss = ""
        if step % eval_every == 0:
            evals.append((step, round(evaluate(model, held, pad), 4)))
            held_loss = f" | held-out loss {evals[-1][1]:.4f}"
        if step % 100 == 0 or step == steps - 1 or held_loss:
            log.append((step, round(loss.item(), 4)))
            print(f"step {step} | loss {loss.item():.4f}{held_loss} | {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    end_eval = evaluate(model, held, pad)
    return {"held_out_loss": [round(start_eval, 4), round(end_eval, 4)], "train_loss": log[-1][1],
            "held_out_curve": evals, "seconds": round(time.perf_counter() - t0, 1),
            "params": sum(p.numel() for p in model.parameters())}


def save(model, out: str, bf16: bool) -> None:
    """config.json + model.safetensors in `out` (bf16 or fp32 weights), nothing else."""
    import torch

    os.makedirs(out, exist_ok=True)
    model.to(torch.bfloat16 if bf16 else torch.float32).save_pretrained(out, safe_serialization=True)
    if os.path.exists(os.path.join(out, "generation_config.json")):
        os.remove(os.path.join(out, "generation_config.json"))
    for name in ("config.json", "model.safetensors"):  # safetensors writes 0600; the files ship in the wheel
        os.chmod(os.path.join(out, name), 0o644)
