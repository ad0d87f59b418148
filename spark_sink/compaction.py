"""Compaction: fold the changelog tail into a new base version and swap it in atomically.

Invariant: a reader of `<table>` never sees a torn or missing table. The new base is written to
a new location and registered as a new partition of the base table (invisible to the view), then
ONE catalog operation — `ALTER VIEW <table> AS ...` naming the new base version and the batch it
covers — switches readers over; the view returns the same rows before and after. Replaced base
versions (and leftovers of an interrupted compaction) are dropped only `gc-grace` seconds after
they were replaced, so queries still running in other JVMs never lose their files.

The base is rewritten to the table's current schema: each visible column in its current
physical column, dropped columns left out.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import TYPE_CHECKING

from sluice.spark_sink import tables as T
from sluice.spark_sink.layout import q

if TYPE_CHECKING:
    from sluice.spark_sink.sink import SparkSink

log = logging.getLogger(__name__)
_BASE_DIR = re.compile(r"^v(\d+)-e(\d+)$")
_BASE_PART = re.compile(r"_v=(\d+)")


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
