"""Reading a MariaDB binlog (GTID auto-position) into whole source transactions.

Invariant: a rows event is decoded only against a TableMap seen earlier in the same transaction;
a rows event whose table_id has no TableMap there is fatal (UnknownTableId, naming the
transaction's GTID and position), never skipped. The resume position of every transaction is its
first event (the GTID event). A transaction cut by a lost connection is dropped whole.

Rows, GTID and XID events and known TableMaps are framed by the native core
(`sluice_native.parse_event`, packets split by `sluice_native.split_packets`): the library never
parses a rows event, so its silent skip of unknown table ids cannot happen; the Assembler's own
per-transaction TableMap cache raises UnknownTableId. Where MariaDB transactions begin and end,
and the library's short COM_BINLOG_DUMP packet: docs/capture.md ("Reading the binlog", "How the
unknown-table_id hole in mysql-replication is closed", "Source connection").
"""
from __future__ import annotations

import dataclasses
import logging
import re
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication import binlogstream as _binlogstream
from pymysqlreplication.binlogstream import MYSQL_EXPECTED_ERROR_CODES
from pymysql.protocol import MysqlPacket
from pymysqlreplication.constants.BINLOG import TABLE_MAP_EVENT
from pymysqlreplication.event import (FormatDescriptionEvent, HeartbeatLogEvent,
                                      MariadbGtidEvent, MariadbGtidListEvent, QueryEvent,
                                      RotateEvent, XidEvent)
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (DeleteRowsEvent, TableMapEvent, UpdateRowsEvent,
                                          WriteRowsEvent)

from sluice.capture.schema import SchemaTracker, TableEntry, version_of
from sluice.capture.types import UndecodableRow, sluice_native
from sluice.core.errors import SluiceError
from sluice.core.marks import APPLY_MARK
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

import grpc

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


@dataclasses.dataclass(frozen=True, slots=True)
class SourceTxn:
    """One source transaction (event group) as read: what becomes one pump transaction."""

    position: pb.Position            # its first event; gtids = GTID state after it
    gtid: str
    server_id: int
    ts_ms: int
    file: str
    offset: int
    mutations: tuple[pb.TableMutation, ...]
    schema_snapshots: tuple[pb.TableInfo, ...]
    ddls: tuple[pb.DDL, ...]
    size: int                        # bytes of row events (grouping budget)
    # Set on a snapshot chunk (op=r rows emitted after a high watermark, not a source
    # transaction): the progress the pump records with it.
    snapshot: pb.SnapshotProgress | None = None

    @property
    def empty(self) -> bool:
        return not (self.mutations or self.schema_snapshots or self.ddls)

    def prewrite_values(self, source_name: str) -> list[pb.PrewriteValue]:
        """The PrewriteValue(s): one, or one per DDL when a statement acts on several tables."""
        src = pb.SourceInfo(name=source_name, server_id=self.server_id, gtid=self.gtid,
                            file=self.file, pos=self.offset, ts_ms=self.ts_ms)
        if len(self.ddls) <= 1:
            v = pb.PrewriteValue(mutations=self.mutations, schema_snapshots=self.schema_snapshots,
                                 source=src, snapshot_chunk=self.snapshot is not None)
            if self.ddls:
                v.ddl.CopyFrom(self.ddls[0])
            return [v]
        out = [pb.PrewriteValue(ddl=d, source=src) for d in self.ddls]
        out[0].schema_snapshots.extend(self.schema_snapshots)
        return out


@dataclasses.dataclass
class _Open:
    gtid: str
    domain: int
    server_id: int
    seq: int
    standalone: bool
    file: str
    file_seq: int
    offset: int
    ts: int
    mutations: list[pb.TableMutation] = dataclasses.field(default_factory=list)
    snapshots: list[pb.TableInfo] = dataclasses.field(default_factory=list)
    ddls: list[pb.DDL] = dataclasses.field(default_factory=list)
    size: int = 0
    marked: bool = False   # written by a Sluice sink (core/marks.py): dropped whole

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
    (shared by all of them: see `_packet_wrapper`), the header is this event's own."""

    __slots__ = ("table",)
    event_type = TABLE_MAP_EVENT

    def __init__(self, table: Any, timestamp: int = 0, log_pos: int = 0, event_size: int = 0) -> None:
        self.table = table
        self.timestamp, self.log_pos, self.event_size = timestamp, log_pos, event_size

    @property
    def table_id(self) -> int:
        return self.table.table_id

    def get_table(self) -> Any:
        return self.table.table_obj


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
            changes, _ = dec.decode(ev.data, tp, ev.start, ev.end)
        except UndecodableRow as e:
            raise UndecodableRow(f"{e} ({self.where()})") from None
        muts = t.mutations
        if not (muts and muts[-1].table_id == entry.table_id):
            muts.append(pb.TableMutation(table_id=entry.table_id, schema_name=entry.db,
                                         table_name=entry.table, table_version=entry.info.version))
        muts[-1].MergeFromString(changes)

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
                          ts_ms=t.ts * 1000, server_id=t.server_id,
                          gtids=[pb.GtidPos(domain_id=d, server_id=s, seq_no=n)
                                 for d, (s, n) in sorted(self.gtid_state.items())])
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


# ------------------------------------------------------------------------------------------------
# the library, made strict
# ------------------------------------------------------------------------------------------------

class _StrictTableMap(dict):
    __slots__ = ("where", "parsed")

    def __init__(self, where: Callable[[], str],
                 parsed: dict[bytes, TableMapEvent] | None = None) -> None:
        super().__init__()
        self.where = where
        # TableMap event body -> the first event parsed from it (see _packet_wrapper).
        self.parsed: dict[bytes, TableMapEvent] = parsed if parsed is not None else {}

    def __missing__(self, table_id: int) -> Any:
        raise UnknownTableId(table_id, self.where())


_PARSE_CACHE_MAX = 4096
_ROWS_EVENTS = frozenset({23, 24, 25, 30, 31, 32})
_GTID_EVENT, _XID_EVENT = 162, 16
_FAST_EVENTS = _ROWS_EVENTS | {TABLE_MAP_EVENT, _GTID_EVENT, _XID_EVENT}
# MariaDB's compressed events (log_bin_compress=ON): the library has no parser for them and would
# drop them silently (a DDL or rows lost), so they are refused by name.
_COMPRESSED_EVENTS = {165: "QUERY_COMPRESSED_EVENT", 166: "WRITE_ROWS_COMPRESSED_EVENT_V1",
                      167: "UPDATE_ROWS_COMPRESSED_EVENT_V1", 168: "DELETE_ROWS_COMPRESSED_EVENT_V1",
                      169: "WRITE_ROWS_COMPRESSED_EVENT", 170: "UPDATE_ROWS_COMPRESSED_EVENT",
                      171: "DELETE_ROWS_COMPRESSED_EVENT"}
_parse_event = sluice_native.parse_event
_split_packets = sluice_native.split_packets


def _frame(data: bytes, table_map: _StrictTableMap, use_checksum: bool) -> _Image | None:
    """A binlog packet's event framed by the native core: rows, GTID and XID events, and a
    TableMap whose body was parsed before; None for anything else (the library parses it)."""
    try:
        h = _parse_event(data, use_checksum)
    except sluice_native.DecodeError as e:
        raise BinlogProtocolError(f"{e} ({table_map.where()})") from None
    etype = h[0]
    if etype in _ROWS_EVENTS:
        return RowsImage(h[6], h[7], h[8], h[9], h[10], data, h[11], h[5], h[1], h[4], h[3])
    if etype == TABLE_MAP_EVENT:
        first = table_map.parsed.get(data[20:h[5]])
        return None if first is None else TableMapImage(first, h[1], h[4], h[3])
    if etype == _GTID_EVENT:
        return GtidImage(h[7], h[2], h[6], h[8], h[1], h[4], h[3])
    if etype == _XID_EVENT:
        return XidImage(h[6], h[1], h[4], h[3])
    if etype in _COMPRESSED_EVENTS:
        raise BinlogProtocolError(
            f"binlog event {_COMPRESSED_EVENTS[etype]} ({table_map.where()}): the source writes "
            "compressed binlog events (log_bin_compress=ON), which the capture cannot read; set "
            "log_bin_compress=OFF on the source")
    return None


def _packet_wrapper(pkt: Any, table_map: Any, ctl: Any, mysql_version: Any, use_checksum: bool,
                    *args: Any, **kwargs: Any) -> Any:
    """mysql-replication builds every event through this name (binlogstream's import of
    BinLogPacketWrapper, replaced below). Any other reader (a benchmark's baseline) gets exactly
    the library's own classes. A strict reader's packet is framed by the native core (`_frame`):
    rows, GTID and XID events become images the Assembler reads (the library never parses their
    rows); a TableMap is parsed by the library once per distinct body (a transaction maps every
    table it touches again: 4 TableMaps in a sysbench transaction, and their parse — column
    definitions, FULL optional metadata — was 60% of the capture's CPU); anything else by the
    library."""
    if not isinstance(table_map, _StrictTableMap):
        return BinLogPacketWrapper(pkt, table_map, ctl, mysql_version, use_checksum, *args, **kwargs)
    data = pkt._data
    image = _frame(data, table_map, use_checksum)
    if image is not None:
        return image
    wrapper = BinLogPacketWrapper(pkt, table_map, ctl, mysql_version, use_checksum, *args, **kwargs)
    if wrapper.event_type == TABLE_MAP_EVENT and wrapper.event is not None:
        parsed = table_map.parsed
        if len(parsed) >= _PARSE_CACHE_MAX:
            parsed.clear()
        first = parsed[data[20:len(data) - (4 if use_checksum else 0)]] = wrapper.event
        return TableMapImage(first, timestamp=wrapper.timestamp, log_pos=wrapper.log_pos,
                             event_size=wrapper.event_size)
    return wrapper


_READ_CHUNK = 256 * 1024
_LOST = "Lost connection to MySQL server during query"


_binlogstream.BinLogPacketWrapper = _packet_wrapper  # type: ignore[assignment]


class FixedBinLogStreamReader(BinLogStreamReader):
    """BinLogStreamReader whose MariaDB COM_BINLOG_DUMP packet has the right length (see the
    module docstring): the only change, so it is also the honest baseline for benchmarks."""

    def _BinLogStreamReader__set_mariadb_settings(self) -> bytes:  # noqa: N802 - overrides the private
        prelude: bytes = BinLogStreamReader._BinLogStreamReader__set_mariadb_settings(self)  # type: ignore[attr-defined]
        # 3-byte payload length + sequence id 0, then the payload as the library built it.
        return struct.pack("<I", len(prelude) - 4) + prelude[4:]


class StrictBinLogStreamReader(FixedBinLogStreamReader):
    """BinLogStreamReader whose TableMap cache refuses unknown table_ids instead of dropping rows."""

    def __init__(self, *args: Any, where: Callable[[], str] = lambda: "?", **kwargs: Any) -> None:
        self._where = where
        self._strict = _StrictTableMap(where)
        self._pending: MysqlPacket | None = None
        self._packets: list[bytes] = []     # payloads split from the last read, and the next one
        self._next = 0
        self._rest = b""                    # an incomplete packet at the end of the last read
        self._bad_seq = -1
        super().__init__(*args, **kwargs)
        # The natively framed events are what `fetchone` returns for rows, TableMaps, GTIDs, XIDs.
        for attr in ("_BinLogStreamReader__allowed_events_in_packet",
                     "_BinLogStreamReader__allowed_events"):
            setattr(self, attr, frozenset(getattr(self, attr)) | set(_IMAGES))

    def _BinLogStreamReader__connect_to_stream(self) -> None:  # noqa: N802 - overrides the private
        # The library silently reconnects after a lost connection (2013/2006) with its *original*
        # start GTID, which would re-deliver transactions already read. One connection per
        # reader: a reconnect becomes an error, and the capture resumes from the pumps' position.
        if getattr(self, "_connected_once", False):
            raise SourceDisconnected(f"lost the binlog connection to the source ({self._where()}); "
                                     "resuming from the last committed position")
        self._connected_once = True
        BinLogStreamReader._BinLogStreamReader__connect_to_stream(self)  # type: ignore[attr-defined]
        # The library reads its packets (the ones `fetchone` leaves to it) from the same buffer.
        conn = self._stream_connection

        def read_packet(packet_type: Any = MysqlPacket) -> Any:
            p = self._pending
            if p is None:
                p = MysqlPacket(self._next_payload(), conn.encoding)
            else:
                self._pending = None
            if p.is_error_packet():
                p.raise_for_error()
            return p
        conn._read_packet = read_packet

    def _next_payload(self) -> bytes:
        i = self._next
        if i < len(self._packets):
            self._next = i + 1
            return self._packets[i]
        return self._refill()

    def _refill(self) -> bytes:
        """Reads what the dump connection has (up to 256 KB at once) and splits it into packet
        payloads natively; pymysql's errors and sequence check as in its `_read_packet` (a lost
        connection or a read timeout is OperationalError 2013, the connection force-closed)."""
        conn = self._stream_connection
        while True:
            if self._bad_seq >= 0:
                bad, self._bad_seq = self._bad_seq, -1
                conn._force_close()
                if bad == 0:   # MariaDB sends its error packet with seqno 0 when it shuts down
                    raise pymysql.err.OperationalError(2013, _LOST)
                raise pymysql.err.InternalError(f"Packet sequence number wrong - got {bad} expected "
                                                f"{conn._next_seq_id}")
            if conn._current_timeout != conn._read_timeout:
                conn._sock.settimeout(conn._read_timeout)
                conn._current_timeout = conn._read_timeout
            rest = self._rest
            # a packet bigger than what is buffered: read the rest of it at once
            missing = 4 + (rest[0] | rest[1] << 8 | rest[2] << 16) - len(rest) if len(rest) >= 4 else 0
            try:
                chunk = conn._rfile.read(missing) if missing > 0 else conn._rfile.read1(_READ_CHUNK)
            except InterruptedError:
                continue
            except OSError as e:
                conn._force_close()
                raise pymysql.err.OperationalError(2013, f"{_LOST} ({e})") from None
            except BaseException:
                conn._force_close()
                raise
            if not chunk or len(chunk) < missing:
                conn._force_close()
                raise pymysql.err.OperationalError(2013, _LOST)
            buf = rest + chunk if rest else chunk
            packets, used, conn._next_seq_id, self._bad_seq = _split_packets(buf, conn._next_seq_id)
            self._rest = buf[used:]
            if packets:
                self._packets, self._next = packets, 1
                return packets[0]

    def fetchone(self) -> Any:
        """The next event. On a connected stream the packet is taken here and the events the
        native core frames (rows, GTID, XID, a TableMap parsed before: 9 of a sysbench
        transaction's 10) are returned directly; any other packet (rotate, format description,
        query, heartbeat, a first TableMap, the end of the stream, an error) goes to the
        library's `fetchone`, which reads it as its next packet and handles it as always."""
        if (self._BinLogStreamReader__connected_stream and self._pending is None  # type: ignore[attr-defined]
                and self._BinLogStreamReader__connected_ctl and not self.end_log_pos  # type: ignore[attr-defined]
                and not self.skip_to_timestamp):
            i = self._next
            if i < len(self._packets):
                self._next = i + 1
                data = self._packets[i]
            else:
                conn = self._stream_connection
                try:
                    data = self._refill()
                except pymysql.OperationalError as e:
                    if e.args[0] not in MYSQL_EXPECTED_ERROR_CODES:
                        raise
                    # what the library does with a lost connection: it reconnects (refused above)
                    conn.close()
                    self._BinLogStreamReader__connected_stream = False
                    return super().fetchone()
            if len(data) > 19 and data[0] == 0 and data[5] in _FAST_EVENTS:
                image = _frame(data, self._strict, self._BinLogStreamReader__use_checksum)  # type: ignore[attr-defined]
                if image is not None:
                    if image.log_pos:
                        self.log_pos = image.log_pos
                    return image
            self._pending = MysqlPacket(data, self._stream_connection.encoding)
        return super().fetchone()

    @property  # type: ignore[override]
    def table_map(self) -> _StrictTableMap:
        return self._strict

    @table_map.setter
    def table_map(self, value: dict) -> None:
        # The library assigns a fresh {} at start and at every rotate; keep it strict (the
        # parsed TableMaps stay: a body names its table id, so a reused id cannot match).
        strict = _StrictTableMap(self._where, getattr(getattr(self, "_strict", None), "parsed", None))
        strict.update(value)
        self._strict = strict


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
            enable_logging=False, where=self.assembler.where)
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

    def lag_s(self) -> float:
        ts = self.assembler.last_event_ts
        return max(0.0, time.time() - ts) if ts else 0.0

    def close(self) -> None:
        self._stream.close()
