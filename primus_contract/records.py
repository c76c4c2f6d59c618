"""The records of the data formats, read and checked once for both sides (standard library).

The trainer's formatters (trainer/data/formatters.py, chat.py) take a record's fields from here and only lay them
out; `generate --prompts` checks each record at submit with the same functions (primus_contract/prompts.py), so a
record the job would refuse is refused before anything is queued.

    json_lines(lines)            -> (line number, value, problem) per non-blank line of a JSON-lines byte stream
    FIELDS[fmt](record, loc)     -> the fields of a record of format fmt (alpaca, squad, text, openai, chatml)
Every refusal is a `DataError("<loc>: <problem naming the field>")`, one line; the trainer's DataError is this one.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator, Optional


class DataError(ValueError):
    """Bad data or a bad `trainer.data.*` option; str(err) is one line meant for the user."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split("\n")))


def record_error(loc: str, message: str) -> DataError:
    """`DataError("<file:line>: <message>")`."""
    return DataError(f"{loc}: {message}")


def template_failure(loc: str, exc: Exception) -> DataError:
    """The record's error when the tokenizer's chat template raised on it: one line with the template's message, the
    same from the job's formatter (trainer/data/chat.py) and the launcher's render (primus_slurm/chat_template.py)."""
    text = str(exc).strip()
    return record_error(loc, f"the tokenizer's chat template failed: {type(exc).__name__}: "
                             f"{text.splitlines()[0] if text else ''}")


def json_lines(lines: Iterable[bytes]) -> Iterator[tuple[int, Any, Optional[str]]]:
    """(line number, value, None) per non-blank line of a JSON-lines byte stream (split at b"\\n", as a file opened
    in binary mode iterates), or (line number, None, problem) for a line that is not UTF-8, not JSON, or nested too
    deep to parse: a bad record for the caller's policy, never an exception."""
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield lineno, None, f"not UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line)"
            continue
        if not line.strip():
            continue
        value, problem = None, None
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            problem = f"invalid JSON ({e.msg} at column {e.colno})"
        except RecursionError:
            problem = "invalid JSON (nested too deeply to read)"
        except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
            problem = f"invalid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        yield lineno, value, problem


def require_utf8(value: str, name: str, loc: str) -> str:
    """`value`, refused when it cannot be written as UTF-8 (a lone surrogate: JSON's "\\ud800", or bytes Python
    decoded with surrogateescape), which no tokenizer takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise record_error(loc, f"field '{name}' is not UTF-8 text (a lone surrogate \\u{ord(value[e.start]):04x} "
                                f"at character {e.start + 1})") from None
    return value


def require_str(record: Any, key: str, loc: str, *, allow_empty: bool = False, path: Optional[str] = None) -> str:
    """record[key] as a string; a `DataError` naming the field when missing, not a string, empty or not UTF-8."""
    name = path or key
    if not isinstance(record, dict):
        raise record_error(loc, f"expected a JSON object, got {type(record).__name__}")
    if key not in record or record[key] is None:
        raise record_error(loc, f"missing field '{name}'")
    value = record[key]
    if not isinstance(value, str):
        raise record_error(loc, f"field '{name}' must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise record_error(loc, f"field '{name}' is empty")
    return require_utf8(value, name, loc)


def first_present(record: Any, keys: tuple[str, ...]) -> Optional[str]:
    """The first of `keys` present (not None) in record, else None."""
    for k in keys:
        if isinstance(record, dict) and record.get(k) is not None:
            return k
    return None


def alpaca_fields(record: Any, loc: str) -> tuple[str, Optional[str], str]:
    """(instruction, input or None, output); ``response`` is accepted for ``output``."""
    instruction = require_str(record, "instruction", loc)
    inp = record.get("input")
    if inp is not None:
        inp = require_str(record, "input", loc, allow_empty=True)
    output = require_str(record, first_present(record, ("output", "response")) or "output", loc)
    return instruction, inp, output


def squad_answer(record: dict, loc: str) -> str:
    """The first answer: ``answers`` may be {"text": [...]}, a list of strings/{"text"}, or a string ``answer``."""
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
    return require_str({key: value}, key, loc)


def squad_fields(record: Any, loc: str) -> tuple[str, str, str]:
    """(context, question, first answer)."""
    context = require_str(record, "context", loc)
    question = require_str(record, "question", loc)
    return context, question, squad_answer(record, loc)


def text_field(record: Any, loc: str) -> str:
    return require_str(record, "text", loc)


ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system"}


def messages_of(record: Any, loc: str, allow_sharegpt: bool) -> list[dict]:
    """The conversation as [{role, content}]: ``messages`` (openai), or ShareGPT ``conversations`` [{from, value}]
    where allowed (chatml); at least one assistant turn, none empty."""
    if not isinstance(record, dict):
        raise record_error(loc, f"expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        raw, key, rkey, ckey, rolemap = record["messages"], "messages", "role", "content", None
    elif allow_sharegpt and "conversations" in record:
        raw, key, rkey, ckey, rolemap = record["conversations"], "conversations", "from", "value", SHAREGPT_ROLES
    else:
        raise record_error(loc, "missing field 'messages'" + (" (or 'conversations')" if allow_sharegpt else ""))
    if not isinstance(raw, list) or not raw:
        raise record_error(loc, f"field '{key}' must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise record_error(loc, f"field '{where}' must be an object")
        role = m.get(rkey)
        role = rolemap.get(role, role) if rolemap and isinstance(role, str) else role
        if role not in ROLES:
            allowed = "|".join(rolemap) if rolemap else "|".join(ROLES)
            raise record_error(loc, f"field '{where}.{rkey}': unknown role {m.get(rkey)!r} (expected {allowed})")
        content = m.get(ckey)
        if not isinstance(content, str):
            raise record_error(loc, f"field '{where}.{ckey}' must be a string")
        if role == "assistant" and not content.strip():
            raise record_error(loc, f"field '{where}.{ckey}': empty assistant turn")
        out.append({"role": role, "content": require_utf8(content, f"{where}.{ckey}", loc)})
    if not any(m["role"] == "assistant" for m in out):
        raise record_error(loc, f"field '{key}': no assistant turn to learn from")
    return out


FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "alpaca": alpaca_fields,
    "squad": squad_fields,
    "text": text_field,
    "openai": lambda record, loc: messages_of(record, loc, allow_sharegpt=False),
    "chatml": lambda record, loc: messages_of(record, loc, allow_sharegpt=True),
}
