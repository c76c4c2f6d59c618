"""A `generate` prompt as a record of the run's format, checked the same way at submit and in the job (standard
library): the launcher refuses what the job's formatter would (primus_slurm/post_training/post_cli.py), the job
lays the prompt out from what `check_prompt` returns (trainer/post/prompts.py).

Records per format (the answer field is optional; when present it is the reference):
  alpaca {"instruction", "input"?, "output"?}; squad {"context", "question", "answers"?};
  openai/chatml {"messages": [...]} (a last assistant turn is the reference); text {"text", "reference"?}.
`--prompt TEXT` is the instruction (alpaca), the question (squad), the user turn (openai/chatml) or the text
(text); `--input TEXT` is the alpaca `input` or the squad `context` (the formats that have one).
"""
from __future__ import annotations

import json
from typing import Any, Optional

from primus_contract.records import (FIELDS, DataError, first_present, messages_of, record_error, require_str,
                                     squad_answer)

PLACEHOLDER = "\u2063ANSWER\u2063"  # invisible separators: no record text contains it
CHAT = ("openai", "chatml")
FORMATS = tuple(FIELDS)  # the formats a prompt can be laid out in (not mlperf_npy: pre-tokenized)
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


def _with_placeholder(fmt: str, rec: dict, loc: str) -> tuple[dict, Optional[str]]:
    if fmt == "alpaca":
        key = first_present(rec, ("output", "response"))
        ref = require_str(rec, key, loc, allow_empty=True) if key else None
        rec.pop("response", None)
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
            raise record_error(loc, "missing field 'messages' (a list of {role, content})")
        # the formatters' own validation and ShareGPT mapping
        messages = messages_of({key: [*rec[key], probe]}, loc, allow_sharegpt=fmt == "chatml")[:-1]
        ref = messages.pop()["content"] if messages and messages[-1]["role"] == "assistant" else None
        rec = {"messages": [*messages, {"role": "assistant", "content": PLACEHOLDER}]}
    elif fmt == "text":
        ref = require_str(rec, "reference", loc, allow_empty=True) if rec.get("reference") is not None else None
        rec = {"text": require_str(rec, "text", loc) + PLACEHOLDER}
    else:
        raise DataError(f"generate: format {fmt} has no prompt layout ({'|'.join(FORMATS)})")
    return rec, ref or None  # (an empty answer field: no reference)


def check_prompt(fmt: str, record: Any, loc: str) -> tuple[dict, Optional[str]]:
    """(the record with PLACEHOLDER for its answer, the reference answer or None), once the record passed every check
    of the run's formatter that needs no tokenizer; a `DataError` naming `loc` and the field otherwise."""
    if not isinstance(record, dict):
        raise record_error(loc, f"expected a JSON object, got {type(record).__name__}")
    rec, ref = _with_placeholder(fmt, dict(record), loc)
    FIELDS[fmt](rec, loc)
    try:  # the job writes the whole record beside its answer (generations.jsonl)
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise record_error(loc, "a string of the record is not UTF-8 text (a lone surrogate such as \\ud800)") \
            from None
    return rec, ref
