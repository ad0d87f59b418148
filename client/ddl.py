"""Table shapes for application producers: structured TableInfo, DDL and schema-snapshot values.

A drainer decodes rows with the table shape in force at their commit_ts (SchemaHistory), so a
producer declares a table's shape before (or with) the first rows it writes for it: a schema
snapshot (`PrewriteValue.schema_snapshots`) the first time it touches a table in a process, and a
DDL binlog carrying the shape after the change (`DDL.table_info`) when it changes one.

Invariant kept here: **a table's id is stable per (source, schema, table)** — every process of
every application writing the same table computes the same id, so their rows and snapshots land
on one schema history. A RENAME keeps the id inside its DDL; a process started after the rename
derives the id from the new name and declares it with a fresh snapshot.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import re
from collections.abc import Iterable
from typing import Any

from sluice.core import errors, rowcodec
from sluice.proto import sluice_pb2 as pb

_ENUM_ITEM = re.compile(r"'((?:[^']|'')*)'")
_TEMPORAL = frozenset({"date", "datetime", "timestamp"})
_ZERO_DT = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?)?$")


def stable_table_id(source: str, schema: str, table: str) -> int:
    """A positive 62-bit id derived from (source, schema, table)."""
    digest = hashlib.sha256(f"{source}\0{schema}\0{table}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2 or 1


def split_name(name: str, default_schema: str) -> tuple[str, str]:
    """`db.table` or `table` (in default_schema), backquotes allowed."""
    parts = [p.strip().strip("`") for p in name.split(".")]
    if len(parts) == 1 and parts[0]:
        return default_schema, parts[0]
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    raise errors.InvalidArgument(f"table name {name!r}: expected `table` or `schema.table`")


def quote(ident: str) -> str:
    return "`" + ident.replace("`", "``") + "`"


def _elements(column_type: str) -> list[str]:
    if not column_type.lower().startswith(("enum(", "set(")):
        return []
    return [m.replace("''", "'") for m in _ENUM_ITEM.findall(column_type)]


def read_table_info(cur: Any, schema: str, table: str, *, source: str = "",
                    version: int = 0) -> pb.TableInfo:
    """The shape of schema.table from information_schema now (blocking, on cursor `cur`).

    MariaDB's JSON is LONGTEXT with a `json_valid` check: such columns get data_type `json`.
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
    cur.execute(
        "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
        "WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s", (schema, table))
    json_cols = {m.group(1) for (clause,) in cur.fetchall()
                 for m in [re.search(r"json_valid\(`?([^`)]+)`?\)", str(clause))] if m}
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
        if name in json_cols:
            data_type = "json"
        length = 0
        if data_type == "bit":
            length = int(num_prec or 0)
        elif char_len is not None:
            length = min(int(char_len), 0xFFFFFFFF)
        scale = int(num_scale or 0) if data_type in ("decimal", "numeric") else int(dt_prec or 0)
        info.columns.append(pb.ColumnInfo(
            name=name, data_type=data_type, column_type=column_type,
            nullable=str(nullable).upper() == "YES",
            unsigned="unsigned" in column_type.lower(), length=length,
            precision=int(num_prec or 0) if data_type in ("decimal", "numeric") else 0,
            scale=scale, charset=charset or "", elements=_elements(column_type),
            generated="GENERATED" in str(extra or "").upper()))
    info.indexes.extend(indexes.values())
    return info


def primary_key(info: pb.TableInfo) -> tuple[str, ...]:
    for ix in info.indexes:
        if ix.primary:
            return tuple(ix.columns)
    return ()


def to_datum(value: Any, col: pb.ColumnInfo) -> pb.Datum:
    """A value as pymysql returns it (or as the application gives it) as a Datum of `col`."""
    dtype = col.data_type
    if isinstance(value, str) and dtype in _TEMPORAL:
        # pymysql hands back zero dates ('0000-00-00') and zero parts as text.
        m = _ZERO_DT.match(value)
        if m is not None:
            y, mo, d, h, mi, s, us = (m.group(i) for i in range(1, 8))
            return rowcodec.python_to_datum(rowcodec.MySQLDateTime(
                int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0),
                int((us or "0").ljust(6, "0"))), col)
    if isinstance(value, (set, frozenset)):
        order = {e: i for i, e in enumerate(col.elements)}
        value = ",".join(sorted(value, key=lambda e: order.get(e, len(order))))
    if isinstance(value, _dt.datetime) and value.tzinfo is None and dtype in _TEMPORAL:
        # Our sessions run with time_zone '+00:00': a naive value is already UTC.
        value = value.replace(tzinfo=_dt.timezone.utc)
    return rowcodec.python_to_datum(value, col)


def ddl_value(ddl: pb.DDL, source: pb.SourceInfo | None = None) -> pb.PrewriteValue:
    """The PrewriteValue of a DDL transaction."""
    value = pb.PrewriteValue(ddl=ddl)
    if ddl.HasField("table_info"):
        value.schema_version = ddl.table_info.version
    if source is not None:
        value.source.CopyFrom(source)
    return value


def make_ddl(tp: int, table_info: pb.TableInfo | None = None, *, query: str = "",
             schema_name: str = "", table_name: str = "", old_schema_name: str = "",
             old_table_name: str = "", table_id: int = 0) -> pb.DDL:
    """A structured DDL; names and id default to the table_info's."""
    ddl = pb.DDL(tp=tp, query=query, old_schema_name=old_schema_name,
                 old_table_name=old_table_name)
    if table_info is not None:
        ddl.table_info.CopyFrom(table_info)
        ddl.schema_name = schema_name or table_info.schema_name
        ddl.table_name = table_name or table_info.table_name
        ddl.table_id = table_id or table_info.table_id
    else:
        ddl.schema_name, ddl.table_name, ddl.table_id = schema_name, table_name, table_id
    if not ddl.schema_name:
        raise errors.InvalidArgument(f"{pb.DDLType.Name(tp)} needs a schema name")
    return ddl


def snapshot_value(infos: Iterable[pb.TableInfo],
                   source: pb.SourceInfo | None = None) -> pb.PrewriteValue:
    """The PrewriteValue of a transaction that only declares table shapes."""
    value = pb.PrewriteValue(schema_snapshots=list(infos))
    if source is not None:
        value.source.CopyFrom(source)
    return value
