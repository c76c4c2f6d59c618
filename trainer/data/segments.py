"""The explicit segment schema every formatter produces.

A formatted record is a list of `Segment(text, supervise)`: the concatenated texts are the document; the
tokens of segments with ``supervise=True`` are the training targets (loss is taken where they are predicted).
Formatters never add BOS/EOS; `trainer.data.tokenize` does, exactly once. The record checks formatters use are
primus_contract.records' (the launcher checks `generate` prompts with them).
"""
from __future__ import annotations

from typing import NamedTuple

from primus_contract.records import first_present, record_error, require_str

__all__ = ["Segment", "first_present", "record_error", "require_str"]


class Segment(NamedTuple):
    text: str
    supervise: bool
