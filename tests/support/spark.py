"""Spark test support: one Derby metastore + one shared SparkSession per test module.

A session costs 10-20 s on this machine and the first metastore statement another 15-20 s, so
a module shares both (`spark_env`); tests isolate themselves by catalog names and roots.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluice.spark_sink.config import SessionConfig, SparkSinkConfig
from sluice.spark_sink.metastore import DerbyServer
from tests.support.procs import free_port


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
        spark.sql("CREATE DATABASE IF NOT EXISTS warmup")  # creates the metastore schema once
        yield SparkEnv(derby, spark, work, cfg)
    finally:
        if spark is not None:
            spark.stop()
        derby.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)
