"""The one exception the contract raises: a recipe value it refuses, with the field it names."""
from __future__ import annotations

import re

_FIELD_RE = re.compile(r"`([A-Za-z_][A-Za-z0-9_.\[\]]*)")


class ContractError(ValueError):
    """A recipe the contract refuses. `field` is the dotted key it names first (what the verdict test compares);
    the message is one line that says what is allowed."""

    def __init__(self, message: str, field: str | None = None):
        message = " ".join(str(message).split())
        super().__init__(message)
        if field is None:
            match = _FIELD_RE.search(message)
            field = match.group(1).split("[")[0] if match else None
        self.field = field


def fail(message: str, field: str | None = None) -> None:
    raise ContractError(message, field)
