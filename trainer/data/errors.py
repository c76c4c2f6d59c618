"""The one exception type of the data pipeline.

A `DataError` message is a single line that names where the problem is (``file:line`` for records, the
config key for options) and what is wrong; the CLI prints it as-is and exits 2. It is primus_contract.records'
(the record checks the launcher shares raise it).
"""
from primus_contract.records import DataError

__all__ = ["DataError"]
