"""The one check of a recipe's text values: what every string field, list item and mapping value goes through."""
from __future__ import annotations

from primus_contract.errors import ContractError
from primus_contract.fields import MAX_STR


def check_text(path: str, value: str) -> None:
    if len(value) > MAX_STR:
        raise ContractError(f"`{path}` is {len(value)} characters long; at most {MAX_STR} are allowed")
    if any(ord(c) < 32 and c != "\t" for c in value) or "\x7f" in value:
        raise ContractError(f"`{path}` contains a newline or control character; use a single-line value")
    if any("\ud800" <= c <= "\udfff" for c in value):  # how Python decodes non-UTF-8 argv/environment bytes
        raise ContractError(f"`{path}` contains bytes that are not valid UTF-8")
