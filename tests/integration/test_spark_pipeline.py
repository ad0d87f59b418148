"""End to end into Spark: pumps -> drainer (`sink = "spark"`) -> catalog views read by another JVM.

Real processes only: etcd, TSO, two pumps, a drainer process whose Spark sink writes through a
Derby network-server metastore, and `sluice spark-sql` as a separate process (a second JVM on
the same catalog) reading the current-state views.

Invariant (DESIGN §7): once the drainer's durable checkpoint covers every acknowledged
transaction, a reader in another JVM sees each acknowledged row exactly once in the
current-state views — nothing lost, nothing doubled.
"""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import Registry
from sluice.drainer.checkpoint import read_checkpoint
from sluice.spark_sink.metastore import DerbyServer
from tests.support.cluster import (CLUSTER_ID, Cluster, TxnWriter, fresh_ts, running_cluster,
                                   table_info)
from tests.support.procs import PYTHON, REPO, free_port, sluice_argv, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

PUMPS = ["pump-1", "pump-2"]
TABLES = 3


@pytest.fixture(scope="module")
def derby(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DerbyServer]:
    server = DerbyServer(tmp_path_factory.mktemp("derby"), free_port()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("spark-pipeline"), etcd_module.endpoint, PUMPS) as c:
        yield c


def spark_sql(derby: DerbyServer, cwd: Path, *sql: str) -> list[dict]:
    """`sluice spark-sql --json` in its own process (its own JVM); the rows it printed."""
    argv = sluice_argv("spark-sql", "--metastore", derby.address, "--master", "local[1]",
                       "--json", "--limit", "100000", *sql)
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), "TZ": "UTC",
                              "SPARK_LOCAL_IP": "127.0.0.1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_pumps_to_spark_views_read_by_another_jvm_equal_the_acked_rows(
        cluster: Cluster, derby: DerbyServer, tmp_path: Path) -> None:
    """Once the drainer's checkpoint covers every acknowledged transaction, `sluice spark-sql`
    (another JVM) reads each acknowledged row exactly once in the current-state views."""
    t0 = fresh_ts(cluster)
    w = TxnWriter(cluster, [table_info(5000 + i, "sp", f"t{i}") for i in range(TABLES)], seed=3)
    try:
        d = cluster.start_drainer("d-spark", sink="spark", wait_online=False,
                                  **{"initial-commit-ts": t0, "to.metastore": derby.address})
        cluster.wait_drainer_online(d, timeout=240)  # a Spark session + catalog set-up first
        w.declare("pump-1")
        w.write(150, PUMPS, group=50)
        w.write(150, PUMPS, group=50)
        last = max(a.commit_ts for a in w.acked)
    finally:
        w.close()

    etcd = Etcd(cluster.etcd, timeout=2)
    reg = Registry(etcd, CLUSTER_ID)

    def covered() -> bool:
        if not d.proc.alive():
            raise AssertionError(f"drainer exited:\n{d.proc.log_text()[-3000:]}")
        cp = read_checkpoint(reg, "d-spark")
        return cp is not None and cp.commit_ts >= last
    try:
        wait_until(covered, 240, 1.0, what="the drainer's checkpoint to cover every acked txn")
    finally:
        etcd.close()

    union = " UNION ALL ".join(f"SELECT 'sp.t{i}' AS t, id, v FROM sp.t{i}" for i in range(TABLES))
    got = sorted((r["t"], r["id"], r["v"]) for r in spark_sql(derby, tmp_path, union))
    want = sorted((a.table, i, v) for a in w.acked for op, i, v in a.rows)
    assert len(want) > 300
    assert got == want
