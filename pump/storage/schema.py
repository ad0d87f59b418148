"""Which transactions carry schema: the table ids a PrewriteValue declares (DDL or snapshots).

Invariant kept here: every table whose shape a transaction declares — a `ddl` (field 3) or a
`schema_snapshots` entry (field 4) of its PrewriteValue, whether the value is stored in one part
or split over the parts of a multi-part prewrite — is reported, so the storage pins that
transaction for GC and the PullBinlogs schema preamble.

Both walks read only the top-level field headers of the PrewriteValue and parse the (small) DDL
and TableInfo messages: the row mutations, which make up nearly all of a big transaction, are
skipped by length and never parsed. For a multi-part prewrite the value is walked as one stream
over its parts in part order, reading through callables (in memory for parts of the current
group, `pread` on the value log otherwise), so a 200 MiB transaction costs a few small reads.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from google.protobuf.message import DecodeError

from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

_DDL_FIELD, _SNAPSHOT_FIELD = 3, 4          # PrewriteValue.ddl, PrewriteValue.schema_snapshots
_PREWRITE_VALUE_FIELD = 4                   # Binlog.prewrite_value
_MAX_SCHEMA_MESSAGE = 64 << 20              # a DDL or TableInfo longer than this is garbage

# read(offset, n) -> up to n bytes at offset of one part's serialized Binlog
ReadAt = Callable[[int, int], bytes]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _tables_of(field: int, body: bytes) -> list[int]:
    if field == _DDL_FIELD:
        ddl = pb.DDL.FromString(body)
        tid = ddl.table_id or ddl.table_info.table_id
        return [tid] if tid else []
    info = pb.TableInfo.FromString(body)
    return [info.table_id] if info.table_id else []


def schema_tables(prewrite_value: bytes) -> tuple[int, ...]:
    """Table ids whose schema a whole (single-part) PrewriteValue declares."""
    # Walk the top-level fields first: almost no prewrite carries a DDL or schema snapshots,
    # and a full parse costs more than the rest of the write path.
    buf, pos, end = prewrite_value, 0, len(prewrite_value)
    fields = 0
    try:
        while pos < end:
            fields += 1
            if fields > 32:  # not a typical PrewriteValue: let the parser decide
                break
            tag = buf[pos]
            if tag < 0x80:
                pos += 1
            else:
                tag, pos = _varint(buf, pos)
            wire = tag & 7
            if wire == 2:
                if tag == 0x1A or tag == 0x22:
                    break
                n = buf[pos]
                if n < 0x80:
                    pos += 1 + n
                else:
                    n, pos = _varint(buf, pos)
                    pos += n
            elif wire == 0:
                _, pos = _varint(buf, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                return ()
        else:
            return ()
        pv = pb.PrewriteValue.FromString(prewrite_value)
    except (IndexError, ValueError, DecodeError):
        return ()
    return value_tables(pv)


def value_tables(pv: pb.PrewriteValue) -> tuple[int, ...]:
    """Table ids whose schema a decoded PrewriteValue declares (the admission check decodes
    every new prewrite's value already: the stager reads them from that)."""
    if not pv.HasField("ddl") and not pv.schema_snapshots:
        return ()
    tables: list[int] = []
    if pv.HasField("ddl"):
        tid = pv.ddl.table_id or pv.ddl.table_info.table_id
        if tid:
            tables.append(tid)
    tables.extend(t.table_id for t in pv.schema_snapshots if t.table_id)
    return tuple(dict.fromkeys(tables))


class _Stream:
    """Forward-only reads over byte ranges of several parts, as if they were one buffer.

    Reads go through a small read-ahead buffer, so walking many small fields costs one `pread`
    per buffer rather than one per field header."""

    _AHEAD = 64 << 10

    def __init__(self, ranges: Sequence[tuple[ReadAt, int, int]]) -> None:
        self._ranges = [r for r in ranges if r[2] > 0]   # (read, start, length)
        self._i = 0
        self._pos = 0          # position inside the current range
        self._buf = b""        # bytes of the current range from _buf_pos on
        self._buf_pos = 0

    def eof(self) -> bool:
        return self._i >= len(self._ranges)

    def tell(self) -> int:
        """Bytes consumed so far."""
        return sum(r[2] for r in self._ranges[:self._i]) + self._pos

    def read(self, n: int) -> bytes:
        out: list[bytes] = []
        while n > 0:
            if self._i >= len(self._ranges):
                raise ValueError("value ends inside a field")
            read, start, length = self._ranges[self._i]
            k = min(n, length - self._pos)
            at = self._pos - self._buf_pos
            if at < 0 or at + k > len(self._buf):
                if k >= self._AHEAD:
                    chunk = read(start + self._pos, k)
                    if len(chunk) != k:
                        raise ValueError("short read of a stored part")
                    out.append(chunk)
                    n -= k
                    self._advance(k)
                    continue
                want = min(max(k, self._AHEAD), length - self._pos)
                self._buf = read(start + self._pos, want)
                self._buf_pos = self._pos
                if len(self._buf) != want:
                    raise ValueError("short read of a stored part")
                at = 0
            out.append(self._buf[at:at + k])
            n -= k
            self._advance(k)
        return out[0] if len(out) == 1 else b"".join(out)

    def skip(self, n: int) -> None:
        while n > 0:
            if self._i >= len(self._ranges):
                raise ValueError("value ends inside a field")
            k = min(n, self._ranges[self._i][2] - self._pos)
            n -= k
            self._advance(k)

    def _advance(self, k: int) -> None:
        self._pos += k
        if self._pos == self._ranges[self._i][2]:
            self._i += 1
            self._pos = 0
            self._buf = b""
            self._buf_pos = 0

    def varint(self) -> int:
        result = shift = 0
        while True:
            b = self.read(1)[0]
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")


_MAX_FIELDS = 1 << 20   # more top-level fields than any real PrewriteValue: not one


def _walk(stream: _Stream, on_bytes: Callable[[int, int], bool]) -> None:
    """Walk top-level protobuf fields; on_bytes(field, length) for each length-delimited field
    returns True when it consumed the field's body itself."""
    fields = 0
    while not stream.eof():
        tag = stream.varint()
        fields += 1
        if tag >> 3 == 0 or fields > _MAX_FIELDS:
            raise ValueError("not a protobuf message (field 0, or too many fields)")
        wire = tag & 7
        if wire == 2:
            n = stream.varint()
            if not on_bytes(tag >> 3, n):
                stream.skip(n)
        elif wire == 0:
            stream.varint()
        elif wire == 1:
            stream.skip(8)
        elif wire == 5:
            stream.skip(4)
        else:
            raise ValueError(f"wire type {wire} in a top-level field")


def _prewrite_value_range(read: ReadAt, length: int) -> tuple[int, int]:
    """(offset, length) of Binlog.prewrite_value inside one part's serialized Binlog."""
    stream = _Stream([(read, 0, length)])
    found = (0, 0)

    def on_bytes(field: int, n: int) -> bool:
        nonlocal found
        if field == _PREWRITE_VALUE_FIELD:
            found = (stream.tell(), n)   # the last occurrence wins, as in the parser
        return False

    _walk(stream, on_bytes)
    return found


def multipart_schema_tables(parts: Sequence[tuple[ReadAt, int]]) -> tuple[int, ...]:
    """Table ids whose schema a multi-part prewrite declares.

    `parts`: (read, length) of each part's serialized Binlog, in part order. Returns () (and
    logs) when the stored parts do not form a parsable PrewriteValue.
    """
    try:
        ranges = []
        for read, length in parts:
            start, n = _prewrite_value_range(read, length)
            ranges.append((read, start, n))
        stream = _Stream(ranges)
        tables: list[int] = []

        def on_bytes(field: int, n: int) -> bool:
            if field not in (_DDL_FIELD, _SNAPSHOT_FIELD):
                return False
            if n > _MAX_SCHEMA_MESSAGE:
                raise ValueError(f"schema field of {n} bytes")
            tables.extend(_tables_of(field, stream.read(n)))
            return True

        _walk(stream, on_bytes)
    except (IndexError, ValueError, DecodeError, OSError) as e:
        log.warning("multi-part prewrite: cannot walk its PrewriteValue for schema (%s); it is "
                    "not pinned as a schema transaction", e)
        return ()
    return tuple(dict.fromkeys(tables))
