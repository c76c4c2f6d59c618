#!/usr/bin/env python
"""Generate the bundled quickstart dataset and tokenizer (deterministic; re-running reproduces the files).

recipes/data/quickstart/train.jsonl, validation.jsonl: Alpaca records ({"instruction", "input", "output"}) of
four tiny tasks a 2-layer model picks up on CPU in about a minute: reverse spaced letters, sort digits,
add two numbers, upper-case spaced letters.
recipes/data/quickstart/tokenizer/: a byte-level BPE (vocab 512, digits split one per token) trained on the
train split; specials <s> (bos, added by default), </s> (eos), <pad>, <|im_start|>, <|im_end|>; ChatML chat
template. Loads offline with transformers.AutoTokenizer.from_pretrained(dir).

Usage: python scripts/make_quickstart_data.py [--out recipes/data/quickstart] [--train 3000] [--val 200]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import string

VOCAB_SIZE = 512
SPECIALS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _letters(rng: random.Random) -> list[str]:
    return [rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 7))]


def make_record(rng: random.Random) -> dict:
    task = rng.randrange(4)
    if task == 0:
        w = _letters(rng)
        return {"instruction": "Reverse the letters.", "input": " ".join(w), "output": " ".join(reversed(w))}
    if task == 1:
        d = [str(rng.randrange(10)) for _ in range(rng.randint(3, 7))]
        return {"instruction": "Sort the digits.", "input": " ".join(d), "output": " ".join(sorted(d))}
    if task == 2:
        a, b = rng.randrange(100), rng.randrange(100)
        return {"instruction": "Add the numbers.", "input": f"{a} + {b}", "output": str(a + b)}
    w = _letters(rng)
    return {"instruction": "Write in capitals.", "input": " ".join(w), "output": " ".join(w).upper()}


HELDOUT_TASKS = ("Reverse the letters.", "Sort the digits.")


def make_heldout(rng: random.Random, seen: set, per_task: int = 8) -> list[dict]:
    """Reversal and sort records whose (instruction, input) is in neither split: `primus-slurm generate`'s
    bundled prompts (prompts.jsonl; the README's before/after and tests/test_post_*.py score them)."""
    out: dict[str, list[dict]] = {t: [] for t in HELDOUT_TASKS}
    while any(len(v) < per_task for v in out.values()):
        r = make_record(rng)
        key = (r["instruction"], r["input"])
        if r["instruction"] in out and len(out[r["instruction"]]) < per_task and key not in seen:
            seen.add(key)
            out[r["instruction"]].append(r)
    return [r for pair in zip(*out.values()) for r in pair]


def write_jsonl(path: str, records: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def train_tokenizer(texts: list[str], out_dir: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1024
    fast.save_pretrained(out_dir)
    _portable_config(out_dir)


def _portable_config(out_dir: str) -> None:
    """Make tokenizer_config.json loadable by transformers 4.x as well as 5.x: generic fast-tokenizer class,
    chat template inline, specials under both key names."""
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path) as f:
        cfg = json.load(f)
    extra = ["<|im_start|>", "<|im_end|>"]
    cfg.update({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
                "additional_special_tokens": extra, "extra_special_tokens": extra,
                "add_bos_token": True, "add_eos_token": False})
    cfg.pop("backend", None)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    template = os.path.join(out_dir, "chat_template.jinja")
    if os.path.exists(template):
        os.remove(template)


def _vocab(tok_dir: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tok_dir))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "recipes", "data", "quickstart"))
    ap.add_argument("--train", type=int, default=3000)
    ap.add_argument("--val", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    train = [make_record(rng) for _ in range(args.train)]
    val = [make_record(rng) for _ in range(args.val)]
    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "train.jsonl"), train)
    write_jsonl(os.path.join(args.out, "validation.jsonl"), val)
    seen = {(r["instruction"], r["input"]) for r in train + val}
    write_jsonl(os.path.join(args.out, "prompts.jsonl"), make_heldout(random.Random(args.seed + 1), seen))
    from trainer.data.formatters import format_alpaca  # the exact prompt text the model will see

    texts = ["".join(s.text for s in format_alpaca(r, "gen")) for r in train]
    train_tokenizer(texts, os.path.join(args.out, "tokenizer"))
    print(json.dumps({"out": os.path.abspath(args.out), "train": len(train), "validation": len(val),
                      "vocab_size": _vocab(os.path.join(args.out, "tokenizer"))}))


if __name__ == "__main__":
    main()
