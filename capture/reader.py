"""Reading a MariaDB binlog (GTID auto-position) into whole source transactions.

A transaction cut by a lost connection is dropped whole. The parts: capture/assembler.py
(transactions from events), capture/binlog_stream.py (the strict stream reader),
capture/binlog_errors.py. docs/capture.md ("Reading the binlog").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
from pymysqlreplication.event import (FormatDescriptionEvent, HeartbeatLogEvent,
                                      MariadbGtidEvent, MariadbGtidListEvent, QueryEvent,
                                      RotateEvent, XidEvent)
from pymysqlreplication.row_event import (DeleteRowsEvent, TableMapEvent, UpdateRowsEvent,
                                          WriteRowsEvent)

from sluice.capture.assembler import (Assembler, GtidImage, RowsImage, SourceTxn, TableMapImage,
                                      XidImage, file_seq_of, gtid_state_text, parse_gtid_state)
from sluice.capture.binlog_errors import (RECONNECTABLE_CODES, BinlogProtocolError,
                                          SourceDisconnected, SourceRefused, UnknownTableId)
from sluice.capture.binlog_stream import FixedBinLogStreamReader, StrictBinLogStreamReader
from sluice.capture.schema import SchemaTracker

__all__ = ["EVENTS", "RECONNECTABLE_CODES", "Assembler", "BinlogProtocolError", "BinlogReader",
           "FixedBinLogStreamReader", "GtidImage", "RowsImage", "SourceDisconnected",
           "SourceRefused", "SourceTxn", "StrictBinLogStreamReader", "TableMapImage",
           "UnknownTableId", "XidImage", "file_seq_of", "gtid_state_text", "parse_gtid_state"]


EVENTS = [MariadbGtidEvent, MariadbGtidListEvent, TableMapEvent, WriteRowsEvent, UpdateRowsEvent,
          DeleteRowsEvent, XidEvent, QueryEvent, RotateEvent, FormatDescriptionEvent,
          HeartbeatLogEvent]


class BinlogReader:
    """A blocking iterator of SourceTxn from a MariaDB source, starting after a GTID state.

    One connection per reader: when it is lost, `transactions()` raises SourceDisconnected and
    the caller makes a new reader from `assembler.resume_state()` (and the same tracker), or from
    the pumps' committed position after a restart.
    """

    def __init__(self, connection: dict[str, Any], *, replica_server_id: int,
                 tracker: SchemaTracker, gtid_state: str, blocking: bool = True,
                 heartbeat_s: float = 1.0, on_connected: Callable[[], None] | None = None) -> None:
        self.assembler = Assembler(tracker, parse_gtid_state(gtid_state),
                                   on_txn_end=self._clear_library_maps)
        # The dump connection's read timeout: several missed heartbeats mean the server (or the
        # network) is gone, which a blocking read without a timeout would never notice.
        settings = dict(connection)
        settings.setdefault("read_timeout", max(10, int(heartbeat_s * 10) + 1))
        settings.setdefault("connect_timeout", 5)
        self._stream = StrictBinLogStreamReader(
            settings, server_id=replica_server_id, blocking=blocking, is_mariadb=True,
            auto_position=gtid_state, only_events=EVENTS, slave_heartbeat=heartbeat_s,
            enable_logging=False, where=self.assembler.where, scanner=tracker.scanner)
        self._on_connected = on_connected
        self.last_event_at = time.monotonic()
        self.caught_up = False        # the last event was a heartbeat: nothing more to send
        self.events = 0

    def _clear_library_maps(self) -> None:
        self._stream.table_map.clear()

    def transactions(self) -> Iterator[SourceTxn]:
        feed = self.assembler.feed
        try:
            for ev in self._stream:
                self.last_event_at = time.monotonic()
                self.events += 1
                if self.events == 1 and self._on_connected is not None:
                    self._on_connected()
                # MariaDB sends a heartbeat only after `heartbeat_s` without any event to send.
                self.caught_up = type(ev) is HeartbeatLogEvent
                txn = feed(ev)
                if txn is not None:
                    yield txn
        except pymysql.MySQLError as e:
            code = e.args[0] if e.args else 0
            self.assembler.abandon()
            if isinstance(e, pymysql.OperationalError) and code in RECONNECTABLE_CODES:
                raise SourceDisconnected(f"binlog connection to the source failed ({code}: "
                                         f"{e.args[-1]}) {self.assembler.where()}") from None
            raise SourceRefused(f"the source refused the binlog stream from GTID state "
                                f"{self.assembler.resume_state() or '(start)'} ({code}: "
                                f"{e.args[-1] if e.args else e})") from None
        except SourceDisconnected:
            self.assembler.abandon()
            raise

    @property
    def reads(self) -> int:
        """Socket reads of the dump connection so far."""
        return self._stream.reads

    def lag_s(self) -> float:
        ts = self.assembler.last_event_ts
        return max(0.0, time.time() - ts) if ts else 0.0

    def wake(self) -> None:
        """From another thread: make a `transactions()` waiting for the source return soon
        (SourceDisconnected), so its thread can be joined before `close`."""
        self._stream.wake()

    def close(self) -> None:
        self._stream.close()
