"""The Spark sink, unchanged, on a standalone Spark cluster: a master and one worker started from
pyspark's own jars (`java -cp "<pyspark>/jars/*" org.apache.spark.deploy.master.Master ...`), the
sink's session on `master = "spark://127.0.0.1:PORT"`.

Its own module: a process holds one SparkSession, and this one's master is not local. The Iceberg
runtime reaches the executors through spark.jars (the session's own setting); the warehouse is
a local directory the driver and the executor share (same machine).

Invariant: the sink's contract does not depend on where Spark runs: the current tables equal
the model and the changelogs hold every change once.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.drainer.sink import Checkpoint
from tests.support.procs import free_port, port_open, wait_until
from tests.support.rows import RandomWorkload
from tests.support.spark import (FAST_JVM, TEST_CONF, SparkEnv, drive, expected_changes,
                                 expected_rows, history, make_sink, run, view_rows)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

T0 = 1 << 40


def pyspark_home() -> str:
    import pyspark
    return os.path.dirname(pyspark.__file__)


def java(cls: str, *args: str, log: Path, home: str) -> subprocess.Popen[bytes]:
    # The worker builds each executor's command with Spark's launcher, which needs the Scala
    # version: from a source build's directories, or this variable (pyspark has no build dirs:
    # "Cannot find any build directories" for every executor otherwise).
    env = {**os.environ, "SPARK_HOME": home, "SPARK_SCALA_VERSION": "2.13",
           "SPARK_LOCAL_IP": "127.0.0.1", "TZ": "UTC", "PYSPARK_PYTHON": sys.executable}
    # The master and the worker do little work: the test JVMs' flags (client compiler, serial
    # collector) spare the 2-core machine their C2 compiler threads.
    with log.open("w") as f:
        return subprocess.Popen(["java", "-Xmx512m", *FAST_JVM.split(), "-cp", f"{home}/jars/*",
                                 cls, *args], env=env, stdout=f, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def standalone_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEnv]:
    from sluice.spark_sink.config import SessionConfig
    from sluice.spark_sink.session import session
    work = tmp_path_factory.mktemp("standalone")
    home = pyspark_home()
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    spark = None
    try:
        master = java("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                      str(port), "--webui-port", "0", log=work / "master.log", home=home)
        procs.append(master)
        wait_until(lambda: port_open(port) or master.poll() is not None, 300, 0.2,
                   what="the Spark master to listen")
        assert master.poll() is None, (work / "master.log").read_text()[-3000:]
        worker = java("org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                      "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0",
                      "--work-dir", str(work / "worker"), log=work / "worker.log", home=home)
        procs.append(worker)
        # The driver's JVM starts while the worker registers (the master is up: the driver's
        # application waits there for the worker's executor).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        cfg = SessionConfig(master=f"spark://127.0.0.1:{port}", warehouse=str(work / "warehouse"),
                            shuffle_partitions=1, log_level="ERROR",
                            spark_conf={**TEST_CONF, "spark.executor.memory": "512m",
                                        # The executor runs a few small tasks per batch: the
                                        # driver's flags (a spark-conf entry replaces the
                                        # default, so it carries the time zone too).
                                        "spark.executor.extraJavaOptions":
                                            f"-Duser.timezone=UTC {FAST_JVM}",
                                        "spark.cores.max": "1", "spark.driver.memory": "768m"})
        spark = session(cfg)

        def registered() -> bool:
            assert worker.poll() is None, (work / "worker.log").read_text()[-3000:]
            return "Successfully registered with master" in (work / "worker.log").read_text()
        wait_until(registered, 300, 0.2, what="the Spark worker to register")
        yield SparkEnv(spark, work, cfg)
    finally:
        if spark is not None:
            spark.stop()
        for p in reversed(procs):   # our own children, by pid
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def test_the_sink_runs_unchanged_on_a_standalone_master_and_worker(standalone_env: SparkEnv) -> None:
    """On `spark://` with one worker, the sink commits random transactions over four tables
    (several batches; the keyless one's multiset rewrite is a Spark job, the rest are files the
    driver commits): the jobs run in the worker's executor, the current tables equal the model
    and the changelogs hold every change once."""
    env = standalone_env
    sc = env.spark.sparkContext
    assert sc.master.startswith("spark://127.0.0.1:")
    w = RandomWorkload(seed=5, schema="dist", keys=60, max_rows=3, keyless=True)
    txns = w.transactions(150, T0)
    schema = history([])
    sink = make_sink(env, "sa", schema, batch_rows=200)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, txns, schema))
    assert sink.checkpoint().commit_ts == txns[-1].commit_ts
    assert sink.checkpoint().sink_state["batch"] >= 2
    for t in w.tables:
        assert view_rows(env, f"sa_dist.{t.name}", t) == expected_rows(w, t), t.name
    # Those jobs ran in the worker's executor (a standalone driver runs no tasks itself): it
    # registered beside the driver's block manager.
    executors = sc._jsc.sc().getExecutorMemoryStatus().size()  # type: ignore[union-attr]
    assert executors >= 2, executors
    got = []
    for t in w.tables:
        got += [(r[0], r[1], r[2]) for r in env.rows(
            f"SELECT _commit_ts, _seq, _op FROM sa_dist.{t.name}_changelog")]
    assert len(got) == len({(c, s) for c, s, _ in got})
    assert sorted(got) == sorted(expected_changes(txns, history(txns)))
    run(sink.close())
