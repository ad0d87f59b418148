"""SQL for the MySQL sink: row changes -> batched statements, DDL -> statements.

Invariant: the statements built for a batch leave the downstream exactly as applying the batch's
changes one by one in order would. Changes are merged into multi-row statements only when no
change between them touches one of their causality keys, so reordering never crosses a key.

Safe mode (idempotent replay): an insert becomes REPLACE, an update becomes DELETE of the old
row + REPLACE of the new one, a delete stays a delete (deleting nothing is fine). A snapshot read
(`upsert`) is always a REPLACE. Tables without a row identity (no primary key, no NOT NULL
unique key) are matched on their full row image, one row per statement with LIMIT 1, so a
replayed insert into such a table duplicates the row: safe mode cannot make that idempotent.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
from collections.abc import Sequence
from typing import Any

from pymysql.converters import escape_bytes, escape_date, escape_datetime, escape_float, escape_string, escape_timedelta

from sluice.drainer.translator import DELETE, INSERT, UPDATE, UPSERT, RowChange, TableShape, shape_of
from sluice.proto import sluice_pb2 as pb


def quote_id(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_name(shape: TableShape) -> str:
    return f"{quote_id(shape.schema)}.{quote_id(shape.table)}"


def _lit_str(v: str) -> str:
    return "'" + escape_string(v) + "'"


_LITERALS: dict[type, Any] = {
    int: str, str: _lit_str, bytes: escape_bytes, float: escape_float,
    decimal.Decimal: lambda v: format(v, "f"), bool: lambda v: str(int(v)),
    _dt.datetime: escape_datetime, _dt.date: escape_date, _dt.timedelta: escape_timedelta,
    type(None): lambda v: "NULL",
    bytearray: lambda v: escape_bytes(bytes(v)), memoryview: lambda v: escape_bytes(bytes(v)),
}


def literal(v: Any) -> str:
    """One value as SQL text (sessions run with sql_mode without NO_BACKSLASH_ESCAPES)."""
    try:
        return _LITERALS[type(v)](v)
    except KeyError:
        raise TypeError(f"cannot write {type(v).__name__} {v!r} as SQL") from None


# --------------------------------------------------------------------------------------------
# Row changes
# --------------------------------------------------------------------------------------------

# Statement kinds after safe-mode rewriting.
_INS, _REP, _DEL, _UPD = "INSERT", "REPLACE", "DELETE", "UPDATE"


@dataclasses.dataclass(slots=True)
class _Op:
    kind: str
    shape: TableShape
    row: tuple[Any, ...]              # after (INSERT/REPLACE), before (DELETE)
    new: tuple[Any, ...] | None       # UPDATE: after
    change: RowChange


@dataclasses.dataclass(slots=True)
class _Group:
    kind: str
    shape: TableShape
    ops: list[_Op]
    keys: set[str]

    @property
    def mergeable(self) -> bool:
        # Multi-row forms exist for INSERT/REPLACE, and for DELETE by row identity.
        return self.kind in (_INS, _REP) or (self.kind == _DEL and self.shape.has_identity)


def _ops(change: RowChange, safe: bool) -> list[_Op]:
    k = change.kind
    if k == UPSERT:
        return [_Op(_REP, change.shape, change.after, None, change)]  # type: ignore[arg-type]
    if k == INSERT:
        return [_Op(_REP if safe else _INS, change.shape, change.after, None, change)]  # type: ignore[arg-type]
    if k == DELETE:
        return [_Op(_DEL, change.shape, change.before, None, change)]  # type: ignore[arg-type]
    if k == UPDATE:
        if safe:
            return [_Op(_DEL, change.shape, change.before, None, change),  # type: ignore[arg-type]
                    _Op(_REP, change.shape, change.after, None, change)]  # type: ignore[arg-type]
        return [_Op(_UPD, change.shape, change.before, change.after, change)]  # type: ignore[arg-type]
    raise ValueError(f"unknown row change kind {k!r}")


def group(changes: Sequence[RowChange], safe: Sequence[bool]) -> list[_Group]:
    """Merge changes into statement groups without reordering across a shared key."""
    groups: list[_Group] = []
    for change, s in zip(changes, safe):
        keys = change.keys
        for op in _ops(change, s):
            # The op must run after the last group touching one of its keys.
            floor = 0
            for i in range(len(groups) - 1, -1, -1):
                if not groups[i].keys.isdisjoint(keys):
                    floor = i
                    break
            target = None
            for i in range(floor, len(groups)):
                g = groups[i]
                if g.kind == op.kind and g.shape is op.shape and g.mergeable:
                    target = g
                    break
            if target is None:
                target = _Group(op.kind, op.shape, [], set())
                groups.append(target)
            target.ops.append(op)
            target.keys.update(keys)
    return groups


def _where(shape: TableShape, row: tuple[Any, ...]) -> str:
    parts = []
    for i in shape.identity:
        v = row[i]
        col = quote_id(shape.columns[i])
        # Only a keyless table's row image can hold NULL here; identity columns are NOT NULL.
        parts.append(f"{col} = {literal(v)}" if v is not None else f"{col} IS NULL")
    return " AND ".join(parts) if parts else "1=1"


def _values(shape: TableShape, row: tuple[Any, ...]) -> str:
    lit = _LITERALS
    if len(shape.writable) == len(row):
        return "(" + ",".join([lit[type(v)](v) for v in row]) + ")"
    return "(" + ",".join([literal(row[i]) for i in shape.writable]) + ")"


def _columns(shape: TableShape) -> str:
    return "(" + ",".join(quote_id(shape.columns[i]) for i in shape.writable) + ")"


def group_sql(g: _Group) -> list[str]:
    shape = g.shape
    name = table_name(shape)
    if g.kind in (_INS, _REP):
        return [f"{g.kind} INTO {name} {_columns(shape)} VALUES "
                + ",".join(_values(shape, op.row) for op in g.ops)]
    if g.kind == _DEL:
        if shape.has_identity:
            if len(shape.identity) == 1:
                col = quote_id(shape.columns[shape.identity[0]])
                vals = ",".join(literal(op.row[shape.identity[0]]) for op in g.ops)
                return [f"DELETE FROM {name} WHERE {col} IN ({vals})"]
            cond = " OR ".join(f"({_where(shape, op.row)})" for op in g.ops)
            return [f"DELETE FROM {name} WHERE {cond}"]
        return [f"DELETE FROM {name} WHERE {_where(shape, op.row)} LIMIT 1" for op in g.ops]
    out = []
    for op in g.ops:
        assert op.new is not None
        sets = ",".join(f"{quote_id(shape.columns[i])} = {literal(op.new[i])}" for i in shape.writable)
        limit = "" if shape.has_identity else " LIMIT 1"
        out.append(f"UPDATE {name} SET {sets} WHERE {_where(shape, op.row)}{limit}")
    return out


def batch_sql(changes: Sequence[RowChange], safe: Sequence[bool]) -> list[tuple[str, list[RowChange]]]:
    """(statement, the changes it carries) for a worker batch, in execution order."""
    out: list[tuple[str, list[RowChange]]] = []
    for g in group(changes, safe):
        carried = [op.change for op in g.ops]
        for stmt in group_sql(g):
            out.append((stmt, carried))
    return out


def row_sql(change: RowChange, safe: bool) -> list[str]:
    """The statements of one change alone (diagnosing a failed batch row by row)."""
    return [stmt for g in group([change], [safe]) for stmt in group_sql(g)]


# --------------------------------------------------------------------------------------------
# DDL
# --------------------------------------------------------------------------------------------

# Errors that mean "this DDL already took effect": ignored when replaying in safe mode.
IDEMPOTENT_DDL_ERRORS = frozenset({
    1007,  # database exists
    1008,  # database doesn't exist (DROP DATABASE)
    1050,  # table exists
    1051,  # unknown table (DROP TABLE)
    1060,  # duplicate column name
    1061,  # duplicate key name
    1068,  # multiple primary key defined
    1091,  # can't DROP column/key; check that it exists
    1146,  # table doesn't exist (RENAME/TRUNCATE/ALTER of a table already renamed or dropped)
    1826,  # duplicate foreign key constraint name
})


def column_definition(c: pb.ColumnInfo) -> str:
    type_text = c.column_type or c.data_type or "text"
    return f"{quote_id(c.name)} {type_text}{'' if c.nullable else ' NOT NULL'}"


def create_table_sql(info: pb.TableInfo, if_not_exists: bool = True) -> str:
    cols = [column_definition(c) for c in info.columns if not c.hidden]
    for index in info.indexes:
        names = ",".join(quote_id(n) for n in index.columns)
        if index.primary:
            cols.append(f"PRIMARY KEY ({names})")
        elif index.unique:
            cols.append(f"UNIQUE KEY {quote_id(index.name)} ({names})")
        else:
            cols.append(f"KEY {quote_id(index.name)} ({names})")
    charset = f" DEFAULT CHARSET={info.charset}" if info.charset else ""
    return (f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}"
            f"{quote_id(info.schema_name)}.{quote_id(info.table_name)} ({', '.join(cols)}){charset}")


def alter_from_shapes(old: pb.TableInfo, new: pb.TableInfo) -> list[str]:
    """ALTER TABLE for a DDL without its text: add and drop columns (indexes are not diffed)."""
    old_cols = {c.name: c for c in old.columns if not c.hidden}
    new_cols = [c for c in new.columns if not c.hidden]
    specs = [f"ADD COLUMN IF NOT EXISTS {column_definition(c)}" for c in new_cols if c.name not in old_cols]
    names = {c.name for c in new_cols}
    specs += [f"DROP COLUMN IF EXISTS {quote_id(n)}" for n in old_cols if n not in names]
    if not specs:
        return []
    return [f"ALTER TABLE {quote_id(new.schema_name)}.{quote_id(new.table_name)} {', '.join(specs)}"]


def ddl_sql(ddl: pb.DDL, previous: pb.TableInfo | None) -> list[str]:
    """Statements for a DDL: its source text when present (run with the DDL's schema as the
    default database), else generated from the structured fields and IF [NOT] EXISTS-safe."""
    schema = ddl.schema_name
    if ddl.query.strip():
        if ddl.tp in (pb.CREATE_DATABASE, pb.DROP_DATABASE) or not schema:
            return [ddl.query]
        return [f"USE {quote_id(schema)}", ddl.query]
    table = f"{quote_id(schema)}.{quote_id(ddl.table_name)}"
    tp = ddl.tp
    if tp == pb.CREATE_DATABASE:
        return [f"CREATE DATABASE IF NOT EXISTS {quote_id(schema)}"]
    if tp == pb.DROP_DATABASE:
        return [f"DROP DATABASE IF EXISTS {quote_id(schema)}"]
    if tp == pb.CREATE_TABLE and ddl.HasField("table_info"):
        return [create_table_sql(ddl.table_info)]
    if tp == pb.DROP_TABLE:
        return [f"DROP TABLE IF EXISTS {table}"]
    if tp == pb.TRUNCATE_TABLE:
        return [f"TRUNCATE TABLE {table}"]
    if tp == pb.RENAME_TABLE:
        old = f"{quote_id(ddl.old_schema_name or schema)}.{quote_id(ddl.old_table_name)}"
        return [f"RENAME TABLE {old} TO {table}"]
    if tp == pb.ALTER_TABLE and ddl.HasField("table_info") and previous is not None:
        return alter_from_shapes(previous, ddl.table_info)
    raise ValueError(f"{pb.DDLType.Name(tp)} on {schema}.{ddl.table_name} has no query text and "
                     f"not enough structure to generate SQL")


def ddl_target(ddl: pb.DDL) -> str:
    if ddl.table_name:
        return f"{ddl.schema_name}.{ddl.table_name}"
    return ddl.schema_name


__all__ = ["literal", "quote_id", "batch_sql", "row_sql", "ddl_sql", "create_table_sql",
           "IDEMPOTENT_DDL_ERRORS", "shape_of"]
