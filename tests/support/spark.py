"""Spark test support: one Derby metastore + one shared SparkSession per test module, and the
helpers every Spark test compares with (model rows, view rows, expected changelog entries).

A session costs 10-20 s on this machine and the first metastore statement another 15-20 s, so
a module shares both (`spark_env`); tests isolate themselves by catalog names and roots.

`warm_metastore` creates the metastore schema AND one row of every DataNucleus id sequence the
sink uses (database, table, partition, view, column descriptors, properties) once, from one JVM:
DataNucleus creates those SEQUENCE_TABLE rows lazily, and JVMs doing it at the same time on a
fresh Derby collide on duplicate keys. After it, several JVMs can open sinks at once.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import decimal
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluice.core.rowcodec import python_to_datum, row_to_dict
from sluice.drainer.sink import load_sink
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import types as ST
from sluice.spark_sink.config import SessionConfig, SparkSinkConfig
from sluice.spark_sink.metastore import DerbyServer
from sluice.spark_sink.tables import key_of_info
from tests.support.procs import REPO, free_port, sluice_argv
from tests.support.rows import RandomWorkload, Table, history_of


@dataclass
class SparkEnv:
    derby: DerbyServer
    spark: Any
    workdir: Path
    session_cfg: SessionConfig

    def sink_config(self, name: str, **kw: Any) -> SparkSinkConfig:
        """A sink config with its own root and meta database (tests share one catalog)."""
        kw.setdefault("batch_rows", 100_000)
        kw.setdefault("batch_interval", 3600.0)
        return SparkSinkConfig(
            master=self.session_cfg.master, metastore=self.session_cfg.metastore,
            warehouse=self.session_cfg.warehouse, shuffle_partitions=2,
            root=str(self.workdir / name), meta_database=f"m_{name}",
            database=f"{name}_{{schema}}", **kw)

    def rows(self, sql: str) -> list[Any]:
        return self.spark.sql(sql).collect()


def session_config(port: int, workdir: Path) -> SessionConfig:
    return SessionConfig(master="local[2]", metastore=f"127.0.0.1:{port}",
                         warehouse=str(workdir / "warehouse"), shuffle_partitions=2,
                         log_level="ERROR",
                         spark_conf={"spark.ui.showConsoleProgress": "false",
                                     "spark.driver.memory": "768m"})


def warm_metastore(spark: Any, workdir: Path) -> None:
    """Create the metastore schema and every id sequence the sink's statements need, once."""
    loc = workdir / "warmup"
    spark.sql("CREATE DATABASE IF NOT EXISTS sluice_warmup")
    spark.sql(f"CREATE TABLE IF NOT EXISTS sluice_warmup.t (a BIGINT, b STRING, p BIGINT) "
              f"USING parquet PARTITIONED BY (p) LOCATION '{loc}/t'")
    spark.sql(f"ALTER TABLE sluice_warmup.t ADD IF NOT EXISTS PARTITION (p=1) LOCATION '{loc}/p1'")
    spark.sql(f"ALTER TABLE sluice_warmup.t PARTITION (p=1) SET LOCATION '{loc}/p1b'")
    spark.sql("ALTER TABLE sluice_warmup.t ADD COLUMNS (c INT)")
    spark.sql("ALTER TABLE sluice_warmup.t SET TBLPROPERTIES ('k' = 'v')")
    spark.sql("CREATE VIEW IF NOT EXISTS sluice_warmup.v AS SELECT a FROM sluice_warmup.t")
    spark.sql("ALTER VIEW sluice_warmup.v AS SELECT a, b FROM sluice_warmup.t")
    spark.sql(f"CREATE TABLE IF NOT EXISTS sluice_warmup.j (x BIGINT, batch BIGINT) USING json "
              f"PARTITIONED BY (batch) LOCATION '{loc}/j'")
    spark.sql(f"ALTER TABLE sluice_warmup.j ADD IF NOT EXISTS PARTITION (batch=1) LOCATION '{loc}/j1'")


@pytest.fixture(scope="module")
def spark_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEnv]:
    os.environ.setdefault("TZ", "UTC")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from sluice.spark_sink.session import session
    work = tmp_path_factory.mktemp("spark")
    derby = DerbyServer(work / "derby", free_port()).start()
    spark = None
    try:
        cfg = session_config(derby.port, work)
        spark = session(cfg)
        warm_metastore(spark, work)
        yield SparkEnv(derby, spark, work, cfg)
    finally:
        if spark is not None:
            release_metastore_thread(spark)
            spark.stop()
        derby.stop()


def release_metastore_thread(spark: Any) -> None:
    """Forget this thread's Hive metastore state. HMSHandler keeps a store and a configuration
    per JVM thread (static thread-locals), from the first metastore the thread talked to; a
    later session on another Derby, created in another thread, would reach this thread's stale
    configuration and even re-point the JVM-wide DataNucleus factory at the stopped server
    ("Connection refused" from the first statement this thread runs on the new session) —
    measured: test_spark_crash then test_matrix in one pytest process."""
    jvm = spark._jvm
    handler = jvm.org.apache.hadoop.hive.metastore.HiveMetaStore.HMSHandler
    store = handler.getRawStore()
    if store is not None:
        store.shutdown()
    handler.removeRawStore()
    field = jvm.java.lang.Class.forName(
        "org.apache.hadoop.hive.metastore.HiveMetaStore$HMSHandler").getDeclaredField(
        "threadLocalConf")
    field.setAccessible(True)
    field.get(None).remove()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --------------------------------------------------------------------------------------------
# Expected values: what the sink stores, normalised for comparison
# --------------------------------------------------------------------------------------------

def norm(v: Any) -> Any:
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, _dt.datetime) and v.tzinfo is not None:
        return v.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    if isinstance(v, decimal.Decimal):
        return v.normalize()
    return v


def spark_value(v: Any, c: pb.ColumnInfo) -> Any:
    """What the sink stores for model value v of column c, normalised for comparison."""
    if v is None:
        return None
    st = ST.spark_type(c)
    return norm(ST.converter(st)(python_to_datum(v, c)))


def expected_rows(w: RandomWorkload, t: Table) -> list[tuple]:
    """The model's rows of table t as the sink's views return them, sorted."""
    rows = w.model[t.name]
    rows = rows.values() if isinstance(rows, dict) else rows
    return sorted((tuple(spark_value(r.get(c.name), c) for c in t.visible) for r in rows), key=repr)


def view_rows(env: SparkEnv, view: str, t: Table) -> list[tuple]:
    """The visible columns of t read from `view` in env's session, normalised and sorted."""
    cols = ", ".join(f"`{c.name}`" for c in t.visible)
    return sorted((tuple(norm(x) for x in r) for r in env.rows(f"SELECT {cols} FROM {view}")), key=repr)


def expected_changes(txns: list[Txn], schema: SchemaHistory) -> list[tuple[int, int, str]]:
    """(commit_ts, _seq, _op) of every change, in commit order, computed from the transactions."""
    out = []
    for t in txns:
        for ev in t.rows(schema):
            key = key_of_info(ev.table_info)
            if ev.op == "u":
                b, a = row_to_dict(ev.before, ev.table_info), row_to_dict(ev.after, ev.table_info)
                changed = (b != a) if not key else any(b[k] != a[k] for k in key)
                if changed:
                    out += [(t.commit_ts, 2 * ev.seq, "d"), (t.commit_ts, 2 * ev.seq + 1, "c")]
                    continue
            out.append((t.commit_ts, 2 * ev.seq, ev.op))
    return out


def history(txns: list[Txn]) -> SchemaHistory:
    return history_of(txns)


# --------------------------------------------------------------------------------------------
# Driving a sink in this process, reading from another
# --------------------------------------------------------------------------------------------

async def drive(sink: Any, txns: list[Txn], schema: SchemaHistory, per_apply: int = 50) -> None:
    """Apply like the drainer: schema effects recorded before the batch reaches the sink."""
    for i in range(0, len(txns), per_apply):
        chunk = txns[i:i + per_apply]
        for t in chunk:
            if t.prewrite.schema_snapshots or t.is_ddl:
                schema.apply(t)
        await sink.apply(chunk)
    await sink.flush()


def make_sink(env: SparkEnv, name: str, schema: SchemaHistory, epoch: int = 0, **kw: Any) -> Any:
    """A spark sink named `name` on env's session and metastore (loaded like the drainer does)."""
    cfg = env.sink_config(name, **kw)
    return load_sink("spark", cfg, schema=schema, source_name="src", epoch=epoch, spark=env.spark)


def spark_sql_argv(metastore: str, *sql: str, limit: int = 100_000) -> list[str]:
    """`sluice spark-sql --json` against `metastore` (host:port): a second JVM on the catalog."""
    return sluice_argv("spark-sql", "--metastore", metastore, "--master", "local[1]", "--json",
                       "--limit", str(limit), *sql)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports sluice from this checkout."""
    return {**os.environ, "PYTHONPATH": str(REPO), "TZ": "UTC", "SPARK_LOCAL_IP": "127.0.0.1",
            **extra}


def spark_sql_proc(metastore: str, cwd: Path, *sql: str) -> subprocess.Popen[str]:
    """Start `sluice spark-sql` in the background (stdout/stderr piped)."""
    return subprocess.Popen(spark_sql_argv(metastore, *sql), cwd=cwd, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --------------------------------------------------------------------------------------------
# A reader in a second JVM: `python -m tests.support.spark --metastore H:P --out F --stop S Q...`
# --------------------------------------------------------------------------------------------

def reader_argv(metastore: str, out: Path, stop: Path, *sql: str) -> list[str]:
    import sys
    return [sys.executable, "-m", "tests.support.spark", "--metastore", metastore,
            "--out", str(out), "--stop", str(stop), *sql]


def _reader_main() -> None:
    """Run the queries round after round in this process's own Spark session until the stop
    file exists (then one last round), appending one JSON line per query result or error."""
    import argparse
    import json
    import time

    from sluice.spark_sink.session import session
    ap = argparse.ArgumentParser()
    ap.add_argument("--metastore", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("sql", nargs="+")
    args = ap.parse_args()
    spark = session(SessionConfig(master="local[1]", metastore=args.metastore, log_level="ERROR",
                                  app_name="sluice-test-reader", shuffle_partitions=2,
                                  spark_conf={"spark.ui.showConsoleProgress": "false",
                                              "spark.driver.memory": "512m"}))
    rnd = 0
    with open(args.out, "a") as out:
        while True:
            last = os.path.exists(args.stop)
            for k, sql in enumerate(args.sql):
                started = time.time()
                try:
                    rows = [[norm(v) if not isinstance(v, decimal.Decimal) else str(v) for v in r]
                            for r in spark.sql(sql).collect()]
                    rec = {"round": rnd, "q": k, "rows": rows, "t": started}
                except Exception as e:  # noqa: BLE001 - every failure is the test's finding
                    rec = {"round": rnd, "q": k, "error": str(e)[:3000], "t": started}
                rec["end"] = time.time()
                out.write(json.dumps(rec, default=str) + "\n")
                out.flush()
            rnd += 1
            if last:
                break
    spark.stop()


if __name__ == "__main__":
    _reader_main()
