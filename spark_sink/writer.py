"""A table's buffered changes -> the writes that land them: the changelog append, the current
state's removal of the keys the batch changes (a DELETE, or an equality-delete file:
`current-state`) plus append of their last images (keyed tables; a MERGE INTO is the
alternative, `MERGE`) or multiset rewrite (keyless ones), TRUNCATE, and the value-keeping cast
of a column whose type Iceberg cannot promote.

Rows arrive as tuples `(*CHANGELOG_META values, *values of the state's columns)`; a table's rows
of a batch become ONE Arrow table (built in C, no per-row pickling, `BatchFrame`), which both
the changelog append and the current-state write read. Appends (and equality deletes) are
parquet files the driver writes and commits through the Iceberg API (datafiles.py: no Spark
job); what needs a scan of the table (a DELETE of keys, MERGE, a keyless multiset rewrite) and
tables the files cannot be exact for (partitioned ones) go through a Spark DataFrame of the same
Arrow table. A keyed table's frame carries `_sluice_latest`, true on the batch's
last change of each key (computed here, in one pass over the rows), so the current-state write
reads the batch already reduced to one change per key, with no window or shuffle of its own,
and `_sluice_delete`, true on the same row when the key may be in the table before the batch
(see `key_masks`: a key whose first change in the batch is an insert is not).

Invariants:
- The current state of a keyed table applies, per key, the batch's last change by
  (`_commit_ts`, `_seq`): a delete removes the row, anything else replaces it.
- A keyless table keeps its exact multiset: each row image's count is its count before the batch
  plus the batch's creates minus its deletes (rewritten whole: keyless tables pay a full rewrite
  per batch, docs/spark.md).
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

from sluice.spark_sink import datafiles
from sluice.spark_sink.tables import CHANGELOG_META, CURRENT_META, TableState, q

_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)$")
BATCH_VIEW = "sluice_batch"
LATEST = "_sluice_latest"   # frame-only column: the batch's last change of its key
DELETE = "_sluice_delete"   # frame-only column: LATEST, and the key may be in the table already
FRAME_ONLY = (LATEST, DELETE)
_OP, _CTS, _SEQ = 0, 1, 2
_META_WIDTH = len(CHANGELOG_META)
# How a keyed current table takes a batch (config `current-state`): a DELETE of the keys the
# batch changes (a Spark job that scans the table) then an append of their last images, or the
# images and an equality-delete file of those keys in one Iceberg commit (no scan;
# datafiles.py). MERGE (one MERGE INTO) and DELETE_ALL (the DELETE of every changed key, inserts'
# included: the sink before the insert-first rule) are kept for bench/spark_sink.py's
# same-invocation comparison only; the config does not accept them.
DELETE_KEYS, EQUALITY_DELETES = "delete", "equality-deletes"
MERGE, DELETE_ALL = "merge", "delete-all"
CURRENT_STATE_METHODS = (DELETE_KEYS, EQUALITY_DELETES)
_VIEW_IDS = itertools.count(1)
# Where a table's writes go as files: a Target of the table's branch, or None (Spark writes).
Direct = Callable[[], 'datafiles.Target | None']


def arrow_type(spark_ddl: str) -> Any:
    """The Arrow type Spark reads as this Spark SQL type."""
    import pyarrow as pa
    t = spark_ddl.strip().upper()
    simple = {"INT": pa.int32(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(),
              "FLOAT": pa.float32(), "STRING": pa.string(), "BINARY": pa.binary(),
              "BOOLEAN": pa.bool_(), "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us", tz="UTC"),
              "ARRAY<STRING>": pa.list_(pa.string())}
    if t in simple:
        return simple[t]
    m = _DECIMAL.match(t)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    raise ValueError(f"no Arrow type for Spark type {spark_ddl!r}")


def key_masks(st: TableState, rows: Sequence[tuple[Any, ...]]) -> tuple[list[bool], list[bool]]:
    """(latest, delete): latest is true on each key's last change in rows by (`_commit_ts`,
    `_seq`); delete is true on the same row unless the key's FIRST change in rows is an insert
    (`c`). Keys compare as Python values (binary strings, exact decimals), as Spark's `<=>`
    compares them.

    Why an insert-first key needs no delete: the source's key is unique, and the current table
    holds the source's state as of the table's skip point, which is where rows start (the
    sink's skip points drop everything the table already holds, so a replay after a crash
    never sees its own earlier inserts here; BatchFrame.write_current falls back to deleting
    every changed key when it writes only part of its rows). An INSERT of K at that state
    means K was absent; a key change K1 -> K2 is a `d` of K1 (in the set) and a `c` of K2
    (absent before, by the same argument). Where it could fail, and why it does not:
    - snapshot reads (`r`) are upserts of rows the table may already hold (a re-snapshot):
      they are never insert-first, so their keys are deleted;
    - a key of the current table that is not the source's: after ADD/CHANGE PRIMARY KEY the
      current table keeps its rows (tables.plan does not rebuild it), and they are the source's
      rows, unique under the new key as the source enforced it; a table skipped by
      on-unmappable = skip-table and taken up again restarts its current table empty (a new
      incarnation, tables.plan), so it never holds stale rows of the skipped period."""
    names = [c.name.lower() for c in st.columns]
    pos = [_META_WIDTH + names.index(k.lower()) for k in st.key]
    if any(c.stype.strip().upper() == "BINARY" for c in key_columns(st)):
        # Binary values arrive as bytearray (unhashable): key them as bytes.
        def key(r: tuple[Any, ...]) -> Any:
            k = tuple(bytes(r[j]) if isinstance(r[j], bytearray) else r[j] for j in pos)
            return k if len(k) > 1 else k[0]
        return _masks(rows, key)
    if len(pos) == 1:
        p = pos[0]
        return _masks(rows, lambda r: r[p])
    return _masks(rows, lambda r: tuple(r[j] for j in pos))


def _masks(rows: Sequence[tuple[Any, ...]],
           key: Callable[[tuple[Any, ...]], Any]) -> tuple[list[bool], list[bool]]:
    order = [(r[_CTS], r[_SEQ]) for r in rows]
    if any(a > b for a, b in zip(order, order[1:])):
        # Buffered in stream order, so this is only a defensive path (a replay's rows).
        idx: Sequence[int] = sorted(range(len(rows)), key=order.__getitem__)
    else:
        idx = range(len(rows))
    last: dict[Any, int] = {}
    first_insert: dict[Any, bool] = {}
    for i in idx:
        r = rows[i]
        k = key(r)
        last[k] = i
        if k not in first_insert:
            first_insert[k] = r[_OP] == "c"
    latest = [False] * len(rows)
    delete = [False] * len(rows)
    for k, i in last.items():
        latest[i] = True
        delete[i] = not first_insert[k]
    return latest, delete


def latest_mask(st: TableState, rows: Sequence[tuple[Any, ...]]) -> list[bool]:
    """True on each key's last change in rows by (`_commit_ts`, `_seq`)."""
    return key_masks(st, rows)[0]


def batch_arrow(st: TableState, rows: Sequence[tuple[Any, ...]]) -> Any:
    """rows as an Arrow table: every changelog column (unmapped ones NULL), and for a keyed
    table the `_sluice_latest` and `_sluice_delete` masks."""
    import pyarrow as pa
    cols = [*CHANGELOG_META, *((c.cl, c.stype) for c in st.columns)]
    extra = list(st.cl_extra)
    n = len(rows)
    data = list(zip(*rows)) if rows else [()] * len(cols)
    arrays = [pa.array(v, type=arrow_type(t)) for v, (_, t) in zip(data, cols)]
    arrays += [pa.nulls(n, type=arrow_type(t)) for _, t in extra]
    names = [c for c, _ in cols] + [c for c, _ in extra]
    if st.key:
        latest, delete = key_masks(st, rows)
        arrays += [pa.array(latest, type=pa.bool_()), pa.array(delete, type=pa.bool_())]
        names += [LATEST, DELETE]
    return pa.Table.from_arrays(arrays, names=names)


class BatchFrame:
    """One table's rows of a batch as one Arrow table, built once for both of its writes.
    `since`: the rows are those with `_commit_ts` > since (the lower of the two skip points).
    `current_by`: how a keyed current table takes it (DELETE_KEYS, EQUALITY_DELETES, or the
    bench's MERGE / DELETE_ALL).

    The writes go as files committed through the Iceberg API (datafiles.py) when the table
    allows (`direct()` returns a Target); otherwise, and for what needs a scan of the table (a
    DELETE of keys, MERGE, a keyless table's multiset rewrite), through Spark, on a DataFrame
    made from the same Arrow table only then."""

    def __init__(self, spark: Any, st: TableState, rows: Sequence[tuple[Any, ...]], since: int,
                 current_by: str = DELETE_KEYS) -> None:
        self.spark, self.st, self.since = spark, st, since
        self.current_by = current_by if st.key else ""
        if self.current_by == EQUALITY_DELETES and not datafiles.supported(
                [c.stype for c in key_columns(st)]):
            self.current_by = DELETE_KEYS
        self.by_delete = self.current_by in (DELETE_KEYS, DELETE_ALL, EQUALITY_DELETES)
        self.arrow = batch_arrow(st, rows)
        self._frame: Any = None
        # What the last write_current did (tests and the bench read it): keys removed, and how.
        self.removed: tuple[str, int] = ("", 0)
        # How each write went: "direct" (a file through the Iceberg API) or "spark".
        self.paths: dict[str, str] = {}

    @property
    def frame(self) -> Any:
        """The rows as a Spark DataFrame (made on first use: only Spark writes need it)."""
        if self._frame is None:
            self._frame = self.spark.createDataFrame(self.arrow)
        return self._frame

    def after(self, skip: int) -> Any:
        """The frame's rows with `_commit_ts` > skip (skip >= since)."""
        if skip <= self.since:
            return self.frame
        from pyspark.sql import functions as F
        return self.frame.where(F.col("_commit_ts") > F.lit(skip))

    def arrow_after(self, skip: int) -> Any:
        """The Arrow rows with `_commit_ts` > skip (skip >= since)."""
        if skip <= self.since:
            return self.arrow
        import pyarrow.compute as pc
        return self.arrow.filter(pc.greater(self.arrow.column("_commit_ts"), skip))

    def changelog_arrow(self, skip: int) -> Any:
        a = self.arrow_after(skip)
        return a.drop_columns(list(FRAME_ONLY)) if self.st.key else a

    def write_changelog(self, target: str, skip: int, direct: Direct | None = None) -> None:
        """The rows after skip appended to the changelog `target` (our branch): one data file
        when direct() gives a Target, else a Spark append."""
        t = direct() if direct is not None else None
        if t is not None:
            t.append(self.changelog_arrow(skip))
            self.paths["changelog"] = "direct"
            return
        self.paths["changelog"] = "spark"
        df = self.after(skip)
        (df.drop(*FRAME_ONLY) if self.st.key else df).writeTo(target).append()

    def delete_mask(self, skip: int) -> str:
        """The frame column that marks the keys to remove before the append, for the rows
        after skip. Only when the write takes every row of the frame is the first change of
        each key known (`_sluice_delete`); a partial write (a skip point inside the frame)
        removes every key it changes."""
        if self.current_by == DELETE_ALL or skip > self.since:
            return LATEST
        return DELETE

    def delete_keys(self, skip: int) -> Any:
        """The keys to remove (Arrow, named as the current table's key columns)."""
        import pyarrow.compute as pc
        a = self.arrow
        mask = a.column(self.delete_mask(skip))
        if skip > self.since:
            mask = pc.and_(mask, pc.greater(a.column("_commit_ts"), skip))
        keys = key_columns(self.st)
        return a.filter(mask).select([c.cl for c in keys]).rename_columns([c.name for c in keys])

    def latest_images(self, skip: int) -> Any:
        """What a keyed current table gets after the removal of delete_keys(skip): each changed
        key's last image after skip, unless that change is a delete (Arrow, named as the
        current table's columns)."""
        import pyarrow.compute as pc
        a = self.arrow_after(skip)
        a = a.filter(pc.and_(a.column(LATEST), pc.not_equal(a.column("_op"), "d")))
        cols = [c.cl for c in self.st.columns] + [m for m, _ in CURRENT_META]
        return a.select(cols).rename_columns([c.name for c in self.st.columns]
                                             + [m for m, _ in CURRENT_META])

    def write_current(self, target: str, skip: int, direct: Direct | None = None) -> None:
        """The batch's rows after skip into the current table `target` (our branch).

        Keyed, by delete: with a direct Target, ONE row-delta commit (the last images and the
        delete file of the keys they replace: equality deletes, or position deletes of the rows
        the driver found, positions.py); otherwise (no Target, or keys pyarrow cannot compare
        exactly) the keys that need it are removed by a Spark DELETE (it scans the table), then
        the last images are appended (a file when direct). Two commits on the sink's branch at
        most; the caller's one fast_forward publishes them (main never points at the first), so readers of main
        see one change. MERGE and keyless tables go through Spark."""
        if not self.by_delete:
            self.paths["current"] = "spark"
            self._write_current_spark(target, skip)
            return
        keys = self.delete_keys(skip)
        t = direct() if direct is not None else None
        how = ""
        if t is not None and self.current_by == EQUALITY_DELETES:
            t.row_delta(self.latest_images(skip), keys)
            self.removed = (EQUALITY_DELETES if keys.num_rows else "", keys.num_rows)
            self.paths["current"] = "direct"
            return
        if keys.num_rows:
            how = DELETE_KEYS
            found = t.find_positions(keys) if t is not None else None
            if found is not None:
                assert t is not None
                # The last images and the position deletes of the keys' older rows: ONE commit,
                # no Spark job (positions.py).
                t.position_delta(self.latest_images(skip), found)
                self.removed = (how, keys.num_rows)
                self.paths["current"] = "direct"
                return
            self._delete_keys_spark(target, keys)
        self.removed = (how, keys.num_rows)
        if t is not None:
            t.append(self.latest_images(skip))
            self.paths["current"] = "direct"
            return
        self.paths["current"] = "spark"
        v = f"{BATCH_VIEW}_{next(_VIEW_IDS)}"
        self.after(skip).createOrReplaceTempView(v)
        try:
            self.spark.sql(latest_images_sql(self.st, v)).writeTo(target).append()
        finally:
            self.spark.catalog.dropTempView(v)

    def _delete_keys_spark(self, target: str, keys: Any) -> None:
        """DELETE from target every row whose key is in keys (a Spark job: it scans the table;
        the keys, small next to it, are broadcast: a broadcast semi-join, no shuffle)."""
        from pyspark.sql import functions as F
        # The session's temp views are shared by all threads: tables written at once need
        # views of their own.
        v = f"{BATCH_VIEW}_{next(_VIEW_IDS)}"
        F.broadcast(self.spark.createDataFrame(keys)).createOrReplaceTempView(v)
        try:
            self.spark.sql(delete_in_sql(key_columns(self.st), target, v))
        finally:
            self.spark.catalog.dropTempView(v)

    def _write_current_spark(self, target: str, skip: int) -> None:
        v = f"{BATCH_VIEW}_{next(_VIEW_IDS)}"
        self.after(skip).createOrReplaceTempView(v)
        try:
            if self.st.key:
                self.spark.sql(current_sql(self.st, target, v))
            else:
                from pyspark.sql import functions as F
                self.spark.sql(keyless_sql(self.st, target, v)).writeTo(target).overwrite(F.lit(True))
        finally:
            self.spark.catalog.dropTempView(v)


def changelog_frame(spark: Any, st: TableState, rows: Sequence[tuple[Any, ...]]) -> Any:
    """The changelog DataFrame of rows: every changelog column (unmapped ones NULL)."""
    df = spark.createDataFrame(batch_arrow(st, rows))
    return df.drop(*FRAME_ONLY) if st.key else df


def current_sql(st: TableState, target: str, view: str = BATCH_VIEW) -> str:
    """The statement that applies the batch view (one change per key: `_sluice_latest`) to a
    keyed current table."""
    names = [c.name for c in st.columns]
    keys = list(st.key)
    on = " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in keys)
    assign = ", ".join(f"t.{q(n)} = s.{q(n)}" for n in [*names, *(m for m, _ in CURRENT_META)])
    ins_cols = ", ".join(q(n) for n in [*names, *(m for m, _ in CURRENT_META)])
    ins_vals = ", ".join(f"s.{q(n)}" for n in [*names, *(m for m, _ in CURRENT_META)])
    src = ", ".join([f"{q(c.cl)} AS {q(c.name)}" for c in st.columns]
                    + [q("_op"), *(q(m) for m, _ in CURRENT_META)])
    return (f"MERGE INTO {target} t USING (SELECT {src} FROM {view} WHERE {q(LATEST)}) s "
            f"ON {on} "
            f"WHEN MATCHED AND s.`_op` = 'd' THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {assign} "
            f"WHEN NOT MATCHED AND s.`_op` <> 'd' THEN INSERT ({ins_cols}) VALUES ({ins_vals})")


def delete_in_sql(keys: Sequence[Any], target: str, view: str) -> str:
    """Delete from a keyed current table every row whose key is in `view` (the key columns
    under the current table's names)."""
    t_cols = ", ".join(q(c.name) for c in keys)
    if len(keys) > 1:
        t_cols = f"({t_cols})"
    return f"DELETE FROM {target} WHERE {t_cols} IN (SELECT {t_cols.strip('()')} FROM {view})"


def latest_images_sql(st: TableState, view: str = BATCH_VIEW) -> str:
    """The rows a keyed current table gets from the batch view after delete_in_sql: each
    changed key's last image, unless that change is a delete."""
    cols = ", ".join([f"{q(c.cl)} AS {q(c.name)}" for c in st.columns]
                     + [q(m) for m, _ in CURRENT_META])
    return f"SELECT {cols} FROM {view} WHERE {q(LATEST)} AND `_op` <> 'd'"


def key_columns(st: TableState) -> list[Any]:
    by_name = {c.name.lower(): c for c in st.columns}
    return [by_name[k.lower()] for k in st.key]


def keyless_sql(st: TableState, target: str, view: str = BATCH_VIEW) -> str:
    """The new multiset of a keyless current table: old counts plus creates minus deletes."""
    names = ", ".join(q(c.name) for c in st.columns)
    return (f"SELECT {names}, `_commit_ts`, `_zero_dates` FROM (SELECT {names}, "
            f"max(`_commit_ts`) AS `_commit_ts`, max(`_zero_dates`) AS `_zero_dates`, "
            f"sum(`_n`) AS `_n` FROM (SELECT {names}, `_commit_ts`, `_zero_dates`, 1 AS `_n` "
            f"FROM {target} UNION ALL SELECT {names}, `_commit_ts`, `_zero_dates`, "
            f"CASE WHEN `_op` = 'd' THEN -1 ELSE 1 END AS `_n` FROM {view}) u "
            f"GROUP BY {names}) g LATERAL VIEW explode(sequence(1, greatest(`_n`, 1))) x AS `_i` "
            f"WHERE `_n` > 0")


def write_changelog(spark: Any, st: TableState, rows: Sequence[tuple[Any, ...]], target: str) -> None:
    changelog_frame(spark, st, rows).writeTo(target).append()


def truncate(spark: Any, target: str) -> None:
    spark.sql(f"DELETE FROM {target} WHERE true")


def lossy_cast_count(spark: Any, table: str, column: str, to: str) -> int:
    """Rows whose value would not survive CAST(column AS to)."""
    c = q(column)
    return int(spark.sql(f"SELECT count(*) FROM {table} WHERE {c} IS NOT NULL AND "
                         f"try_cast({c} AS {to}) IS NULL").collect()[0][0])
