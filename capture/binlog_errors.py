"""The errors of reading a binlog, and which MySQL client errors mean "reconnect"."""

from __future__ import annotations

import grpc

from sluice.core.errors import SluiceError


class UnknownTableId(SluiceError):
    """A rows event for a table_id with no TableMap in its transaction: never skipped."""

    code = grpc.StatusCode.DATA_LOSS

    def __init__(self, table_id: int, where: str) -> None:
        super().__init__(f"rows event for table_id {table_id} without a TableMap in its "
                         f"transaction ({where}): the binlog stream is inconsistent; refusing to "
                         "skip rows")
        self.table_id = table_id


class BinlogProtocolError(SluiceError):
    """Events that do not form transactions as expected (missing end, statement-format DML)."""

    code = grpc.StatusCode.DATA_LOSS


class SourceDisconnected(SluiceError):
    """The binlog connection was lost (or could not be opened): reconnect from a known position."""

    code = grpc.StatusCode.UNAVAILABLE


class SourceRefused(SluiceError):
    """The source answered the binlog dump with an error (a purged GTID, missing privileges)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


# MySQL client errors that mean "the connection is gone or the server is not there (yet)": the
# capture reconnects after them. Anything else the server says (a purged GTID, an access error)
# is fatal and named.
RECONNECTABLE_CODES = frozenset({2003, 2006, 2013, 2055, 1053, 1927})
