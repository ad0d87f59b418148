"""MySQL column types and Datums -> Spark SQL / Iceberg types and values (docs/types.md).

Invariant: every value a column can hold lands in its Iceberg column without loss, or as a
documented lossless stand-in: DECIMAL beyond 38 digits as its exact text, BIGINT UNSIGNED as
DECIMAL(20,0), TIME as "[-]HH:MM:SS.ffffff" text, JSON as its text, UUID/INET4/INET6 as their
canonical text, spatial values as WKB (BINARY, the 4-byte SRID prefix of MariaDB's storage
format removed), SET as an array of its members, and a zero or otherwise invalid date as NULL with
the column named in the row's `_zero_dates` flag.

Iceberg has no 8- or 16-bit integers: TINYINT, SMALLINT, MEDIUMINT, INT and YEAR are INT.
Timestamps are UTC instants with microseconds (the session runs in UTC).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import ipaddress as _ipaddress
import uuid as _uuid
from collections.abc import Callable
from typing import Any

from sluice.core.errors import InvalidArgument
from sluice.proto import sluice_pb2 as pb

MAX_DECIMAL_PRECISION = 38
_UTC = _dt.timezone.utc

_INT_SIGNED = {"tinyint": "INT", "smallint": "INT", "mediumint": "INT", "int": "INT",
               "integer": "INT", "bigint": "BIGINT", "year": "INT", "bool": "INT",
               "boolean": "INT"}
_INT_UNSIGNED = {"tinyint": "INT", "smallint": "INT", "mediumint": "INT", "int": "BIGINT",
                 "integer": "BIGINT", "bigint": "DECIMAL(20,0)", "year": "INT"}
_STRING = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum",
                     "json", "time"})
_UUID = "uuid"
_INET = frozenset({"inet4", "inet6"})
_SET = "set"
_BINARY = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob",
                     "geometry", "point", "linestring", "polygon", "multipoint",
                     "multilinestring", "multipolygon", "geometrycollection"})
_DOUBLE = frozenset({"float", "double", "real"})
_DECIMAL = frozenset({"decimal", "numeric", "newdecimal", "fixed"})
_TIMESTAMP = frozenset({"datetime", "timestamp"})
_DATE = frozenset({"date", "newdate"})

SET_TYPE = "ARRAY<STRING>"


class UnsupportedType(InvalidArgument):
    """A column type the Spark sink has no mapping for."""


def spark_type(col: pb.ColumnInfo) -> str:
    """The Spark SQL type (DDL text) for a column."""
    dt = col.data_type.lower()
    if dt in _INT_SIGNED:
        return (_INT_UNSIGNED if col.unsigned else _INT_SIGNED).get(dt, "BIGINT")
    if dt == "bit":
        return "DECIMAL(20,0)" if (col.length or 1) > 63 else "BIGINT"
    if dt in _DOUBLE:
        return "DOUBLE"
    if dt in _DECIMAL:
        p = col.precision or 10
        if p > MAX_DECIMAL_PRECISION:
            return "STRING"
        return f"DECIMAL({p},{col.scale})"
    if dt in _TIMESTAMP:
        return "TIMESTAMP"
    if dt in _DATE:
        return "DATE"
    if dt in _STRING or dt == _UUID or dt in _INET:
        return "STRING"
    if dt == _SET:
        return SET_TYPE
    if dt in _BINARY:
        return "BINARY"
    raise UnsupportedType(f"column {col.name}: MySQL type {col.column_type or dt!r} has no Spark "
                          "mapping")


def _decimal_parts(t: str) -> tuple[int, int] | None:
    if t.startswith("DECIMAL("):
        p, s = t[8:-1].split(",")
        return int(p), int(s)
    return None


def widens(old: str, new: str) -> bool:
    """True when Iceberg can promote a column of Spark type `old` to `new` in place (int ->
    bigint, float -> double, decimal precision up with the same scale)."""
    if old == new:
        return True
    if (old, new) in (("INT", "BIGINT"), ("FLOAT", "DOUBLE")):
        return True
    od, nd = _decimal_parts(old), _decimal_parts(new)
    return od is not None and nd is not None and od[1] == nd[1] and nd[0] >= od[0]


_NUMERIC = ("INT", "BIGINT", "DOUBLE", "FLOAT")


def castable(old: str, new: str) -> bool:
    """Whether Spark's CAST from `old` to `new` gives what MySQL's ALTER gives for every value
    it accepts (a value it cannot convert becomes NULL under try_cast, which the sink counts as
    a loss): numbers and dates to text, integers and decimals between each other with a scale
    that does not drop digits, text to numbers, dates and timestamps, DATE to TIMESTAMP."""
    od, nd = _decimal_parts(old), _decimal_parts(new)
    exact_num = old in ("INT", "BIGINT") or (od is not None)
    if new == "STRING":
        return exact_num or old in ("DATE", "TIMESTAMP", "STRING")
    if old == "STRING":
        return new in _NUMERIC or nd is not None or new in ("DATE", "TIMESTAMP")
    if old in ("INT", "BIGINT") and (new in ("INT", "BIGINT", "DOUBLE") or nd is not None):
        return True
    if od is not None and (nd is not None and nd[1] >= od[1] or new in ("INT", "BIGINT") and od[1] == 0):
        return True
    return old == "DATE" and new == "TIMESTAMP"


def time_text(v: pb.TimeValue) -> str:
    sign = "-" if v.negative else ""
    return f"{sign}{v.hours:02d}:{v.minutes:02d}:{v.seconds:02d}.{v.microseconds:06d}"


def _datetime_text(v: pb.DateTimeValue) -> str:
    return (f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
            f".{v.microsecond:06d}")


_ZERO = object()  # a zero/invalid date: NULL in its column, named in _zero_dates


def _conv_int(d: pb.Datum) -> Any:
    k = d.WhichOneof("value")
    if k == "int":
        return d.int
    if k == "uint":
        return d.uint
    if k == "bytes":
        return int.from_bytes(d.bytes, "big")
    if k == "decimal":
        return int(decimal.Decimal(d.decimal))
    if k == "double":
        return int(d.double)
    if k == "str":
        return int(d.str)
    return _bad(d, "an integer")


def _conv_dec(d: pb.Datum) -> Any:
    k = d.WhichOneof("value")
    if k == "decimal":
        return decimal.Decimal(d.decimal)
    if k == "uint":
        return decimal.Decimal(d.uint)
    if k == "int":
        return decimal.Decimal(d.int)
    if k == "bytes":
        return decimal.Decimal(int.from_bytes(d.bytes, "big"))
    if k == "str":
        return decimal.Decimal(d.str)
    return _bad(d, "a decimal")


def _conv_double(d: pb.Datum) -> Any:
    k = d.WhichOneof("value")
    if k == "double":
        return d.double
    if k == "int":
        return float(d.int)
    if k == "uint":
        return float(d.uint)
    if k == "decimal":
        return float(d.decimal)
    return _bad(d, "a double")


def _conv_str(d: pb.Datum) -> Any:
    k = d.WhichOneof("value")
    if k == "str":
        return d.str
    if k == "json":
        return d.json
    if k == "decimal":
        return d.decimal
    if k == "time":
        return time_text(d.time)
    if k == "int":
        return str(d.int)
    if k == "uint":
        return str(d.uint)
    if k == "double":
        return repr(d.double)
    if k == "bytes":
        return d.bytes.decode("utf-8", "surrogateescape")
    if k == "datetime":
        return _datetime_text(d.datetime)
    return _bad(d, "text")


def _conv_bytes(d: pb.Datum) -> Any:
    k = d.WhichOneof("value")
    if k == "bytes":
        return bytearray(d.bytes)
    if k == "str":
        return bytearray(d.str.encode("utf-8"))
    return _bad(d, "bytes")


def _conv_ts(d: pb.Datum) -> Any:
    if d.WhichOneof("value") != "datetime":
        return _bad(d, "a timestamp")
    v = d.datetime
    try:
        return _dt.datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond,
                            tzinfo=_UTC)
    except ValueError:
        return _ZERO


def _conv_date(d: pb.Datum) -> Any:
    if d.WhichOneof("value") != "datetime":
        return _bad(d, "a date")
    v = d.datetime
    try:
        return _dt.date(v.year, v.month, v.day)
    except ValueError:
        return _ZERO


def _conv_uuid(d: pb.Datum) -> Any:
    if d.WhichOneof("value") == "bytes" and len(d.bytes) == 16:
        return str(_uuid.UUID(bytes=d.bytes))
    return _conv_str(d)


def inet6_text(b: bytes) -> str:
    """INET6 bytes as MariaDB prints them (inet_ntop's rules): IPv4-mapped `::ffff:a.b.c.d` and
    IPv4-compatible `::a.b.c.d` (not `::` or `::1`-like) in dotted form, else RFC 5952 text.
    Python's ipaddress (3.11) writes `::ffff:102:304` for a mapped address."""
    if b[:10] == bytes(10) and b[10:12] in (b"\xff\xff", b"\x00\x00") and (
            b[10:12] == b"\xff\xff" or b[12:14] != b"\x00\x00"):
        return ("::ffff:" if b[10:12] == b"\xff\xff" else "::") + str(_ipaddress.IPv4Address(b[12:]))
    return str(_ipaddress.IPv6Address(b))


def _conv_inet(d: pb.Datum) -> Any:
    if d.WhichOneof("value") == "bytes" and len(d.bytes) == 4:
        return str(_ipaddress.IPv4Address(d.bytes))
    if d.WhichOneof("value") == "bytes" and len(d.bytes) == 16:
        return inet6_text(d.bytes)
    return _conv_str(d)


def _conv_set(d: pb.Datum) -> Any:
    text = _conv_str(d)
    return [m for m in text.split(",") if m] if text else []


_SRID_PREFIX = 4


def _conv_wkb(d: pb.Datum) -> Any:
    """MariaDB stores a geometry as a 4-byte SRID then WKB; the column holds the WKB."""
    b = _conv_bytes(d)
    if len(b) > _SRID_PREFIX + 5 and b[_SRID_PREFIX] in (0, 1):
        return b[_SRID_PREFIX:]
    return b


def _bad(d: pb.Datum, what: str) -> Any:
    raise InvalidArgument(f"datum {d.WhichOneof('value')} cannot be read as {what}")


_BY_TYPE: dict[str, Callable[[pb.Datum], Any]] = {
    "INT": _conv_int, "BIGINT": _conv_int,
    "DOUBLE": _conv_double, "STRING": _conv_str, "BINARY": _conv_bytes, "TIMESTAMP": _conv_ts,
    "DATE": _conv_date,
}


_SPATIAL = frozenset({"geometry", "point", "linestring", "polygon", "multipoint",
                      "multilinestring", "multipolygon", "geometrycollection"})


def converter(stype: str, col: pb.ColumnInfo | None = None) -> Callable[[pb.Datum], Any]:
    """Datum -> Python value for Spark type stype of column col (NULL handled by the caller)."""
    dt = col.data_type.lower() if col is not None else ""
    if stype == "STRING":
        if dt == _UUID:
            return _conv_uuid
        if dt in _INET:
            return _conv_inet
    if stype == SET_TYPE:
        return _conv_set
    if stype == "BINARY" and dt in _SPATIAL:
        return _conv_wkb
    if stype.startswith("DECIMAL("):
        return _conv_dec
    return _BY_TYPE[stype]


def text_converter(col: pb.ColumnInfo) -> Callable[[pb.Datum], Any]:
    """Datum -> text for a column the sink keeps as STRING although its source type maps to
    another Spark type (`on-unmappable = "as-string"`): the value as MySQL prints it in its
    source type (`CAST(col AS CHAR)`: dates `2024-01-02`, datetimes with the column's fractional
    digits, numbers as written), except binary and spatial values, which are no text: base64
    (as Debezium's binary.handling.mode=base64), so no byte is lost."""
    dt = col.data_type.lower()
    if dt in _BINARY:
        return _text_base64
    if dt in _DATE:
        return _text_date
    if dt in _TIMESTAMP or dt == "time":
        fsp = col.scale

        def text_datetime(d: pb.Datum) -> Any:
            if d.WhichOneof("value") == "time":
                t = time_text(d.time)
            elif d.WhichOneof("value") == "datetime":
                t = _datetime_text(d.datetime)
            else:
                return _conv_str(d)
            return t[:len(t) - 6 + fsp] if fsp else t[:len(t) - 7]
        return text_datetime
    if dt == _UUID:
        return _conv_uuid
    if dt in _INET:
        return _conv_inet
    return _conv_str


def _text_base64(d: pb.Datum) -> Any:
    import base64
    return base64.b64encode(_conv_bytes(d)).decode("ascii")


def _text_date(d: pb.Datum) -> Any:
    if d.WhichOneof("value") != "datetime":
        return _conv_str(d)
    v = d.datetime
    return f"{v.year:04d}-{v.month:02d}-{v.day:02d}"


def native_kinds(stype: str, col: pb.ColumnInfo | None = None) -> frozenset[str]:
    """Datum kinds read as they are for this column (no conversion call)."""
    dt = col.data_type.lower() if col is not None else ""
    if dt in _SPATIAL or stype == SET_TYPE:
        return frozenset()
    return _NATIVE.get(stype, frozenset())


# Datum kinds whose attribute already is the Spark value of the type: read as is (the hot path).
_NATIVE: dict[str, frozenset[str]] = {
    "INT": frozenset({"int", "uint"}), "BIGINT": frozenset({"int", "uint"}),
    "DOUBLE": frozenset({"double"}), "STRING": frozenset({"str", "json", "decimal"}),
}


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnPlan:
    """How one visible column of a TableInfo version lands: its name, Spark type, converter,
    and the Datum kinds read as they are."""

    name: str
    stype: str
    convert: Callable[[pb.Datum], Any]
    native: frozenset[str] = frozenset()


def plan_columns(info: pb.TableInfo, kept: dict[str, str] | None = None) -> list[ColumnPlan]:
    """One plan per visible column, in TableInfo order. `kept`: the sink table's column types by
    lower-case name; a column the table keeps as STRING while its source type maps to another
    type (on-unmappable = "as-string") is written as text."""
    out = []
    for c in info.columns:
        if c.hidden:
            continue
        st = spark_type(c)
        if kept is not None and st != "STRING" and kept.get(c.name.lower()) == "STRING":
            out.append(ColumnPlan(c.name, "STRING", text_converter(c)))
            continue
        out.append(ColumnPlan(c.name, st, converter(st, c), native_kinds(st, c)))
    return out


# The type of the former per-table Python row reader (kept in tests/support/pysparkrows.py as the
# oracle of native/src/sparkrows.rs, which the sink now uses).
RowReader = Callable[[pb.Row, "tuple[Any, ...]"], "tuple[Any, ...]"]
