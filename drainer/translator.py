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
conflict. The keys are built natively (ApplyShape.keys, native/src/causality.rs); `fold` below
is the folding rule, which the native code applies itself to ints, ASCII text and bytes and calls
for every other value.
"""
from __future__ import annotations

import dataclasses
import decimal
import unicodedata
from typing import Any

import sluice_native

from sluice.core.rowcodec import datum_to_python, row_to_dict
from sluice.core.table import quote_ident as quote_id
from sluice.drainer.txn import CorruptTxn, MutationSpan, SchemaLookup, Txn
from sluice.proto import sluice_pb2 as pb

INSERT, UPDATE, DELETE, UPSERT = "insert", "update", "delete", "upsert"

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
    # Statement heads of drainer/sql.py's merged statements, built once per shape.
    sql_ident: tuple[str, ...] = dataclasses.field(init=False, compare=False, repr=False)  # quoted identity columns
    sql_delete: str = dataclasses.field(init=False, compare=False, repr=False)     # DELETE FROM `s`.`t` WHERE
    sql_insert: str = dataclasses.field(init=False, compare=False, repr=False)     # INSERT INTO `s`.`t` (..) VALUES
    sql_replace: str = dataclasses.field(init=False, compare=False, repr=False)    # REPLACE INTO `s`.`t` (..) VALUES
    sql_upsert: str = dataclasses.field(init=False, compare=False, repr=False)     # ON DUPLICATE KEY UPDATE ...
    value_cols: list[int] | None = dataclasses.field(init=False, compare=False, repr=False)  # writable; None: all
    key_specs: tuple[tuple[str, tuple[int, ...], bool], ...] = dataclasses.field(
        init=False, compare=False, repr=False)   # (key prefix, columns, primary) per unique index
    # Columns of the unique keys other than the identity (drainer/sql.py merge_table: a row
    # keeps its place only if none of them changes).
    other_unique: tuple[int, ...] = dataclasses.field(init=False, compare=False, repr=False)
    bit_columns: frozenset[int] = dataclasses.field(init=False, compare=False, repr=False)
    date_columns: frozenset[int] = dataclasses.field(init=False, compare=False, repr=False)
    decoder: sluice_native.MutationDecoder = dataclasses.field(init=False, compare=False, repr=False)
    keys: sluice_native.KeyBuilder = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        qualified = f"{self.schema}.{self.table}"
        set_ = object.__setattr__
        set_(self, "qualified", qualified)
        set_(self, "sql_name", f"{quote_id(self.schema)}.{quote_id(self.table)}")
        set_(self, "sql_columns", "(" + ",".join(quote_id(self.columns[i]) for i in self.writable) + ")")
        name = self.sql_name
        set_(self, "sql_ident", tuple(quote_id(self.columns[i]) for i in self.identity))
        set_(self, "sql_delete", f"DELETE FROM {name} WHERE ")
        set_(self, "sql_insert", f"INSERT INTO {name} {self.sql_columns} VALUES ")
        set_(self, "sql_replace", f"REPLACE INTO {name} {self.sql_columns} VALUES ")
        set_(self, "sql_upsert", " ON DUPLICATE KEY UPDATE " + ",".join(
            f"{c}=VALUES({c})" for c in (quote_id(self.columns[i]) for i in self.writable)))
        set_(self, "value_cols", None if len(self.writable) == len(self.columns) else list(self.writable))
        set_(self, "key_specs", tuple((f"{qualified}\x00{name}\x00", cols, primary)
                                      for name, cols, primary in self.unique))
        set_(self, "other_unique", tuple(i for _, cols, _ in self.unique if cols != self.identity for i in cols))
        set_(self, "bit_columns", frozenset(i for i, t in enumerate(self.data_types) if t == "bit"))
        set_(self, "date_columns", frozenset(i for i, t in enumerate(self.data_types) if t in _DATE_TYPES))
        set_(self, "decoder", _decoder(self))
        # Causality keys natively (native/src/causality.rs), the rule of the module docstring;
        # the values it does not fold itself (non-ASCII text above all) go to `fold`.
        set_(self, "keys", sluice_native.KeyBuilder(list(self.key_specs), self.has_identity,
                                                    qualified, fold))


# Not frozen (like txn.RowEvent): a frozen dataclass's __init__ costs ~1 us more per row, and
# nothing mutates these (nor hashes them: their shape holds protobuf messages).
@dataclasses.dataclass(slots=True, eq=True)
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

_BIT_MODE, _DATE_MODE = 1, 2


def _decoder(shape: ApplyShape) -> sluice_native.MutationDecoder:
    """The native decoder of shape's rows (native/src/prewrite.rs): per visible column whether
    BIT bytes become an integer (a binary string assigned to BIT is checked against the width
    byte-wise; the integer is exact) and whether a datetime Datum is a DATE."""
    modes = [_BIT_MODE if t == "bit" else _DATE_MODE if t in _DATE_TYPES else 0
             for t in shape.data_types]
    return sluice_native.MutationDecoder(shape.total, list(shape.visible_pos), modes)


def decode_mutation(txn: Txn, m: MutationSpan, shape: ApplyShape
                    ) -> list[tuple[int, tuple[Any, ...] | None, tuple[Any, ...] | None]]:
    """(MutationType, before, after) per row change of m, values in `shape.columns` order, as
    pymysql must send them so MySQL stores the source value: NULL, ints (BIT as an integer),
    doubles, exact `Decimal`s, bytes, text, JSON text, `date` for DATE, naive UTC `datetime`
    (sink sessions run with time_zone '+00:00'), zero dates and zero parts as text (Python's
    datetime cannot hold them, MySQL parses the text), TIME as `timedelta`."""
    try:
        return shape.decoder.decode(m.payload, m.start, m.end)
    except sluice_native.DecodeError as e:
        raise CorruptTxn(txn.pump_id, txn.start_ts, txn.commit_ts, f"{shape.qualified} (table id {shape.table_id}): {e}") from None
    except sluice_native.ColumnCountError as e:
        row_to_dict(pb.Row(columns=[pb.Datum()] * e.args[0]), m.info)  # the codec's error: table, version, counts
        raise AssertionError("unreachable") from None
    except sluice_native.DecimalTextError as e:
        i, text = e.args
        datum_to_python(pb.Datum(decimal=text), shape.infos[i])  # the codec's error naming the column
        raise AssertionError("unreachable") from None


_DECODE_ERRORS = (sluice_native.DecodeError, sluice_native.ColumnCountError, sluice_native.DecimalTextError)


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


# --------------------------------------------------------------------------------------------
# Translation
# --------------------------------------------------------------------------------------------

class Translator:
    """Turns Txns into RowChanges; caches one ApplyShape per TableInfo version it meets."""

    def __init__(self) -> None:
        self._shapes: dict[tuple[int, str | None, str | None], tuple[pb.TableInfo, ApplyShape]] = {}
        # translate's cache: id(info) -> (info, schema, table, shape) of the last names met.
        self._by_info: dict[int, tuple[pb.TableInfo, str, str, ApplyShape]] = {}

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

    def translate(self, txn: Txn, schema: SchemaLookup) -> list[RowChange]:
        """Row changes in source order; MissingSchema (naming table id and commit_ts) for a
        table unknown at the transaction's commit_ts, CorruptTxn for a malformed change."""
        commit_ts = txn.commit_ts
        snapshot_chunk, mutations = txn.mutations(schema)
        out: list[RowChange] = []
        insert_kind = UPSERT if snapshot_chunk else INSERT
        by_info = self._by_info
        for m in mutations:
            info, name, table, payload, start, end, _ = m
            hit = by_info.get(id(info))
            # The cached TableInfo object is kept alive in the entry, so its id cannot be reused.
            if hit is not None and hit[0] is info and hit[1] == name and hit[2] == table:
                shape = hit[3]
            else:
                shape = self.shape(info, name, table)
                if len(by_info) > 4096:
                    by_info.clear()
                by_info[id(info)] = (info, name, table, shape)
            # Decoded, keyed and made into RowChanges in one native pass (no Python per row):
            # UPDATE and DELETE as such, INSERT as insert_kind, a snapshot READ as UPSERT.
            try:
                out += shape.decoder.changes(payload, start, end, shape.keys, RowChange, shape,
                                             commit_ts, insert_kind)
            except _DECODE_ERRORS:
                decode_mutation(txn, m, shape)   # raises the named error
                raise
        return out
