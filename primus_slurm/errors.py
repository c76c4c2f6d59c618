"""The one exception the CLI turns into a single `error: ...` line and exit code 2."""
from __future__ import annotations

from contextlib import contextmanager

from primus_contract.errors import ContractError


class UserError(ContractError):
    """Bad input from the user (recipe, CLI option, run id). The message names the field and what is allowed."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message, field)  # always one line


@contextmanager
def from_contract():
    """Re-raise the contract's refusal as the launcher's UserError (same message and field)."""
    try:
        yield
    except UserError:
        raise
    except ContractError as err:
        raise UserError(str(err), err.field) from None
