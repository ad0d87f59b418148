"""Compaction: fold the changelog tail into a new base version and swap it in atomically.

Invariant: a reader of `<table>` never sees a torn or missing table. The new base is written to
a new location and registered as a new partition of the base table (invisible to the view), then
ONE catalog operation — `ALTER VIEW <table> AS ...` naming the new base version and the batch it
covers — switches readers over; the view returns the same rows before and after. Replaced base
versions (and leftovers of an interrupted compaction) are dropped only `gc-grace` seconds after
they were replaced, so queries still running in other JVMs never lose their files.

The base is rewritten to the table's current schema: each visible column in its current
physical column, dropped columns left out.

Small-file merging (`merge_small_files`): every micro-batch leaves its own small raw partition,
and the changelog view would list them all forever. Once a compaction covers batch U, the
committed raw rows up to U are rewritten, with the merged rows of earlier merges, into ONE new
directory of the table's merged changelog `tN_hist`, and its single partition is switched there
with `ALTER TABLE ... PARTITION (_part=0) SET LOCATION`; then ONE `ALTER VIEW` moves the
changelog view's boundary U (a constant of the view text: merged batches <= U, raw batches > U).
A reader resolves the view text once, then lists the merged files: with the old text it reads
batches <= U_old from whichever files it meets (both hold them) and the raw batches after U_old;
with the new text it can only meet the new files (the switch came first). So every combination
is exact, provided the raw batches in (U_old, U] stay listed: the merged raw partitions are
dropped from the catalog, and their files deleted, only `gc-grace` seconds later (a trash record
carries both), like every replaced directory — a query planned before the switch in another JVM
still finds every partition and file it listed.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from typing import TYPE_CHECKING

from sluice.spark_sink import tables as T
from sluice.spark_sink.layout import Files, Layout, q

if TYPE_CHECKING:
    from sluice.spark_sink.sink import SparkSink

log = logging.getLogger(__name__)
_BASE_DIR = re.compile(r"^v(\d+)-e(\d+)$")
_BASE_PART = re.compile(r"_v=(\d+)")
_HIST_DIR = re.compile(r"^h(\d+)-u(\d+)-e(\d+)$")
_RAW_PART = re.compile(r"_batch=(\d+)/_epoch=(\d+)")


def compaction_select(st: T.TableState, layout: T.Layout, upto_batch: int) -> str:
    """Rows of the new base: the current state up to batch `upto_batch`, as base columns."""
    current = {c.phys[-1][0]: c for c in st.visible}
    cols = []
    for p, t in st.phys_columns():
        c = current.get(p)
        cols.append(f"CAST({q(c.name)} AS {t}) AS {q(p)}" if c is not None else f"CAST(NULL AS {t}) AS {q(p)}")
    inner = T.state_query(st, layout, st.base_version, st.base_upto, upto_batch=upto_batch, with_meta=True)
    return (f"SELECT 'c' AS `_op`, `_commit_ts`, `_seq`, CAST({st.version} AS BIGINT) AS `_schema_ver`, "
            f"CAST(NULL AS STRING) AS `_producer`, CAST(NULL AS STRING) AS `_pos`, "
            f"CAST(NULL AS BIGINT) AS `_ts_ms`, `_zero_dates`, {', '.join(cols)} FROM ({inner}) s")


def compact(sink: SparkSink, st: T.TableState) -> T.TableState:
    """Compact one table up to the sink's last committed batch; returns the new state."""
    spark, layout, files = sink.spark, sink.layout, sink.files
    assert files is not None
    last = sink._last
    upto = last.batch if last is not None else 0
    if upto <= st.base_upto:
        return st
    existing = [int(m.group(1)) for r in spark.sql(f"SHOW PARTITIONS {layout.base(st.table_id)}").collect()
                if (m := _BASE_PART.search(r[0]))]
    version = max([st.base_version, *existing]) + 1
    loc = layout.base_dir(st.table_id, version, sink._epoch)
    started = time.monotonic()
    df = spark.sql(compaction_select(st, layout, upto))
    df.coalesce(max(1, spark.sparkContext.defaultParallelism // 2)).write.mode("overwrite").parquet(loc)
    spark.sql(f"ALTER TABLE {layout.base(st.table_id)} ADD IF NOT EXISTS PARTITION (`_v`={version}) "
              f"LOCATION '{loc}'")
    new = dataclasses.replace(st, base_version=version, base_upto=upto)
    # The swap: one metastore update of the view (new base + the batch it covers).
    spark.sql(f"ALTER VIEW {layout.view(st.db, st.table)} AS {T.current_view_sql(new, layout)}")
    log.info("table compacted", extra={"fields": {
        "table": f"{st.db}.{st.table}", "base_version": version, "upto_batch": upto,
        "seconds": round(time.monotonic() - started, 2)}})
    collect_garbage(sink, new)
    return new


def collect_garbage(sink: SparkSink, st: T.TableState, now_ms: int | None = None) -> int:
    """Drop base versions other than the one in use once replaced for longer than gc-grace."""
    spark, layout, files = sink.spark, sink.layout, sink.files
    assert files is not None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    parent = layout.base_dir(st.table_id, 0, 0).rsplit("/", 1)[0]
    dirs = sorted(((int(m.group(1)), int(m.group(2)), name, mtime)
                   for name, mtime in files.list_dirs(parent) if (m := _BASE_DIR.match(name))))
    in_use_since = next((mt for v, _, _, mt in dirs if v == st.base_version), now_ms)
    removed = 0
    for v, e, name, mtime in dirs:
        if v == st.base_version:
            continue
        # A version older than the one in use was replaced when the newer one was written.
        replaced_at = in_use_since if v < st.base_version else mtime
        if now_ms - replaced_at < sink.cfg.gc_grace * 1000:
            continue
        spark.sql(f"ALTER TABLE {layout.base(st.table_id)} DROP IF EXISTS PARTITION (`_v`={v})")
        files.delete(f"{parent}/{name}")
        removed += 1
    return removed


# --------------------------------------------------------------------------------------------
# Small-file merging and the trash
# --------------------------------------------------------------------------------------------

def trash(files: Files, layout: Layout, paths: list[str], now_ms: int | None = None,
          drop: tuple[str, list[str]] | None = None) -> None:
    """Schedule paths for deletion, and `drop` = (table, partition specs) for dropping from the
    catalog first, after gc-grace (one small record file per call)."""
    if not paths and not (drop and drop[1]):
        return
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    name = f"{now_ms:015d}-{abs(hash(tuple(paths))) % 10**8:08d}.json"
    rec: dict[str, object] = {"replaced_ms": now_ms, "paths": paths}
    if drop and drop[1]:
        rec["drop_table"], rec["drop_partitions"] = drop
    files.write_bytes(f"{layout.trash_dir()}/{name}", json.dumps(rec).encode())


def empty_trash(sink: SparkSink, now_ms: int | None = None) -> int:
    """Delete what was trashed more than gc-grace ago; returns how many paths were deleted."""
    files, layout = sink.files, sink.layout
    assert files is not None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    removed = 0
    for name, _ in sorted(files.list_files(layout.trash_dir())):
        path = f"{layout.trash_dir()}/{name}"
        try:
            rec = json.loads(files.read_text(path))
        except ValueError:
            files.delete(path)  # a record torn by a crash while written: its paths leak
            continue
        if now_ms - int(rec["replaced_ms"]) < sink.cfg.gc_grace * 1000:
            continue
        if rec.get("drop_partitions"):
            # Catalog first: a partition whose directory is gone already lists as empty, a
            # directory whose partition is gone is only a leak.
            sink.spark.sql(f"ALTER TABLE {rec['drop_table']} DROP IF EXISTS " + ", ".join(
                f"PARTITION ({spec})" for spec in rec["drop_partitions"]))
        for p in rec["paths"]:
            files.delete(p)
            removed += 1
        files.delete(path)
    return removed


def partition_location(spark: object, table: str, spec: str) -> str | None:
    """The location of one partition, from the catalog (None: no such partition)."""
    try:
        rows = spark.sql(f"DESCRIBE FORMATTED {table} PARTITION ({spec})").collect()  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - the metastore's answer decides
        if "PARTITIONS_NOT_FOUND" in str(e) or "NoSuchPartition" in str(e):
            return None
        raise
    for r in rows:
        if r[0] == "Location":
            return str(r[1])
    return None


def merge_small_files(sink: SparkSink, st: T.TableState) -> T.TableState:
    """Fold the committed raw batches up to the base's batch into one new merged-changelog
    directory, switch to it with SET LOCATION, move the views' boundary, schedule the merged raw
    partitions' retirement; returns the new state (its hist_upto is the new boundary)."""
    spark, layout, files = sink.spark, sink.layout, sink.files
    assert files is not None
    upto = st.base_upto
    if not upto:
        return st
    hist = layout.hist(st.table_id)
    spark.sql(T.create_hist_sql(st, layout))
    have = {f.name for f in spark.table(hist).schema.fields}
    missing = [(n, t) for n, t in st.phys_columns() if n not in have]
    if missing:
        spark.sql(f"ALTER TABLE {hist} ADD COLUMNS (" + ", ".join(f"{q(n)} {t}" for n, t in missing) + ")")
    current = partition_location(spark, hist, "`_part`=0")
    cur = _HIST_DIR.match(current.rstrip("/").rsplit("/", 1)[-1]) if current else None
    done_upto = int(cur.group(2)) if cur else 0
    if upto <= done_upto:
        # A merge that crashed after its switch left the views on an older boundary: move them.
        return _set_boundary(sink, st, done_upto) if st.hist_upto < done_upto else st
    parent = layout.hist_dir(st.table_id, 0, 0, 0).rsplit("/", 1)[0]
    existing = [(int(m.group(1)), n) for n, _ in files.list_dirs(parent) if (m := _HIST_DIR.match(n))]
    version = max([v for v, _ in existing], default=0) + 1
    # Newer than the one in use: written by a merge that crashed before its switch.
    cur_version = int(cur.group(1)) if cur else 0
    trash(files, layout, [f"{parent}/{n}" for v, n in existing if v > cur_version])
    loc = layout.hist_dir(st.table_id, version, upto, sink._epoch)
    started = time.monotonic()
    cols = T.raw_columns(st)
    src = (f"SELECT {cols} FROM {hist} WHERE `_part` = 0 UNION ALL " if current else "") + \
        (f"SELECT {cols} FROM ({T.committed_raw(st, layout, done_upto)}) x WHERE x.`_batch` <= {upto}")
    df = spark.sql(src)
    df.coalesce(1).write.mode("overwrite").parquet(loc)
    if current is None:
        spark.sql(f"ALTER TABLE {hist} ADD IF NOT EXISTS PARTITION (`_part`=0) LOCATION '{loc}'")
    else:
        # The switch of the files: readers planned from now on list the new ones (which hold
        # every batch the old ones did, so a view text with the old boundary reads the same).
        spark.sql(f"ALTER TABLE {hist} PARTITION (`_part`=0) SET LOCATION '{loc}'")
        trash(files, layout, [current])
    new = _set_boundary(sink, st, upto)
    # Retire the merged raw partitions — later: a reader that resolved a view text from before
    # this merge (or the compaction before it) still reads them, so they are dropped from the
    # catalog, like their files are deleted, only gc-grace after now (empty_trash).
    raw = layout.raw(st.table_id)
    gone = []
    for r in spark.sql(f"SHOW PARTITIONS {raw}").collect():
        m = _RAW_PART.search(r[0])
        if m and int(m.group(1)) <= upto:
            gone.append((int(m.group(1)), int(m.group(2))))
    committed = {(c.batch, c.epoch) for c in sink.committer.read()} if sink.committer else set()
    gone = [g for g in gone if g in committed]
    trash(files, layout, [layout.raw_dir(st.table_id, e, b) for b, e in gone],
          drop=(raw, [f"`_batch`={b}, `_epoch`={e}" for b, e in gone]))
    log.info("small files merged", extra={"fields": {
        "table": f"{st.db}.{st.table}", "hist_version": version, "upto_batch": upto,
        "raw_partitions_to_retire": len(gone), "seconds": round(time.monotonic() - started, 2)}})
    return new


def _set_boundary(sink: SparkSink, st: T.TableState, upto: int) -> T.TableState:
    """The views read merged batches <= upto: the state first (open rewrites every view from
    it), then the changelog view — ONE catalog operation for new readers."""
    new = dataclasses.replace(st, hist_upto=upto)
    sink._persist_state(new)
    sink.spark.sql(f"ALTER VIEW {sink.layout.changelog(st.db, st.table)} AS "
                   f"{T.changelog_sql(new, sink.layout)}")
    return new
