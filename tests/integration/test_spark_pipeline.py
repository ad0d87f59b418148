"""End to end into Spark: pumps -> drainer (`sink = "spark"`) -> catalog views read by other JVMs.

Real processes only: etcd, TSO, two pumps, a drainer process whose Spark sink writes through a
Derby network-server metastore; the views are read by `sluice spark-sql` as a separate process
(its own JVM) and by this test's own Spark session (a third JVM on the same catalog).

Invariant (DESIGN §7): once the drainer's durable checkpoint covers every acknowledged
transaction, a reader in another JVM sees each acknowledged row exactly once in the
current-state views — nothing lost, nothing doubled — and each changelog holds every change
exactly once, in commit order.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import Registry
from sluice.drainer import ha
from sluice.drainer.checkpoint import read_checkpoint
from sluice.spark_sink.metastore import DerbyServer
from tests.support.cluster import (CLUSTER_ID, Cluster, TxnWriter, fresh_ts, running_cluster,
                                   table_info)
from tests.support.procs import REPO, sluice_argv, wait_until
from tests.support.rows import RandomWorkload, history_of, prewrite_value, txn
from tests.support.spark import (SparkEnv, expected_changes, expected_rows, spark_env,  # noqa: F401
                                 view_rows)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

PUMPS = ["pump-1", "pump-2"]
TABLES = 3
RANDOM_TXNS = 20_000
# Lease TTL 4 s: a stalled active stops itself 3 s after its last acknowledged keepalive was
# sent; the standby takes over 5 s after the lease is gone.
HA = {"ha": True, "alive-ttl": 4, "ha-margin": 1.0}
EXIT_FENCED = 3   # drainer/server.py: a stale HA drainer's exit code


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


def epoch_files(out_dir: Path, epoch: int) -> set[str]:
    """Files of the Spark sink written under one epoch's locations."""
    mark = f"e{epoch}"
    return {str(p.relative_to(out_dir)) for p in out_dir.rglob("*")
            if p.is_file() and mark in p.relative_to(out_dir).parts}


def leader_epoch(reg: Registry) -> int:
    leader = ha.read_leader(reg, "d-spark")
    return leader.epoch if leader is not None else 0


def test_pumps_to_spark_views_read_by_other_jvms_equal_the_acked_rows(
        cluster: Cluster, spark_env: SparkEnv, tmp_path: Path) -> None:
    """Once the drainer's checkpoint covers every acknowledged transaction: `sluice spark-sql`
    (another JVM) reads each acknowledged row exactly once in the current-state views; and after
    20k random transactions (inserts, updates, deletes, primary-key changes, unique-key swaps,
    three tables) each view equals the model row for row and each changelog holds every change
    exactly once, in commit order.

    Meanwhile HA: the active drainer stalls between writing a batch's files and its commit
    point (failpoint `spark-after-files`) and is SIGSTOPped past its lease TTL; the standby takes
    over; after SIGCONT the stale one exits fenced and its batch never becomes visible (it wrote
    no file after the takeover, and nothing is doubled)."""
    derby = spark_env.derby
    t0 = fresh_ts(cluster)
    w = TxnWriter(cluster, [table_info(5000 + i, "sp", f"t{i}") for i in range(TABLES)], seed=3)
    wl = RandomWorkload(seed=21, schema="sprw", keys=3000, max_rows=4, keyless=False)
    values = [wl.next_value() for _ in range(RANDOM_TXNS)]
    spark_to = {"initial-commit-ts": t0, "to.metastore": derby.address, "to.batch-rows": 20_000,
                **HA}
    etcd = Etcd(cluster.etcd, timeout=2)
    reg = Registry(etcd, CLUSTER_ID)
    try:
        a = cluster.start_drainer("d-spark", sink="spark", instance="sp-a", wait_online=False,
                                  env={"SLUICE_FAILPOINTS": "spark-after-files=1*sleep(30000)@2"},
                                  **spark_to)
        wait_until(lambda: "active at" in a.proc.log_text(), 60, 0.1, what="sp-a to be active")
        b = cluster.start_drainer("d-spark", sink="spark", instance="sp-b", wait_online=False,
                                  **spark_to)
        cluster.wait_drainer_standby(b, timeout=60)
        cluster.wait_drainer_online(a, timeout=240)  # a Spark session + catalog set-up first
        w.declare("pump-1")
        declared = w.write_values([prewrite_value(snapshots=wl.tables)], ["pump-1"])
        w.write(150, PUMPS, group=50)
        acked = w.write_values(values, PUMPS, group=500)
        w.write(150, PUMPS, group=50)
        last = max(ack.commit_ts for ack in w.acked)

        # The second data batch stalls with its files written, before any partition or commit.
        wait_until(lambda: "failpoint spark-after-files fired" in a.proc.log_text(), 240, 0.1,
                   what="sp-a to stall between files and commit point")
        stale_epoch = leader_epoch(reg)
        a.proc.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: leader_epoch(reg) > stale_epoch, 60, 0.1, what="sp-b to take over")
            wait_until(lambda: "spark sink open" in b.proc.log_text(), 240, 0.2,
                       what="sp-b to open the sink")
            files = epoch_files(a.out_dir, stale_epoch)
        finally:
            a.proc.signal(signal.SIGCONT)
        wait_until(lambda: not a.proc.alive(), 30, 0.1, what="the stale drainer to exit")
        assert a.proc.popen.returncode == EXIT_FENCED, a.proc.log_text()[-3000:]  # type: ignore[union-attr]
        assert "no longer certainly the active instance" in a.proc.log_text()
    finally:
        w.close()

    def covered() -> bool:
        if not b.proc.alive():
            raise AssertionError(f"drainer exited:\n{b.proc.log_text()[-3000:]}")
        cp = read_checkpoint(reg, "d-spark")
        return cp is not None and cp.commit_ts >= last
    try:
        wait_until(covered, 300, 1.0, what="the drainer's checkpoint to cover every acked txn")
    finally:
        etcd.close()
    # The stale epoch's locations got nothing after SIGCONT (the new active's recovery may only
    # have removed its uncommitted files); the views below hold nothing twice.
    assert epoch_files(a.out_dir, stale_epoch) <= files, "the stale drainer wrote files"

    union = " UNION ALL ".join(f"SELECT 'sp.t{i}' AS t, id, v FROM sp.t{i}" for i in range(TABLES))
    got = sorted((r["t"], r["id"], r["v"]) for r in spark_sql(derby, tmp_path, union))
    want = sorted((ack.table, i, v) for ack in w.acked for op, i, v in ack.rows)
    assert len(want) > 300
    assert got == want

    # The random workload, read by this process's own Spark session.
    spark_env.spark.catalog.clearCache()
    for t in wl.tables:
        assert view_rows(spark_env, f"sprw.{t.name}", t) == expected_rows(wl, t), t.name
    txns = [txn(prewrite_value(snapshots=wl.tables), declared[0].commit_ts)] + [
        txn(v, ack.commit_ts) for v, ack in zip(values, acked)]
    want_changes = expected_changes(txns, history_of(txns))
    got_changes = []
    for t in wl.tables:
        got_changes += spark_env.rows(f"SELECT _commit_ts, _seq, _op, _batch FROM sprw.{t.name}_changelog")
    assert len(got_changes) == len({(c, s) for c, s, _, _ in got_changes}), "a change twice"
    assert sorted((c, s, o) for c, s, o, _ in got_changes) == sorted(want_changes)
    # Micro-batches follow commit order: a later batch never holds an earlier commit_ts.
    spans: dict[int, list[int]] = {}
    for cts, _, _, batch in got_changes:
        lo_hi = spans.setdefault(batch, [cts, cts])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], cts), max(lo_hi[1], cts)
    ordered = [spans[k] for k in sorted(spans)]
    assert len(ordered) >= 2 and all(x[1] < y[0] for x, y in zip(ordered, ordered[1:]))
