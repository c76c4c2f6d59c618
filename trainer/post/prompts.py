"""Prompts laid out as in training, and the score of answers against references.

A prompt is the run's formatter (trainer.data.formatters) applied to the record with a placeholder answer
(primus_contract.prompts.check_prompt: the record checks the launcher ran at submit): the segments before the
placeholder's are the prompt, tokenized segment by segment like training (trainer.data.tokenize: BOS once, no EOS);
the supervised text after the placeholder (a chat template's end-of-turn token, or the ChatML markup's
``<|im_end|>``) is where the answer stops, besides EOS: by its id when it is one token, else as a stop string.
Records per format and `--prompt`/`--input`: primus_contract/prompts.py.
"""
from __future__ import annotations

from typing import Any, Optional

from primus_contract.prompts import PLACEHOLDER, check_prompt, from_text
from trainer.data.errors import DataError
from trainer.data.formatters import get_formatter
from trainer.data.segments import Segment
from trainer.data.tokenize import tokenize_documents, tokenizer_info

__all__ = ["answer_text", "char_accuracy", "encode", "from_text", "prompt_segments", "score", "stops"]


def prompt_segments(fmt: str, record: Any, loc: str, tokenizer: Any) -> tuple[list[Segment], str, Optional[str]]:
    """(prompt segments, unsupervised; text that ends an answer in training ('' = EOS only); reference)."""
    rec, ref = check_prompt(fmt, record, loc)
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


def stops(tokenizer: Any, closing: str) -> tuple[list[int], list[str]]:
    """(stop ids, stop strings): EOS, and the end-of-turn text training supervised after the answer, by its id when it
    is one token, else as a string (ChatML markup's ``<|im_end|>`` where the tokenizer has no such token; an EOS
    supervised after it is EOS already)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    closing = closing.strip()
    eos = tokenizer.eos_token
    if eos and closing.endswith(eos) and closing != eos:
        closing = closing[:-len(eos)].strip()
    if not closing:
        return ids, []
    enc = tokenizer(closing, add_special_tokens=False)["input_ids"]
    if len(enc) != 1:
        return ids, [closing]
    return (ids if enc[0] in ids else ids + enc), []


def answer_text(tokenizer: Any, new_ids: list[int], stop_ids: list[int], stop_strings: list[str]) -> str:
    """The generated answer: its tokens up to a stop id, decoded without special tokens, cut before a stop string."""
    ids = next((new_ids[:i] for i, t in enumerate(new_ids) if t in stop_ids), new_ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    for s in stop_strings:
        text = text.split(s, 1)[0]
    return text.strip()


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
