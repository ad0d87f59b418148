"""Binlog events in, whole source transactions (SourceTxn) out: pure logic, no I/O.

Invariant: a rows event is decoded only against a TableMap seen earlier in the same transaction;
one whose table_id has no TableMap there is fatal (UnknownTableId), never skipped. A
transaction's resume position is its first event (the GTID event). Where MariaDB transactions
begin and end: docs/capture.md ("Reading the binlog").
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from typing import Any

import sluice_native
from pymysqlreplication.constants.BINLOG import TABLE_MAP_EVENT
from pymysqlreplication.event import FormatDescriptionEvent, QueryEvent, RotateEvent

from sluice.capture.binlog_errors import BinlogProtocolError, UnknownTableId
from sluice.capture.payload import Mutation, RowsMutation
from sluice.capture.schema import SchemaTracker, TableEntry, version_of
from sluice.capture.types import UndecodableRow
from sluice.core.log import kv
from sluice.core.marks import APPLY_MARK
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)


_FILE_SEQ = re.compile(r"\.(\d+)$")
_FL_STANDALONE = 1
_HARMLESS = re.compile(r"^\s*(SAVEPOINT|ROLLBACK\s+TO|RELEASE\s+SAVEPOINT|FLUSH|GRANT|REVOKE|"
                       r"CREATE\s+USER|DROP\s+USER|ALTER\s+USER|RENAME\s+USER|SET\s|ANALYZE|OPTIMIZE|"
                       r"REPAIR|CREATE\s+(OR\s+REPLACE\s+)?(DEFINER|VIEW|FUNCTION|PROCEDURE|TRIGGER|EVENT"
                       r"|SEQUENCE|ROLE|SERVER)|DROP\s+(VIEW|FUNCTION|PROCEDURE|TRIGGER|EVENT|"
                       r"SEQUENCE|ROLE|SERVER)|ALTER\s+(VIEW|FUNCTION|PROCEDURE|EVENT|SEQUENCE)|"
                       r"XA\s|INSTALL|UNINSTALL|CHECK|CHECKSUM)", re.IGNORECASE)
_DML = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE|LOAD\s+DATA)\b", re.IGNORECASE)


def file_seq_of(name: str) -> int:
    m = _FILE_SEQ.search(name)
    return int(m.group(1)) if m else 0


def gtid_state_text(gtids: Any) -> str:
    """pb GtidPos list -> MariaDB slave_connect_state text ("0-1-99,1-2-5")."""
    return ",".join(f"{g.domain_id}-{g.server_id}-{g.seq_no}" for g in gtids)


def parse_gtid_state(text: str) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        d, s, n = (int(x) for x in part.split("-"))
        out[d] = (s, n)
    return out


@dataclasses.dataclass(slots=True)
class SourceTxn:
    """One source transaction (event group) as read: what becomes one pump transaction.

    Not changed once built (`dataclasses.replace` makes the altered copies). Not frozen only
    because a frozen dataclass's __init__ sets each field through object.__setattr__: one made
    per source transaction, that was ~10 µs of the capture's per-transaction CPU."""

    position: pb.Position            # its first event; gtids = GTID state after it
    gtid: str
    server_id: int
    ts_ms: int
    file: str
    offset: int
    mutations: tuple[Mutation, ...]   # native rows as wire bytes; snapshot chunks as messages
    schema_snapshots: tuple[pb.TableInfo, ...]
    ddls: tuple[pb.DDL, ...]
    size: int                        # bytes of row events (grouping budget)
    # Set on a snapshot chunk (op=r rows emitted after a high watermark, not a source
    # transaction): the progress the pump records with it.
    snapshot: pb.SnapshotProgress | None = None

    @property
    def empty(self) -> bool:
        return not (self.mutations or self.schema_snapshots or self.ddls)

    def prewrite_values(self, source_name: str) -> list[bytes]:
        """The serialized PrewriteValue(s): one, or one per DDL when a statement acts on several
        tables (the schema snapshots travel with the first), built natively from the rows' wire
        bytes (native/src/pumpwrite.rs)."""
        return sluice_native.prewrite_values(self, source_name, RowsMutation)


class _Open:
    """The transaction being assembled (a plain slotted class: one is made per transaction)."""

    __slots__ = ("gtid", "domain", "server_id", "seq", "standalone", "file", "file_seq", "offset",
                 "ts", "mutations", "snapshots", "ddls", "size", "marked")

    def __init__(self, gtid: str, domain: int, server_id: int, seq: int, standalone: bool,
                 file: str, file_seq: int, offset: int, ts: int) -> None:
        self.gtid, self.domain, self.server_id, self.seq = gtid, domain, server_id, seq
        self.standalone, self.file, self.file_seq, self.offset, self.ts = \
            standalone, file, file_seq, offset, ts
        self.mutations: list[Mutation] = []
        self.snapshots: list[pb.TableInfo] = []
        self.ddls: list[pb.DDL] = []
        self.size = 0
        self.marked = False   # written by a Sluice sink (core/marks.py): dropped whole

    def where(self) -> str:
        return f"GTID {self.gtid} at {self.file}:{self.offset}"


# ------------------------------------------------------------------------------------------------
# the events the native core frames (sluice_native.parse_event): what the Assembler reads of them
# ------------------------------------------------------------------------------------------------

class _Image:
    """An event framed natively. It is its own packet wrapper for the library's `fetchone`
    (`event_type`, `log_pos`, `timestamp`, `event`), so one object is made per event."""

    __slots__ = ("timestamp", "log_pos", "event_size")
    event_type = -1

    @property
    def event(self) -> _Image:
        return self


class RowsImage(_Image):
    """A WRITE/UPDATE/DELETE rows event (v1: MariaDB; v2: MySQL): its post-header, and where
    its row images are in the packet (`data[start:end]`), not yet decoded."""

    __slots__ = ("tp", "table_id", "number_of_columns", "present", "present2", "data", "start", "end")

    def __init__(self, tp: int, table_id: int, number_of_columns: int, present: bytes,
                 present2: bytes | None, data: bytes, start: int, end: int, timestamp: int = 0,
                 log_pos: int = 0, event_size: int = 0) -> None:
        self.tp, self.table_id, self.number_of_columns = tp, table_id, number_of_columns
        self.present, self.present2 = present, present2
        self.data, self.start, self.end = data, start, end
        self.timestamp, self.log_pos, self.event_size = timestamp, log_pos, event_size


class GtidImage(_Image):
    """A MariaDB GTID event: it starts every event group."""

    __slots__ = ("gtid", "domain_id", "server_id", "gtid_seq_no", "flags")

    def __init__(self, domain_id: int, server_id: int, gtid_seq_no: int, flags: int,
                 timestamp: int = 0, log_pos: int = 0, event_size: int = 0) -> None:
        self.gtid = f"{domain_id}-{server_id}-{gtid_seq_no}"
        self.domain_id, self.server_id, self.gtid_seq_no, self.flags = domain_id, server_id, gtid_seq_no, flags
        self.timestamp, self.log_pos, self.event_size = timestamp, log_pos, event_size


class XidImage(_Image):
    """An XID event: the commit of a transactional event group."""

    __slots__ = ("xid",)

    def __init__(self, xid: int, timestamp: int = 0, log_pos: int = 0, event_size: int = 0) -> None:
        self.xid = xid
        self.timestamp, self.log_pos, self.event_size = timestamp, log_pos, event_size


class TableMapImage(_Image):
    """A TableMap event: `table` is the library's parse of the first event with an equal body
    (shared by all of them: see `_packet_wrapper`), `body` the event's bytes after its header
    (without the checksum: what the native TxnScanner learns it by), the header is this event's
    own."""

    __slots__ = ("table", "body")
    event_type = TABLE_MAP_EVENT

    def __init__(self, table: Any, body: bytes = b"", timestamp: int = 0, log_pos: int = 0,
                 event_size: int = 0) -> None:
        self.table, self.body = table, body
        self.timestamp, self.log_pos, self.event_size = timestamp, log_pos, event_size

    @property
    def table_id(self) -> int:
        return self.table.table_id

    def get_table(self) -> Any:
        return self.table.table_obj


class TxnImage(_Image):
    """A whole event group read by the native core (`sluice_native.TxnScanner.scan`, see
    capture/binlog_stream.py): its GTID event's fields and header, the header fields of its
    last event (`timestamp`, `log_pos`: the last non-zero ones), and its rows as
    `(TableEntry, repeated RowChange bytes, count)` per run of one table."""

    __slots__ = ("gtid", "domain_id", "server_id", "gtid_seq_no", "flags", "gtid_ts", "gtid_log_pos",
                 "gtid_event_size", "size", "marked", "mutations", "events")

    def __init__(self, ids: tuple[int, int, int, int], gtid_ts: int, gtid_log_pos: int,
                 gtid_event_size: int, log_pos: int, timestamp: int, size: int, marked: bool,
                 mutations: list[tuple[TableEntry, bytes, int]], events: int) -> None:
        domain_id, server_id, seq, flags = ids
        self.gtid = f"{domain_id}-{server_id}-{seq}"
        self.domain_id, self.server_id, self.gtid_seq_no, self.flags = domain_id, server_id, seq, flags
        self.gtid_ts, self.gtid_log_pos, self.gtid_event_size = gtid_ts, gtid_log_pos, gtid_event_size
        self.size, self.marked, self.mutations, self.events = size, marked, mutations, events
        self.timestamp, self.log_pos, self.event_size = timestamp, log_pos, 0


_IMAGES = (RowsImage, GtidImage, XidImage, TableMapImage)


class Assembler:
    """Events in, whole SourceTxn out. Pure logic over event objects (no I/O)."""

    def __init__(self, tracker: SchemaTracker, gtid_state: dict[int, tuple[int, int]] | None = None,
                 on_txn_end: Callable[[], None] | None = None) -> None:
        self.tracker = tracker
        self.gtid_state = dict(gtid_state or {})
        self.file = ""
        self.file_seq = 0
        self.last_event_end = 0
        self.last_event_ts = 0
        self._txn: _Open | None = None
        self._maps: dict[int, TableEntry] = {}
        self._on_txn_end = on_txn_end or (lambda: None)

    def where(self) -> str:
        t = self._txn
        base = t.where() if t is not None else f"outside any transaction in {self.file}"
        return f"{base}, after the event ending at {self.file}:{self.last_event_end}"

    def feed(self, ev: Any) -> SourceTxn | None:
        cls = type(ev)
        if cls is TxnImage:
            return self._whole(ev)
        if cls in _IMAGES:
            if ev.log_pos:
                self.last_event_end = ev.log_pos
            if ev.timestamp:
                self.last_event_ts = ev.timestamp
            if cls is RowsImage:
                self._rows(ev)
                return None
            if cls is TableMapImage:
                t = self._need_txn("TableMap")
                entry, declare = self.tracker.on_table_map(ev.table, version_of(t.file_seq, t.offset))
                self._maps[ev.table.table_id] = entry
                if ev.body:
                    self.tracker.learn_body(ev.body, ev.table.table_id, entry)
                if declare is not None and all(s.table_id != declare.table_id for s in t.snapshots):
                    t.snapshots.append(declare)
                return None
            if cls is GtidImage:
                if self._txn is not None:
                    raise BinlogProtocolError(f"GTID {ev.gtid} starts while {self._txn.where()} has "
                                              "not ended (no XID/COMMIT seen)")
                offset = (ev.log_pos - ev.event_size) if ev.log_pos else 0
                self._txn = _Open(gtid=ev.gtid, domain=ev.domain_id, server_id=ev.server_id,
                                  seq=ev.gtid_seq_no, standalone=bool(ev.flags & _FL_STANDALONE),
                                  file=self.file, file_seq=self.file_seq, offset=offset,
                                  ts=ev.timestamp)
                return None
            return self._finish()   # XidImage
        # the events the library parses (query, rotate, format description, heartbeat, ...)
        pk = getattr(ev, "packet", None)
        if pk is not None and getattr(pk, "log_pos", 0):
            self.last_event_end = pk.log_pos
        ts = getattr(ev, "timestamp", 0)
        if ts:
            self.last_event_ts = ts
        if isinstance(ev, QueryEvent):
            return self._query(ev)
        if isinstance(ev, RotateEvent):
            self.file, self.file_seq = ev.next_binlog, file_seq_of(ev.next_binlog)
            return None
        if isinstance(ev, FormatDescriptionEvent):
            if self._txn is not None:
                # The source restarted inside a group: it never committed, the server drops it.
                log.warning("transaction cut by a source restart dropped",
                            extra=kv(at=self._txn.where()))
                self.abandon()
            return None
        return None   # GTID lists, checkpoints, heartbeats, annotations: no data

    # -- pieces -------------------------------------------------------------------------------

    def _need_txn(self, what: str) -> _Open:
        if self._txn is None:
            raise BinlogProtocolError(f"{what} event outside a transaction ({self.where()})")
        return self._txn

    def _whole(self, ev: TxnImage) -> SourceTxn | None:
        """A whole transaction read natively: what its events one by one would have left (the
        GTID branch of `feed`, `_rows` for each rows event, `_finish` at its XID)."""
        if self._txn is not None:
            if ev.gtid_log_pos:
                self.last_event_end = ev.gtid_log_pos
            if ev.gtid_ts:
                self.last_event_ts = ev.gtid_ts
            raise BinlogProtocolError(f"GTID {ev.gtid} starts while {self._txn.where()} has "
                                      "not ended (no XID/COMMIT seen)")
        if ev.log_pos:
            self.last_event_end = ev.log_pos
        if ev.timestamp:
            self.last_event_ts = ev.timestamp
        offset = (ev.gtid_log_pos - ev.gtid_event_size) if ev.gtid_log_pos else 0
        t = self._txn = _Open(gtid=ev.gtid, domain=ev.domain_id, server_id=ev.server_id,
                              seq=ev.gtid_seq_no, standalone=False, file=self.file,
                              file_seq=self.file_seq, offset=offset, ts=ev.gtid_ts)
        muts = t.mutations
        for entry, changes, count in ev.mutations:
            m = RowsMutation(entry.table_id, entry.db, entry.table, entry.info.version)  # type: ignore[union-attr]
            m.add(changes, count)
            muts.append(m)
        t.size, t.marked = ev.size, ev.marked
        return self._finish()

    def _rows(self, ev: RowsImage) -> None:
        t = self._need_txn("rows")
        entry = self._maps.get(ev.table_id)
        if entry is None:
            raise UnknownTableId(ev.table_id, self.where())
        t.size += ev.end - ev.start
        if entry.info is None or entry.decoder is None:
            if self.tracker.filter.marks(entry.db, entry.table):
                t.marked = True
            return   # a table outside the filter
        dec = entry.decoder
        if ev.number_of_columns != dec.ncols:
            raise UndecodableRow(f"{dec.where}: rows event has {ev.number_of_columns} columns, its "
                                 f"TableMap {dec.ncols} ({self.where()})")
        tp = ev.tp
        if tp == pb.UPDATE:
            dec.check_present(ev.present, "before")
            dec.check_present(ev.present2, "after")
        else:
            dec.check_present(ev.present, "inserted" if tp == pb.INSERT else "deleted")
        try:
            # One native call per event: the RowChanges' protobuf bytes, every byte consumed.
            changes, count = dec.decode(ev.data, tp, ev.start, ev.end)
        except UndecodableRow as e:
            raise UndecodableRow(f"{e} ({self.where()})") from None
        muts = t.mutations
        last = muts[-1] if muts else None
        if last is None or last.table_id != entry.table_id or type(last) is not RowsMutation:
            last = RowsMutation(entry.table_id, entry.db, entry.table, entry.info.version)
            muts.append(last)
        last.add(changes, count)

    def _query(self, ev: Any) -> SourceTxn | None:
        q = ev.query.strip()
        upper = q[:10].upper()
        if upper == "BEGIN":
            return None
        if upper == "COMMIT":
            return self._finish()
        t = self._need_txn("query")
        if q.startswith(APPLY_MARK) and self.tracker.filter.has_marks:
            t.marked = True   # the sink's own DDL: shapes follow it, nothing is emitted
        schema = ev.schema.decode() if isinstance(ev.schema, bytes) else (ev.schema or "")
        ddls = self.tracker.on_ddl(q, schema, version_of(t.file_seq, t.offset))
        if ddls:
            t.ddls.extend(ddls)
        elif _DML.match(q):
            raise BinlogProtocolError(
                f"statement-format DML in the binlog ({t.where()}): {q[:80]!r}; the session that "
                "wrote it used binlog_format=STATEMENT/MIXED — set binlog_format=ROW globally and "
                "re-snapshot the affected tables")
        elif not _HARMLESS.match(q):
            log.debug("query event ignored", extra=kv(query=q[:80], at=t.where()))
        if t.standalone:
            return self._finish()
        return None

    def _reset_txn(self) -> None:
        self._txn = None
        self._maps.clear()
        self._on_txn_end()

    def abandon(self) -> None:
        """Drop the open transaction, if any (its source connection was lost or restarted).

        Shapes it declared were going to travel in its own schema snapshots, which are dropped
        with it: the tracker must stop believing they are declared downstream.
        """
        if self._txn is not None:
            self._reset_txn()
            self.tracker.reset_declared()

    def resume_state(self) -> str:
        """The GTID state after the last whole transaction returned: where to reconnect from."""
        return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(self.gtid_state.items()))

    def _finish(self) -> SourceTxn | None:
        t = self._txn
        if t is None:
            raise BinlogProtocolError(f"transaction end outside a transaction ({self.where()})")
        self._reset_txn()
        self.gtid_state[t.domain] = (t.server_id, t.seq)
        pos = pb.Position(file_seq=t.file_seq, offset=t.offset, file_name=t.file,
                          ts_ms=t.ts * 1000, server_id=t.server_id)
        # add() in place: a list of GtidPos messages copied into the field costs ~1.4x as much
        add = pos.gtids.add
        for d, (s, n) in sorted(self.gtid_state.items()):
            add(domain_id=d, server_id=s, seq_no=n)
        if t.marked:
            # A Sluice sink's own write: replicated here from elsewhere, so not captured again
            # (it would loop). Only its position moves on; shapes it declared were not sent.
            if t.snapshots or t.ddls:
                self.tracker.reset_declared()
            log.debug("transaction written by a Sluice sink skipped", extra=kv(at=t.where()))
            return SourceTxn(position=pos, gtid=t.gtid, server_id=t.server_id, ts_ms=t.ts * 1000,
                             file=t.file, offset=t.offset, mutations=(), schema_snapshots=(),
                             ddls=(), size=t.size)
        return SourceTxn(position=pos, gtid=t.gtid, server_id=t.server_id, ts_ms=t.ts * 1000,
                         file=t.file, offset=t.offset, mutations=tuple(t.mutations),
                         schema_snapshots=tuple(t.snapshots), ddls=tuple(t.ddls), size=t.size)
