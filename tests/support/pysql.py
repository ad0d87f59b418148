"""drainer/sql.py's former all-Python statement building for row changes (merge_table,
batch_sql, ordered_sql and their literals before native/src/sqltext.rs and the per-shape
statement heads, issue 23), kept only as the differential oracle of tests/unit/test_sql_native.py
and the baseline of bench/drainer_apply.py (`--paths oldsql`). The text below the first line of
the former module docstring is unchanged."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import re
from collections.abc import Sequence
from typing import Any

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


def _values(shape: ApplyShape, row: tuple[Any, ...]) -> str:
    lit = _LITERALS
    if len(shape.writable) == len(row):
        return "(" + ",".join([lit[type(v)](v) for v in row]) + ")"
    return "(" + ",".join([literal(row[i]) for i in shape.writable]) + ")"


def _columns(shape: ApplyShape) -> str:
    return shape.sql_columns


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
    # exact identity -> [first before-image (None: did not exist; _UNKNOWN: a snapshot read
    # came first), final row or None]
    net: dict[tuple[Any, ...], list[Any]] = {}
    upsert = False
    for ch in changes:
        before, after = ch.before, ch.after
        if before is not None:
            key = tuple([before[i] for i in ident])
            e = net.get(key)
            if e is None:
                net[key] = [before, None]
            else:
                e[1] = None
        if after is not None:
            key = tuple([after[i] for i in ident])
            e = net.get(key)
            if e is None:
                net[key] = [_UNKNOWN if ch.kind == UPSERT else None, after]
            else:
                e[1] = after
            upsert = upsert or ch.kind == UPSERT
    folded: dict[tuple[str, ...], tuple[Any, ...]] = {}
    for key in net:
        if None in key:
            return None  # an identity column holding NULL: not an identity after all
        # Only text compares differently downstream than here (numbers equal in Python are one
        # dict key already).
        if any(isinstance(v, str) for v in key):
            if folded.setdefault(tuple([fold(v) for v in key]), key) is not key:
                return None
    others = [cols for _, cols, primary in shape.unique if cols != ident]
    gone: list[tuple[Any, ...]] = []        # DELETE by identity
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
        elif all(first[i] == final[i] for cols in others for i in cols):
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
        fresh.sort(key=lambda r: [r[i] for i in ident])
        kept.sort(key=lambda r: [r[i] for i in ident])
    except TypeError:
        pass  # mixed value types in one column: any order is correct, only slower
    name = table_name(shape)
    out: list[tuple[str, list[RowChange]]] = []
    carried = list(changes)
    n = MAX_ROWS_PER_STATEMENT
    for i in range(0, len(gone), n):
        part = gone[i:i + n]
        if len(ident) == 1:
            cond = f"{quote_id(shape.columns[ident[0]])} IN ({','.join([literal(k[0]) for k in part])})"
        else:
            cols = [quote_id(shape.columns[c]) for c in ident]
            cond = " OR ".join("(" + " AND ".join(f"{c} = {literal(v)}" for c, v in zip(cols, k)) + ")"
                               for k in part)
        out.append((f"DELETE FROM {name} WHERE {cond}", carried))
    verb = _REP if safe or upsert else _INS
    head = f"{verb} INTO {name} {_columns(shape)} VALUES "
    for i in range(0, len(fresh), n):
        out.append((head + ",".join([_values(shape, r) for r in fresh[i:i + n]]), carried))
    if kept:
        update = ",".join(f"{c}=VALUES({c})" for c in (quote_id(shape.columns[i]) for i in shape.writable)
                         )
        head = f"INSERT INTO {name} {_columns(shape)} VALUES "
        for i in range(0, len(kept), n):
            out.append((head + ",".join([_values(shape, r) for r in kept[i:i + n]])
                        + f" ON DUPLICATE KEY UPDATE {update}", carried))
    return out


def batch_sql(changes: Sequence[RowChange], safe: Sequence[bool]) -> list[tuple[str, list[RowChange]]]:
    """(statement, the changes it carries) for a worker batch, in execution order.

    Tables are independent here (the sink runs with foreign_key_checks=0), so each table's
    changes are merged on their own, tables in name order. A batch with any change
    in safe mode is merged in safe mode (deleting every touched identity first is always right)."""
    by_table: dict[str, list[RowChange]] = {}
    for ch in changes:
        by_table.setdefault(table_name(ch.shape), []).append(ch)
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

