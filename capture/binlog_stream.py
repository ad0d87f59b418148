"""mysql-replication's BinLogStreamReader made strict: native event framing, no skipped rows.

Rows, GTID and XID events and known TableMaps are framed by the native core
(`sluice_native.parse_event`, the dump connection read and split into packets by
`sluice_native.PacketReader`), so the library
never parses a rows event and its silent skip of unknown table ids cannot happen. Importing this
module replaces the library's packet wrapper (`_packet_wrapper`). Why, and the library's short
MariaDB COM_BINLOG_DUMP packet: docs/capture.md ("How the unknown-table_id hole in
mysql-replication is closed", "Source connection").
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any

import pymysql
from pymysql.protocol import MysqlPacket
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication import binlogstream as _binlogstream
from pymysqlreplication.binlogstream import MYSQL_EXPECTED_ERROR_CODES
from pymysqlreplication.constants.BINLOG import TABLE_MAP_EVENT
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent

from sluice.capture.assembler import (_IMAGES, GtidImage, RowsImage, TableMapImage, TxnImage,
                                      XidImage, _Image)
from sluice.capture.binlog_errors import BinlogProtocolError, SourceDisconnected, UnknownTableId
from sluice.capture.types import sluice_native


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
        body = data[20:h[5]]
        first = table_map.parsed.get(body)
        return None if first is None else TableMapImage(first, body, h[1], h[4], h[3])
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
        body = data[20:len(data) - (4 if use_checksum else 0)]
        first = parsed[body] = wrapper.event
        return TableMapImage(first, body, timestamp=wrapper.timestamp, log_pos=wrapper.log_pos,
                             event_size=wrapper.event_size)
    return wrapper


_READ_CHUNK = 256 * 1024
# When a read took less than this (the socket was drained: events trickle), the native reader
# gathers: it sleeps _LINGER_MS and takes what came in one read, again while each sleep brought
# bytes, _LINGER_MAX_MS at most (native/src/sockread.rs): fewer, larger batches per GIL
# hand-over, and one wakeup per _LINGER_MS instead of one per transaction of a live source
# (docs/benchmarks.md, round 33: 4 ms took 6-8% off the capture's CPU against 2 ms, 8 / 20 ms
# nothing more). A read of _SMALL_READ or more ends it: catch-up is read as fast as it comes.
_SMALL_READ = 16 * 1024
_LINGER_MS = 4.0
_LINGER_MAX_MS = 10.0
# A group bigger than this is read event by event rather than scanned again after every read.
_MAX_WHOLE_BYTES = 4 * 1024 * 1024
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

    def __init__(self, *args: Any, where: Callable[[], str] = lambda: "?",
                 scanner: Any = None, **kwargs: Any) -> None:
        self._where = where
        # sluice_native.TxnScanner (the SchemaTracker's): whole transactions read natively
        self._scanner = scanner
        self._strict = _StrictTableMap(where)
        self._pending: MysqlPacket | None = None
        self._packets: list[bytes] = []     # payloads split from the last read, and the next one
        self._next = 0
        self._native: Any = None            # sluice_native.PacketReader, from the first read on
        self._first_reads = 0
        self._bad_seq = -1
        self._failed: BaseException | None = None   # a read error kept for the next _refill
        super().__init__(*args, **kwargs)
        # The natively framed events are what `fetchone` returns for rows, TableMaps, GTIDs, XIDs.
        for attr in ("_BinLogStreamReader__allowed_events_in_packet",
                     "_BinLogStreamReader__allowed_events"):
            setattr(self, attr, frozenset(getattr(self, attr)) | set(_IMAGES))

    def wake(self) -> None:
        """From another thread: end a read waiting on the dump connection. Shutting the socket
        down wakes a poll or recv on it (the read then fails as a lost connection); closing it
        would not, and would free its number for reuse while the read still polls it."""
        sock = getattr(getattr(self, "_stream_connection", None), "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

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
        """The next payloads of the dump connection, read natively (`sluice_native.PacketReader`:
        the wait and the reads without the GIL, up to 256 KB at once, then split into payloads);
        pymysql's errors and sequence check as in its `_read_packet` (a lost connection or a
        read timeout is OperationalError 2013, the connection force-closed)."""
        if self._failed is not None:
            e, self._failed = self._failed, None
            raise e
        conn = self._stream_connection
        while True:
            if self._bad_seq >= 0:
                bad, self._bad_seq = self._bad_seq, -1
                self._native = None    # its socket is closed: its number may be reused
                conn._force_close()
                if bad == 0:   # MariaDB sends its error packet with seqno 0 when it shuts down
                    raise pymysql.err.OperationalError(2013, _LOST)
                raise pymysql.err.InternalError(f"Packet sequence number wrong - got {bad} expected "
                                                f"{conn._next_seq_id}")
            if conn._current_timeout != conn._read_timeout:
                conn._sock.settimeout(conn._read_timeout)
                conn._current_timeout = conn._read_timeout
            native = self._native
            if native is None:
                native = self._native = self._take_socket(conn)
            packets, conn._next_seq_id, self._bad_seq, err = native.read(
                conn._read_timeout, _READ_CHUNK, _SMALL_READ, _LINGER_MS, _LINGER_MAX_MS)
            if err is not None:
                self._native = None
                conn._force_close()
                raise pymysql.err.OperationalError(2013, f"{_LOST} ({err})" if err else _LOST)
            if packets:
                self._packets, self._next = packets, 1
                return packets[0]

    def _take_socket(self, conn: Any) -> Any:
        """The native reader of the dump connection's socket. The connection's buffered reader
        may hold bytes of the stream read with the last reply: its first read (which returns
        them, or reads the socket once) goes to the native reader first; after it nothing
        reads the socket but the native reader."""
        self._first_reads += 1
        while True:
            try:
                chunk = conn._rfile.read1(_READ_CHUNK)
            except InterruptedError:
                continue
            except OSError as e:
                conn._force_close()
                raise pymysql.err.OperationalError(2013, f"{_LOST} ({e})") from None
            except BaseException:
                conn._force_close()
                raise
            break
        if not chunk:
            conn._force_close()
            raise pymysql.err.OperationalError(2013, _LOST)
        native = sluice_native.PacketReader(conn._sock.fileno(), conn._next_seq_id)
        native.feed(chunk)
        return native

    @property
    def reads(self) -> int:
        """Socket reads of the dump connection (sluice_capture_source_reads_total)."""
        return self._first_reads + (self._native.reads if self._native is not None else 0)

    def _whole(self, checksum: bool) -> TxnImage | None:
        """The group starting at the GTID packet just taken, read whole by the native scanner,
        or None (declined: `self._next` is again just after the GTID packet). A group that goes
        on past the packets read so far is scanned again with more read (up to
        `_MAX_WHOLE_BYTES`); an error of that read is kept for the per-event path's next read,
        so it surfaces after the same events as without the scanner."""
        i = self._next - 1
        while True:
            got = self._scanner.scan(self._packets, i, checksum)
            if got is None:
                return None
            k, item = got
            if item is not None:
                self._next = k
                whole = TxnImage(*item)
                if whole.log_pos:
                    self.log_pos = whole.log_pos
                return whole
            rest = self._packets[i:]
            if sum(map(len, rest)) > _MAX_WHOLE_BYTES:
                return None
            try:
                self._refill()
            except Exception as e:  # noqa: BLE001 - re-raised by the next _refill, unchanged
                self._failed = e
                self._packets, self._next = rest, 1
                return None
            self._packets, self._next = rest + self._packets, 1
            i = 0

    def fetchone(self) -> Any:
        """The next event, or a whole transaction. On a connected stream the packet is taken
        here; a GTID event starting a group the native TxnScanner reads whole (rows on TableMaps
        the tracker resolved before, up to the XID: a sysbench transaction's 10 events) comes
        back as one TxnImage; otherwise the events the native core frames (rows, GTID, XID, a
        TableMap parsed before) are returned directly; any other packet (rotate, format description,
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
                checksum = self._BinLogStreamReader__use_checksum  # type: ignore[attr-defined]
                if data[5] == _GTID_EVENT and self._scanner is not None:
                    # The whole group natively when it is rows on known TableMaps up to its
                    # XID (native/src/txnscan.rs); otherwise event by event below.
                    whole = self._whole(checksum)
                    if whole is not None:
                        return whole
                image = _frame(data, self._strict, checksum)
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
