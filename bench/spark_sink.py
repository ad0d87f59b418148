"""Spark sink landing throughput into Iceberg: SparkSink vs a plain Arrow-backed `writeTo().append()`.

Both sides run in ONE SparkSession (local[2], the embedded SQLite Iceberg catalog in a temp
warehouse) in the same invocation.

- ours: SparkSink.apply() of pre-built transactions (RandomWorkload over three keyed tables: every
  Datum kind, inserts, updates, deletes, primary-key changes), --apply-batch transactions per
  call, micro-batches of --batch-rows, flush() at the end. Timed from the first apply() to the
  return of flush(): binlog decoding, type conversion, the changelog appends, the current tables'
  writes, the marker, each published by branch + fast-forward — everything before a reader sees
  the rows. Opening the sink and the schema-snapshot transaction (table creation) are not timed.
- baseline: exactly the changelog rows the sink landed, read back per table as Arrow before the
  clock starts, then `spark.createDataFrame(arrow).writeTo(<fresh table>).append()` — the least
  Spark does to put those rows in an Iceberg table: no current state, no CAS, no checkpoint.

rows/s = changelog rows landed / wall seconds. Ours is checked against the workload's model, so a
fast wrong answer cannot win. A warm-up of both paths runs first and is not reported.

--current: the ways of keeping a keyed current table to compare (comma-separated; each round
runs every one of them, in a rotating order, plus the baseline): delete-all (the DELETE of every
changed key: the sink before the insert-first rule), delete (the DELETE of the keys not inserted
first: the default), equality-deletes (an equality-delete file, no scan), merge (MERGE INTO);
each optionally as `<method>/spark`: every write through Spark jobs, as before the direct writes
(spark_sink/datafiles.py), or `delete/scan`: direct appends but the keys removed by a Spark
DELETE job (before spark_sink/positions.py), so old and new alternate in one invocation.

Second part (--state-rows, 0 to skip): the cost of keeping the current state. A keyed table of
--state-rows rows receives --state-batches batches of --state-changes changes each (updates of
random keys, a few inserts and deletes) through the sink, the batches taking turns between the
--state-methods (same table, so each sees the same table size and load; equality-delete files
left by earlier batches are applied by every later scan, whatever its method); per batch, ours
(changelog append + current state + marker) vs a plain append of the same number of rows to a
table of the same size.

Run: .venv/bin/python bench/spark_sink.py [--changes 200000] [--batch-rows 100000]
     [--current delete-all,delete,equality-deletes] [--state-methods delete-all,delete,equality-deletes]
     [--state-rows 1000000] [--state-changes 10000] [--state-batches 6]
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

from sluice.drainer.main import tune_gc  # noqa: E402
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
ALL_METHODS = (W.DELETE_ALL, W.DELETE_KEYS, W.EQUALITY_DELETES, W.MERGE)


def config(warehouse: Path, name: str, batch_rows: int) -> SparkSinkConfig:
    return SparkSinkConfig(master="local[2]", warehouse=str(warehouse), shuffle_partitions=2,
                           database=f"{name}_{{schema}}", meta_database=f"m_{name}",
                           batch_rows=batch_rows, batch_interval=3600.0, maintenance_every=0,
                           log_level="ERROR", write_mode=WRITE_MODE)


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


# A method spelled `<method>/spark` writes every table through Spark (SparkSink.direct_writes
# False: the path before datafiles.py, kept for partitioned tables), for an old-vs-new
# comparison in one invocation.
SPARK_WRITES = "/spark"
# `delete/scan`: the direct appends, but the keys removed by a Spark DELETE job (the sink's
# default before the driver found the positions itself, spark_sink/positions.py).
SPARK_DELETE = "/scan"


def methods(text: str) -> list[str]:
    out = [m.strip() for m in text.split(",") if m.strip()]
    for m in out:
        if m.removesuffix(SPARK_WRITES).removesuffix(SPARK_DELETE) not in ALL_METHODS:
            raise SystemExit(f"unknown method {m!r}: one of {', '.join(ALL_METHODS)}, each "
                             f"optionally with {SPARK_WRITES} or {SPARK_DELETE}")
    return out


def set_method(sink: SparkSink, how: str, cache: Any) -> None:
    """How `sink` keeps its current tables for the next batch (a method of methods())."""
    sink.current_by = how.removesuffix(SPARK_WRITES).removesuffix(SPARK_DELETE)
    sink.direct_writes = not how.endswith(SPARK_WRITES)
    sink.key_cache = None if how.endswith(SPARK_DELETE) else cache


def run_sink(spark: Any, cfg: SparkSinkConfig, txns: list[Txn], schema: SchemaHistory,
             apply_batch: int, how: str) -> tuple[SparkSink, float]:
    sink = SparkSink(cfg, schema, "bench", 1, spark, owner="bench")
    set_method(sink, how, sink.key_cache)

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
    cache = sink.key_cache
    ts = iter(range(T0, T0 + 10 ** 9))
    first = schema_txn(next(ts), STATE)
    schema.apply(first)
    # The initial table: n rows as snapshot reads, in 50k-row transactions.
    initial = [txn(prewrite_value(STATE.mutation(*[STATE.read(id=i, v=0, pad="x" * 40)
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
    asyncio.run(land(initial))
    spark.sql("CREATE NAMESPACE IF NOT EXISTS st_base")
    spark.sql("DROP TABLE IF EXISTS st_base.kv")
    spark.sql("CREATE TABLE st_base.kv USING iceberg AS SELECT id, v, pad FROM st_state.kv")
    ways = methods(args.state_methods)
    ours: dict[str, list[float]] = {m: [] for m in ways}
    loads: dict[str, list[float]] = {m: [] for m in ways}
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
        how = ways[b % len(ways)]
        set_method(sink, how, cache)
        ours[how].append(asyncio.run(land(batch)))
        loads[how].append(os.getloadavg()[0])
        rows = spark.range(k).selectExpr("id + 1000000000 AS id", "1 AS v", "'z' AS pad").toArrow()
        t = time.perf_counter()
        spark.createDataFrame(rows).writeTo("st_base.kv").append()
        base.append(time.perf_counter() - t)
        log(f"state batch {b + 1}: ours ({how}) {ours[how][-1]:.2f} s, plain append {base[-1]:.2f} s, "
            f"load {load()}")
    got = spark.sql("SELECT count(*), count(DISTINCT id) FROM st_state.kv").collect()[0]
    if got[0] != got[1]:
        raise SystemExit(f"state: {got[0]} rows but {got[1]} keys")
    mb = statistics.median(base)
    print(f"\nCurrent state of a {n}-row keyed table, batches of {k} changes (median of "
          f"{min(map(len, ours.values()))}-{max(map(len, ours.values()))} per method, write-mode "
          f"{WRITE_MODE}, load {load()}):")
    print("| what | ms per batch | rows/s | baseline time / ours | load (1 min) |\n"
          "|---|---|---|---|---|")
    print(f"| plain append of {k} rows (baseline) | {mb * 1000:.0f} | {k / mb:,.0f} | 1 | |")
    for how in ways:
        if ours[how]:
            mo = statistics.median(ours[how])
            print(f"| sink: changelog + current by {how} + marker | {mo * 1000:.0f} | "
                  f"{k / mo:,.0f} | {mb / mo:.2f}x | "
                  f"{', '.join(f'{x:.1f}' for x in loads[how])} |")
    asyncio.run(sink.close())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--batch-rows", type=int, default=SparkSinkConfig.batch_rows)
    ap.add_argument("--apply-batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--state-rows", type=int, default=1_000_000)
    ap.add_argument("--state-changes", type=int, default=10_000)
    ap.add_argument("--state-batches", type=int, default=6)
    ap.add_argument("--state-methods", default=f"{W.DELETE_ALL},{W.DELETE_KEYS},{W.EQUALITY_DELETES}",
                    help="the ways of keeping the current state the second part alternates")
    ap.add_argument("--write-mode", default="merge-on-read", choices=("merge-on-read", "copy-on-write"))
    ap.add_argument("--current", default=W.DELETE_KEYS,
                    help="how the sink keeps a keyed current table in the first part (comma-"
                         f"separated, alternating: {', '.join(ALL_METHODS)}; `<method>/spark`: "
                         "every write through Spark, the path before direct writes)")
    ap.add_argument("--gc", default="drainer", choices=("drainer", "default"),
                    help="the process's cyclic GC: as the drainer sets it (default) or Python's")
    args = ap.parse_args()
    global WRITE_MODE
    WRITE_MODE = args.write_mode
    ways = methods(args.current)
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-spark-"))
    warehouse = work / "warehouse"
    cfg = config(warehouse, "warm", args.batch_rows)
    spark = session(cfg)
    if args.gc == "drainer":
        tune_gc()   # the drainer process's GC setting (drainer/main.py), under which the sink runs
    try:
        log("warm-up")
        txns, wl, schema = workload(3000, 1)
        for i, how in enumerate(ways):
            sink, _ = run_sink(spark, config(warehouse, f"warm{i}", args.batch_rows), txns,
                               schema, args.apply_batch, how)
        run_baseline(spark, landed(spark, sink), "warm_base")
        ours: dict[str, list[float]] = {m: [] for m in ways}
        loads: dict[str, list[float]] = {m: [] for m in ways}
        steps: dict[str, list[dict[str, float]]] = {m: [] for m in ways}
        base, base_loads, rows = [], [], 0
        for r in range(args.repeat):
            txns, wl, schema = workload(args.changes, 10 + r)
            # Every method on the same transactions, in a rotating order, then the baseline.
            order = ways[r % len(ways):] + ways[:r % len(ways)]
            for how in order:
                name = f"r{r}{ways.index(how)}"
                log(f"round {r + 1}: sink by {how} ({len(txns)} transactions)")
                sink, t_ours = run_sink(spark, config(warehouse, name, args.batch_rows), txns,
                                        schema, args.apply_batch, how)
                check(spark, name, wl)
                tables = landed(spark, sink)
                n = sum(a.num_rows for _, a in tables)
                ours[how].append(n / t_ours)
                loads[how].append(os.getloadavg()[0])
                steps[how].append({k: round(v, 2) for k, v in sink.timings.items()})
                log(f"round {r + 1}: ours by {how} {n / t_ours:,.0f} rows/s, load {load()}; "
                    f"sink steps {steps[how][-1]}")
            log(f"round {r + 1}: baseline ({n} rows)")
            t_base = run_baseline(spark, tables, f"r{r}_base")
            base.append(n / t_base)
            base_loads.append(os.getloadavg()[0])
            rows = n
            log(f"round {r + 1}: baseline {n / t_base:,.0f} rows/s, load {load()}")
        mb = statistics.median(base)
        print(f"\nSpark sink into Iceberg — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
              f"UTC, {os.cpu_count()} cores, {platform.python_version()}, load {load()}")
        print(f"{rows} changelog rows per round, batch-rows {args.batch_rows}, median of {args.repeat}, gc {args.gc}")
        print("| what | rows/s | ratio (goal >= 0.8x) | load (1 min) per round |\n|---|---|---|---|")
        print(f"| baseline: createDataFrame(arrow).writeTo().append() | {mb:,.0f} | 1 | "
              f"{', '.join(f'{x:.1f}' for x in base_loads)} |")
        for how in ways:
            mo = statistics.median(ours[how])
            print(f"| SparkSink (decode + changelog + current by {how} + marker, CAS) | {mo:,.0f} | "
                  f"{mo / mb:.2f}x | {', '.join(f'{x:.1f}' for x in loads[how])} |")
        for how in ways:
            print(f"steps by {how}: {steps[how]}")
        if args.state_rows:
            state_bench(spark, warehouse, args)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
