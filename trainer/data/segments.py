"""The explicit segment schema every formatter produces.

A formatted record is a list of `Segment(text, supervise)`: the concatenated texts are the document; the
tokens of segments with ``supervise=True`` are the training targets (loss is taken where they are predicted).
Formatters never add BOS/EOS; `trainer.data.tokenize` does, exactly once.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from .errors import DataError


class Segment(NamedTuple):
    text: str
    supervise: bool


def record_error(loc: str, message: str) -> DataError:
    """`DataError("<file:line>: <message>")`."""
    return DataError(f"{loc}: {message}")


def require_str(record: Any, key: str, loc: str, *, allow_empty: bool = False, path: str | None = None) -> str:
    """record[key] as a string; a `DataError` naming the field when missing, not a string, or empty."""
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
    return value


def first_present(record: dict, keys: tuple[str, ...]) -> str | None:
    """The first of `keys` present (not None) in record, else None."""
    for k in keys:
        if isinstance(record, dict) and record.get(k) is not None:
            return k
    return None
