"""Transactions -> ordered row changes with values ready for pymysql, and their causality keys.

Invariant: a transaction translates into its row changes in source order, each decoded with the
table shape in force at the transaction's commit_ts (SchemaHistory.table_at, through Txn.rows),
and every Datum kind becomes a value MySQL stores back unchanged: NULL, signed and unsigned 64-bit
integers, doubles, decimals of any precision (as exact `Decimal`), bytes, text, dates and
datetimes including zero dates and zero parts (as text), TIME beyond 24 hours and negative (as
`timedelta`), JSON (as its text), BIT (as an integer).

Causality keys (drainer/causality.py routes on them): for every row image touched (before and
after of an update) one key per primary/unique index (`unique_keys_of`'s rule: a unique key
containing NULL never conflicts and is left out); a table without a primary key or a NOT NULL
unique key uses the full row image instead, plus one key for the whole table (its UPDATE/DELETE
statements scan the table, locking every row they pass: two workers on it would deadlock). Text
in keys is folded (case, trailing spaces,
accents) because a case/accent-insensitive unique index treats 'Abc' and 'abc ' as the same
value downstream: folding only merges keys, which can cost an extra flush, never a missed
conflict.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import unicodedata
from collections.abc import Sequence
from typing import Any

from sluice.core.rowcodec import MySQLDateTime, datum_to_python, row_to_dict
from sluice.core.table import quote_ident as quote_id
from sluice.drainer.txn import RowEvent, SchemaLookup, Txn
from sluice.proto import sluice_pb2 as pb

INSERT, UPDATE, DELETE, UPSERT = "insert", "update", "delete", "upsert"

_KIND_OF_OP = {"c": INSERT, "u": UPDATE, "d": DELETE, "r": UPSERT}
# Inexact or unbounded types compare badly in a WHERE built from a full row image.
_NOT_IN_ROW_IMAGE_WHERE = frozenset({"float", "double", "real"})
_DATE_TYPES = frozenset({"date", "newdate"})


@dataclasses.dataclass(frozen=True, slots=True)
class ApplyShape:
    """What the SQL builder needs of one TableInfo version (visible columns only).

    Not core.table.TableShape: that one describes a source table as a producer reads it
    (all columns, its key, from information_schema); this one is the downstream apply's view
    of a decoded row (hidden columns dropped, the WHERE identity, causality key specs)."""

    table_id: int
    version: int
    schema: str
    table: str
    columns: tuple[str, ...]                 # visible columns, table order
    data_types: tuple[str, ...]              # lower-case data_type per visible column
    infos: tuple[pb.ColumnInfo, ...]         # visible ColumnInfos
    visible_pos: tuple[int, ...]             # positions of the visible columns in a full row
    total: int                               # columns in a full row (hidden included)
    writable: tuple[int, ...]                # visible, not generated: INSERT/SET lists
    identity: tuple[int, ...]                # columns of the WHERE that finds a row
    has_identity: bool                       # a primary key or NOT NULL unique key exists
    unique: tuple[tuple[str, tuple[int, ...], bool], ...]  # (index, columns, primary)
    # Derived once per shape (the per-row paths below read them for every row).
    qualified: str = dataclasses.field(init=False, compare=False, repr=False)
    sql_name: str = dataclasses.field(init=False, compare=False, repr=False)      # `schema`.`table`
    sql_columns: str = dataclasses.field(init=False, compare=False, repr=False)   # (`a`,`b`): writable
    key_specs: tuple[tuple[str, tuple[int, ...], bool], ...] = dataclasses.field(
        init=False, compare=False, repr=False)   # (key prefix, columns, primary) per unique index
    bit_columns: frozenset[int] = dataclasses.field(init=False, compare=False, repr=False)
    date_columns: frozenset[int] = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        qualified = f"{self.schema}.{self.table}"
        set_ = object.__setattr__
        set_(self, "qualified", qualified)
        set_(self, "sql_name", f"{quote_id(self.schema)}.{quote_id(self.table)}")
        set_(self, "sql_columns", "(" + ",".join(quote_id(self.columns[i]) for i in self.writable) + ")")
        set_(self, "key_specs", tuple((f"{qualified}\x00{name}\x00", cols, primary)
                                      for name, cols, primary in self.unique))
        set_(self, "bit_columns", frozenset(i for i, t in enumerate(self.data_types) if t == "bit"))
        set_(self, "date_columns", frozenset(i for i, t in enumerate(self.data_types) if t in _DATE_TYPES))


@dataclasses.dataclass(frozen=True, slots=True)
class RowChange:
    """One row change to apply downstream; values are in `shape.columns` order."""

    kind: str                                # insert | update | delete | upsert (snapshot read)
    shape: ApplyShape
    commit_ts: int
    before: tuple[Any, ...] | None           # update, delete
    after: tuple[Any, ...] | None            # insert, update, upsert
    keys: tuple[str, ...]                    # causality keys of both images


def shape_of(info: pb.TableInfo) -> ApplyShape:
    visible = [c for c in info.columns if not c.hidden]
    names = tuple(c.name for c in visible)
    pos = {n: i for i, n in enumerate(names)}
    unique: list[tuple[str, tuple[int, ...], bool]] = []
    identity: tuple[int, ...] | None = None
    for index in info.indexes:
        if not (index.primary or index.unique):
            continue
        if not all(n in pos for n in index.columns):
            continue  # an index on a dropped column: MySQL dropped it too
        cols = tuple(pos[n] for n in index.columns)
        unique.append((index.name or ("PRIMARY" if index.primary else ""), cols, index.primary))
        if index.primary:
            identity = cols
    if identity is None:
        # MySQL treats the first NOT NULL unique key as the row's identity when there is no PK.
        for _, cols, _ in unique:
            if all(not visible[i].nullable for i in cols):
                identity = cols
                break
    has_identity = identity is not None
    if identity is None:
        identity = tuple(i for i, c in enumerate(visible)
                         if not c.generated and c.data_type.lower() not in _NOT_IN_ROW_IMAGE_WHERE)
    return ApplyShape(
        table_id=info.table_id, version=info.version, schema=info.schema_name,
        table=info.table_name, columns=names,
        data_types=tuple(c.data_type.lower() for c in visible), infos=tuple(visible),
        visible_pos=tuple(i for i, c in enumerate(info.columns) if not c.hidden),
        total=len(info.columns),
        writable=tuple(i for i, c in enumerate(visible) if not c.generated),
        identity=identity, has_identity=has_identity, unique=tuple(unique))


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------

def sql_value(value: Any, data_type: str) -> Any:
    """A rowcodec Python value -> what pymysql must send so MySQL stores the source value."""
    if value is None:
        return None
    if isinstance(value, MySQLDateTime):
        # Zero dates and zero parts: Python's datetime cannot hold them, MySQL parses the text.
        if data_type in _DATE_TYPES:
            return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
        return str(value)
    if isinstance(value, _dt.datetime):
        # Datums are UTC and sink sessions run with time_zone '+00:00'.
        return value.replace(tzinfo=None)
    if data_type == "bit" and isinstance(value, bytes):
        # A binary string assigned to BIT is checked against the width byte-wise; the integer is exact.
        return int.from_bytes(value, "big")
    return value


def decode_row(row: pb.Row, info: pb.TableInfo, shape: ApplyShape) -> tuple[Any, ...]:
    datums = row.columns
    n = len(datums)
    if n == len(shape.columns):
        visible = datums
    elif n == shape.total:
        visible = [datums[i] for i in shape.visible_pos]
    else:
        row_to_dict(row, info)  # raises the codec's error naming table, version and counts
        raise AssertionError("unreachable")
    out: list[Any] = []
    append = out.append
    # The common kinds inline (this is the drainer's hottest loop); the rest in _decode_other.
    for i, d in enumerate(visible):
        kind = d.WhichOneof("value")
        if kind == "int":
            append(d.int)
        elif kind == "str":
            append(d.str)
        elif kind is None or kind == "null":
            append(None)
        elif kind == "uint":
            append(d.uint)
        elif kind == "double":
            append(d.double)
        else:
            append(_decode_other(d, kind, i, shape))
    return tuple(out)


def _decode_other(d: pb.Datum, kind: str, i: int, shape: ApplyShape) -> Any:
    """sql_value(datum_to_python(d)) for the remaining kinds, without its generic dispatch."""
    if kind == "bytes":
        return int.from_bytes(d.bytes, "big") if i in shape.bit_columns else d.bytes
    if kind == "datetime":
        v = d.datetime
        try:
            if i in shape.date_columns:
                return _dt.date(v.year, v.month, v.day)
            # Datums are UTC and sink sessions run with time_zone '+00:00': naive UTC.
            return _dt.datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)
        except ValueError:
            pass  # zero dates and zero parts: sql_value writes them as text
    elif kind == "time":
        v = d.time
        td = _dt.timedelta(0, v.hours * 3600 + v.minutes * 60 + v.seconds, v.microseconds)
        return -td if v.negative else td
    elif kind == "decimal":
        try:
            return decimal.Decimal(d.decimal)
        except decimal.InvalidOperation:
            pass  # datum_to_python raises the codec's error naming the column
    return sql_value(datum_to_python(d, shape.infos[i]), shape.data_types[i])


# --------------------------------------------------------------------------------------------
# Causality keys
# --------------------------------------------------------------------------------------------

def fold(v: Any) -> str:
    """A key value as causality-key text: text folded the way a _ci collation compares it."""
    t = type(v)
    if t is int:
        return f"i{v}"
    if t is str and v.isascii():
        return "s" + v.rstrip(" ").lower()
    if isinstance(v, str):
        if v.isascii():
            return "s" + v.rstrip(" ").lower()
        s = unicodedata.normalize("NFKD", v.rstrip(" ").casefold())
        return "s" + "".join(ch for ch in s if not unicodedata.combining(ch))
    if isinstance(v, bool):
        return f"i{int(v)}"
    if isinstance(v, int):
        return f"i{v}"
    if isinstance(v, decimal.Decimal):
        # 1.0 and 1.00 are one value in a DECIMAL key.
        return "i" + format(v.normalize(), "f") if v == v.to_integral_value() else "n" + format(v.normalize(), "f")
    if isinstance(v, float):
        return ("i" + str(int(v))) if v.is_integer() else "n" + repr(v)
    if isinstance(v, bytes):
        return "b" + v.hex()
    return "t" + str(v)


def row_keys(shape: ApplyShape, values: Sequence[Any]) -> list[str]:
    prefix = shape.qualified
    if shape.has_identity or shape.unique:
        out = []
        for key_prefix, cols, primary in shape.key_specs:
            if len(cols) == 1:
                v = values[cols[0]]
                if v is None and not primary:
                    continue
                out.append(key_prefix + fold(v))
                continue
            vals = [values[i] for i in cols]
            if not primary and None in vals:
                continue
            out.append(key_prefix + "\x00".join([fold(v) for v in vals]))
        if shape.has_identity:
            return out
    # No row identity: the full image is the only thing that names the row. The table key comes
    # first (routing hashes the first key): statements on such a table scan it and lock every
    # row they pass, so two workers on one keyless table would deadlock each other.
    full = f"{prefix}\x00*\x00" + "\x00".join("N" if v is None else fold(v) for v in values)
    return [f"{prefix}\x00**", full]


# --------------------------------------------------------------------------------------------
# Translation
# --------------------------------------------------------------------------------------------

class Translator:
    """Turns Txns into RowChanges; caches one ApplyShape per TableInfo version it meets."""

    def __init__(self) -> None:
        self._shapes: dict[tuple[int, str | None, str | None], tuple[pb.TableInfo, ApplyShape]] = {}

    def shape(self, info: pb.TableInfo, schema: str | None = None, table: str | None = None) -> ApplyShape:
        """The shape of info (under schema.table when given); one object per version and name,
        so the SQL builder can merge rows of one table by identity."""
        key = (id(info), schema, table)
        hit = self._shapes.get(key)
        # The cached TableInfo object is kept alive with its shape, so its id cannot be reused.
        if hit is not None and hit[0] is info:
            return hit[1]
        shape = shape_of(info)
        if (schema is not None and schema != shape.schema) or (table is not None and table != shape.table):
            shape = dataclasses.replace(shape, schema=schema or shape.schema, table=table or shape.table)
        if len(self._shapes) > 4096:
            self._shapes.clear()
        self._shapes[key] = (info, shape)
        return shape

    def event(self, ev: RowEvent, commit_ts: int) -> RowChange:
        shape = self.shape(ev.table_info, ev.schema, ev.table)
        before = decode_row(ev.before, ev.table_info, shape) if ev.before is not None else None
        after = decode_row(ev.after, ev.table_info, shape) if ev.after is not None else None
        keys: list[str] = []
        if before is not None:
            keys += row_keys(shape, before)
        if after is not None:
            for k in row_keys(shape, after):
                if k not in keys:
                    keys.append(k)
        return RowChange(_KIND_OF_OP[ev.op], shape, commit_ts, before, after, tuple(keys))

    def translate(self, txn: Txn, schema: SchemaLookup) -> list[RowChange]:
        """Row changes in source order; MissingSchema (naming table id and commit_ts) for a
        table unknown at the transaction's commit_ts."""
        return [self.event(ev, txn.commit_ts) for ev in txn.rows(schema)]
