"""A SparkSession with the Iceberg runtime and the sink's catalog: UTC, loopback, quiet logs.

One JVM per Python process: `session()` returns the active session when there is one (a test
module or a drainer shares it), so settings apply at the first call only — except the catalog,
whose identity is checked: asking for another catalog than the active session's is a
ConfigError, never a session that would read and write the other one.

The Iceberg Spark runtime and the SQLite JDBC driver are jars that install.sh copies from Maven
Central into `jars/` (pinned; nothing is downloaded at run time), beside `sluice-hadoop.jar`,
which install.sh compiles from spark_sink/java (Hadoop's local filesystem without a `chmod`
process per file created: `LOCAL_FS`). `SLUICE_SPARK_JARS` (a directory) overrides where they
are looked for.
"""
from __future__ import annotations

import glob
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.core.errors import ConfigError
from sluice.spark_sink import sqlite_catalog
from sluice.spark_sink.config import SessionConfig
from sluice.core.log import kv

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ICEBERG_RUNTIME = "iceberg-spark-runtime-4.1_2.13-*.jar"
SQLITE_JDBC = "sqlite-jdbc-*.jar"
SLUICE_HADOOP = "sluice-hadoop.jar"
# The `file:` filesystem of every JVM the session starts (spark_sink/java/sluice/hadoop/
# LocalFileSystem.java): Hadoop's own ran `chmod` in a child process for every file and
# directory it created, ~9 ms of CPU per file, and an Iceberg commit writes two or three.
LOCAL_FS = "sluice.hadoop.LocalFileSystem"
_JVM_START_ATTEMPTS = 3
# JVM loggers that print at WARN/ERROR on a normal start or a normal commit.
QUIET_LOGGERS = ("org.apache.hadoop.util.NativeCodeLoader", "org.apache.spark.util.Utils",
                 "org.apache.iceberg.hadoop.HadoopTableOperations",
                 "org.apache.spark.sql.execution.datasources.v2.V2ScanRelationPushDown",
                 "org.apache.iceberg.spark.source.SparkWrite",
                 "org.apache.iceberg.jdbc.JdbcCatalog", "org.apache.iceberg.BaseMetastoreCatalog",
                 "org.apache.spark.sql.catalyst.util.SparkStringUtils",
                 "org.apache.spark.sql.internal.SharedState")


LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"
# The driver JVM's CPU on a small, shared machine (bench/spark_cpu.py measured it per batch):
# the C2 JIT compiler was the JVM's largest thread (every batch plans new queries and Spark
# generates new classes for them), so compilation stops at C1; the serial collector spends no
# threads on a concurrent heap of the default 1 GB. A `spark-conf` value of
# spark.driver.extraJavaOptions replaces these (and the UTC and log4j options) whole.
JVM_CPU_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def jars_dir() -> Path:
    env = os.environ.get("SLUICE_SPARK_JARS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "jars"


def jars() -> list[str]:
    """The runtime jars Spark loads (spark.jars); a missing one is a one-line ConfigError."""
    d = jars_dir()
    out = []
    for pattern, what in ((ICEBERG_RUNTIME, "Iceberg Spark runtime"), (SQLITE_JDBC, "SQLite JDBC driver"),
                          (SLUICE_HADOOP, "Sluice's Hadoop local filesystem (spark_sink/java)")):
        found = sorted(glob.glob(str(d / pattern)))
        if not found:
            raise ConfigError(f"spark: no {what} jar ({pattern}) in {d}: run ./install.sh "
                              "(it copies the pinned jars from Maven Central and builds sluice-hadoop.jar), or set "
                              "SLUICE_SPARK_JARS to the directory holding them")
        out.append(found[-1])
    return out


def catalog_conf(cfg: SessionConfig) -> dict[str, str]:
    """spark.sql.catalog.<name>.* for cfg: the catalog's identity."""
    pre = f"spark.sql.catalog.{cfg.catalog}"
    conf = {pre: "org.apache.iceberg.spark.SparkCatalog", f"{pre}.type": cfg.catalog_type}
    if cfg.warehouse:
        conf[f"{pre}.warehouse"] = cfg.warehouse_uri
    if cfg.catalog_type == "jdbc":
        conf[f"{pre}.uri"] = cfg.jdbc_uri
        conf[f"{pre}.jdbc.schema-version"] = "V1"
    elif cfg.catalog_uri:
        conf[f"{pre}.uri"] = cfg.catalog_uri
    conf.update({f"{pre}.{k}": str(v) for k, v in cfg.catalog_properties.items()})
    return conf


def conf_of(cfg: SessionConfig) -> dict[str, str]:
    """The Spark settings for cfg (before cfg.spark_conf, which overrides them)."""
    runtime_jars = jars()
    conf = {
        "spark.master": cfg.master,
        "spark.app.name": cfg.app_name,
        "spark.jars": ",".join(runtime_jars),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.defaultCatalog": cfg.catalog,
        "spark.ui.enabled": "false",
        # A drainer's log is for its own lines; console progress bars would bury them.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # The sink's plans are small (a batch of one table); re-planning them stage by stage
        # costs the driver more CPU than it saves (bench/spark_cpu.py, docs/benchmarks.md).
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.extraJavaOptions": f"-Duser.timezone=UTC -Dlog4j2.configurationFile={LOG4J2} "
                                         + JVM_CPU_OPTIONS,
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    }
    if cfg.master.startswith("local"):
        # Driver and executors are this one JVM. Not for other masters: their executors would
        # need the jar at this path on every worker.
        conf["spark.hadoop.fs.file.impl"] = LOCAL_FS
    conf.update(catalog_conf(cfg))
    conf.update(cfg.spark_conf)
    if conf.get("spark.hadoop.fs.file.impl") == LOCAL_FS:
        # On the JVM's class path from the start (spark.jars come too late: spark-submit reads
        # local files before it loads them), ahead of a class path the spark-conf gives.
        given = conf.get("spark.driver.extraClassPath")
        ours = next(j for j in runtime_jars if os.path.basename(j) == SLUICE_HADOOP)
        conf["spark.driver.extraClassPath"] = ours + (
            os.pathsep + given if given else "")
    return conf


def _check_same_catalog(active: SparkSession, cfg: SessionConfig) -> None:
    have = active.sparkContext.getConf()
    for k, v in catalog_conf(cfg).items():
        if have.get(k) != v:
            raise ConfigError(
                f"spark: this process's Spark session has {k}={have.get(k)!r}; a sink or command "
                f"asks for {v!r}. One process holds one session per catalog name: use another "
                "catalog name, or run components on different catalogs in different processes")


def quiet(spark: SparkSession, level: str) -> None:
    """The JVM's log level, and the known-noisy loggers off below ERROR."""
    spark.sparkContext.setLogLevel(level.upper())
    try:
        cfg = spark._jvm.org.apache.logging.log4j.core.config.Configurator  # type: ignore[union-attr]
        off = spark._jvm.org.apache.logging.log4j.Level.ERROR  # type: ignore[union-attr]
        for name in QUIET_LOGGERS:
            cfg.setLevel(name, off)
    except Exception as e:  # noqa: BLE001 - logging tweaks never stop a session
        log.debug("could not quiet JVM loggers", extra=kv(error=str(e)[:200]))


def _launch_jvm(conf: dict[str, str], output: str) -> None:
    """Start the JVM with its stdout and stderr appended to the file `output` (the Spark banner,
    log4j's console lines), so a command with a terminal of its own keeps it for its own lines."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    if SparkContext._gateway is not None:  # type: ignore[attr-defined]
        return
    spark_conf = SparkConf(loadDefaults=False)
    for k, v in conf.items():
        spark_conf.set(k, v)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "ab") as f:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": f, "stderr": f})
    SparkContext._ensure_initialized(gateway=gateway)  # type: ignore[attr-defined]


def shutdown_jvm(timeout: float = 30.0) -> None:
    """End this process's JVM (after spark.stop()) and reap it, so a command that exits leaves
    no JVM behind, not even a zombie: its stdin closes (the JVM exits on EOF), then it is
    waited for (killed after timeout)."""
    from pyspark import SparkContext
    gateway = SparkContext._gateway  # type: ignore[attr-defined]
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception as e:  # noqa: BLE001 - the JVM may already be gone
        log.debug("gateway shutdown", extra=kv(error=str(e)[:200]))
    SparkContext._gateway = None  # type: ignore[attr-defined]
    SparkContext._jvm = None  # type: ignore[attr-defined]
    if proc is None:
        return
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: kill, then reap
        proc.kill()
        proc.wait(10)


def session(cfg: SessionConfig, jvm_output: str | None = None) -> SparkSession:
    """The process's SparkSession, created from cfg if none is active. jvm_output: a file that
    gets the JVM's own stdout and stderr instead of this process's (when this call starts it)."""
    os.environ.setdefault("TZ", "UTC")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    active = SparkSession.getActiveSession()
    if active is not None:
        _check_same_catalog(active, cfg)
        return active
    if cfg.sqlite_path:
        sqlite_catalog.prepare(cfg.sqlite_path)
    conf = conf_of(cfg)
    builder = SparkSession.builder
    for k, v in conf.items():
        builder = builder.config(k, v)
    for attempt in range(1, _JVM_START_ATTEMPTS + 1):
        try:
            if jvm_output:
                _launch_jvm(conf, jvm_output)
            spark = builder.getOrCreate()
            break
        except Exception as e:  # noqa: BLE001 - only the launcher's transient failure is retried
            # The JVM launcher (a fork of this process) can die before it reports its port when
            # the fork meets gRPC's threads at a bad moment; a second launch starts normally.
            if "JAVA_GATEWAY_EXITED" not in str(e) or attempt == _JVM_START_ATTEMPTS:
                raise
            log.warning("spark JVM exited at start; starting it again",
                        extra=kv(attempt=attempt, error=str(e)[:200]))
            time.sleep(1.0)
    quiet(spark, cfg.log_level)
    log.info("spark session started", extra=kv(master=cfg.master, catalog=cfg.catalog, catalog_type=cfg.catalog_type, warehouse=cfg.warehouse_uri))
    return spark
