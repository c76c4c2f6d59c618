"""Prompts laid out as in training, and the score of answers against references.

A prompt is the run's formatter (trainer.data.formatters) applied to the record with a placeholder answer: the
segments before the placeholder's are the prompt, tokenized segment by segment like training
(trainer.data.tokenize: BOS once, no EOS); the supervised text after the placeholder (a chat template's
end-of-turn token) is where the answer stops, besides EOS.

Records per format (the answer field is optional; when present it is the reference):
  alpaca {"instruction", "input"?, "output"?}; squad {"context", "question", "answers"?};
  openai/chatml {"messages": [...]} (a last assistant turn is the reference); text {"text", "reference"?}.
`--prompt TEXT` is the instruction (alpaca), the question (squad), the user turn (openai/chatml) or the text
(text); `--input TEXT` is the alpaca `input` or the squad `context` (the formats that have one).
"""
from __future__ import annotations

from typing import Any, Optional

from trainer.data.chat import messages_of
from trainer.data.errors import DataError
from trainer.data.formatters import get_formatter, squad_answer
from trainer.data.segments import Segment
from trainer.data.tokenize import tokenize_documents, tokenizer_info

PLACEHOLDER = "\u2063ANSWER\u2063"  # invisible separators: no record text contains it
CHAT = ("openai", "chatml")


INPUT_FIELD = {"alpaca": "input", "squad": "context"}  # the record field --input fills, per format


def from_text(fmt: str, text: str, extra: Optional[str] = None) -> dict:
    """The record of `--prompt TEXT [--input EXTRA]` in format `fmt`."""
    if extra is not None and fmt not in INPUT_FIELD:
        raise DataError(f"--input: format {fmt} has no input field (only {', '.join(INPUT_FIELD)} have one)")
    if fmt == "alpaca":
        return {"instruction": text, **({"input": extra} if extra is not None else {})}
    if fmt == "squad":
        if extra is None:
            raise DataError("--prompt: format squad needs the passage too: --input CONTEXT (the question is --prompt)")
        return {"question": text, "context": extra}
    if fmt in CHAT:
        return {"messages": [{"role": "user", "content": text}]}
    if fmt == "text":
        return {"text": text}
    raise DataError(f"--prompt: format {fmt} needs fields a single text cannot give; use --prompts FILE.jsonl")


def with_placeholder(fmt: str, record: Any, loc: str) -> tuple[dict, Optional[str]]:
    """(record whose answer is PLACEHOLDER, the reference answer or None)."""
    if not isinstance(record, dict):
        raise DataError(f"{loc}: expected a JSON object, got {type(record).__name__}")
    rec = dict(record)
    if fmt == "alpaca":
        ref = rec.pop("output", None) or rec.pop("response", None)
        rec["output"] = PLACEHOLDER
    elif fmt == "squad":
        ref = squad_answer(rec, loc) if ("answers" in rec or "answer" in rec) else None
        rec.pop("answer", None)
        rec["answers"] = PLACEHOLDER
    elif fmt in CHAT:
        sharegpt = "messages" not in rec and "conversations" in rec
        key, probe = ("conversations", {"from": "gpt", "value": "x"}) if sharegpt else \
            ("messages", {"role": "assistant", "content": "x"})
        if not isinstance(rec.get(key), list):
            raise DataError(f"{loc}: missing field 'messages' (a list of {{role, content}})")
        # the formatters' own validation and ShareGPT mapping
        messages = messages_of({key: [*rec[key], probe]}, loc, allow_sharegpt=fmt == "chatml")[:-1]
        ref = messages.pop()["content"] if messages and messages[-1]["role"] == "assistant" else None
        rec = {"messages": [*messages, {"role": "assistant", "content": PLACEHOLDER}]}
    elif fmt == "text":
        ref = rec.get("reference")
        rec = {"text": str(rec.get("text", "")) + PLACEHOLDER}
    else:
        raise DataError(f"generate: format {fmt} has no prompt layout (alpaca|squad|openai|chatml|text)")
    if ref is not None and not isinstance(ref, str):
        raise DataError(f"{loc}: the reference answer must be a string")
    return rec, ref


def prompt_segments(fmt: str, record: Any, loc: str, tokenizer: Any) -> tuple[list[Segment], str, Optional[str]]:
    """(prompt segments, unsupervised; text that ends an answer in training ('' = EOS only); reference)."""
    rec, ref = with_placeholder(fmt, record, loc)
    segs = get_formatter(fmt)(rec, loc, tokenizer)
    prompt: list[Segment] = []
    for seg in segs:
        at = seg.text.find(PLACEHOLDER)
        if at < 0:
            prompt.append(Segment(seg.text, False))
            continue
        if seg.text[:at]:
            prompt.append(Segment(seg.text[:at], False))
        return prompt, seg.text[at + len(PLACEHOLDER):] if seg.supervise else "", ref
    raise DataError(f"{loc}: the {fmt} formatter dropped the answer placeholder")


def encode(segments: list[Segment], tokenizer: Any) -> list[int]:
    tokens, _, _ = tokenize_documents([segments], tokenizer, tokenizer_info(tokenizer))
    return [int(t) for t in tokens]


def stop_ids(tokenizer: Any, closing: str) -> list[int]:
    """EOS, and the end-of-turn token training supervised after the answer when it is one token."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    closing = closing.strip()
    if closing:
        enc = tokenizer(closing, add_special_tokens=False)["input_ids"]
        if len(enc) == 1 and enc[0] not in ids:
            ids.append(enc[0])
    return ids


def char_accuracy(answer: str, reference: str) -> float:
    """Characters equal at the same position, over the longer of the two (1.0 only for an exact match)."""
    n = max(len(answer), len(reference))
    return 1.0 if n == 0 else sum(a == b for a, b in zip(answer, reference)) / n


def score(rows: list[dict]) -> dict:
    scored = [r for r in rows if r.get("reference") is not None]
    if not scored:
        return {}
    exact = sum(r["answer"].strip() == r["reference"].strip() for r in scored) / len(scored)
    chars = sum(char_accuracy(r["answer"].strip(), r["reference"].strip()) for r in scored) / len(scored)
    return {"scored": len(scored), "exact_match": exact, "char_accuracy": chars}
