"""SQL for the MySQL sink: row changes -> batched statements, DDL -> statements.

Invariant: the statements built for a worker batch leave the downstream exactly as applying the
batch's changes one by one in order would (`row_sql`), given a downstream that held the rows'
before-images when the batch began (the sink's replication invariant; safe mode relaxes it).

Merge mode (TiDB-Binlog pkg/loader's): for a table with a row identity (primary key, or a NOT NULL
unique key) the changes of a batch are reduced to their net effect per identity, last write
wins in batch order, and written as at most three multi-row statements:
1. `DELETE ... WHERE <identity> IN (...)`: rows that existed before the batch and are gone at its
   end, or whose unique-key values changed (a primary-key change is a delete of the old identity
   plus an insert of the new one);
2. `INSERT ... VALUES (...),(...)`: rows new in the batch, and the rows of (1) that moved a
   unique value;
3. `INSERT ... ON DUPLICATE KEY UPDATE`: rows that existed and keep every unique-key value (an
   update in place; it can only meet its own row, since no unique value of it changes).
Deleting first makes unique-key swaps safe: every row whose unique value moved is gone before any
final row is written, and the final rows are the source's rows at the end of the batch, which
the source's own unique keys kept apart. A unique value held by a row the batch did not touch
cannot be taken by a final row: the change that released it carries the same causality key, so
it is committed already or in this batch. (Upserting a row whose unique value moved would
update whichever row holds the value, which is why (3) excludes them: the loader's "fall back
when a unique key changes", per row rather than per batch.) Safe mode, or a snapshot read in the
batch: (1) deletes every identity touched and (2) is `REPLACE` of every final row.
Falls back to ordered statements (`group`, merging only consecutive inserts/deletes that share no
causality key with anything between them) for: tables without identity (full-row-image matches,
duplicates possible), and batches where two distinct identities of one table compare equal once
folded (case/accents/trailing spaces: under a `_ci` collation they are the same row, under `_bin`
two rows, so no single net effect is right for both).

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
import operator
import re
from collections.abc import Sequence
from typing import Any

import sluice_native
from pymysql.converters import escape_bytes, escape_date, escape_datetime, escape_float, escape_string, escape_timedelta

from sluice.drainer.translator import (DELETE, INSERT, UPDATE, UPSERT, RowChange, ApplyShape, fold, quote_id,
                                      shape_of)
from sluice.proto import sluice_pb2 as pb


def table_name(shape: ApplyShape) -> str:
    return shape.sql_name


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
    shape: ApplyShape
    row: tuple[Any, ...]              # after (INSERT/REPLACE), before (DELETE)
    new: tuple[Any, ...] | None       # UPDATE: after
    change: RowChange


@dataclasses.dataclass(slots=True)
class _Group:
    kind: str
    shape: ApplyShape
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


def _where(shape: ApplyShape, row: tuple[Any, ...]) -> str:
    parts = []
    for i in shape.identity:
        v = row[i]
        col = quote_id(shape.columns[i])
        # Only a keyless table's row image can hold NULL here; identity columns are NOT NULL.
        parts.append(f"{col} = {literal(v)}" if v is not None else f"{col} IS NULL")
    return " AND ".join(parts) if parts else "1=1"


# The literals of many values in one native call (native/src/sqltext.rs): None, ints, str and
# bytes are written there exactly as `literal` writes them; every other value goes to `literal`.
_sql_values, _sql_list = sluice_native.sql_values, sluice_native.sql_list


def _values(shape: ApplyShape, rows: list[tuple[Any, ...]]) -> str:
    """`(v,..),(v,..)`: the writable columns of rows (full visible-column tuples)."""
    return _sql_values(rows, shape.value_cols, literal)


def _columns(shape: ApplyShape) -> str:
    return shape.sql_columns


def group_sql(g: _Group) -> list[str]:
    shape = g.shape
    name = table_name(shape)
    if g.kind in (_INS, _REP):
        return [f"{g.kind} INTO {name} {_columns(shape)} VALUES "
                + _values(shape, [op.row for op in g.ops])]
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


# Rows per multi-row statement: keeps statements far below max_allowed_packet and the range
# optimizer's lists short.
MAX_ROWS_PER_STATEMENT = 512


_UNKNOWN = object()  # merge_table: whether the row existed before the batch is not known


def merge_table(shape: ApplyShape, changes: Sequence[RowChange], safe: bool
                ) -> list[tuple[str, list[RowChange]]] | None:
    """The net effect of one table's changes (batch order) as DELETE / INSERT / upsert
    statements, or None when it cannot be merged (no identity, or identities equal only once
    folded). See the module docstring for why each form is equivalent."""
    if not shape.has_identity:
        return None
    ident = shape.identity
    # identity -> [first before-image (None: did not exist; _UNKNOWN: a snapshot read came
    # first), final row or None]. A one-column identity is keyed by the value itself (a
    # 1-tuple hashes, compares and sorts as its element does: the same merge, cheaper).
    single = len(ident) == 1
    key_of = operator.itemgetter(*ident)
    net: dict[Any, list[Any]] = {}
    upsert = False
    get = net.get
    for ch in changes:
        before, after = ch.before, ch.after
        if before is not None:
            key = key_of(before)
            e = get(key)
            if e is None:
                net[key] = [before, None]
            else:
                e[1] = None
        if after is not None:
            key = key_of(after)
            e = get(key)
            if e is None:
                net[key] = [_UNKNOWN if ch.kind == UPSERT else None, after]
            else:
                e[1] = after
            if ch.kind == UPSERT:
                upsert = True
    folded: dict[Any, Any] = {}
    for key in net:
        if single:
            if key is None:
                return None  # an identity column holding NULL: not an identity after all
            if type(key) is int:
                continue
            parts = (key,)
        else:
            parts = key
            if None in parts:
                return None
        # Only text compares differently downstream than here (numbers equal in Python are one
        # dict key already).
        if any(isinstance(v, str) for v in parts):
            if folded.setdefault(tuple([fold(v) for v in parts]), key) is not key:
                return None
    others = shape.other_unique
    gone: list[Any] = []                    # DELETE by identity
    fresh: list[tuple[Any, ...]] = []       # INSERT (REPLACE)
    kept: list[tuple[Any, ...]] = []        # existed, every unique value unchanged: upsert in place
    for key, (first, final) in net.items():
        if safe or first is _UNKNOWN:
            gone.append(key)
            if final is not None:
                fresh.append(final)
        elif first is None:
            if final is not None:
                fresh.append(final)
        elif final is None:
            gone.append(key)
        elif not others or all(first[i] == final[i] for i in others):
            kept.append(final)
        else:
            # A unique value moves: the old row goes first, so no final row meets it.
            gone.append(key)
            fresh.append(final)
    # Rows in identity order: concurrent workers then lock their (disjoint) rows and the index
    # gaps between them in one direction, which avoids most of the deadlocks that InnoDB's
    # next-key locks on unique indexes cause between transactions touching disjoint keys.
    try:
        gone.sort()
        fresh.sort(key=key_of)
        kept.sort(key=key_of)
    except TypeError:
        pass  # mixed value types in one column: any order is correct, only slower
    out: list[tuple[str, list[RowChange]]] = []
    carried = list(changes)
    n = MAX_ROWS_PER_STATEMENT
    for i in range(0, len(gone), n):
        part = gone[i:i + n]
        if single:
            cond = f"{shape.sql_ident[0]} IN ({_sql_list(part, literal)})"
        else:
            cols = shape.sql_ident
            cond = " OR ".join("(" + " AND ".join(f"{c} = {literal(v)}" for c, v in zip(cols, k)) + ")"
                               for k in part)
        out.append((shape.sql_delete + cond, carried))
    head = shape.sql_replace if safe or upsert else shape.sql_insert
    for i in range(0, len(fresh), n):
        out.append((head + _values(shape, fresh[i:i + n]), carried))
    for i in range(0, len(kept), n):
        out.append((shape.sql_insert + _values(shape, kept[i:i + n]) + shape.sql_upsert, carried))
    return out


def batch_sql(changes: Sequence[RowChange], safe: Sequence[bool]) -> list[tuple[str, list[RowChange]]]:
    """(statement, the changes it carries) for a worker batch, in execution order.

    Tables are independent here (the sink runs with foreign_key_checks=0), so each table's
    changes are merged on their own, tables in name order. A batch with any change
    in safe mode is merged in safe mode (deleting every touched identity first is always right)."""
    by_table: dict[str, list[RowChange]] = {}
    for ch in changes:
        name = ch.shape.sql_name
        same = by_table.get(name)
        if same is None:
            by_table[name] = [ch]
        else:
            same.append(ch)
    any_safe = any(safe)
    out: list[tuple[str, list[RowChange]]] = []
    # Tables in name order, for the same reason as rows in identity order (merge_table).
    for _, table_changes in sorted(by_table.items()):
        shape = table_changes[0].shape
        merged = None
        # One shape per table in a batch: a DDL flushes every worker before it runs.
        if all(ch.shape is shape for ch in table_changes):
            merged = merge_table(shape, table_changes, any_safe)
        if merged is None:
            merged = ordered_sql(table_changes, [any_safe] * len(table_changes))
        out += merged
    return out


def ordered_sql(changes: Sequence[RowChange], safe: Sequence[bool]) -> list[tuple[str, list[RowChange]]]:
    """Statements that keep the batch order wherever two changes share a causality key."""
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


# Types that take CHARACTER SET / COLLATE (JSON is an alias with its own, binary types have none).
_CHARACTER_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"})
_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def _charset_clause(charset: str, collation: str, keyword: str = " CHARACTER SET ") -> str:
    # Names are the source's own; anything else is left out rather than pasted into the DDL.
    out = ""
    if charset and charset != "binary" and _NAME.match(charset):
        out += f"{keyword}{charset}"
    if collation and _NAME.match(collation) and (not charset or collation.startswith(charset + "_")):
        out += f" COLLATE {collation}" if keyword == " CHARACTER SET " else f" COLLATE={collation}"
    return out


def column_definition(c: pb.ColumnInfo) -> str:
    """A column as CREATE TABLE / ADD COLUMN text: the exact source type (column_type), its
    character set and collation, its generation expression, and nullability."""
    type_text = c.column_type or c.data_type or "text"
    if c.data_type in ("varchar", "varbinary") and "(" not in type_text:
        # A shape known only from a TableMap: its length is in bytes, enough for any value.
        type_text = f"{c.data_type}({c.length or 255})"
    out = f"{quote_id(c.name)} {type_text}"
    if c.data_type.lower() in _CHARACTER_TYPES:
        out += _charset_clause(c.charset, c.collation)
    if c.generated and c.generation_expression:
        kind = "STORED" if c.generated_stored else "VIRTUAL"
        # MariaDB refuses NOT NULL on a generated column; the expression decides its nullability.
        return f"{out} GENERATED ALWAYS AS {c.generation_expression} {kind}"
    # NULL spelled out: without it a TIMESTAMP is NOT NULL when explicit_defaults_for_timestamp is off.
    return out + (" NULL" if c.nullable else " NOT NULL")


def create_table_sql(info: pb.TableInfo, if_not_exists: bool = True) -> str:
    """CREATE TABLE for a TableInfo: visible columns, primary and unique keys (the table's row
    identity downstream), default character set and collation."""
    visible = [c for c in info.columns if not c.hidden]
    cols = [column_definition(c) for c in visible]
    present = {c.name.lower() for c in visible}
    for index in info.indexes:
        if not index.columns or not all(n.lower() in present for n in index.columns):
            continue  # an index on a dropped column: MySQL dropped it too
        names = ",".join(quote_id(n) for n in index.columns)
        name = f"{quote_id(index.name)} " if index.name else ""
        if index.primary:
            cols.append(f"PRIMARY KEY ({names})")
        elif index.unique:
            cols.append(f"UNIQUE KEY {name}({names})")
        else:
            cols.append(f"KEY {name}({names})")
    charset = _charset_clause(info.charset, info.collation, " DEFAULT CHARSET=")
    return (f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}"
            f"{quote_id(info.schema_name)}.{quote_id(info.table_name)} ({', '.join(cols)}){charset}")


def create_database_sql(schema: str) -> str:
    return f"CREATE DATABASE IF NOT EXISTS {quote_id(schema)}"


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


__all__ = ["literal", "quote_id", "batch_sql", "ordered_sql", "merge_table", "row_sql", "ddl_sql", "create_table_sql",
           "create_database_sql",
           "IDEMPOTENT_DDL_ERRORS", "shape_of"]
