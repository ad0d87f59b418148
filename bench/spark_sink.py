"""Spark sink landing throughput into Iceberg: SparkSink vs a plain Arrow-backed `writeTo().append()`.

Both sides run in ONE SparkSession (local[2], the embedded SQLite Iceberg catalog in a temp
warehouse) in the same invocation.

- ours: SparkSink.apply() of pre-built transactions (RandomWorkload over three keyed tables: every
  Datum kind, inserts, updates, deletes, primary-key changes), --apply-batch transactions per
  call, micro-batches of --batch-rows, flush() at the end. Timed from the first apply() to the
  return of flush(): binlog decoding, type conversion, the changelog appends, the current tables'
  MERGE, the marker, each published by branch + fast-forward — everything before a reader sees
  the rows. Opening the sink and the schema-snapshot transaction (table creation) are not timed.
- baseline: exactly the changelog rows the sink landed, read back per table as Arrow before the
  clock starts, then `spark.createDataFrame(arrow).writeTo(<fresh table>).append()` — the least
  Spark does to put those rows in an Iceberg table: no current state, no CAS, no checkpoint.

rows/s = changelog rows landed / wall seconds. Ours is checked against the workload's model, so a
fast wrong answer cannot win. A warm-up of both paths runs first and is not reported.

Second part (--state-rows, 0 to skip): the cost of keeping the current state. A keyed table of
--state-rows rows receives --state-batches batches of --state-changes changes each (updates of
random keys, a few inserts and deletes) through the sink, the batches taking turns between the
two ways of keeping the current state (DELETE of the keys + append, MERGE INTO); per batch, ours
(changelog append + current state + marker) vs a plain append of the same number of rows to a
table of the same size. --current picks the way for the first part.

Run: .venv/bin/python bench/spark_sink.py [--changes 200000] [--batch-rows 100000]
     [--state-rows 1000000] [--state-changes 10000] [--state-batches 5]
     [--write-mode merge-on-read|copy-on-write]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import random
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
from sluice.spark_sink.session import session  # noqa: E402
from sluice.spark_sink.sink import SparkSink  # noqa: E402
from sluice.spark_sink import writer as W  # noqa: E402
from tests.support.rows import (RandomWorkload, Table, col, history_of, prewrite_value,  # noqa: E402
                                schema_txn, txn)

T0 = 1 << 40


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def workload(changes: int, seed: int) -> tuple[list[Txn], RandomWorkload, SchemaHistory]:
    wl = RandomWorkload(seed, "bench", keys=max(100, changes // 4), max_rows=5, keyless=False)
    txns = wl.transactions(max(1, changes // 3), T0)
    return txns, wl, history_of(txns)


WRITE_MODE = "merge-on-read"
CURRENT_BY = W.DELETE_KEYS


def config(warehouse: Path, name: str, batch_rows: int) -> SparkSinkConfig:
    return SparkSinkConfig(master="local[2]", warehouse=str(warehouse), shuffle_partitions=2,
                           database=f"{name}_{{schema}}", meta_database=f"m_{name}",
                           batch_rows=batch_rows, batch_interval=3600.0, maintenance_every=0,
                           log_level="ERROR", write_mode=WRITE_MODE)


def run_sink(spark: Any, cfg: SparkSinkConfig, txns: list[Txn], schema: SchemaHistory,
             apply_batch: int) -> tuple[SparkSink, float]:
    sink = SparkSink(cfg, schema, "bench", 1, spark, owner="bench")
    sink.current_by = CURRENT_BY

    async def go() -> float:
        await sink.open(Checkpoint(0))
        await sink.apply(txns[:1])      # the schema snapshot: table creation, not timed
        await sink.flush()
        t = time.perf_counter()
        for i in range(1, len(txns), apply_batch):
            await sink.apply(txns[i:i + apply_batch])
        await sink.flush()
        return time.perf_counter() - t

    elapsed = asyncio.run(go())
    return sink, elapsed


def landed(spark: Any, sink: SparkSink) -> list[tuple[str, Any]]:
    """(table, Arrow table) of every changelog the sink wrote."""
    out = []
    for st in sink._states.values():
        out.append((st.changelog, spark.table(f"{st.db}.{st.changelog}").toArrow()))
    return out


def run_baseline(spark: Any, tables: list[tuple[str, Any]], db: str) -> float:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {db}")
    frames = []
    for name, arrow in tables:
        spark.sql(f"DROP TABLE IF EXISTS {db}.{name}")
        df = spark.createDataFrame(arrow.slice(0, 0))
        df.writeTo(f"{db}.{name}").using("iceberg").create()
        frames.append((name, arrow))
    t = time.perf_counter()
    for name, arrow in frames:
        spark.createDataFrame(arrow).writeTo(f"{db}.{name}").append()
    return time.perf_counter() - t


def check(spark: Any, name: str, wl: RandomWorkload) -> None:
    for t in wl.tables:
        rows = wl.model[t.name]
        want = len(rows)
        got = spark.sql(f"SELECT count(*) FROM {name}_bench.{t.name}").collect()[0][0]
        if got != want:
            raise SystemExit(f"{name}: {t.name} has {got} rows, the model {want}")


STATE = Table(901, "state", "kv", [col("id", "bigint(20)", nullable=False), col("v", "int(11)"),
                                   col("pad", "varchar(64)")], primary=["id"])


def state_bench(spark: Any, warehouse: Path, args: argparse.Namespace) -> None:
    rnd = random.Random(7)
    n, k = args.state_rows, args.state_changes
    schema = SchemaHistory()
    cfg = config(warehouse, "st", batch_rows=10 ** 9)
    sink = SparkSink(cfg, schema, "bench", 1, spark, owner="bench")
    ts = iter(range(T0, T0 + 10 ** 9))
    first = schema_txn(next(ts), STATE)
    schema.apply(first)
    # The initial table: n rows as snapshot reads, in 50k-row transactions.
    load = [txn(prewrite_value(STATE.mutation(*[STATE.read(id=i, v=0, pad="x" * 40)
                                                 for i in range(s, min(n, s + 50_000))])), next(ts))
            for s in range(0, n, 50_000)]

    async def land(txns: list[Txn]) -> float:
        t = time.perf_counter()
        await sink.apply(txns)
        await sink.flush()
        return time.perf_counter() - t

    async def setup() -> None:
        await sink.open(Checkpoint(0))
        await sink.apply([first])
        await sink.flush()
    asyncio.run(setup())
    log(f"state: loading {n} rows")
    asyncio.run(land(load))
    spark.sql("CREATE NAMESPACE IF NOT EXISTS st_base")
    spark.sql("DROP TABLE IF EXISTS st_base.kv")
    spark.sql("CREATE TABLE st_base.kv USING iceberg AS SELECT id, v, pad FROM st_state.kv")
    ours: dict[str, list[float]] = {"delete": [], "merge": []}
    base = []
    nxt = n
    for b in range(args.state_batches):
        changes = []
        for _ in range(k):
            r = rnd.random()
            if r < 0.9:
                i = rnd.randrange(n)
                changes.append(STATE.update({"id": i, "v": 0, "pad": "x" * 40}, {"v": b + 1}))
            elif r < 0.95:
                changes.append(STATE.insert(id=nxt, v=b, pad="y" * 40))
                nxt += 1
            else:
                changes.append(STATE.delete(id=rnd.randrange(n), v=0, pad="x" * 40))
        batch = [txn(prewrite_value(STATE.mutation(*changes[s:s + 100])), next(ts))
                 for s in range(0, k, 100)]
        # The two ways of keeping the current state take turns on the same table (they leave
        # the same rows), so both see the same table size and the same load.
        how = ("delete", "merge")[b % 2]
        sink.current_by = how
        ours[how].append(asyncio.run(land(batch)))
        rows = spark.range(k).selectExpr("id + 1000000000 AS id", "1 AS v", "'z' AS pad").toArrow()
        t = time.perf_counter()
        spark.createDataFrame(rows).writeTo("st_base.kv").append()
        base.append(time.perf_counter() - t)
        log(f"state batch {b + 1}: ours ({how}) {ours[how][-1]:.2f} s, plain append {base[-1]:.2f} s, "
            f"load {os.getloadavg()[0]:.1f}")
    got = spark.sql("SELECT count(*), count(DISTINCT id) FROM st_state.kv").collect()[0]
    if got[0] != got[1]:
        raise SystemExit(f"state: {got[0]} rows but {got[1]} keys")
    mb = statistics.median(base)
    print(f"\nCurrent state of a {n}-row keyed table, batches of {k} changes (median of "
          f"{args.state_batches // 2}-{(args.state_batches + 1) // 2} per method, write-mode "
          f"{WRITE_MODE}, load {os.getloadavg()[0]:.1f}):")
    print(f"| what | ms per batch | rows/s | baseline time / ours |\n|---|---|---|---|")
    print(f"| plain append of {k} rows (baseline) | {mb * 1000:.0f} | {k / mb:,.0f} | 1 |")
    for how, label in (("delete", "DELETE keys + append"), ("merge", "MERGE")):
        if ours[how]:
            mo = statistics.median(ours[how])
            print(f"| sink: changelog + {label} + marker | {mo * 1000:.0f} | {k / mo:,.0f} | "
                  f"{mb / mo:.2f}x |")
    asyncio.run(sink.close())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--batch-rows", type=int, default=SparkSinkConfig.batch_rows)
    ap.add_argument("--apply-batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--state-rows", type=int, default=1_000_000)
    ap.add_argument("--state-changes", type=int, default=10_000)
    ap.add_argument("--state-batches", type=int, default=5)
    ap.add_argument("--write-mode", default="merge-on-read", choices=("merge-on-read", "copy-on-write"))
    ap.add_argument("--current", default=W.DELETE_KEYS, choices=(W.DELETE_KEYS, W.MERGE),
                    help="how the sink keeps a keyed current table in the first part")
    args = ap.parse_args()
    global WRITE_MODE, CURRENT_BY
    WRITE_MODE = args.write_mode
    CURRENT_BY = args.current
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-spark-"))
    warehouse = work / "warehouse"
    cfg = config(warehouse, "warm", args.batch_rows)
    spark = session(cfg)
    try:
        log("warm-up")
        txns, wl, schema = workload(3000, 1)
        sink, _ = run_sink(spark, cfg, txns, schema, args.apply_batch)
        run_baseline(spark, landed(spark, sink), "warm_base")
        ours, base, rows = [], [], 0
        for r in range(args.repeat):
            name = f"r{r}"
            txns, wl, schema = workload(args.changes, 10 + r)
            log(f"round {r + 1}: sink ({len(txns)} transactions)")
            sink, t_ours = run_sink(spark, config(warehouse, name, args.batch_rows), txns, schema,
                                    args.apply_batch)
            check(spark, name, wl)
            tables = landed(spark, sink)
            n = sum(a.num_rows for _, a in tables)
            log(f"round {r + 1}: baseline ({n} rows)")
            t_base = run_baseline(spark, tables, f"{name}_base")
            ours.append(n / t_ours)
            base.append(n / t_base)
            rows = n
            log(f"round {r + 1}: ours {n / t_ours:,.0f} rows/s, baseline {n / t_base:,.0f} rows/s; "
                f"sink steps {({k: round(v, 2) for k, v in sink.timings.items()})}")
        mo, mb = statistics.median(ours), statistics.median(base)
        print(f"\nSpark sink into Iceberg — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
              f"UTC, {os.cpu_count()} cores, {platform.python_version()}, load {os.getloadavg()[0]:.1f}")
        print(f"{rows} changelog rows per round, batch-rows {args.batch_rows}, median of {args.repeat}")
        print("| what | rows/s |\n|---|---|")
        print(f"| baseline: createDataFrame(arrow).writeTo().append() | {mb:,.0f} |")
        print(f"| SparkSink (decode + changelog + current by {CURRENT_BY} + marker, CAS) | {mo:,.0f} |")
        print(f"ratio: {mo / mb:.2f}x (goal >= 0.8x)")
        if args.state_rows:
            state_bench(spark, warehouse, args)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
