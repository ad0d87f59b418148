"""The snapshot key of a table: which columns chunk it, and key predicates in SQL.

Invariant: a snapshot key identifies a row — it is the primary key, or a `surrogate-key` column
that is NOT NULL and covered by a single-column unique index; a table with neither is refused
(`NoSnapshotKey`), never chunked by a non-unique column (chunks would still partition the rows,
but the watermark windows could not tell two rows apart).

Key values are tuples of Python values in key-column order; the same tuple comes from a SELECT
row and from a binlog row image (`key_of_row`), because both go through `core.rowcodec`.

Composite keys are compared lexicographically, i.e. the row-value comparison `(a,b) > (?,?)`.
It is spelled out as `a > ? OR (a = ? AND b > ?)` because MariaDB 10.11 does not turn a row
constructor comparison into an index range (EXPLAIN: type=index, every row scanned), while the
spelled-out form is a range scan on the primary key.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sluice.core import rowcodec
from sluice.core.errors import FailedPrecondition, InvalidArgument, NotFound
from sluice.core.table import TableShape, quote_ident, read_table_info
from sluice.proto import sluice_pb2 as pb

__all__ = ["KeySpec", "NoSnapshotKey", "SnapshotTable", "load_shape", "key_of_row", "after",
           "at_most", "INTEGER_TYPES"]

INTEGER_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})


class NoSnapshotKey(FailedPrecondition):
    """A table that cannot be chunked: no primary key and no usable surrogate key."""


@dataclasses.dataclass(frozen=True, slots=True)
class KeySpec:
    """How one table is chunked."""

    db: str
    table: str
    columns: tuple[str, ...]
    kind: str                      # "primary" | "surrogate"
    integer: bool                  # one integer column: even splitting is possible
    unsigned: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.db}.{self.table}"

    @property
    def sql_table(self) -> str:
        return f"{quote_ident(self.db)}.{quote_ident(self.table)}"

    @property
    def sql_columns(self) -> str:
        return ", ".join(quote_ident(c) for c in self.columns)


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotTable:
    """A table being snapshotted: its shape (core/table.py) keyed by the chosen snapshot key."""

    shape: TableShape
    key: KeySpec

    @property
    def columns(self) -> tuple[pb.ColumnInfo, ...]:
        return self.shape.columns

    @property
    def names(self) -> tuple[str, ...]:
        return self.shape.names

    @property
    def key_index(self) -> tuple[int, ...]:
        return self.shape.key_index


def load_shape(conn: Any, db: str, table: str, surrogate_key: str = "") -> SnapshotTable:
    """Read the table's columns and indexes and choose its snapshot key.

    The primary key wins unless a surrogate key is asked for (Debezium's `surrogate-key` of
    `execute-snapshot`), which must name a NOT NULL column with a single-column unique index.
    """
    with conn.cursor() as cur:
        try:
            info = read_table_info(cur, db, table)
        except NotFound:
            raise InvalidArgument(f"snapshot of {db}.{table}: no such table") from None
    cols = list(info.columns)
    indexes = {ix.name: (ix.unique or ix.primary, list(ix.columns)) for ix in info.indexes}
    by_name = {c.name: c for c in cols}
    if surrogate_key:
        c = by_name.get(surrogate_key)
        if c is None:
            raise NoSnapshotKey(f"snapshot of {db}.{table}: surrogate-key {surrogate_key!r} is not "
                                f"a column of the table (columns: {', '.join(by_name)})")
        if c.nullable:
            raise NoSnapshotKey(f"snapshot of {db}.{table}: surrogate-key {surrogate_key!r} is "
                                "nullable; rows with NULL there would never be read — make it NOT "
                                "NULL or choose another column")
        if not any(u and cs == [surrogate_key] for u, cs in indexes.values()):
            raise NoSnapshotKey(f"snapshot of {db}.{table}: surrogate-key {surrogate_key!r} has no "
                                "single-column UNIQUE index; add one (it must identify a row)")
        key_cols, kind = [surrogate_key], "surrogate"
    elif "PRIMARY" in indexes:
        key_cols, kind = indexes["PRIMARY"][1], "primary"
    else:
        raise NoSnapshotKey(f"snapshot of {db}.{table}: the table has no primary key; give a "
                            "`surrogate-key` (a NOT NULL column with a UNIQUE index) in the "
                            "execute-snapshot signal, or add a primary key")
    first = by_name[key_cols[0]]
    spec = KeySpec(db=db, table=table, columns=tuple(key_cols), kind=kind,
                   integer=len(key_cols) == 1 and first.data_type in INTEGER_TYPES,
                   unsigned=first.unsigned)
    return SnapshotTable(shape=TableShape(info, tuple(key_cols)), key=spec)


def key_of_row(row: pb.Row, shape: SnapshotTable) -> tuple[Any, ...]:
    """The key tuple of a row image (a SELECT row converted to Datums or a binlog image)."""
    cols = row.columns
    return tuple(rowcodec.datum_to_python(cols[i], shape.columns[i]) for i in shape.key_index)


def _lexicographic(columns: Sequence[str], op: str) -> str:
    """SQL for `(c1..cn) op (?..?)`, op in {'>', '<='}, spelled out (see the module docstring);
    parameters: for i in 0..n-1, the first i key values then the i-th again."""
    strict = ">" if op == ">" else "<"
    terms: list[str] = []
    for i, c in enumerate(columns):
        eqs = [f"{quote_ident(p)} = %s" for p in columns[:i]]
        last = i == len(columns) - 1
        cmp = op if last else strict
        terms.append("(" + " AND ".join([*eqs, f"{quote_ident(c)} {cmp} %s"]) + ")")
    return "(" + " OR ".join(terms) + ")"


def _params(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for i in range(len(values)):
        out.extend(values[:i])
        out.append(values[i])
    return out


def after(spec: KeySpec, key: Sequence[Any]) -> tuple[str, list[Any]]:
    """`key_columns > key` as (SQL, parameters)."""
    if len(spec.columns) == 1:
        return f"{quote_ident(spec.columns[0])} > %s", [key[0]]
    return _lexicographic(spec.columns, ">"), _params(key)


def at_most(spec: KeySpec, key: Sequence[Any]) -> tuple[str, list[Any]]:
    """`key_columns <= key` as (SQL, parameters)."""
    if len(spec.columns) == 1:
        return f"{quote_ident(spec.columns[0])} <= %s", [key[0]]
    return _lexicographic(spec.columns, "<="), _params(key)
