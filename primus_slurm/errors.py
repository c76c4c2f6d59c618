"""The one exception the CLI turns into a single `error: ...` line and exit code 2."""


class UserError(Exception):
    """Bad input from the user (recipe, CLI option, run id). The message names the field and what is allowed."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # always one line
