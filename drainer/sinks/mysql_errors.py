"""The MySQL sink's errors and how it classifies MySQL error codes (retry, reconnect, fenced)."""
from __future__ import annotations

import pymysql

from sluice.core.errors import SluiceError, StaleEpoch

# "Subquery returns more than 1 row": the fence guard of a worker transaction found a newer epoch.
FENCE_GUARD_ERROR = 1242
# Transient: the transaction (or connection) is gone and the batch can run again.
RETRYABLE_ERRORS = frozenset({1205, 1213, 1040, 1053, 1927, 2003, 2006, 2013, 2055})
# The connection cannot be used any more: reconnect before retrying.
CONNECTION_ERRORS = frozenset({1053, 1927, 2003, 2006, 2013, 2055})


class SinkFenced(StaleEpoch):
    """A newer drainer (higher epoch) owns the downstream: this sink must stop."""


class ApplyError(SluiceError):
    """A permanent downstream error: the sink stops, naming what failed."""

    def __init__(self, target: str, commit_ts: int, what: str, error: BaseException) -> None:
        code, msg = _error_code(error), _error_message(error)
        super().__init__(f"mysql sink: {what} on {target} (commit_ts {commit_ts}) failed: "
                         f"MySQL error {code}: {msg}")
        self.target, self.commit_ts, self.mysql_code = target, commit_ts, code


class CreateTableError(ApplyError):
    """create-tables could not create a missing database or table downstream."""

    def __init__(self, kind: str, target: str, commit_ts: int, sql: str, error: BaseException) -> None:
        SluiceError.__init__(self, f"mysql sink: cannot create missing {kind} {target} (commit_ts "
                             f"{commit_ts}): MySQL error {_error_code(error)}: {_error_message(error)}; "
                             f"statement: {sql[:300]}. Create it downstream yourself (create-tables "
                             f"never alters an existing table), or set create-tables = false")
        self.target, self.commit_ts, self.mysql_code = target, commit_ts, _error_code(error)


class RetriesExhausted(SluiceError):
    def __init__(self, what: str, attempts: int, error: BaseException) -> None:
        super().__init__(f"mysql sink: {what} still failing after {attempts} attempts: "
                         f"MySQL error {_error_code(error)}: {_error_message(error)}")


def _error_code(e: BaseException) -> int:
    if isinstance(e, pymysql.err.InterfaceError):
        return 2013  # pymysql's "connection closed" carries no server code
    args = getattr(e, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


def _error_message(e: BaseException) -> str:
    args = getattr(e, "args", ())
    return str(args[1]) if len(args) > 1 else repr(e)


def _is_mysql_error(e: BaseException) -> bool:
    return isinstance(e, (pymysql.err.MySQLError, ConnectionError, OSError))


def _retryable(e: BaseException) -> bool:
    return isinstance(e, (pymysql.err.InterfaceError, ConnectionError, OSError)) or \
        _error_code(e) in RETRYABLE_ERRORS
