"""The Spark session's settings (spark_sink/session.py): the measured CPU defaults, and a
`spark-conf` entry replacing a default whole."""
from __future__ import annotations

import pytest

from sluice.core.errors import ConfigError
from sluice.spark_sink.config import SessionConfig
from sluice.spark_sink.session import JVM_CPU_OPTIONS, LOCAL_FS, LOG4J2, conf_of


def _conf(**kw: object) -> dict[str, str]:
    try:
        return conf_of(SessionConfig(warehouse="/unused", **kw))  # type: ignore[arg-type]
    except ConfigError as e:   # no jars: install.sh was not run
        pytest.fail(f"conf_of needs the jars install.sh fetches: {e}")


def test_the_driver_jvm_runs_c1_only_with_the_serial_collector_and_no_adaptive_replanning() -> None:
    """The defaults bench/spark_cpu.py measured (docs/spark.md "JVM settings"), beside the UTC
    time zone and the sink's log4j profile, which the same option string carries."""
    conf = _conf()
    opts = conf["spark.driver.extraJavaOptions"].split()
    for flag in ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Duser.timezone=UTC",
                 f"-Dlog4j2.configurationFile={LOG4J2}"):
        assert flag in opts
    assert set(JVM_CPU_OPTIONS.split()) <= set(opts)
    assert conf["spark.sql.adaptive.enabled"] == "false"


def test_a_spark_conf_entry_replaces_the_default_whole() -> None:
    """spark-conf wins: the operator's driver options and AQE setting are used as given, none
    of the defaults appended."""
    conf = _conf(spark_conf={"spark.driver.extraJavaOptions": "-Duser.timezone=UTC -XX:+UseG1GC",
                             "spark.sql.adaptive.enabled": "true"})
    assert conf["spark.driver.extraJavaOptions"] == "-Duser.timezone=UTC -XX:+UseG1GC"
    assert conf["spark.sql.adaptive.enabled"] == "true"


def test_a_local_master_gets_the_local_filesystem_without_a_process_per_file() -> None:
    """With a local master the `file:` filesystem is sluice.hadoop.LocalFileSystem, its jar first
    on the driver's class path (ahead of one the spark-conf gives, which is kept); another
    master, or a spark-conf naming another filesystem, leaves Hadoop's and the class path."""
    conf = _conf()
    jar = conf["spark.driver.extraClassPath"]
    assert conf["spark.hadoop.fs.file.impl"] == LOCAL_FS
    assert jar.endswith("/sluice-hadoop.jar") and jar in conf["spark.jars"].split(",")
    given = _conf(spark_conf={"spark.driver.extraClassPath": "/opt/x.jar"})
    assert given["spark.driver.extraClassPath"] == f"{jar}:/opt/x.jar"
    for other in (_conf(master="spark://127.0.0.1:7077"),
                  _conf(spark_conf={"spark.hadoop.fs.file.impl":
                                    "org.apache.hadoop.fs.LocalFileSystem"})):
        assert other.get("spark.hadoop.fs.file.impl") != LOCAL_FS
        assert "spark.driver.extraClassPath" not in other
