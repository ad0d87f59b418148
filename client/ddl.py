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
import re
from collections.abc import Iterable
from typing import Any

from sluice.core import errors, rowcodec
from sluice.core.table import primary_key, read_table_info, stable_table_id
from sluice.proto import sluice_pb2 as pb

__all__ = ["stable_table_id", "split_name", "read_table_info", "primary_key", "to_datum",
           "ddl_value", "make_ddl", "snapshot_value"]

_TEMPORAL = frozenset({"date", "datetime", "timestamp"})
_ZERO_DT = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?)?$")


def split_name(name: str, default_schema: str) -> tuple[str, str]:
    """`db.table` or `table` (in default_schema), backquotes allowed."""
    parts = [p.strip().strip("`") for p in name.split(".")]
    if len(parts) == 1 and parts[0]:
        return default_schema, parts[0]
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    raise errors.InvalidArgument(f"table name {name!r}: expected `table` or `schema.table`")


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
