"""The recipe schema, as the launcher uses it: primus_contract.fields is its one definition (keys, types,
defaults, allowed values); this module re-exports it and raises the launcher's UserError."""
from __future__ import annotations

from typing import Any

from primus_contract import schema as _schema
from primus_contract.fields import ALWAYS_SECRET, MODEL, NAME_RE, SCHEMA, Field  # noqa: F401 (recipe.py's)
from primus_contract.schema import nearest  # noqa: F401 (recipe.py's)
from primus_slurm.errors import from_contract


def apply_schema(raw: Any, spec: dict = SCHEMA, path: str = "") -> dict:
    """Validate `raw` against `spec`, returning a new dict with every default filled in."""
    with from_contract():
        return _schema.apply_schema(raw, spec, path)
