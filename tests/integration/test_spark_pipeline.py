"""End to end into Iceberg: pumps -> drainer (`sink = "spark"`, HA pair) -> tables read by other JVMs.

Real processes only: etcd, TSO, two pumps, an active drainer and a standby of the same name
(HA) whose Spark sinks write Iceberg tables through the embedded catalog (an SQLite file in the
name's warehouse); the tables are read by `sluice spark-sql` as a separate process (its own
JVM) and by pyiceberg (no JVM) in this process.

Invariants:
- DESIGN §7: once the drainer's durable checkpoint covers every acknowledged transaction, a
  reader in another JVM sees each acknowledged row exactly once — nothing lost, nothing
  doubled — and each changelog holds every change once.
- Fencing (spark_sink/commit.py, drainer/ha.py): an active drainer frozen past its lease TTL
  (SIGSTOP) while a batch is in flight, once resumed (SIGCONT), commits nothing: after the
  standby's fence snapshot no snapshot of the old epoch reaches any table's main branch, and the
  old process stops itself (EXIT_FENCED).
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import Registry
from sluice.drainer import ha
from sluice.drainer.checkpoint import read_checkpoint
from tests.support.cluster import (CLUSTER_ID, Cluster, TxnWriter, fresh_ts, running_cluster,
                                   table_info)
from tests.support.procs import wait_until
from tests.support.spark import (child_env, main_ancestry, pyiceberg_catalog, spark_sql_argv,
                                 summary_of)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

PUMPS = ["pump-1", "pump-2"]
TABLES = 3
NAME = "d-spark"
# Lease TTL 4 s: a stalled active stops itself 3 s after its last acknowledged keepalive was
# sent; the standby takes over 5 s after the lease is gone.
HA = {"ha": True, "alive-ttl": 4, "ha-margin": 1.0}
EXIT_FENCED = 3   # drainer/node_state.py: a stale HA drainer's exit code
# The active's second batch stalls this long before its commits: longer than the SIGSTOP
# takes to be noticed, shorter than the takeover, so on SIGCONT the stale commit thread is
# ready to go at once and races the process's own fencing exit.
STALL_MS = 6000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("spark-pipeline"), etcd_module.endpoint, PUMPS) as c:
        yield c


class SparkSql:
    """`sluice spark-sql --json` started in its own process (its own JVM), so the JVM starts
    while the test goes on; output to files (nothing blocks on a full pipe meanwhile)."""

    def __init__(self, warehouse: str, cwd: Path, *sql: str) -> None:
        self.out, self.err = cwd / "spark-sql.out", cwd / "spark-sql.err"
        with self.out.open("w") as o, self.err.open("w") as e:
            self.proc = subprocess.Popen(spark_sql_argv(warehouse, *sql), cwd=cwd, stdout=o,
                                         stderr=e, text=True, env=child_env())

    def rows(self) -> list[dict]:
        """Waits for it to exit 0; the rows it printed."""
        self.proc.wait(900)
        assert self.proc.returncode == 0, self.err.read_text()[-3000:]
        return [json.loads(line) for line in self.out.read_text().splitlines()
                if line.startswith("{")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by pid
            self.proc.wait()


def leader_epoch(reg: Registry) -> int:
    leader = ha.read_leader(reg, NAME)
    return leader.epoch if leader is not None else 0


def test_pumps_to_iceberg_read_by_other_jvms_with_a_fenced_stale_active(
        cluster: Cluster, tmp_path: Path) -> None:
    """Acked rows reach Iceberg exactly once and `sluice spark-sql` (another JVM) reads them
    equal to the acked rows; pyiceberg reads the same. Meanwhile HA: the active drainer is
    SIGSTOPped past its TTL with a batch in flight, the standby of the same name takes over and
    fences the tables; after SIGCONT the stale drainer exits fenced and commits nothing: no
    snapshot of its epoch on any table's main after the standby's fence snapshot."""
    t0 = fresh_ts(cluster)
    w = TxnWriter(cluster, [table_info(5000 + i, "sp", f"t{i}") for i in range(TABLES)], seed=3)
    spark_to = {"initial-commit-ts": t0, "to.batch-interval": 1.0, **HA}
    etcd = Etcd(cluster.etcd, timeout=2)
    reg = Registry(etcd, CLUSTER_ID)
    try:
        a = cluster.start_drainer(NAME, sink="spark", instance="sp-a", wait_online=False,
                                  env={"SLUICE_FAILPOINTS": f"spark-before-commit=1*sleep({STALL_MS})@2"},
                                  **spark_to)
        wait_until(lambda: "active at" in a.proc.log_text(), 60, 0.1, what="sp-a to be active")
        b = cluster.start_drainer(NAME, sink="spark", instance="sp-b", wait_online=False,
                                  **spark_to)
        cluster.wait_drainer_standby(b, timeout=60)
        cluster.wait_drainer_online(a, timeout=300)  # a Spark session + the catalog first
        w.declare("pump-1")
        w.write(60, PUMPS, group=60)   # one group: most likely one batch
        first = max(ack.commit_ts for ack in w.acked)
        wait_until(lambda: (cp := read_checkpoint(reg, NAME)) is not None and cp.commit_ts >= first,
                   240, 0.2, what="sp-a to commit its first batch")
        w.write(60, PUMPS, group=20)
        # The second data batch stalls in the commit thread, before any table is written.
        wait_until(lambda: "failpoint spark-before-commit fired" in a.proc.log_text(), 120, 0.05,
                   what="sp-a to start its second batch")
        stale_epoch = leader_epoch(reg)
        a.proc.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: leader_epoch(reg) > stale_epoch, 60, 0.1, what="sp-b to take over")
            wait_until(lambda: "spark sink open" in b.proc.log_text(), 300, 0.2,
                       what="sp-b to open the sink (its fence snapshots)")
            new_epoch = leader_epoch(reg)
        finally:
            a.proc.signal(signal.SIGCONT)
        wait_until(lambda: not a.proc.alive(), 30, 0.1, what="the stale drainer to exit")
        assert a.proc.popen.returncode == EXIT_FENCED, a.proc.log_text()[-3000:]  # type: ignore[union-attr]
        assert "no longer certainly the active instance" in a.proc.log_text()
        w.write(60, PUMPS, group=20)
        last = max(ack.commit_ts for ack in w.acked)

        def covered() -> bool:
            if not b.proc.alive():
                raise AssertionError(f"drainer exited:\n{b.proc.log_text()[-3000:]}")
            cp = read_checkpoint(reg, NAME)
            return cp is not None and cp.commit_ts >= last
        wait_until(covered, 300, 0.5, what="the drainer's checkpoint to cover every acked txn")
        # A normal start and normal commits (sp-b's) log no warning or error, JVM included
        # (issue 21): only the JVM's own `WARNING: Using incubator modules` line, which log4j
        # does not govern; one INFO line per batch.
        noisy = [line for line in b.proc.log_text().splitlines()
                 if re.search(r"\b(ERROR|WARN|WARNING)\b", line) and "incubator modules" not in line]
        assert not noisy, noisy[:5]
        assert "spark batch committed" in b.proc.log_text()
    finally:
        w.close()
        etcd.close()

    warehouse = str(a.out_dir / "warehouse")
    want = sorted((ack.table, i, v) for ack in w.acked for op, i, v in ack.rows)
    assert len(want) > 300
    # Another JVM reads exactly the acked rows (checked after pyiceberg's read below, which
    # runs while that JVM starts).
    union = " UNION ALL ".join(f"SELECT 'sp.t{i}' AS t, id, v FROM sp.t{i}" for i in range(TABLES))
    other_jvm = SparkSql(warehouse, tmp_path, union)
    try:
        pyiceberg_and_fencing_checks(warehouse, want, stale_epoch, new_epoch)
        got = sorted((r["t"], r["id"], r["v"]) for r in other_jvm.rows())
        assert got == want
    finally:
        other_jvm.stop()


def pyiceberg_and_fencing_checks(warehouse: str, want: list[tuple], stale_epoch: int,
                                 new_epoch: int) -> None:
    # pyiceberg (no JVM) reads the same rows; each changelog holds every change once.
    cat = pyiceberg_catalog(warehouse)
    py_rows, changes = [], []
    for i in range(TABLES):
        cur = cat.load_table(f"sp.t{i}").scan(selected_fields=("id", "v")).to_arrow().to_pylist()
        py_rows += [(f"sp.t{i}", r["id"], r["v"]) for r in cur]
        log = cat.load_table(f"sp.t{i}_changelog").scan(
            selected_fields=("_commit_ts", "_seq")).to_arrow().to_pylist()
        changes += [(r["_commit_ts"], r["_seq"]) for r in log]
    assert sorted(py_rows) == want
    assert len(changes) == len(set(changes)) == len(want)

    # Fencing: on every table's main, the new epoch's fence snapshot comes before anything the
    # stale epoch made after the takeover — i.e. nothing of the stale epoch follows it.
    tables = [f"sp.t{i}" for i in range(TABLES)] + [f"sp.t{i}_changelog" for i in range(TABLES)] \
        + ["sluice._sluice_commits"]
    for name in tables:
        snaps = [summary_of(s) for s in main_ancestry(cat.load_table(name))]
        epochs = [int(s.get("sluice.epoch", "0")) for s in snaps]
        fence = next((k for k, s in enumerate(snaps) if s.get("sluice.fence") == "true"
                      and int(s.get("sluice.epoch", "0")) == new_epoch), None)
        assert fence is not None, (name, snaps)
        assert stale_epoch not in epochs[fence:], (name, epochs)
        assert all(e <= new_epoch for e in epochs), (name, epochs)
        # The stale epoch did commit before (its first batch): the check above means something.
        assert stale_epoch in epochs[:fence], (name, epochs)
