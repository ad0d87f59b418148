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

Run: .venv/bin/python bench/spark_sink.py [--changes 30000] [--batch-rows 50000] [--repeat 2]
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

from sluice.drainer.sink import Checkpoint  # noqa: E402
from sluice.drainer.txn import SchemaHistory, Txn  # noqa: E402
from sluice.spark_sink.config import SparkSinkConfig  # noqa: E402
from sluice.spark_sink.metastore import DerbyServer  # noqa: E402
from sluice.spark_sink.session import session  # noqa: E402
from sluice.spark_sink.sink import SparkSink  # noqa: E402
from tests.support.procs import free_port  # noqa: E402
from tests.support.rows import RandomWorkload, history_of, txn  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=30_000)
    ap.add_argument("--batch-rows", type=int, default=50_000)  # the sink's default
    ap.add_argument("--apply-batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
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
        for r in range(args.repeat):
            name = f"run{r}"
            t, sink = run_sink(spark, config(work, derby.port, name, args.batch_rows), txns,
                               history_of(txns), args.apply_batch)
            check(spark, name, wl)
            ours_s.append(t)
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
    finally:
        if spark is not None:
            spark.stop()
        derby.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
