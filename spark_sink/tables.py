"""Per source table: the raw/base tables' physical columns, schema versions, and the views.

Invariant: the user-facing views read only committed batches — `<table>_changelog` and
`<table>` join the raw table with `_sluice_commits` on (batch, epoch), so raw partitions of a
batch that has no commit record are invisible however long they exist.

Schema evolution never rewrites or retypes a physical column: a new column adds one; a widened
column gets a new physical column of the wider type (`name__<type>`) and the view reads
COALESCE(CAST(newest), ..., CAST(oldest)) — each row fills exactly one of them; a dropped column
is hidden by the views; a column re-added after a drop starts a fresh physical column. A change
that is not a widening is UnmappableChange, naming the table, the column and the DDL.

TRUNCATE (and CREATE of a table id that already has rows) lands as a marker row `_op = 't'`
in the changelog; the current-state view keeps only changes after the newest committed marker,
so the table is empty from exactly the batch that commits the marker on, in every JVM.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from sluice.core.errors import FailedPrecondition
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink.layout import Layout, ident, q
from sluice.spark_sink.types import spark_type, widens

# Metadata columns of raw and base tables, in order (partition columns come after the data).
META_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_op", "STRING"), ("_commit_ts", "BIGINT"), ("_seq", "INT"), ("_schema_ver", "BIGINT"),
    ("_producer", "STRING"), ("_pos", "STRING"), ("_ts_ms", "BIGINT"), ("_zero_dates", "ARRAY<STRING>"),
)
CHANGELOG_META = ("_op", "_commit_ts", "_seq", "_batch", "_schema_ver", "_producer", "_pos",
                  "_ts_ms", "_zero_dates")
_VIEW_MARK = re.compile(r"/\* sluice:base=(\d+):upto=(\d+) \*/")


class UnmappableChange(FailedPrecondition):
    """A schema change the Spark tables cannot follow (the drainer stops on it)."""


@dataclasses.dataclass(frozen=True)
class Column:
    name: str                                  # source column name
    stype: str                                 # current Spark type
    phys: tuple[tuple[str, str], ...]          # physical (name, type), oldest first
    hidden: bool = False


@dataclasses.dataclass(frozen=True)
class TableState:
    """What the sink knows about one source table (persisted as the raw table's property)."""

    table_id: int
    schema: str                                # source schema / table (current names)
    table: str
    db: str                                    # catalog database of the views
    version: int
    columns: tuple[Column, ...]
    key: tuple[str, ...]                       # identity columns (empty: keyless multiset)
    base_version: int = 0                      # compacted base in use (0: none)
    base_upto: int = 0                         # last batch folded into that base
    physical: tuple[tuple[str, str], ...] = () # physical columns, append-only (table order)
    dropped: bool = False                      # DROP TABLE: views removed, history kept
    cleared: bool = False                      # has had a truncate marker: views filter by it
    hist_upto: int = 0                         # last batch in the merged changelog (tN_hist) the
                                               # views read (0: none); raw batches after it

    @property
    def hist(self) -> bool:
        """Whether the views read a merged changelog."""
        return self.hist_upto > 0

    @property
    def visible(self) -> list[Column]:
        return [c for c in self.columns if not c.hidden]

    def phys_columns(self) -> list[tuple[str, str]]:
        return list(self.physical)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TableState:
        d = json.loads(text)
        cols = tuple(Column(c["name"], c["stype"], tuple(tuple(p) for p in c["phys"]), c["hidden"])
                     for c in d.pop("columns"))
        physical = tuple(tuple(p) for p in d.pop("physical"))
        # Written before the merged changelog's boundary was part of the state: its views are
        # rewritten at open, and the next merge (which reads the boundary from the files' location)
        # sets it; until then the views read the raw batches.
        d.pop("hist", None)
        return cls(columns=cols, key=tuple(d.pop("key")), physical=physical, **d)  # type: ignore[arg-type]


def key_of_info(info: pb.TableInfo) -> tuple[str, ...]:
    """The primary key; else the first unique key of NOT NULL columns; else () (keyless)."""
    nullable = {c.name: c.nullable for c in info.columns if not c.hidden}
    for ix in info.indexes:
        if ix.primary:
            return tuple(ix.columns)
    for ix in info.indexes:
        if ix.unique and ix.columns and all(n in nullable and not nullable[n] for n in ix.columns):
            return tuple(ix.columns)
    return ()


def evolve(state: TableState | None, info: pb.TableInfo, layout: Layout, ddl: str = "") -> TableState:
    """The state after table shape `info` (a new table when state is None)."""
    table = f"{info.schema_name}.{info.table_name}"
    old = {c.name.lower(): c for c in state.columns} if state is not None else {}
    used = {p[0] for c in old.values() for p in c.phys}
    cols: list[Column] = []
    seen: set[str] = set()
    for c in info.columns:
        if c.hidden:
            continue
        try:
            st = spark_type(c)
        except FailedPrecondition:
            raise
        except Exception as e:  # UnsupportedType
            raise UnmappableChange(f"spark sink: table {table}: {e}"
                                   + (f" (DDL: {ddl})" if ddl else "")) from None
        prev = old.get(c.name.lower())
        seen.add(c.name.lower())
        if prev is not None and not prev.hidden:
            if prev.stype == st:
                cols.append(dataclasses.replace(prev, name=c.name))
                continue
            if not widens(prev.stype, st):
                raise UnmappableChange(
                    f"spark sink: table {table} column {c.name}: {prev.stype} -> {st} is not a "
                    f"widening the Spark tables can follow"
                    + (f" (DDL: {ddl})" if ddl else " (schema version "
                       f"{info.version})") + "; stop the drainer, migrate the tables, restart")
            pname = _fresh(f"{ident(c.name)}__{_tag(st)}", used)
            cols.append(Column(c.name, st, (*prev.phys, (pname, st))))
            continue
        base = ident(c.name) if prev is None else f"{ident(c.name)}__v{info.version}"
        pname = _fresh(base, used)
        cols.append(Column(c.name, st, ((pname, st),)))
    for name, prev in old.items():
        if name not in seen:
            cols.append(dataclasses.replace(prev, hidden=True))
    db = layout.database(info.schema_name)
    physical = list(state.physical) if state is not None else []
    known = set(physical)
    physical += [p for c in cols for p in c.phys if p not in known]
    return TableState(
        table_id=info.table_id, schema=info.schema_name, table=info.table_name, db=db,
        version=info.version, columns=tuple(cols), key=key_of_info(info),
        base_version=state.base_version if state else 0, base_upto=state.base_upto if state else 0,
        physical=tuple(physical), cleared=state.cleared if state else False,
        hist_upto=state.hist_upto if state else 0)


def recreated(state: TableState) -> TableState:
    """state as the starting point of a CREATE over the same table id: every old column hidden,
    so the new incarnation's columns get fresh physical columns whatever their types."""
    return dataclasses.replace(state, columns=tuple(dataclasses.replace(c, hidden=True)
                                                    for c in state.columns), dropped=False)


def _tag(stype: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", stype.lower()).strip("_")


def _fresh(name: str, used: set[str]) -> str:
    out, i = name, 1
    while out in used or out.startswith("_"):
        i += 1
        out = f"{name}_{i}"
    used.add(out)
    return out


# --------------------------------------------------------------------------------------------
# SQL
# --------------------------------------------------------------------------------------------

def column_expr(c: Column, alias: str = "") -> str:
    pre = f"{alias}." if alias else ""
    if len(c.phys) == 1 and c.phys[0][1] == c.stype:
        e = f"{pre}{q(c.phys[0][0])}"
    else:
        e = "COALESCE(" + ", ".join(f"CAST({pre}{q(p)} AS {c.stype})" for p, _ in reversed(c.phys)) + ")"
    return f"{e} AS {q(c.name)}"


def create_raw_sql(state: TableState, layout: Layout) -> str:
    cols = ", ".join(f"{q(n)} {t}" for n, t in (*META_COLUMNS, *state.phys_columns()))
    return (f"CREATE TABLE IF NOT EXISTS {layout.raw(state.table_id)} ({cols}, `_batch` BIGINT, "
            f"`_epoch` BIGINT) USING parquet PARTITIONED BY (`_batch`, `_epoch`) "
            f"LOCATION '{layout.raw_table_dir(state.table_id)}'")


def create_base_sql(state: TableState, layout: Layout) -> str:
    cols = ", ".join(f"{q(n)} {t}" for n, t in (*META_COLUMNS, *state.phys_columns()))
    return (f"CREATE TABLE IF NOT EXISTS {layout.base(state.table_id)} ({cols}, `_v` BIGINT) "
            f"USING parquet PARTITIONED BY (`_v`) LOCATION '{layout.base_table_dir(state.table_id)}'")


def committed_raw(state: TableState, layout: Layout, after_batch: int = 0) -> str:
    """The raw rows of committed batches (> after_batch), every column."""
    where = f" WHERE r.`_batch` > {after_batch}" if after_batch else ""
    cond = f" AND c.batch > {after_batch}" if after_batch else ""
    return (f"SELECT r.* FROM {layout.raw(state.table_id)} r LEFT SEMI JOIN {layout.commits()} c "
            f"ON r.`_batch` = c.batch AND r.`_epoch` = c.epoch{cond}{where}")


def create_hist_sql(state: TableState, layout: Layout) -> str:
    """The merged changelog: committed raw rows of many batches in a few files, `_batch` and
    `_epoch` as data columns; ONE partition (`_part`=0) whose location merging switches."""
    cols = ", ".join(f"{q(n)} {t}" for n, t in (*META_COLUMNS, *state.phys_columns()))
    return (f"CREATE TABLE IF NOT EXISTS {layout.hist(state.table_id)} ({cols}, `_batch` BIGINT, "
            f"`_epoch` BIGINT, `_part` BIGINT) USING parquet PARTITIONED BY (`_part`) "
            f"LOCATION '{layout.hist_table_dir(state.table_id)}'")


def raw_columns(state: TableState) -> str:
    return ", ".join(q(n) for n, _ in (*META_COLUMNS, *state.phys_columns(), ("_batch", ""), ("_epoch", "")))


def all_changes_sql(state: TableState, layout: Layout) -> str:
    """Every committed change of the table, raw columns: the merged changelog's batches up to
    `hist_upto` plus the committed raw batches after it. The boundary is a constant of the view
    text, which a reader resolves once: reading it twice from the merged files (rows and their
    max batch) let a reader meet the old location in one read and the new one in the other,
    and count the batches between twice (compaction.py says why the order of the switch keeps
    every combination a reader can meet exact)."""
    if not state.hist_upto:
        return committed_raw(state, layout)
    cols = raw_columns(state)
    u = state.hist_upto
    return (f"SELECT {cols} FROM {layout.hist(state.table_id)} WHERE `_part` = 0 AND `_batch` <= {u} "
            f"UNION ALL SELECT {cols} FROM ({committed_raw(state, layout, u)}) x")


def changelog_sql(state: TableState, layout: Layout) -> str:
    meta = ", ".join(f"r.{q(m)}" for m in CHANGELOG_META)
    cols = ", ".join(column_expr(c, "r") for c in state.visible)
    return f"SELECT {meta}{', ' if cols else ''}{cols} FROM ({all_changes_sql(state, layout)}) r"


TRUNCATED = "t"   # _op of a truncate marker row (row columns NULL)


def _union_sql(state: TableState, layout: Layout, base_version: int, base_upto: int,
               upto_batch: int | None = None, as_of_ts: int | None = None) -> str:
    cols = ", ".join(column_expr(c) for c in state.visible)
    sel = f"`_op`, `_commit_ts`, `_seq`, `_zero_dates`{', ' if cols else ''}{cols}"
    tail_where = []
    if upto_batch is not None:
        tail_where.append(f"`_batch` <= {upto_batch}")
    if as_of_ts is not None:
        tail_where.append(f"`_commit_ts` <= {as_of_ts}")
    tw = (" WHERE " + " AND ".join(tail_where)) if tail_where else ""
    parts = []
    if base_version:
        parts.append(f"SELECT {sel} FROM {layout.base(state.table_id)} WHERE `_v` = {base_version}")
    # The tail: committed batches after the base (their raw partitions are never merged away:
    # merging stops at the base's batch); from the beginning, every change.
    tail = committed_raw(state, layout, base_upto) if base_upto else all_changes_sql(state, layout)
    parts.append(f"SELECT {sel} FROM ({tail}) t{tw}")
    union = " UNION ALL ".join(parts)
    if not state.cleared:
        return union
    # Markers live only in the tail: a compaction that folded one in already left the rows
    # before it out of the base, and every base row is older than any tail marker.
    marker = (f"SELECT coalesce(max(`_commit_ts`), 0) FROM ({tail}) m "
              f"WHERE m.`_op` = '{TRUNCATED}'"
              + "".join(f" AND m.{w}" for w in tail_where))
    return (f"SELECT * FROM ({union}) a WHERE a.`_op` <> '{TRUNCATED}' "
            f"AND a.`_commit_ts` > ({marker})")


def state_query(state: TableState, layout: Layout, base_version: int, base_upto: int,
                upto_batch: int | None = None, as_of_ts: int | None = None,
                with_meta: bool = False) -> str:
    """Current state: the latest change per key by (_commit_ts, _seq), deletes removed; keyless
    tables as a multiset (creates minus deletes of each full row)."""
    union = _union_sql(state, layout, base_version, base_upto, upto_batch, as_of_ts)
    names = ", ".join(q(c.name) for c in state.visible)
    if state.key:
        keys = ", ".join(q(k) for k in state.key)
        extra = ", `_commit_ts`, `_seq`, `_zero_dates`" if with_meta else ", `_commit_ts`, `_zero_dates`"
        return (f"SELECT {names}{extra} FROM (SELECT *, row_number() OVER (PARTITION BY {keys} "
                f"ORDER BY `_commit_ts` DESC, `_seq` DESC) AS `_rn` FROM ({union}) u) w "
                f"WHERE `_rn` = 1 AND `_op` <> 'd'")
    extra = ", `_commit_ts`, 0 AS `_seq`, CAST(NULL AS ARRAY<STRING>) AS `_zero_dates`" if with_meta \
        else ", `_commit_ts`"
    return (f"SELECT {names}{extra} FROM (SELECT {names}, max(`_commit_ts`) AS `_commit_ts`, "
            f"sum(CASE WHEN `_op` = 'd' THEN -1 ELSE 1 END) AS `_n` FROM ({union}) u "
            f"GROUP BY {names} HAVING sum(CASE WHEN `_op` = 'd' THEN -1 ELSE 1 END) > 0) g "
            f"LATERAL VIEW explode(sequence(1, `_n`)) x AS `_i`")


def current_view_sql(state: TableState, layout: Layout) -> str:
    mark = f"/* sluice:base={state.base_version}:upto={state.base_upto} */"
    return f"SELECT {mark} * FROM ({state_query(state, layout, state.base_version, state.base_upto)}) s"


def as_of_sql(state: TableState, layout: Layout, commit_ts: int) -> str:
    """The table's state as of commit_ts (from the full changelog; slower than the view)."""
    return state_query(state, layout, 0, 0, as_of_ts=commit_ts)


def parse_view_mark(view_text: str) -> tuple[int, int] | None:
    m = _VIEW_MARK.search(view_text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def physical_row(meta: tuple[Any, ...], values: list[Any], index: list[int], width: int) -> tuple[Any, ...]:
    """meta + the values placed at their physical column indexes (others NULL)."""
    row: list[Any] = [None] * width
    for v, i in zip(values, index):
        row[i] = v
    return (*meta, *row)


def phys_index(state: TableState, info: pb.TableInfo) -> list[int]:
    """For each visible column of `info` (a version already folded into state), the index of
    the physical column its values go to: the one of the column's type at that version."""
    phys = state.phys_columns()
    pos = {p: i for i, p in enumerate(phys)}
    by_name = {c.name.lower(): c for c in state.columns}
    out = []
    for col in info.columns:
        if col.hidden:
            continue
        st = spark_type(col)
        c = by_name[col.name.lower()]
        # The newest physical column of this type (a re-added column's fresh one).
        choice = [p for p in c.phys if p[1] == st]
        if not choice:
            raise UnmappableChange(f"spark sink: table {info.schema_name}.{info.table_name} column "
                                   f"{col.name}: no physical column of type {st} (version {info.version})")
        out.append(pos[choice[-1]])
    return out
