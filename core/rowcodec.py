"""Row codec: pb.Datum <-> Python values <-> the file sink's JSON, and row keys.

Invariant: every Datum kind round-trips without loss: python_to_datum(datum_to_python(d, col),
col) == d. That holds for every value MySQL can store (int64/uint64 extremes, decimals of any
number of digits, zero dates and zero date parts, TIME beyond 24 hours and negative,
microseconds, utf8mb4 text, NULL).

Mapping (docs/types.md has the full table):
- null -> None; int/uint -> int; double -> float; decimal -> decimal.Decimal; bytes -> bytes;
  str -> str; json -> str (the JSON text, as MySQL stores it).
- datetime -> datetime.date for DATE columns, datetime.datetime (UTC) otherwise; a value Python
  cannot represent (zero date, zero month/day, year 0) -> MySQLDateTime.
- time -> datetime.timedelta (negative and > 24 h are fine).

Rows are in TableInfo.columns order. A row may carry a datum for every column (hidden ones
included) or only for the visible ones; the length decides, anything else is an error.
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import json as _json
import math
from typing import Any

from sluice.core.errors import InvalidArgument
from sluice.proto import sluice_pb2 as pb

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1

_UTC = _dt.timezone.utc
_DATE_TYPES = frozenset({"date", "newdate"})
_DECIMAL_TYPES = frozenset({"decimal", "numeric", "newdecimal"})
_JSON_TYPES = frozenset({"json"})


@dataclasses.dataclass(frozen=True, slots=True)
class MySQLDateTime:
    """A DATE/DATETIME/TIMESTAMP value that Python's datetime cannot hold ('0000-00-00', '2020-00-15')."""

    year: int = 0
    month: int = 0
    day: int = 0
    hour: int = 0
    minute: int = 0
    second: int = 0
    microsecond: int = 0

    def __str__(self) -> str:
        return (f"{self.year:04d}-{self.month:02d}-{self.day:02d} "
                f"{self.hour:02d}:{self.minute:02d}:{self.second:02d}.{self.microsecond:06d}")


def _data_type(col: pb.ColumnInfo | None) -> str:
    return col.data_type.lower() if col is not None else ""


# --------------------------------------------------------------------------------------------
# Datum -> Python
# --------------------------------------------------------------------------------------------

def _datetime_to_python(v: pb.DateTimeValue, col: pb.ColumnInfo | None) -> Any:
    try:
        if _data_type(col) in _DATE_TYPES:
            return _dt.date(v.year, v.month, v.day)
        return _dt.datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond,
                            tzinfo=_UTC)
    except ValueError:
        return MySQLDateTime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)


def _time_to_python(v: pb.TimeValue) -> _dt.timedelta:
    td = _dt.timedelta(hours=v.hours, minutes=v.minutes, seconds=v.seconds,
                       microseconds=v.microseconds)
    return -td if v.negative else td


def datum_to_python(d: pb.Datum, col: pb.ColumnInfo | None = None) -> Any:
    kind = d.WhichOneof("value")
    if kind is None or kind == "null":
        return None
    if kind == "int":
        return d.int
    if kind == "uint":
        return d.uint
    if kind == "str":
        return d.str
    if kind == "decimal":
        try:
            return decimal.Decimal(d.decimal)
        except decimal.InvalidOperation:
            raise InvalidArgument(f"invalid decimal text {d.decimal!r}"
                                  + (f" in column {col.name}" if col is not None else "")) from None
    if kind == "double":
        return d.double
    if kind == "bytes":
        return d.bytes
    if kind == "datetime":
        return _datetime_to_python(d.datetime, col)
    if kind == "time":
        return _time_to_python(d.time)
    if kind == "json":
        return d.json
    raise InvalidArgument(f"unknown datum kind {kind}")  # pragma: no cover - proto has no more


# --------------------------------------------------------------------------------------------
# Python -> Datum
# --------------------------------------------------------------------------------------------

def _decimal_text(value: decimal.Decimal, where: str) -> str:
    if not value.is_finite():
        raise InvalidArgument(f"{where}: decimal {value} is not finite")
    # format 'f' never uses exponent notation, so '1E+3' travels as '1000'.
    return format(value, "f")


def _where(col: pb.ColumnInfo | None) -> str:
    return f"column {col.name}" if col is not None else "value"


def python_to_datum(value: Any, col: pb.ColumnInfo | None = None) -> pb.Datum:
    dtype = _data_type(col)
    if value is None:
        return pb.Datum(null=True)
    if isinstance(value, bool):
        return pb.Datum(int=int(value))
    if isinstance(value, int):
        if dtype in _DECIMAL_TYPES:
            return pb.Datum(decimal=str(value))
        unsigned = col is not None and col.unsigned
        if value < 0 and unsigned:
            raise InvalidArgument(f"{_where(col)}: {value} is negative for an unsigned column")
        if unsigned or value > INT64_MAX:
            if value > UINT64_MAX:
                raise InvalidArgument(f"{_where(col)}: {value} is beyond uint64")
            return pb.Datum(uint=value)
        if value < INT64_MIN:
            raise InvalidArgument(f"{_where(col)}: {value} is below int64")
        return pb.Datum(int=value)
    if isinstance(value, float):
        if dtype in _DECIMAL_TYPES:
            return pb.Datum(decimal=_decimal_text(decimal.Decimal(repr(value)), _where(col)))
        return pb.Datum(double=value)
    if isinstance(value, decimal.Decimal):
        return pb.Datum(decimal=_decimal_text(value, _where(col)))
    if isinstance(value, str):
        if dtype in _JSON_TYPES:
            return pb.Datum(json=value)
        if dtype in _DECIMAL_TYPES:
            try:
                return pb.Datum(decimal=_decimal_text(decimal.Decimal(value), _where(col)))
            except decimal.InvalidOperation:
                raise InvalidArgument(f"{_where(col)}: invalid decimal text {value!r}") from None
        return pb.Datum(str=value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return pb.Datum(bytes=bytes(value))
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(_UTC)
        return pb.Datum(datetime=pb.DateTimeValue(
            year=value.year, month=value.month, day=value.day, hour=value.hour,
            minute=value.minute, second=value.second, microsecond=value.microsecond))
    if isinstance(value, _dt.date):
        return pb.Datum(datetime=pb.DateTimeValue(year=value.year, month=value.month, day=value.day))
    if isinstance(value, MySQLDateTime):
        return pb.Datum(datetime=pb.DateTimeValue(
            year=value.year, month=value.month, day=value.day, hour=value.hour,
            minute=value.minute, second=value.second, microsecond=value.microsecond))
    if isinstance(value, _dt.timedelta):
        total_us = abs(value) // _dt.timedelta(microseconds=1)
        secs, us = divmod(total_us, 1_000_000)
        mins, s = divmod(secs, 60)
        h, m = divmod(mins, 60)
        return pb.Datum(time=pb.TimeValue(negative=value < _dt.timedelta(0), hours=h, minutes=m,
                                          seconds=s, microseconds=us))
    if isinstance(value, (dict, list)) and dtype in _JSON_TYPES:
        return pb.Datum(json=_json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    raise InvalidArgument(f"{_where(col)}: cannot encode {type(value).__name__} {value!r} as a datum")


# --------------------------------------------------------------------------------------------
# Datum -> JSON (file sink, Debezium-like)
# --------------------------------------------------------------------------------------------

def _datetime_json(v: pb.DateTimeValue, col: pb.ColumnInfo | None) -> str:
    if _data_type(col) in _DATE_TYPES:
        return f"{v.year:04d}-{v.month:02d}-{v.day:02d}"
    if not (v.year or v.month or v.day or v.hour or v.minute or v.second or v.microsecond):
        return "0000-00-00T00:00:00Z"
    return (f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:{v.second:02d}"
            f".{v.microsecond:06d}Z")


def _time_json(v: pb.TimeValue) -> str:
    sign = "-" if v.negative else ""
    return f"{sign}{v.hours:02d}:{v.minutes:02d}:{v.seconds:02d}.{v.microseconds:06d}"


def datum_to_json(d: pb.Datum, col: pb.ColumnInfo | None = None) -> Any:
    """A JSON-serialisable value: decimals as exact strings, bytes as base64, temporals as text."""
    kind = d.WhichOneof("value")
    if kind is None or kind == "null":
        return None
    if kind == "int":
        return d.int
    if kind == "uint":
        return d.uint
    if kind == "str":
        return d.str
    if kind == "decimal":
        return d.decimal
    if kind == "double":
        v = d.double
        # NaN/Infinity are not JSON; MySQL cannot store them either, but never write invalid lines.
        return v if math.isfinite(v) else repr(v)
    if kind == "bytes":
        return base64.b64encode(d.bytes).decode("ascii")
    if kind == "datetime":
        return _datetime_json(d.datetime, col)
    if kind == "time":
        return _time_json(d.time)
    if kind == "json":
        return d.json
    raise InvalidArgument(f"unknown datum kind {kind}")  # pragma: no cover


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------

def _pairs(row: pb.Row, table_info: pb.TableInfo) -> list[tuple[pb.ColumnInfo, pb.Datum]]:
    """(column, datum) for every visible column."""
    cols = table_info.columns
    datums = row.columns
    if len(datums) == len(cols):
        return [(c, d) for c, d in zip(cols, datums) if not c.hidden]
    visible = [c for c in cols if not c.hidden]
    if len(datums) == len(visible):
        return list(zip(visible, datums))
    raise InvalidArgument(
        f"row of {table_info.schema_name}.{table_info.table_name} (table id {table_info.table_id}, "
        f"version {table_info.version}) has {len(datums)} values, the table has {len(cols)} "
        f"columns ({len(visible)} visible)")


def row_to_dict(row: pb.Row, table_info: pb.TableInfo, json: bool = False) -> dict[str, Any]:
    """Column name -> value (hidden columns skipped); `json=True` gives datum_to_json values."""
    conv = datum_to_json if json else datum_to_python
    return {c.name: conv(d, c) for c, d in _pairs(row, table_info)}


def _key_values(by_name: dict[str, tuple[pb.ColumnInfo, pb.Datum]], index: pb.IndexInfo,
                table_info: pb.TableInfo) -> tuple:
    try:
        return tuple(datum_to_python(by_name[n][1], by_name[n][0]) for n in index.columns)
    except KeyError as e:
        raise InvalidArgument(
            f"index {index.name} of {table_info.schema_name}.{table_info.table_name} names "
            f"unknown column {e.args[0]}") from None


def key_of(row: pb.Row, table_info: pb.TableInfo) -> tuple | None:
    """The primary-key values of a row, or None when the table has no primary key."""
    for index in table_info.indexes:
        if index.primary:
            by_name = {c.name: (c, d) for c, d in _pairs(row, table_info)}
            return _key_values(by_name, index, table_info)
    return None


def unique_keys_of(row: pb.Row, table_info: pb.TableInfo) -> list[tuple[str, tuple]]:
    """(index name, values) for the primary key and every unique index.

    A unique key containing NULL is left out: MySQL lets any number of rows share it, so it can
    never conflict.
    """
    out: list[tuple[str, tuple]] = []
    by_name: dict[str, tuple[pb.ColumnInfo, pb.Datum]] | None = None
    for index in table_info.indexes:
        if not (index.primary or index.unique):
            continue
        if by_name is None:
            by_name = {c.name: (c, d) for c, d in _pairs(row, table_info)}
        values = _key_values(by_name, index, table_info)
        if not index.primary and any(v is None for v in values):
            continue
        out.append((index.name, values))
    return out
