"""Record -> segments formatters: alpaca, squad, text, openai, chatml.

`get_formatter(name)` returns ``fn(record, loc, tokenizer) -> list[Segment]``; every formatter validates its
record and raises `DataError("<loc>: <problem naming the field>")`.

Prompt templates (prompt unsupervised, answer supervised; the tokenizer step appends a supervised EOS):
  alpaca: "### Instruction:\\n{instruction}\\n\\n[### Input:\\n{input}\\n\\n]### Response:\\n" + {output}
          (``response`` is accepted for ``output``)
  squad:  "Context: {context}\\nQuestion: {question}\\nAnswer: " + {first answer}
          (``answers`` may be {"text": [...]}, a list of strings/{"text"}, or a string ``answer``)
  text:   {text}, all supervised (plain continued training)
openai / chatml: see `trainer.data.chat`.
"""
from __future__ import annotations

from typing import Any, Callable

from .chat import format_chatml, format_openai
from .errors import DataError
from .segments import Segment, first_present, record_error, require_str

ALPACA_INSTRUCTION = "### Instruction:\n{instruction}\n\n"
ALPACA_INPUT = "### Input:\n{input}\n\n"
ALPACA_RESPONSE = "### Response:\n"
SQUAD_PROMPT = "Context: {context}\nQuestion: {question}\nAnswer: "


def format_alpaca(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    instruction = require_str(record, "instruction", loc)
    inp = record.get("input")
    if inp is not None and not isinstance(inp, str):
        raise record_error(loc, f"field 'input' must be a string, got {type(inp).__name__}")
    out_key = first_present(record, ("output", "response")) or "output"
    output = require_str(record, out_key, loc)
    prompt = ALPACA_INSTRUCTION.format(instruction=instruction)
    if inp and inp.strip():
        prompt += ALPACA_INPUT.format(input=inp)
    return [Segment(prompt + ALPACA_RESPONSE, False), Segment(output, True)]


def squad_answer(record: dict, loc: str) -> str:
    key = first_present(record, ("answers", "answer"))
    if key is None:
        raise record_error(loc, "missing field 'answers'")
    value = record[key]
    if isinstance(value, dict):
        value = value.get("text")
        key = key + ".text"
    if isinstance(value, list):
        if not value:
            raise record_error(loc, f"field '{key}' has no answer")
        value = value[0]["text"] if isinstance(value[0], dict) and "text" in value[0] else value[0]
        key = key + "[0]"
    if not isinstance(value, str):
        raise record_error(loc, f"field '{key}' must be a string, got {type(value).__name__}")
    if not value.strip():
        raise record_error(loc, f"field '{key}' is empty")
    return value


def format_squad(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    context = require_str(record, "context", loc)
    question = require_str(record, "question", loc)
    answer = squad_answer(record, loc)
    return [Segment(SQUAD_PROMPT.format(context=context, question=question), False), Segment(answer, True)]


def format_text(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    return [Segment(require_str(record, "text", loc), True)]


FORMATTERS: dict[str, Callable[..., list[Segment]]] = {
    "alpaca": format_alpaca,
    "squad": format_squad,
    "text": format_text,
    "openai": format_openai,
    "chatml": format_chatml,
}


def get_formatter(name: str) -> Callable[..., list[Segment]]:
    if name not in FORMATTERS:
        raise DataError(f"trainer.data.format: no formatter for {name!r} (one of {'|'.join(FORMATTERS)})")
    return FORMATTERS[name]
