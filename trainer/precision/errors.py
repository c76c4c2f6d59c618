"""The one exception the precision package raises for unsupported or inconsistent settings."""


class PrecisionError(RuntimeError):
    """A precision setting cannot run here. The message is one line: what, and what would work instead."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
