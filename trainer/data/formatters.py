"""Record -> segments formatters: alpaca, squad, text, openai, chatml.

`get_formatter(name)` returns ``fn(record, loc, tokenizer) -> list[Segment]``; every formatter takes its record's
fields from primus_contract.records (which validates them and raises `DataError("<loc>: <problem naming the
field>")`) and lays them out.

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

from primus_contract.records import alpaca_fields, squad_fields, text_field

from .chat import format_chatml, format_openai
from .errors import DataError
from .segments import Segment

ALPACA_INSTRUCTION = "### Instruction:\n{instruction}\n\n"
ALPACA_INPUT = "### Input:\n{input}\n\n"
ALPACA_RESPONSE = "### Response:\n"
SQUAD_PROMPT = "Context: {context}\nQuestion: {question}\nAnswer: "


def format_alpaca(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    instruction, inp, output = alpaca_fields(record, loc)
    prompt = ALPACA_INSTRUCTION.format(instruction=instruction)
    if inp and inp.strip():
        prompt += ALPACA_INPUT.format(input=inp)
    return [Segment(prompt + ALPACA_RESPONSE, False), Segment(output, True)]


def format_squad(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    context, question, answer = squad_fields(record, loc)
    return [Segment(SQUAD_PROMPT.format(context=context, question=question), False), Segment(answer, True)]


def format_text(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    return [Segment(text_field(record, loc), True)]


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
