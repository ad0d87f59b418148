"""A source table as producers see it: identifier quoting, the information_schema reader, TableShape.

One reader of information_schema serves every producer (application transactions, standalone
DDL, the capture's snapshots, ctl), so a table read by any of them gets the same TableInfo.

Invariant kept here: **a MariaDB JSON column is described as the binlog capture's DDL reader
describes it** (capture/ddl.py): a text-family column (MariaDB's JSON is LONGTEXT) whose CHECK
clause starts with `json_valid(<that column>)` gets data_type and column_type "json"; any other
column keeps its own type, whatever its CHECK says. Rows of one table then carry the same Datum
kinds whether they came from the binlog, a snapshot chunk or an application transaction.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable
from typing import Any

from sluice.core import errors
from sluice.proto import sluice_pb2 as pb

__all__ = ["quote_ident", "TableShape", "read_table_info", "stable_table_id", "primary_key"]

_ENUM_ITEM = re.compile(r"'((?:[^']|'')*)'")
# MariaDB prints a CHECK clause with backquoted identifiers: json_valid(`j`); older servers and
# hand-written clauses may leave them bare.
_JSON_CHECK = re.compile(r"^\s*json_valid\s*\(\s*(?:`((?:[^`]|``)+)`|(\w+))\s*\)", re.IGNORECASE)
_DECIMAL = ("decimal", "numeric")
_NO_SUCH_TABLE_OR_COLUMN = (1054, 1109, 1146)   # bad field, unknown table, no such table


def quote_ident(name: str) -> str:
    """A MySQL/Spark SQL identifier in backquotes (backquotes inside doubled)."""
    return "`" + name.replace("`", "``") + "`"


def stable_table_id(source: str, schema: str, table: str) -> int:
    """A positive 62-bit id derived from (source, schema, table): every process of every
    application writing the same table computes the same id."""
    digest = hashlib.sha256(f"{source}\0{schema}\0{table}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2 or 1


def primary_key(info: pb.TableInfo) -> tuple[str, ...]:
    for ix in info.indexes:
        if ix.primary:
            return tuple(ix.columns)
    return ()


@dataclasses.dataclass(frozen=True, slots=True)
class TableShape:
    """One version of a table as producers use it: its TableInfo, the columns that identify a
    row (`key`, the primary key unless another is chosen) and the SQL spellings of its names."""

    info: pb.TableInfo
    key: tuple[str, ...] = ()
    columns: tuple[pb.ColumnInfo, ...] = dataclasses.field(init=False, compare=False, repr=False)
    names: tuple[str, ...] = dataclasses.field(init=False, compare=False, repr=False)
    primary_key: tuple[str, ...] = dataclasses.field(init=False, compare=False, repr=False)
    key_index: tuple[int, ...] = dataclasses.field(init=False, compare=False, repr=False)
    sql_name: str = dataclasses.field(init=False, compare=False, repr=False)     # `db`.`table`
    select_list: str = dataclasses.field(init=False, compare=False, repr=False)  # `a`, `b`

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        info = self.info
        names = tuple(c.name for c in info.columns)
        pk = primary_key(info)
        key = self.key or pk
        unknown = [k for k in key if k not in names]
        if unknown:
            raise errors.InvalidArgument(f"{info.schema_name}.{info.table_name}: key column(s) "
                                         f"{unknown} are not columns of the table")
        set_(self, "columns", tuple(info.columns))
        set_(self, "names", names)
        set_(self, "primary_key", pk)
        set_(self, "key", key)
        set_(self, "key_index", tuple(names.index(k) for k in key))
        set_(self, "sql_name", f"{quote_ident(info.schema_name)}.{quote_ident(info.table_name)}")
        set_(self, "select_list", ", ".join(quote_ident(n) for n in names))

    @property
    def name(self) -> tuple[str, str]:
        return self.info.schema_name, self.info.table_name

    @property
    def qualified(self) -> str:
        """`db.table` for messages (unquoted)."""
        return f"{self.info.schema_name}.{self.info.table_name}"

    def as_dict(self, row: Iterable[Any]) -> dict[str, Any]:
        return dict(zip(self.names, row))


def _elements(column_type: str) -> list[str]:
    if not column_type.lower().startswith(("enum(", "set(")):
        return []
    return [m.replace("''", "'") for m in _ENUM_ITEM.findall(column_type)]


def json_checked_columns(clauses: Iterable[str]) -> set[str]:
    """Columns named by CHECK clauses that start with json_valid(<column>) (module docstring)."""
    out = set()
    for clause in clauses:
        m = _JSON_CHECK.match(str(clause))
        if m is not None:
            out.add(m.group(1).replace("``", "`") if m.group(1) is not None else m.group(2))
    return out


def read_table_info(cur: Any, schema: str, table: str, *, source: str = "",
                    version: int = 0) -> pb.TableInfo:
    """The shape of schema.table from information_schema now (blocking, on cursor `cur`).

    Raises errors.NotFound when the table does not exist.
    """
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, CHARACTER_MAXIMUM_LENGTH, "
        "NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_SET_NAME, EXTRA "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
        "ORDER BY ORDINAL_POSITION", (schema, table))
    cols = cur.fetchall()
    if not cols:
        raise errors.NotFound(f"table {schema}.{table} does not exist (no columns in "
                              "information_schema)")
    json_cols: set[str] = set()
    if any(str(c[1]).lower().endswith("text") for c in cols):
        # MySQL reports JSON itself (and has no TABLE_NAME in CHECK_CONSTRAINTS before 8.0.16).
        import pymysql   # here: the drainer and the Spark sink import this module for quote_ident
        try:
            cur.execute("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
                        "WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s", (schema, table))
            json_cols = json_checked_columns(clause for (clause,) in cur.fetchall())
        except (pymysql.err.ProgrammingError, pymysql.err.InternalError,
                pymysql.err.OperationalError) as e:
            if e.args and e.args[0] not in _NO_SUCH_TABLE_OR_COLUMN:
                raise
    cur.execute(
        "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME FROM information_schema.STATISTICS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY INDEX_NAME = 'PRIMARY' DESC, "
        "INDEX_NAME, SEQ_IN_INDEX", (schema, table))
    indexes: dict[str, pb.IndexInfo] = {}
    for index_name, non_unique, column in cur.fetchall():
        ix = indexes.get(index_name)
        if ix is None:
            ix = indexes[index_name] = pb.IndexInfo(
                name=index_name, primary=index_name == "PRIMARY", unique=not int(non_unique))
        ix.columns.append(column)
    cur.execute(
        "SELECT c.CHARACTER_SET_NAME FROM information_schema.TABLES t JOIN "
        "information_schema.COLLATIONS c ON c.COLLATION_NAME = t.TABLE_COLLATION "
        "WHERE t.TABLE_SCHEMA = %s AND t.TABLE_NAME = %s", (schema, table))
    row = cur.fetchone()
    info = pb.TableInfo(table_id=stable_table_id(source, schema, table), schema_name=schema,
                        table_name=table, version=version, charset=(row[0] if row else "") or "",
                        source=source)
    for (name, data_type, column_type, nullable, char_len, num_prec, num_scale, dt_prec,
         charset, extra) in cols:
        data_type = str(data_type).lower()
        column_type = str(column_type)
        if name in json_cols and data_type.endswith("text"):
            data_type = column_type = "json"
        length = 0
        if data_type == "bit":
            length = int(num_prec or 0)
        elif char_len is not None and data_type != "json":
            length = min(int(char_len), 0xFFFFFFFF)
        scale = int(num_scale or 0) if data_type in _DECIMAL else int(dt_prec or 0)
        info.columns.append(pb.ColumnInfo(
            name=name, data_type=data_type, column_type=column_type,
            nullable=str(nullable).upper() == "YES",
            unsigned="unsigned" in column_type.lower(), length=length,
            precision=int(num_prec or 0) if data_type in _DECIMAL else 0,
            scale=scale, charset=charset or "", elements=_elements(column_type),
            generated="GENERATED" in str(extra or "").upper()))
    info.indexes.extend(indexes.values())
    return info
