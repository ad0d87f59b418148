"""Spark sink landing throughput: SparkSink vs a plain `createDataFrame(rows).write.parquet(path)`.

Both sides run in ONE SparkSession (local[2], Hive metastore on a Derby network server started by
this script) in the same invocation.

- ours: SparkSink.apply() of pre-built transactions (RandomWorkload over three keyed tables: every
  Datum kind, inserts, updates, deletes, primary-key changes), --apply-batch transactions per
  call, micro-batches of --batch-rows, flush() at the end. Timed from the first apply() to the
  return of flush(): binlog decoding, type conversion, parquet files, raw partitions, the commit
  point — everything needed before a reader sees the rows. Opening the sink (catalog set-up,
  recovery) and the schema-snapshot transaction (creates each table's raw/base tables and views)
  are one-time and not timed.
- baseline: exactly the rows the sink landed (read back from its raw tables, collected to Python
  before the clock starts), written per table with `spark.createDataFrame(rows, schema,
  verifySchema=False).write.parquet(dir)` — the least Spark can do to put those rows in parquet;
  no catalog, no visibility guarantee. verifySchema=False as in the sink, so the baseline is not
  slowed by checks ours skips.

rows/s = changelog rows landed (a primary-key change lands as two rows) / wall seconds. A small
warm-up of both paths runs first (JIT, metastore schema creation) and is not reported. Ours is
checked against the workload's model (row counts of the current-state views), so a fast wrong
answer cannot win. The machine is shared: the load average is printed; compare ratios within one
run only.

Also printed: where our time went (summed over the timed runs' commits: decode = binlog
decoding and type conversion in apply(); convert = rows into physical column order; files =
createDataFrame + parquet write of every table, tables in parallel; partitions = one raw
`ADD PARTITION` per table; commit = the commit record and the commit point).

Second table (--view-rows, 0 to skip): the current-state view of one table whose compacted base
holds --view-rows rows, with a changelog tail of --tail-rows changes landed through the sink
(updates, inserts, deletes of random keys) vs a scan of the compacted base alone — what the view's
latest-per-key window over base + tail costs. Both run `SELECT count(*), sum(v)`, median of
--repeat, same session.

Run: .venv/bin/python bench/spark_sink.py [--changes 200000] [--batch-rows 100000] [--repeat 2]
     [--view-rows 1000000] [--tail-rows 100000]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TZ", "UTC")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from sluice.drainer.server import tune_gc  # noqa: E402
from sluice.drainer.sink import Checkpoint  # noqa: E402
from sluice.drainer.txn import SchemaHistory, Txn  # noqa: E402
from sluice.spark_sink.config import SparkSinkConfig  # noqa: E402
from sluice.spark_sink.metastore import DerbyServer  # noqa: E402
from sluice.spark_sink.session import session  # noqa: E402
from sluice.spark_sink.sink import SparkSink  # noqa: E402
from tests.support.procs import free_port  # noqa: E402
from tests.support.rows import (RandomWorkload, Table, col, history_of, prewrite_value,  # noqa: E402
                                schema_txn, txn)

T0 = 1 << 40


def workload(changes: int, seed: int) -> tuple[list[Txn], RandomWorkload, SchemaHistory]:
    wl = RandomWorkload(seed, "bench", keys=max(100, changes // 4), max_rows=5, keyless=False)
    txns = wl.transactions(1, T0)
    while wl.rows < changes:
        txns.append(txn(wl.next_value(), T0 + len(txns)))
    return txns, wl, history_of(txns)


def config(work: Path, port: int, name: str, batch_rows: int) -> SparkSinkConfig:
    return SparkSinkConfig(master="local[2]", metastore=f"127.0.0.1:{port}",
                           warehouse=str(work / "warehouse"), shuffle_partitions=2,
                           log_level="ERROR", root=str(work / name), meta_database=f"m_{name}",
                           database=f"{name}_{{schema}}", batch_rows=batch_rows,
                           batch_interval=3600.0,
                           spark_conf={"spark.ui.showConsoleProgress": "false",
                                       "spark.driver.memory": "1g"})


def run_sink(spark: Any, cfg: SparkSinkConfig, txns: list[Txn], schema: SchemaHistory,
             apply_batch: int) -> tuple[float, SparkSink]:
    sink = SparkSink(cfg, schema, source_name="bench", epoch=1, spark=spark)

    async def go() -> float:
        await sink.open(Checkpoint(0))
        # One-time per table, like open(): the schema-snapshot transaction creates the raw and
        # base tables and the views (no data batch). Steady-state landing is what is timed.
        await sink.apply(txns[:1])
        await sink.flush()
        t = time.perf_counter()
        for i in range(1, len(txns), apply_batch):
            await sink.apply(txns[i:i + apply_batch])
        await sink.flush()
        return time.perf_counter() - t

    return asyncio.run(go()), sink


def landed(spark: Any, sink: SparkSink) -> list[tuple[Any, list[Any]]]:
    """(schema, rows) per table exactly as the sink landed them (raw table, partition columns
    dropped), collected to Python."""
    out = []
    for tid in sorted(sink._states):
        df = spark.table(sink.layout.raw(tid)).drop("_batch", "_epoch")
        # Plain tuples, as the sink hands createDataFrame (Row objects cost more to convert).
        out.append((df.schema, [tuple(r) for r in df.collect()]))
    return out


def run_baseline(spark: Any, tables: list[tuple[Any, list[Any]]], root: Path) -> float:
    t = time.perf_counter()
    for i, (schema, rows) in enumerate(tables):
        spark.createDataFrame(rows, schema, verifySchema=False).write.parquet(str(root / f"t{i}"))
    return time.perf_counter() - t


def check(spark: Any, name: str, wl: RandomWorkload) -> None:
    for t in wl.tables:
        got = spark.sql(f"SELECT count(*) FROM {name}_bench.{t.name}").collect()[0][0]
        assert got == len(wl.model[t.name]), f"{name}: {t.name} has {got} rows, model {len(wl.model[t.name])}"


BIG = Table(900, "bench", "big", [col("id", "bigint(20)", nullable=False), col("v", "bigint(20)"),
                                  col("s", "varchar(20)")], primary=["id"])


def view_bench(spark: Any, work: Path, port: int, args: argparse.Namespace) -> None:
    """Current-state view (compacted base of --view-rows + a --tail-rows changelog tail) vs the
    compacted base alone."""
    import dataclasses
    import random

    from sluice.spark_sink import tables as T
    n, tail = args.view_rows, args.tail_rows
    cfg = config(work, port, "view", max(args.batch_rows, tail + 1))
    schema = SchemaHistory()
    first = schema_txn(T0, BIG)
    schema.apply(first)
    sink = SparkSink(cfg, schema, source_name="bench", epoch=1, spark=spark)

    async def land(txns: list[Txn]) -> None:
        await sink.apply(txns)
        await sink.flush()

    asyncio.run(sink.open(Checkpoint(0)))
    asyncio.run(land([first]))
    st = sink._states[BIG.table_id]
    # The compacted base: --view-rows rows written by Spark straight into a base version, as
    # compaction leaves it (a fold of --view-rows inserts through the sink would take minutes).
    t = time.perf_counter()
    phys = dict(st.physical)
    cols = {"_op": "'c'", "_commit_ts": f"CAST({T0} + 1 AS BIGINT)", "_seq": "CAST(0 AS INT)",
            "_schema_ver": f"CAST({st.version} AS BIGINT)", "_producer": "CAST(NULL AS STRING)",
            "_pos": "CAST(NULL AS STRING)", "_ts_ms": "CAST(NULL AS BIGINT)",
            "_zero_dates": "CAST(NULL AS ARRAY<STRING>)", "id": "id", "v": "id * 7",
            "s": "concat('row', CAST(id AS STRING))"}
    sel = ", ".join(f"CAST({cols[c]} AS {phys.get(c, dict(T.META_COLUMNS).get(c))}) AS `{c}`"
                    for c in [m for m, _ in T.META_COLUMNS] + list(phys))
    loc = sink.layout.base_dir(BIG.table_id, 1, 1)
    spark.sql(f"SELECT {sel} FROM range({n})").coalesce(2).write.mode("overwrite").parquet(loc)
    spark.sql(f"ALTER TABLE {sink.layout.base(BIG.table_id)} ADD PARTITION (`_v`=1) LOCATION '{loc}'")
    # A schema-only transaction commits no batch: the base then covers "batch 0".
    upto = sink.checkpoint().sink_state.get("batch", 0)
    st = dataclasses.replace(st, base_version=1, base_upto=upto)
    sink._states[BIG.table_id] = st
    spark.sql(f"ALTER VIEW {sink.layout.view(st.db, st.table)} AS {T.current_view_sql(st, sink.layout)}")
    # The tail: --tail-rows changes through the sink (updates of existing keys, new keys, deletes).
    rng = random.Random(5)
    txns, changes, next_id, ts = [], 0, n, T0 + 2
    model_count, model_sum = n, sum(i * 7 for i in range(n))
    touched: dict[int, int | None] = {}
    while changes < tail:
        ch = []
        for _ in range(10):
            r = rng.random()
            if r < 0.8:
                k = rng.randrange(n)
                if touched.get(k, k * 7) is None:
                    continue
                old = touched.get(k, k * 7)
                ch.append(BIG.update({"id": k, "v": old, "s": f"row{k}"}, {"v": old + 1}))
                touched[k] = old + 1
                model_sum += 1
            elif r < 0.9:
                ch.append(BIG.insert(id=next_id, v=1, s="new"))
                next_id += 1
                model_count += 1
                model_sum += 1
            else:
                k = rng.randrange(n)
                old = touched.get(k, k * 7)
                if old is None:
                    continue
                ch.append(BIG.delete(id=k, v=old, s=f"row{k}"))
                touched[k] = None
                model_count -= 1
                model_sum -= old
        if ch:
            txns.append(txn(prewrite_value(BIG.mutation(*ch)), ts))
            ts += 1
            changes += len(ch)
    asyncio.run(land(txns))
    setup = time.perf_counter() - t
    view_q = f"SELECT count(*), sum(v) FROM {sink.layout.view(st.db, st.table)}"
    base_q = f"SELECT count(*), sum(`v`) FROM {sink.layout.base(BIG.table_id)} WHERE `_v` = 1"
    got = spark.sql(view_q).collect()[0]
    assert (got[0], got[1]) == (model_count, model_sum), (tuple(got), model_count, model_sum)
    spark.sql(base_q).collect()
    view_s, base_s = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        spark.sql(base_q).collect()
        base_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        spark.sql(view_q).collect()
        view_s.append(time.perf_counter() - t)
    v, b = statistics.median(view_s), statistics.median(base_s)
    load = os.getloadavg()
    print(f"# Current-state view: compacted base {n:,} rows + changelog tail {changes:,} changes "
          f"(set-up {setup:.0f} s); SELECT count(*), sum(v); median of {args.repeat}; load {load[0]:.1f}")
    print(f"each run (s): view {[round(x, 2) for x in view_s]}, base alone {[round(x, 2) for x in base_s]}")
    print("| what | baseline | ours | ratio |")
    print("|---|---|---|---|")
    print(f"| scan the table (baseline: compacted base alone, {n:,} rows; ours: current-state view, "
          f"base + {changes:,}-change tail) | {b:.2f} s | {v:.2f} s | {b / v:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--batch-rows", type=int, default=SparkSinkConfig.batch_rows)  # the sink's default
    ap.add_argument("--view-rows", type=int, default=1_000_000)
    ap.add_argument("--tail-rows", type=int, default=100_000)
    ap.add_argument("--apply-batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    tune_gc()   # the drainer process's GC settings: the sink runs inside it
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    derby = DerbyServer(work / "derby", free_port()).start()
    spark = None
    try:
        spark = session(config(work, derby.port, "warm", args.batch_rows))
        # Warm-up (not reported): metastore schema, JIT, both code paths on a small workload.
        txns, wl, h = workload(300, 1)
        _, sink = run_sink(spark, config(work, derby.port, "warm", args.batch_rows), txns, h,
                           args.apply_batch)
        run_baseline(spark, landed(spark, sink), work / "base-warm")
        txns, wl, h = workload(args.changes, 2)
        ours_s: list[float] = []
        base_s: list[float] = []
        rows = 0
        spent: dict[str, float] = {}
        for r in range(args.repeat):
            name = f"run{r}"
            t, sink = run_sink(spark, config(work, derby.port, name, args.batch_rows), txns,
                               history_of(txns), args.apply_batch)
            check(spark, name, wl)
            ours_s.append(t)
            for k, v in sink.timings.items():
                spent[k] = spent.get(k, 0.0) + v
            tables = landed(spark, sink)
            rows = sum(len(x[1]) for x in tables)
            batches = sink.checkpoint().sink_state["batch"]
            base_s.append(run_baseline(spark, tables, work / f"base-{r}"))
        ours, base = statistics.median(ours_s), statistics.median(base_s)
        load = os.getloadavg()
        print(f"# Spark sink landing: {len(txns) - 1} transactions, {rows} changelog rows over "
              f"3 tables, {batches} micro-batches (batch-rows {args.batch_rows}), apply() calls of "
              f"{args.apply_batch} txns, median of {args.repeat}")
        print(f"machine: {platform.machine()} {os.cpu_count()} cores, local disk, Spark local[2], "
              f"load {load[0]:.1f}, {datetime.date.today()}; total run "
              f"{time.perf_counter() - started:.0f} s")
        print(f"each run (s): ours {[round(x, 1) for x in ours_s]}, baseline "
              f"{[round(x, 1) for x in base_s]}")
        print("| what | baseline | ours | ratio | machine | date |")
        print("|---|---|---|---|---|---|")
        machine = f"{os.cpu_count()} cores, load {load[0]:.1f}"
        print(f"| rows/s landed ({rows} rows; baseline: createDataFrame+write.parquet of the same "
              f"rows; ours: SparkSink apply+flush, visible via views) | {rows / base:,.0f} "
              f"({base:.1f} s) | {rows / ours:,.0f} ({ours:.1f} s) | {base / ours:.2f}x | "
              f"{machine} | {datetime.date.today()} |")
        n = args.repeat
        print(f"where ours went (mean per run, s): decode {spent.get('decode_s', 0) / n:.1f}, "
              f"convert {spent.get('convert_s', 0) / n:.1f}, files {spent.get('files_s', 0) / n:.1f}, "
              f"partitions {spent.get('partitions_s', 0) / n:.1f}, commit {spent.get('commit_s', 0) / n:.1f} "
              f"({spent.get('batches', 0) / n:.0f} batches)")
        if args.view_rows:
            view_bench(spark, work, derby.port, args)
    finally:
        if spark is not None:
            spark.stop()
        derby.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
