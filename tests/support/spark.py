"""Spark test support: one Iceberg catalog (an SQLite file in a warehouse directory) and one
shared SparkSession per test module, and the helpers every Spark test compares with (model rows,
table rows, expected changelog entries).

A session costs 7-20 s on this machine, so a module shares it (`spark_env`); tests isolate
themselves by namespaces (each sink gets its own `database` pattern and meta database).
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
from sluice.spark_sink.session import JVM_CPU_OPTIONS
from sluice.spark_sink.tables import key_of_info
from tests.support.procs import REPO, sluice_argv
from tests.support.rows import RandomWorkload, Table, history_of


@dataclass
class SparkEnv:
    spark: Any
    workdir: Path
    session_cfg: SessionConfig

    @property
    def warehouse(self) -> str:
        return self.session_cfg.warehouse

    def sink_config(self, name: str, **kw: Any) -> SparkSinkConfig:
        """A sink config with its own namespaces (tests share one catalog)."""
        kw.setdefault("batch_rows", 100_000)
        kw.setdefault("batch_interval", 3600.0)
        kw.setdefault("maintenance_every", 0)
        kw.setdefault("meta_database", f"m_{name}")
        kw.setdefault("database", f"{name}_{{schema}}")
        return SparkSinkConfig(master=self.session_cfg.master, warehouse=self.session_cfg.warehouse,
                               shuffle_partitions=1, **kw)

    def rows(self, sql: str) -> list[Any]:
        return self.spark.sql(sql).collect()


# JVM flags for a test JVM on a 2-core machine: the client compiler only and the serial
# collector, the sink's own driver defaults since they measured cheaper for it too (a test
# session started ~17% faster with them); the spark-sql children and the CDS key use them.
FAST_JVM = JVM_CPU_OPTIONS


# A class-data-sharing archive of the classes a Spark session with the sink's catalog loads
# (JDK dynamic CDS): a test JVM maps them instead of loading, parsing and verifying them from
# the jars. Measured side by side under the same load (docs/benchmarks.md): a session starts in
# about half the time. Built once per checkout and classpath (the key below), by a child JVM
# that runs a small sink-like workload and dumps its classes at exit; SLUICE_TEST_CDS=0 turns it
# off. A JVM given an archive that does not match its classpath runs without one (-Xlog: its
# CDS warnings would otherwise reach logs the tests read for warnings).
CDS_DIR = REPO / ".venv" / "spark-cds"
CDS_BUILD_TIMEOUT_S = 900.0


def _cds_key() -> str:
    """What the archive depends on: this checkout, the JVM, pyspark and the runtime jars."""
    import hashlib
    import importlib.metadata
    import importlib.util
    import shutil
    from sluice.spark_sink.session import jars
    java = os.environ.get("JAVA_HOME") or os.path.realpath(shutil.which("java") or "java")
    parts = [str(REPO), FAST_JVM, java, str(os.stat(java).st_mtime) if os.path.exists(java) else "",
             importlib.metadata.version("pyspark"),
             str(importlib.util.find_spec("pyspark").origin)]  # type: ignore[union-attr]
    parts += [f"{j}:{os.path.getsize(j)}" for j in jars()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def cds_archive() -> Path | None:
    """The test JVMs' CDS archive, built first when missing (once, under a lock: pytest runs in
    several checkouts share nothing, runs in one wait for each other); None when off or when it
    cannot be built (no jars: the session's own error comes later)."""
    import fcntl
    import shutil
    import sys
    import time
    from sluice.core.errors import ConfigError
    if os.environ.get("SLUICE_TEST_CDS", "1") == "0":
        return None
    try:
        path = CDS_DIR / f"spark-{_cds_key()}.jsa"
    except (ConfigError, OSError):
        return None
    if path.exists():
        return path
    CDS_DIR.mkdir(parents=True, exist_ok=True)
    with open(CDS_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        t0 = time.monotonic()
        work = CDS_DIR / f"work-{os.getpid()}"
        try:
            r = subprocess.run([sys.executable, "-m", "tests.support.spark", "--make-cds", str(tmp),
                                str(work)], cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(REPO), "TZ": "UTC",
                                    "SPARK_LOCAL_IP": "127.0.0.1", "SLUICE_TEST_CDS": "0"},
                               capture_output=True, text=True, timeout=CDS_BUILD_TIMEOUT_S)
            if r.returncode == 0 and tmp.exists():
                os.replace(tmp, path)
                print(f"tests/support/spark.py: built the test JVMs' CDS archive {path.name} in "
                      f"{time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
            else:
                print(f"tests/support/spark.py: no CDS archive (exit {r.returncode}): "
                      f"{r.stderr[-2000:]}", file=sys.stderr, flush=True)
        except subprocess.TimeoutExpired:
            print("tests/support/spark.py: no CDS archive (its build timed out)", file=sys.stderr,
                  flush=True)
        finally:
            tmp.unlink(missing_ok=True)
            shutil.rmtree(work, ignore_errors=True)
    return path if path.exists() else None


def _cds_options() -> str:
    path = cds_archive()
    return f" -XX:SharedArchiveFile={path} -Xlog:cds*=off" if path is not None else ""


def _make_cds(archive: str, work: str) -> None:
    """The archive's build: a session like a test's, a sink-like workload (tables, appends,
    MERGE, branches, metadata tables, procedures), then the JVM exits and dumps its classes."""
    from sluice.spark_sink.session import session, shutdown_jvm
    cfg = session_config(Path(work))
    opts = cfg.spark_conf["spark.driver.extraJavaOptions"]
    cfg.spark_conf["spark.driver.extraJavaOptions"] = f"{opts} -XX:ArchiveClassesAtExit={archive} -Xlog:cds*=off"
    spark = session(cfg)
    c = cfg.catalog
    for sql in (f"CREATE NAMESPACE IF NOT EXISTS {c}.cds",
                f"CREATE TABLE {c}.cds.t (id INT, v STRING, d DECIMAL(20,2), ts TIMESTAMP) USING iceberg "
                "TBLPROPERTIES ('format-version'='2')",
                f"INSERT INTO {c}.cds.t VALUES (1, 'a', 1.5, current_timestamp()), (2, 'b', NULL, NULL)",
                f"ALTER TABLE {c}.cds.t CREATE BRANCH b1",
                f"MERGE INTO {c}.cds.t.branch_b1 t USING (SELECT 1 AS id, 'z' AS v, 2.5 AS d, "
                "current_timestamp() AS ts) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
                "WHEN NOT MATCHED THEN INSERT *",
                f"CALL {c}.system.fast_forward('cds.t', 'main', 'b1')",
                f"DELETE FROM {c}.cds.t WHERE id = 2",
                f"ALTER TABLE {c}.cds.t ADD COLUMN x BIGINT",
                f"SHOW TBLPROPERTIES {c}.cds.t",
                f"SELECT * FROM {c}.cds.t.snapshots",
                f"SELECT count(*), max(id) FROM {c}.cds.t GROUP BY v",
                f"CALL {c}.system.rewrite_data_files(table => 'cds.t')",
                f"CALL {c}.system.expire_snapshots(table => 'cds.t', retain_last => 1)"):
        spark.sql(sql).collect()
    spark.createDataFrame([(3, "c")], "id INT, v STRING").createOrReplaceTempView("cds_src")
    spark.sql(f"INSERT INTO {c}.cds.t (id, v) SELECT id, v FROM cds_src").collect()
    spark.stop()
    shutdown_jvm(CDS_BUILD_TIMEOUT_S)   # the dump runs as the JVM exits: wait for it


def _driver_java_options() -> str:
    """The sink's own driver options (spark_sink/session.py: UTC, its log4j profile, FAST_JVM)
    plus the CDS archive: a spark-conf entry replaces the default, so it carries them all."""
    from sluice.core.errors import ConfigError
    from sluice.spark_sink.session import LOG4J2, conf_of
    try:
        default = conf_of(SessionConfig(warehouse="/unused"))["spark.driver.extraJavaOptions"]
    except ConfigError:   # no jars (install.sh not run): the session's own error comes later
        default = f"-Duser.timezone=UTC -Dlog4j2.configurationFile={LOG4J2} {FAST_JVM}"
    return f"{default}{_cds_options()}"


# Spark settings for a test JVM: the tests' tables hold a few hundred rows, so one shuffle
# partition and no adaptive re-planning (both cost a task set or a plan per query, seconds on a
# loaded 2-core machine, for nothing at this size). Results do not depend on them.
TEST_CONF = {"spark.ui.showConsoleProgress": "false", "spark.sql.adaptive.enabled": "false",
             "spark.driver.extraJavaOptions": _driver_java_options()}


def session_config(workdir: Path) -> SessionConfig:
    return SessionConfig(master="local[2]", warehouse=str(workdir / "warehouse"),
                         shuffle_partitions=1, log_level="ERROR",
                         spark_conf={**TEST_CONF, "spark.driver.memory": "768m"})


@pytest.fixture(scope="module")
def spark_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEnv]:
    os.environ.setdefault("TZ", "UTC")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from sluice.spark_sink.session import session
    work = tmp_path_factory.mktemp("spark")
    spark = None
    try:
        cfg = session_config(work)
        spark = session(cfg)
        yield SparkEnv(spark, work, cfg)
    finally:
        if spark is not None:
            spark.stop()


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


def make_sink(env: SparkEnv, name: str, schema: SchemaHistory, epoch: int = 0,
              drainer: str = "", **kw: Any) -> Any:
    """A spark sink named `name` on env's session and catalog (loaded like the drainer does)."""
    cfg = env.sink_config(name, **kw)
    return load_sink("spark", cfg, schema=schema, source_name="src", epoch=epoch, spark=env.spark,
                     drainer_name=drainer)


def spark_sql_argv(warehouse: str, *sql: str, limit: int = 100_000) -> list[str]:
    """`sluice spark-sql --json` on the catalog of `warehouse`: a second JVM on the catalog."""
    return sluice_argv("spark-sql", "--warehouse", warehouse, "--master", "local[1]", "--json",
                       "--limit", str(limit), *sql)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports sluice from this checkout. A Spark
    session it opens (`sluice spark-sql` has no option for JVM flags) starts with the test
    JVM flags: pyspark appends PYSPARK_SUBMIT_ARGS to its spark-submit command, after the
    session's own settings, so its driver options win (they carry the session's defaults)."""
    import shlex
    submit = f"--driver-java-options {shlex.quote(TEST_CONF['spark.driver.extraJavaOptions'])} pyspark-shell"
    return {**os.environ, "PYTHONPATH": str(REPO), "TZ": "UTC", "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_SUBMIT_ARGS": submit, **extra}


def spark_sql_proc(warehouse: str, cwd: Path, *sql: str) -> subprocess.Popen[str]:
    """Start `sluice spark-sql` in the background (stdout/stderr piped)."""
    return subprocess.Popen(spark_sql_argv(warehouse, *sql), cwd=cwd, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --------------------------------------------------------------------------------------------
# A reader in a second JVM: `python -m tests.support.spark --warehouse W --out F --stop S Q...`
# --------------------------------------------------------------------------------------------

def reader_argv(warehouse: str, out: Path, stop: Path, *sql: str,
                ready: tuple[str, ...] = ()) -> list[str]:
    """ready: queries whose first value the reader waits to be true (a failing query counts as
    not yet) before its first round, so its JVM can start while the tables are being made."""
    import sys
    return [sys.executable, "-m", "tests.support.spark", "--warehouse", warehouse,
            "--out", str(out), "--stop", str(stop),
            *(a for q in ready for a in ("--ready", q)), *sql]


def _reader_main() -> None:
    """Run the queries round after round in this process's own Spark session until the stop
    file exists (then one last round), appending one JSON line per query result or error."""
    import argparse
    import json
    import time

    from sluice.spark_sink.session import session
    ap = argparse.ArgumentParser()
    ap.add_argument("--warehouse", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--ready", action="append", default=[])
    ap.add_argument("sql", nargs="+")
    args = ap.parse_args()
    spark = session(SessionConfig(master="local[1]", warehouse=args.warehouse, log_level="ERROR",
                                  app_name="sluice-test-reader", shuffle_partitions=1,
                                  spark_conf={**TEST_CONF, "spark.driver.memory": "512m",
                                              # Each round plans on the catalog's newest
                                              # snapshot (Iceberg caches tables for 30 s).
                                              "spark.sql.catalog.sluice.cache-enabled": "false"}))
    for sql in args.ready:
        deadline = time.monotonic() + 600
        while True:
            try:
                if spark.sql(sql).collect()[0][0]:
                    break
            except Exception:  # noqa: BLE001 - a table not there yet: not ready
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"reader: not ready after 600 s: {sql}")
            time.sleep(0.2)
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
    import sys as _sys
    if _sys.argv[1:2] == ["--make-cds"]:
        _make_cds(_sys.argv[2], _sys.argv[3])
    else:
        _reader_main()


# --------------------------------------------------------------------------------------------
# pyiceberg: the same catalog without a JVM
# --------------------------------------------------------------------------------------------

def pyiceberg_catalog(warehouse: str) -> Any:
    """pyiceberg's SqlCatalog on the embedded catalog of `warehouse` (the SQLite file the sink's
    JDBC catalog writes): a reader with no JVM."""
    from pyiceberg.catalog.sql import SqlCatalog
    path = os.path.abspath(warehouse)
    return SqlCatalog("sluice", uri=f"sqlite:///{path}/catalog.db", warehouse=f"file://{path}")


def main_ancestry(table: Any) -> list[Any]:
    """The snapshots on main's history, oldest first (pyiceberg Table)."""
    md = table.metadata
    by_id = {s.snapshot_id: s for s in md.snapshots}
    out = []
    s = table.current_snapshot()
    while s is not None:
        out.append(s)
        s = by_id.get(s.parent_snapshot_id) if s.parent_snapshot_id is not None else None
    return out[::-1]


def summary_of(snapshot: Any) -> dict[str, str]:
    """A pyiceberg snapshot's summary properties (the sink's `sluice.*` keys among them)."""
    s = snapshot.summary
    if s is None:
        return {}
    return {**dict(getattr(s, "additional_properties", {}) or {}), "operation": str(s.operation)}
