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
import re
from collections.abc import Sequence
from typing import Any

import pymysql

from sluice.core import rowcodec
from sluice.core.errors import FailedPrecondition, InvalidArgument
from sluice.proto import sluice_pb2 as pb

__all__ = ["KeySpec", "NoSnapshotKey", "TableShape", "load_shape", "quote", "key_of_row",
           "after", "at_most", "INTEGER_TYPES"]

INTEGER_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})
_ENUM_RE = re.compile(r"'((?:[^']|'')*)'")


class NoSnapshotKey(FailedPrecondition):
    """A table that cannot be chunked: no primary key and no usable surrogate key."""


def quote(name: str) -> str:
    """A MySQL identifier in backquotes (backquotes inside doubled)."""
    return "`" + name.replace("`", "``") + "`"


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
        return f"{quote(self.db)}.{quote(self.table)}"

    @property
    def sql_columns(self) -> str:
        return ", ".join(quote(c) for c in self.columns)


@dataclasses.dataclass(frozen=True, slots=True)
class TableShape:
    """Columns (as the capture describes them) and the snapshot key of one table."""

    key: KeySpec
    columns: tuple[pb.ColumnInfo, ...]
    key_index: tuple[int, ...]     # positions of the key columns in `columns`

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def _column_info(row: dict[str, Any]) -> pb.ColumnInfo:
    ctype = str(row["COLUMN_TYPE"])
    dtype = str(row["DATA_TYPE"]).lower()
    c = pb.ColumnInfo(name=str(row["COLUMN_NAME"]), data_type=dtype, column_type=ctype,
                      nullable=row["IS_NULLABLE"] == "YES", unsigned="unsigned" in ctype.lower(),
                      charset=str(row["CHARACTER_SET_NAME"] or ""),
                      generated=bool(row["GENERATION_EXPRESSION"]))
    if dtype in ("decimal", "numeric"):
        c.precision, c.scale = int(row["NUMERIC_PRECISION"] or 0), int(row["NUMERIC_SCALE"] or 0)
    elif dtype in ("datetime", "timestamp", "time"):
        c.scale = int(row["DATETIME_PRECISION"] or 0)
    elif dtype in ("enum", "set"):
        c.elements.extend(e.replace("''", "'") for e in _ENUM_RE.findall(ctype))
    elif row["CHARACTER_MAXIMUM_LENGTH"] is not None:
        c.length = min(int(row["CHARACTER_MAXIMUM_LENGTH"]), 2**32 - 1)
    return c


_JSON_CHECK = re.compile(r"^\s*json_valid\(`((?:[^`]|``)+)`\)\s*$", re.IGNORECASE)


def _mark_json(cur: Any, db: str, table: str, cols: list[pb.ColumnInfo]) -> None:
    """MariaDB's JSON is a LONGTEXT with a `json_valid(col)` check, which information_schema
    lists as LONGTEXT: the column becomes "json", as the capture's DDL reader makes it, so chunk
    rows carry the binlog's json Datums. (MySQL reports JSON itself and has no TABLE_NAME in
    CHECK_CONSTRAINTS: nothing to do there.)"""
    if not any(c.data_type.endswith("text") for c in cols):
        return
    try:
        cur.execute("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
                    "WHERE CONSTRAINT_SCHEMA=%s AND TABLE_NAME=%s", (db, table))
    except (pymysql.err.OperationalError, pymysql.err.ProgrammingError, pymysql.err.InternalError):
        return
    checked = {m.group(1).replace("``", "`") for (clause,) in cur.fetchall()
               if (m := _JSON_CHECK.match(str(clause)))}
    for c in cols:
        if c.name in checked and c.data_type.endswith("text"):
            c.data_type = c.column_type = "json"


def load_shape(conn: Any, db: str, table: str, surrogate_key: str = "") -> TableShape:
    """Read the table's columns and indexes and choose its snapshot key.

    The primary key wins unless a surrogate key is asked for (Debezium's `surrogate-key` of
    `execute-snapshot`), which must name a NOT NULL column with a single-column unique index.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, CHARACTER_SET_NAME, "
                    "NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, "
                    "CHARACTER_MAXIMUM_LENGTH, GENERATION_EXPRESSION FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s ORDER BY ORDINAL_POSITION", (db, table))
        names = [d[0] for d in cur.description]
        cols = [_column_info(dict(zip(names, r))) for r in cur.fetchall()]
        if not cols:
            raise InvalidArgument(f"snapshot of {db}.{table}: no such table")
        _mark_json(cur, db, table, cols)
        cur.execute("SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME FROM information_schema.STATISTICS "
                    "WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s ORDER BY INDEX_NAME, SEQ_IN_INDEX",
                    (db, table))
        indexes: dict[str, tuple[bool, list[str]]] = {}
        for name, non_unique, col in cur.fetchall():
            indexes.setdefault(name, (not int(non_unique), []))[1].append(col)
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
    order = [c.name for c in cols]
    return TableShape(key=spec, columns=tuple(cols),
                      key_index=tuple(order.index(k) for k in key_cols))


def key_of_row(row: pb.Row, shape: TableShape) -> tuple[Any, ...]:
    """The key tuple of a row image (a SELECT row converted to Datums or a binlog image)."""
    cols = row.columns
    return tuple(rowcodec.datum_to_python(cols[i], shape.columns[i]) for i in shape.key_index)


def _lexicographic(columns: Sequence[str], op: str) -> str:
    """SQL for `(c1..cn) op (?..?)`, op in {'>', '<='}, spelled out (see the module docstring);
    parameters: for i in 0..n-1, the first i key values then the i-th again."""
    strict = ">" if op == ">" else "<"
    terms: list[str] = []
    for i, c in enumerate(columns):
        eqs = [f"{quote(p)} = %s" for p in columns[:i]]
        last = i == len(columns) - 1
        cmp = op if last else strict
        terms.append("(" + " AND ".join([*eqs, f"{quote(c)} {cmp} %s"]) + ")")
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
        return f"{quote(spec.columns[0])} > %s", [key[0]]
    return _lexicographic(spec.columns, ">"), _params(key)


def at_most(spec: KeySpec, key: Sequence[Any]) -> tuple[str, list[Any]]:
    """`key_columns <= key` as (SQL, parameters)."""
    if len(spec.columns) == 1:
        return f"{quote(spec.columns[0])} <= %s", [key[0]]
    return _lexicographic(spec.columns, "<="), _params(key)
