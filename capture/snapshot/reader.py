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
from pymysql.constants import FIELD_TYPE

from sluice.capture.snapshot.chunks import Chunk
from sluice.capture.snapshot.keys import TableShape, quote
from sluice.core.errors import InvalidArgument
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["snapshot_connect", "RowConverter", "chunk_sql", "read_chunk", "SNAPSHOT_CONV"]

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


class RowConverter:
    """SELECT tuples (from a `snapshot_connect` connection) -> pb.Row, one setter per column."""

    def __init__(self, columns: Sequence[pb.ColumnInfo]) -> None:
        self.columns = tuple(columns)
        self._setters = [_setter(c) for c in self.columns]

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


def chunk_sql(shape: TableShape, chunk: Chunk, condition: str = "") -> tuple[str, list[Any]]:
    """The chunk's SELECT: every column, key range, optional additional condition, key order."""
    spec = shape.key
    where, params = chunk.where(spec)
    if condition:
        # Pasted into a parameterised statement: a literal % (as in `id % 2 = 0`) is doubled.
        where = f"{where} AND ({condition.replace('%', '%%')})"
    cols = ", ".join(quote(c.name) for c in shape.columns)
    order = ", ".join(quote(c) for c in spec.columns)
    return f"SELECT {cols} FROM {spec.sql_table} WHERE {where} ORDER BY {order}", params


def read_chunk(conn: Any, shape: TableShape, chunk: Chunk, condition: str = "",
               converter: RowConverter | None = None) -> list[pb.Row]:
    """Run the chunk's SELECT on `conn` (autocommit: one consistent read; or inside the caller's
    consistent-snapshot transaction) and convert its rows."""
    sql, params = chunk_sql(shape, chunk, condition)
    conv = converter or RowConverter(shape.columns)
    with conn.cursor() as cur:
        cur.execute(sql, params)
        raw = cur.fetchall()
    return [conv.row(r) for r in raw]
