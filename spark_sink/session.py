"""A SparkSession on the shared Hive metastore: UTC, loopback, quiet logs, any master.

One JVM per Python process: `session()` returns the active session when there is one (a test
module or a drainer shares it between sinks), so the settings apply at the first call only —
except the metastore, the catalog's identity: asking for another one than the active session's
is a ConfigError, never a session that would read and write the other catalog.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from sluice.core.errors import ConfigError
from sluice.spark_sink.config import SessionConfig
from sluice.spark_sink.metastore import DERBY_CLIENT_JAR

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def conf_of(cfg: SessionConfig) -> dict[str, str]:
    """The Spark settings for cfg (before cfg.spark_conf, which overrides them)."""
    conf = {
        "spark.master": cfg.master,
        "spark.app.name": cfg.app_name,
        "spark.ui.enabled": "false",
        # A drainer's log is for its own lines; console progress bars would bury them.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions),
        "spark.sql.catalogImplementation": "hive",
        # Parquet timestamps as microsecond instants (Spark's default INT96 loses nothing either,
        # but TIMESTAMP_MICROS is what other readers expect).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.sources.partitionOverwriteMode": "static",
        "spark.sql.legacy.createHiveTableByDefault": "false",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    }
    if cfg.metastore:
        conf.update({
            "spark.driver.extraClassPath": DERBY_CLIENT_JAR,
            "spark.hadoop.javax.jdo.option.ConnectionURL":
                f"jdbc:derby://{cfg.metastore}/{cfg.metastore_db};create=true",
            "spark.hadoop.javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.ClientDriver",
            "spark.hadoop.datanucleus.schema.autoCreateAll": "true",
            "spark.hadoop.hive.metastore.schema.verification": "false",
            # The views filter on BIGINT partition columns (_batch, batch, _v); the embedded
            # Hive client pushes such filters to Derby only with this set.
            "spark.hadoop.hive.metastore.integral.jdo.pushdown": "true",
            "spark.sql.hive.metastorePartitionPruningFallbackOnException": "true",
        })
    if cfg.warehouse:
        conf["spark.sql.warehouse.dir"] = cfg.warehouse
    conf.update(cfg.spark_conf)
    return conf


_JVM_START_ATTEMPTS = 3
_METASTORE_URL = "spark.hadoop.javax.jdo.option.ConnectionURL"


def _metastore_of(url: str | None) -> str:
    return url or "Spark's embedded Derby"


def _check_same_metastore(active: SparkSession, cfg: SessionConfig) -> None:
    have = active.sparkContext.getConf().get(_METASTORE_URL)
    want = conf_of(cfg).get(_METASTORE_URL)
    if have != want:
        raise ConfigError(
            f"spark: this process's Spark session uses the metastore {_metastore_of(have)}; a "
            f"sink or command asks for {_metastore_of(want)}. One JVM holds one Hive metastore "
            "connection: run components on different metastores in different processes")


def session(cfg: SessionConfig) -> SparkSession:
    """The process's SparkSession, created from cfg if none is active."""
    os.environ.setdefault("TZ", "UTC")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    active = SparkSession.getActiveSession()
    if active is not None:
        _check_same_metastore(active, cfg)
        return active
    builder = SparkSession.builder
    for k, v in conf_of(cfg).items():
        builder = builder.config(k, v)
    for attempt in range(1, _JVM_START_ATTEMPTS + 1):
        try:
            spark = builder.enableHiveSupport().getOrCreate()
            break
        except Exception as e:  # noqa: BLE001 - only the launcher's transient failure is retried
            # The JVM launcher (a fork of this process) can die before it reports its port when
            # the fork meets gRPC's threads at a bad moment; a second launch starts normally.
            if "JAVA_GATEWAY_EXITED" not in str(e) or attempt == _JVM_START_ATTEMPTS:
                raise
            log.warning("spark JVM exited at start; starting it again",
                        extra={"fields": {"attempt": attempt, "error": str(e)[:200]}})
            time.sleep(1.0)
    spark.sparkContext.setLogLevel(cfg.log_level.upper())
    log.info("spark session started", extra={"fields": {"master": cfg.master,
                                                        "metastore": cfg.metastore or "embedded"}})
    return spark
