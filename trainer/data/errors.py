"""The one exception type of the data pipeline.

A `DataError` message is a single line that names where the problem is (``file:line`` for records, the
config key for options) and what is wrong; the CLI prints it as-is and exits 2.
"""


class DataError(ValueError):
    """Bad data or a bad `trainer.data.*` option; str(err) is one line meant for the user."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split("\n")))
