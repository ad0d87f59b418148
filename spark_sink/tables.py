"""Per source table: its two Iceberg tables, their columns, and how a new shape changes them.

Each source table lands as `<db>.<table>_changelog` (append-only, every change) and `<db>.<table>`
(the current state). `TableState` is what the sink knows of one source table (persisted as a
property of its changelog table); `plan` turns a new table shape into the state after it and
the schema operations (Iceberg schema evolution, by field id) that get the tables there.

Invariants:
- The changelog never loses a column's history: a dropped column stays; a column whose type
  changes in a way Iceberg cannot promote is renamed aside (`<name>__v<version>`, same field id,
  same data) and a new column takes the name; a new incarnation (DROP then CREATE of the table)
  does the same for every column whose type differs.
- The current table has exactly the source's visible columns (plus `_commit_ts`,
  `_zero_dates`); its values follow every schema change (promotion, rename, cast).
- A change that cannot be followed is UnmappableChange naming table, column and DDL, unless
  the table's `on-unmappable` policy says otherwise.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any

from sluice.core.errors import FailedPrecondition
from sluice.core.table import quote_ident
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink.types import UnsupportedType, castable, spark_type, widens

# Metadata columns of the changelog, first, in this order. (`_position`, not `_pos`: Iceberg
# reserves `_pos` for its row-position metadata column and refuses to scan a table that has one.)
CHANGELOG_META: tuple[tuple[str, str], ...] = (
    ("_op", "STRING"), ("_commit_ts", "BIGINT"), ("_seq", "INT"), ("_schema_ver", "BIGINT"),
    ("_producer", "STRING"), ("_position", "STRING"), ("_ts_ms", "BIGINT"),
    ("_zero_dates", "ARRAY<STRING>"),
)
# Metadata columns of the current table, after the source columns.
CURRENT_META: tuple[tuple[str, str], ...] = (("_commit_ts", "BIGINT"), ("_zero_dates", "ARRAY<STRING>"))
TRUNCATED = "t"   # _op of a truncate marker row in the changelog (row columns NULL)
CHANGELOG_SUFFIX = "_changelog"
_IDENT = re.compile(r"[^a-z0-9_]")


class UnmappableChange(FailedPrecondition):
    """A schema change the Iceberg tables cannot follow under the table's policy."""


def ident(name: str) -> str:
    """A catalog identifier from a source name: lower case, [a-z0-9_]; a hash suffix keeps names
    that needed rewriting distinct."""
    low = name.lower()
    clean = _IDENT.sub("_", low)
    if clean != low or not clean or clean[0].isdigit():
        clean = f"{clean or 'x'}_{hashlib.sha1(name.encode()).hexdigest()[:6]}"
    return clean


def q(*parts: str) -> str:
    """A backquoted, dotted identifier."""
    return ".".join(quote_ident(p) for p in parts)


def sql_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclasses.dataclass(frozen=True)
class Column:
    name: str      # source column name (current spelling)
    stype: str     # Spark type of the current table's column
    cl: str        # the changelog column holding its values


@dataclasses.dataclass(frozen=True)
class TableState:
    table_id: int
    schema: str                     # source schema / table (current names)
    table: str
    db: str                         # catalog namespace and table name of the current table
    name: str
    version: int
    columns: tuple[Column, ...]     # the source's visible columns, in order
    key: tuple[str, ...]            # identity columns (empty: a keyless multiset)
    cl_extra: tuple[tuple[str, str], ...] = ()   # changelog columns no source column maps to now
    incarnation: int = 1            # DROP then CREATE of the same table starts the next one
    dropped: bool = False           # DROP TABLE: current table gone, changelog kept
    skipped: bool = False           # on-unmappable = skip-table hit: changes dropped from then on

    @property
    def changelog(self) -> str:
        return self.name + CHANGELOG_SUFFIX

    def changelog_columns(self) -> list[tuple[str, str]]:
        """The changelog's data columns (after CHANGELOG_META): mapped ones, then the rest."""
        return [(c.cl, c.stype) for c in self.columns] + list(self.cl_extra)

    def current_columns(self) -> list[tuple[str, str]]:
        return [(c.name, c.stype) for c in self.columns]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TableState:
        d = json.loads(text)
        cols = tuple(Column(**c) for c in d.pop("columns"))
        return cls(columns=cols, key=tuple(d.pop("key")),
                   cl_extra=tuple(tuple(x) for x in d.pop("cl_extra")), **d)  # type: ignore[arg-type]


def key_of_info(info: pb.TableInfo) -> tuple[str, ...]:
    """The primary key; else the first unique key of NOT NULL columns; else () (keyless)."""
    nullable = {c.name: c.nullable for c in info.columns if not c.hidden}
    for ix in info.indexes:
        if ix.primary and all(n in nullable for n in ix.columns):
            return tuple(ix.columns)
    for ix in info.indexes:
        if ix.unique and ix.columns and all(n in nullable and not nullable[n] for n in ix.columns):
            return tuple(ix.columns)
    return ()


# --------------------------------------------------------------------------------------------
# Schema operations: what the tables need to follow a change (applied by catalog.Catalog)
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Op:
    kind: str          # create | add | drop | rename | widen | recast | drop_table | rename_table
    table: str         # "changelog" | "current"
    column: str = ""
    to: str = ""       # new name (rename, rename_table), type (add, widen, recast)
    old_type: str = ""


def _mapped(info: pb.TableInfo, table: str, ddl: str, policy: str) -> list[tuple[pb.ColumnInfo, str]]:
    out = []
    for c in info.columns:
        if c.hidden:
            continue
        try:
            out.append((c, spark_type(c)))
        except UnsupportedType as e:
            if policy == "as-string":
                out.append((c, "STRING"))
                continue
            raise UnmappableChange(f"spark sink: table {table}: {e}"
                                   + (f" (DDL: {ddl})" if ddl else "")) from None
    return out


_RENAME_COL = re.compile(r"\bRENAME\s+COLUMN\s+`?([^`\s]+)`?\s+TO\s+`?([^`\s,]+)`?", re.I)
_CHANGE_COL = re.compile(r"\bCHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?`?([^`\s]+)`?\s+`?([^`\s]+)`?", re.I)


def renamed_columns(ddl: str) -> dict[str, str]:
    """{old: new} (lower case) for the column renames an ALTER statement spells out."""
    out = {}
    for rx in (_RENAME_COL, _CHANGE_COL):
        for m in rx.finditer(ddl or ""):
            if m.group(1).lower() != m.group(2).lower():
                out[m.group(1).lower()] = m.group(2).lower()
    return out


def _fresh(base: str, used: set[str]) -> str:
    out, i = base, 1
    while out.lower() in used:
        i += 1
        out = f"{base}_{i}"
    used.add(out.lower())
    return out


def plan(state: TableState | None, info: pb.TableInfo, db: str, ddl: str = "",
         new_incarnation: bool = False, policy: str = "stop") -> tuple[TableState, list[Op]]:
    """The state after table shape `info`, and the schema operations that get there.

    `new_incarnation`: a CREATE of a table the sink already has (DROP then CREATE): the current
    table starts again, empty, in the new shape; the changelog keeps every old column."""
    table = f"{info.schema_name}.{info.table_name}"
    cols = _mapped(info, table, ddl, policy)
    name = ident(info.table_name)
    if state is None:
        new = TableState(info.table_id, info.schema_name, info.table_name, db, name, info.version,
                         tuple(Column(c.name, t, c.name) for c, t in cols), key_of_info(info))
        return new, [Op("create", "changelog"), Op("create", "current")]
    # A table skipped by on-unmappable = skip-table and now taken up again starts a new
    # incarnation as a re-created one does: its current table missed the skipped changes (a
    # delete never applied would leave a row the source no longer has), so it restarts empty;
    # the changelog keeps its columns and gains the new shape's.
    restart = new_incarnation or state.dropped or state.skipped
    ops: list[Op] = []
    extra = {n.lower(): (n, t) for n, t in state.cl_extra}
    used = {n.lower() for n, _ in state.changelog_columns()}
    old = {c.name.lower(): c for c in state.columns}
    if restart:
        for c in state.columns:
            extra[c.cl.lower()] = (c.cl, c.stype)
        old = {}
    renames = renamed_columns(ddl) if not restart else {}
    new_names = {c.name.lower() for c, _ in cols}
    # A rename the statement spells out keeps the column (and its field id) in both tables.
    for o, n in renames.items():
        if o in old and n in new_names and n not in old:
            c = old.pop(o)
            if n in extra:
                # The target name is an old changelog column: move it aside first.
                aside = _fresh(f"{extra[n][0]}__old", used)
                ops.append(Op("rename", "changelog", extra[n][0], aside))
                extra[aside.lower()] = (aside, extra.pop(n)[1])
            newname = next(ci.name for ci, _ in cols if ci.name.lower() == n)
            ops.append(Op("rename", "changelog", c.cl, newname))
            ops.append(Op("rename", "current", c.name, newname))
            used.add(n)
            old[n] = Column(newname, c.stype, newname)
    out: list[Column] = []
    for c, t in cols:
        low = c.name.lower()
        prev = old.pop(low, None)
        if prev is not None:
            if prev.stype == t:
                out.append(dataclasses.replace(prev, name=c.name))
                continue
            if widens(prev.stype, t):
                ops.append(Op("widen", "changelog", prev.cl, t, prev.stype))
                ops.append(Op("widen", "current", prev.name, t, prev.stype))
                out.append(Column(c.name, t, prev.cl))
                continue
            # Not a promotion Iceberg can make: the changelog keeps the old column aside; the
            # current table's values are cast (recast checks that no value is lost).
            if policy == "as-string" and not castable(prev.stype, t):
                t = "STRING"
            if not castable(prev.stype, t):
                raise UnmappableChange(
                    f"spark sink: table {table} column {c.name}: {prev.stype} -> {t} is neither "
                    "an Iceberg promotion nor a cast that keeps MySQL's values"
                    + (f" (DDL: {ddl})" if ddl else f" (schema version {info.version})"))
            aside = _fresh(f"{prev.cl}__v{state.version}", used)
            ops.append(Op("rename", "changelog", prev.cl, aside))
            extra[aside.lower()] = (aside, prev.stype)
            ops.append(Op("add", "changelog", c.name, t))
            ops.append(Op("recast", "current", prev.name, t, prev.stype))
            out.append(Column(c.name, t, c.name))
            continue
        # A new column (or one of a new incarnation).
        x = extra.get(low)
        if x is not None and x[1] == t:
            extra.pop(low)
            cl = x[0]
        else:
            if x is not None:
                aside = _fresh(f"{x[0]}__v{state.version}", used)
                ops.append(Op("rename", "changelog", x[0], aside))
                extra[aside.lower()] = (aside, extra.pop(low)[1])
            cl = c.name
            used.add(low)
            ops.append(Op("add", "changelog", cl, t))
        if not restart:
            ops.append(Op("add", "current", c.name, t))
        out.append(Column(c.name, t, cl))
    for prev in old.values():   # dropped source columns: gone from the current table only
        extra[prev.cl.lower()] = (prev.cl, prev.stype)
        if not restart:
            ops.append(Op("drop", "current", prev.name))
    if restart:
        ops.insert(0, Op("drop_table", "current"))
        ops.append(Op("create", "current"))
    # Keep the changelog's column order stable: extra columns as they were, new ones after.
    order = [n for n, _ in state.cl_extra]
    cl_extra = sorted(extra.values(), key=lambda x: (order.index(x[0]) if x[0] in order
                                                     else len(order), x[0]))
    mapped_cls = {c.cl.lower() for c in out}
    new = dataclasses.replace(
        state, schema=info.schema_name, table=info.table_name, db=db, name=name,
        version=info.version,
        columns=tuple(out), key=key_of_info(info),
        cl_extra=tuple(x for x in cl_extra if x[0].lower() not in mapped_cls),
        incarnation=state.incarnation + (1 if restart else 0),
        dropped=False, skipped=False)
    return new, ops


def renamed(state: TableState, info: pb.TableInfo, db: str) -> TableState:
    """state under the names of a RENAME TABLE (its history moves with it)."""
    return dataclasses.replace(state, table_id=info.table_id, schema=info.schema_name,
                               table=info.table_name, db=db, name=ident(info.table_name))


def row_index(state: TableState, info: pb.TableInfo) -> list[int] | None:
    """For a row decoded with `info`'s visible columns: the position in state.columns of each of
    its values (None when they are the same, in order — the common case)."""
    names = [c.name.lower() for c in info.columns if not c.hidden]
    have = [c.name.lower() for c in state.columns]
    if names == have:
        return None
    pos = {n: i for i, n in enumerate(have)}
    return [pos.get(n, -1) for n in names]


def reorder(values: list[Any] | tuple[Any, ...], index: list[int], width: int) -> list[Any]:
    out: list[Any] = [None] * width
    for v, i in zip(values, index):
        if i >= 0:
            out[i] = v
    return out
