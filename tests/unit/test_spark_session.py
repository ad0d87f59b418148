"""The Spark session's settings (spark_sink/session.py): the measured CPU defaults, and a
`spark-conf` entry replacing a default whole."""
from __future__ import annotations

import pytest

from sluice.core.errors import ConfigError
from sluice.spark_sink.config import SessionConfig
from sluice.spark_sink.session import JVM_CPU_OPTIONS, LOG4J2, conf_of


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
