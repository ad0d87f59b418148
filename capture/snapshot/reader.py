"""Reading one chunk: its SELECT, and the SELECT's values turned into the binlog's Datums.

Invariant: a row read by a chunk SELECT becomes the same pb.Row the binlog reader
(`capture.types`) decodes for the same stored row, so an op=r row and a later update's before
image are equal and the window can match their keys. To get there the connection returns
temporals, decimals and floating point as the server's text (`snapshot_connect` sets `conv`),
which is parsed exactly here: zero dates and zero parts, TIME beyond 24 h, microseconds,
decimals of any precision. TIMESTAMP is read in UTC (session time_zone '+00:00') as the binlog
carries it. FLOAT is rounded to the nearest float32, as the binlog's float32 widened to a double;
that is exact for every value the server prints with enough digits (it prints FLOAT with up to
6-9 significant digits), documented as the one approximation.
"""
from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any

import pymysql
import pymysql.cursors
from pymysql.constants import FIELD_TYPE

from sluice.capture.snapshot.chunks import Chunk
from sluice.capture.snapshot.keys import SnapshotTable
from sluice.core.table import quote_ident
from sluice.core.errors import InvalidArgument
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["snapshot_connect", "RowConverter", "chunk_sql", "read_chunk", "select_rows",
           "SNAPSHOT_CONV"]

_RAW = (FIELD_TYPE.DATE, FIELD_TYPE.NEWDATE, FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP,
        FIELD_TYPE.TIME, FIELD_TYPE.DECIMAL, FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.FLOAT,
        FIELD_TYPE.DOUBLE, FIELD_TYPE.YEAR)
SNAPSHOT_CONV: dict[Any, Any] = {k: v for k, v in pymysql.converters.conversions.items()
                                 if k not in _RAW}
"""pymysql conversions with temporals, decimals and floats left as server text."""

_F32 = struct.Struct("<f")


def snapshot_connect(connection: dict[str, Any], **kwargs: Any) -> pymysql.connections.Connection:
    """A connection for chunk reads: raw text for exact types, UTC, autocommit REPEATABLE READ."""
    conn = pymysql.connect(**{"charset": "utf8mb4", "autocommit": True, **connection, **kwargs},
                           conv=SNAPSHOT_CONV)
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
    return conn


def _text(v: Any) -> str:
    return v.decode("ascii") if isinstance(v, (bytes, bytearray)) else str(v)


def _datetime(v: Any) -> pb.DateTimeValue:
    s = _text(v)
    date, _, time = s.partition(" ")
    y, mo, d = date.split("-")
    out = pb.DateTimeValue(year=int(y), month=int(mo), day=int(d))
    if time:
        hms, _, frac = time.partition(".")
        h, mi, sec = hms.split(":")
        out.hour, out.minute, out.second = int(h), int(mi), int(sec)
        if frac:
            out.microsecond = int(frac.ljust(6, "0")[:6])
    return out


def _time(v: Any) -> pb.TimeValue:
    s = _text(v)
    neg = s.startswith("-")
    hms, _, frac = s.lstrip("-").partition(".")
    h, mi, sec = hms.split(":")
    return pb.TimeValue(negative=neg, hours=int(h), minutes=int(mi), seconds=int(sec),
                        microseconds=int(frac.ljust(6, "0")[:6]) if frac else 0)


def _setter(col: pb.ColumnInfo) -> Callable[[pb.Datum, Any], None]:
    t = col.data_type
    if t in ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"):
        if col.unsigned:
            def f(d: pb.Datum, v: Any) -> None:
                d.uint = int(v)
        else:
            def f(d: pb.Datum, v: Any) -> None:
                d.int = int(v)
        return f
    if t in ("decimal", "numeric"):
        def f(d: pb.Datum, v: Any) -> None:
            d.decimal = _text(v)
        return f
    if t == "float":
        def f(d: pb.Datum, v: Any) -> None:
            d.double = _F32.unpack(_F32.pack(float(_text(v))))[0]
        return f
    if t in ("double", "real"):
        def f(d: pb.Datum, v: Any) -> None:
            d.double = float(_text(v))
        return f
    if t in ("date", "datetime", "timestamp"):
        def f(d: pb.Datum, v: Any) -> None:
            d.datetime.CopyFrom(_datetime(v))
        return f
    if t == "time":
        def f(d: pb.Datum, v: Any) -> None:
            d.time.CopyFrom(_time(v))
        return f
    if t == "json":
        def f(d: pb.Datum, v: Any) -> None:
            d.json = v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else v
        return f

    def f(d: pb.Datum, v: Any) -> None:
        # Character columns arrive as str, binary ones (charset binary, BIT, geometry) as bytes.
        if isinstance(v, str):
            d.str = v
        else:
            d.bytes = bytes(v)
    return f


_INTS = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"})
_TEXTS = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"})
_BLOBS = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
_UTF8 = frozenset({"utf8", "utf-8", "utf8mb4", "utf8mb3"})
# How a packet reader sets a column's Datum from its wire bytes (see RowConverter.packet_reader).
_INT, _UINT, _STR, _BYTES, _OTHER = range(5)


class RowConverter:
    """SELECT rows (from a `snapshot_connect` connection) -> pb.Row, one setter per column:
    `row` for tuples pymysql decoded, `packet_reader` straight from the rows' wire packets."""

    def __init__(self, columns: Sequence[pb.ColumnInfo]) -> None:
        self.columns = tuple(columns)
        self._setters = [_setter(c) for c in self.columns]

    def packet_reader(self, converters: Sequence[tuple[str | None, Any]]
                      ) -> Callable[[Any, Callable[[], pb.RowChange]], pb.Row]:
        """pymysql's `_read_row_from_packet` for one result, making the pb.Row itself.

        `converters`: the result's (encoding, converter) per column, as pymysql derived them
        from the field descriptions. Integers are parsed from their text, UTF-8 text is handed to
        protobuf as bytes (it checks and decodes them in C) and binary strings as they are; the
        other types go through pymysql's decoding and converter and then `row`'s setter — every
        column gets the Datum `row` would give it, at about half the Python work per row."""
        if len(converters) != len(self.columns):
            raise InvalidArgument(f"chunk SELECT returned {len(converters)} columns for "
                                  f"{len(self.columns)} (did the table change shape mid-snapshot?)")
        plan = []
        for (encoding, conv), col, setter in zip(converters, self.columns, self._setters):
            t = col.data_type
            if t in _INTS and encoding in (None, "ascii") and conv in (int, None):
                kind = _UINT if col.unsigned else _INT
            elif t in _TEXTS and conv is None and encoding in _UTF8:
                kind = _STR
            elif (t in _TEXTS or t in _BLOBS) and conv is None and encoding is None:
                kind = _BYTES
            else:
                kind = _OTHER
            plan.append((kind, encoding, conv, setter))
        return _compile_reader(plan)

    def row(self, values: Sequence[Any]) -> pb.Row:
        if len(values) != len(self._setters):
            raise InvalidArgument(f"chunk row has {len(values)} values for {len(self._setters)} "
                                  "columns (did the table change shape mid-snapshot?)")
        row = pb.Row()
        add = row.columns.add
        for setter, v in zip(self._setters, values):
            d = add()
            if v is None:
                d.null = True
            else:
                setter(d, v)
        return row


def _length(data: bytes, pos: int) -> tuple[int, int]:
    """A length-coded integer of 3, 4 or 9 bytes at data[pos] (first byte 252, 253, 254): (n, pos
    after it)."""
    first = data[pos]
    if first == 252:
        return data[pos + 1] | data[pos + 2] << 8, pos + 3
    if first == 253:
        return data[pos + 1] | data[pos + 2] << 8 | data[pos + 3] << 16, pos + 4
    if first == 254:
        return int.from_bytes(data[pos + 1:pos + 9], "little"), pos + 9
    raise InvalidArgument(f"a chunk row packet has the length byte {first} (0xff) in a value")


# The statement that sets a column's Datum from its wire bytes data[pos:end], per kind.
_SET = {_INT: "add().int = int(data[pos:end])", _UINT: "add().uint = int(data[pos:end])",
        _STR: "add().str = data[pos:end]", _BYTES: "add().bytes = data[pos:end]"}


def _compile_reader(plan: list[tuple[int, str | None, Any, Callable[[pb.Datum, Any], None]]]
                    ) -> Callable[[Any, Callable[[], pb.RowChange]], pb.Row]:
    """The row reader for `plan` as one function with the columns unrolled (no per-column loop,
    tuple unpacking or kind tests): one statement per column sets its Datum.
    `read(packet, new_change)`: the row is the `after` of `new_change()`, a RowChange added to a
    message holding the whole chunk (cheaper than a pb.Row of its own each)."""
    width = len(plan)
    env: dict[str, Any] = {"_length": _length, "InvalidArgument": InvalidArgument}
    src = ["def read(packet, new_change):",
           "    data = packet._data",
           "    pos = start = packet._position",
           "    row = new_change().after",
           "    add = row.columns.add",
           "    try:"]
    for i, (kind, encoding, conv, setter) in enumerate(plan):
        # A length-coded string (protocol::LengthEncodedString); 251 is NULL.
        src += ["        n = data[pos]",
                "        if n == 251:",
                "            add().null = True",
                "            pos += 1",
                "        else:",
                "            if n < 251:",
                "                pos += 1",
                "            else:",
                "                n, pos = _length(data, pos)",
                "            end = pos + n"]
        if kind in _SET:
            src.append(f"            {_SET[kind]}")
        else:
            env[f"enc{i}"], env[f"conv{i}"], env[f"set{i}"] = encoding, conv, setter
            value = "data[pos:end]" if encoding is None else f"data[pos:end].decode(enc{i})"
            src.append(f"            set{i}(add(), {value if conv is None else f'conv{i}({value})'})")
        src.append("            pos = end")
    src += ["    except IndexError:",
            "        raise InvalidArgument(f'a chunk row packet of {len(data) - start} bytes ends "
            f"before its {width} columns') from None",
            "    if pos != len(data):",
            "        raise InvalidArgument(f'a chunk row packet holds {len(data) - start} bytes, "
            f"{{pos - start}} of them for its {width} columns')",
            "    packet._position = pos",
            "    return row"]
    exec("\n".join(src), env)  # noqa: S102 - generated from the plan's kinds and indexes only
    return env["read"]  # type: ignore[no-any-return]


def chunk_sql(shape: SnapshotTable, chunk: Chunk, condition: str = "") -> tuple[str, list[Any]]:
    """The chunk's SELECT: every column, key range, optional additional condition, key order."""
    spec = shape.key
    where, params = chunk.where(spec)
    if condition:
        # Pasted into a parameterised statement: a literal % (as in `id % 2 = 0`) is doubled.
        where = f"{where} AND ({condition.replace('%', '%%')})"
    cols = ", ".join(quote_ident(c.name) for c in shape.columns)
    order = ", ".join(quote_ident(c) for c in spec.columns)
    return f"SELECT {cols} FROM {spec.sql_table} WHERE {where} ORDER BY {order}", params


def read_chunk(conn: Any, shape: SnapshotTable, chunk: Chunk, condition: str = "",
               converter: RowConverter | None = None) -> list[pb.Row]:
    """Run the chunk's SELECT on `conn` (autocommit: one consistent read; or inside the caller's
    consistent-snapshot transaction) and convert its rows."""
    sql, params = chunk_sql(shape, chunk, condition)
    return select_rows(conn, sql, params, converter or RowConverter(shape.columns))


def select_rows(conn: Any, sql: str, params: Sequence[Any], converter: RowConverter) -> list[pb.Row]:
    """Run a SELECT of the converter's columns on `conn` (a pymysql connection) and return its
    rows as pb.Row, each made from its wire packet by `converter.packet_reader` (the rows are
    never Python tuples)."""
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(sql, params)   # unbuffered: the rows are still on the wire
        result = cur._result
        read = converter.packet_reader(result.converters)
        # pymysql's unbuffered row loop (MySQLResult._read_rowdata_packet_unbuffered) without its
        # per-row fetchone calls. Should `read` raise, closing the cursor drains the rest.
        read_packet, at_eof = conn._read_packet, result._check_packet_is_eof
        rows: list[pb.Row] = []
        append = rows.append
        new_change = pb.TableMutation().changes.add   # one message holds the chunk's rows
        while True:
            packet = read_packet()
            if at_eof(packet):
                break
            append(read(packet, new_change))
        result.unbuffered_active = False
        result.connection = result.rows = None
        return rows
