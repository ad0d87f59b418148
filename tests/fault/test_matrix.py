"""The fault matrix (issue #11 item 7): one real cluster under a sustained MariaDB workload, and
in turn every process kind killed, frozen, paused, taken offline or starved of disk.

Cluster: etcd, two TSOs, three pumps (replicas 1), MariaDB source + `sluice capture`, a Spark
drainer with a standby (HA, one name, Iceberg tables in the embedded catalog) and a MySQL drainer
into a second MariaDB.
While the workload runs (inserts, updates, deletes and primary-key changes over four tables):
 1. kill -9 a pump, restart it;
 2. kill -9 the MySQL drainer at a random moment, then at `mysql-sink-after-commit`, restart;
 3. kill -9 the active Spark drainer: the standby takes over;
 4. kill -9 the capture at a random moment, then at its group failpoint, restart;
 5. kill -9 the TSO leader;
 6. SIGSTOP the active Spark drainer past its TTL: the other takes over; after SIGCONT the stale
    one commits nothing (no snapshot of its epoch on any table's main after the new epoch's fence
    snapshot) and exits fenced;
 7. pause a pump and resume it; take a pump offline (`sluice ctl offline-pump`);
 8. trip a pump's disk threshold (`pump-disk-full`): its writes are refused, the capture fails
    over to the other pumps; then clear it (restart without the failpoint).
Each step ends only when a fresh probe row is in the MySQL downstream and both drainers' durable
checkpoints passed it. Steps 1, 2, 4 and 5 run first, while the Spark drainer's first session
starts (their probes wait for the MySQL drainer only). The capture must never exit unless killed:
a commit its pump never acknowledged makes it restart in-process with a new epoch. Random choices come from a seed printed in the output
(SLUICE_MATRIX_SEED=<seed> repeats a run); a failure names its step and prints the logs' tails.

Invariant: whatever fails, in the end the Spark current state and the MariaDB downstream both
equal the source, the Spark changelog holds no `(_commit_ts, _seq)` twice, and every source
GTID committed during the run is in the pipeline exactly once.
"""
from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sluice.core.registry import NodeKind
from sluice.core.tso_client import read_leader
from tests.support.capture import assert_exactly_once, assert_same_rows, gtid_pos, gtid_range
from tests.support.cluster import Cluster
from tests.support.mariadb import MariaDBServer
from tests.support.matrix import (EXIT_FENCED, MYSQL, PUMPS, SCHEMA, SPARK, SPARK_START_S, TABLES,
                                  Matrix, changelog_keys, duplicates, seed_from_env, spark_rows,
                                  stale_commits_after_fence)
from tests.support.procs import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.mariadb]

PACE_S = 0.05          # between source transactions (1-3 statements each): ~15 txn/s here
EARLY = (MYSQL,)       # the drainers steps 0-5 wait for (see "Spark drainer online")


def _session(warehouse: Path) -> Any:
    """This process's own JVM on the Spark drainer's catalog (the embedded one in its
    warehouse), for the final comparison."""
    from sluice.spark_sink.config import SessionConfig
    from sluice.spark_sink.session import session
    from tests.support.spark import TEST_CONF
    spark = session(SessionConfig(master="local[2]", warehouse=str(warehouse), log_level="ERROR",
                                  shuffle_partitions=1,
                                  spark_conf={**TEST_CONF, "spark.driver.memory": "768m",
                                              "spark.sql.catalog.sluice.cache-enabled": "false"}))
    spark.sql("SHOW NAMESPACES").collect()
    return spark


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory, etcd_module,  # type: ignore[no-untyped-def]
           mariadb_module: MariaDBServer) -> Iterator[tuple[Matrix, Callable[[], Future]]]:
    seed = seed_from_env()
    print(f"[matrix] seed {seed} (repeat with SLUICE_MATRIX_SEED={seed})", flush=True)
    work = tmp_path_factory.mktemp("matrix")
    downstream = MariaDBServer(work / "downstream", server_id=2, binlog=False).start()
    pool = ThreadPoolExecutor(1)
    sessions: list[Future] = []
    m: Matrix | None = None
    try:
        m = Matrix(work, Cluster(work, etcd_module.endpoint), mariadb_module, downstream,
                   seed, random.Random(seed))
        with m.step("start the cluster"):
            m.start(PACE_S)

        def start_session() -> Future:
            assert m is not None
            sessions.append(pool.submit(_session, m.spark["spark-a"].out_dir / "warehouse"))
            return sessions[-1]
        yield m, start_session
    finally:
        if m is not None:
            m.stop()
        for f in sessions:
            try:
                spark = f.result(timeout=120)
                spark.stop()
            except Exception:  # noqa: BLE001 - teardown continues
                pass
        pool.shutdown(wait=False)
        downstream.stop()


@pytest.mark.timeout(1800)
def test_every_fault_in_turn_leaves_spark_and_mariadb_equal_to_the_source_exactly_once(
        matrix: tuple[Matrix, Callable[[], Future]]) -> None:
    """Whatever fails, in the end the Spark current state and the MariaDB downstream both equal
    the source, the Spark changelog holds no `(_commit_ts, _seq)` twice, and every source GTID
    committed during the run is in the pipeline exactly once."""
    m, start_session = matrix
    rng = m.rng
    c = m.cluster

    with m.step("0 warm-up"):
        m.probe("0 warm-up", drainers=EARLY)

    with m.step("1 kill -9 a pump, restart it"):
        victim = rng.choice(PUMPS)
        time.sleep(rng.uniform(0.3, 2.0))
        c.pumps[victim].proc.kill9()
        m.gone.add(victim)
        time.sleep(rng.uniform(0.5, 2.0))   # the capture fails over; the merge waits for it
        c.start_pump(victim)
        m.gone.discard(victim)
        m.probe(f"1 {victim} restarted", drainers=EARLY)

    with m.step("2 kill -9 the MySQL drainer, randomly and at mysql-sink-after-commit"):
        assert m.mysql is not None
        time.sleep(rng.uniform(0.3, 2.0))
        m.mysql.proc.kill9()
        m.gone.add(MYSQL)
        fp = f"mysql-sink-after-commit=exit(137)@{rng.randint(2, 8)}"
        m.mysql = c.start_drainer(MYSQL, sink="mysql", wait_online=False,
                                  env={"SLUICE_FAILPOINTS": fp})
        code = m.wait_exit(m.mysql.proc, 60, f"the MySQL drainer to exit at {fp}")
        assert code == 137, m.mysql.proc.log_text()[-3000:]
        assert "failpoint mysql-sink-after-commit fired" in m.mysql.proc.log_text()
        m.mysql = c.start_drainer(MYSQL, sink="mysql", wait_online=False)
        m.gone.discard(MYSQL)
        m.probe("2 MySQL drainer restarted", drainers=EARLY)

    with m.step("4 kill -9 the capture, randomly and at its group failpoint"):
        assert m.capture is not None
        time.sleep(rng.uniform(0.3, 2.5))
        m.gone.add("capture")
        m.capture.kill9()
        fp = f"capture-between-prewrite-and-commit=exit(137)@{rng.randint(2, 6)}"
        cap = m.start_capture(env={"SLUICE_FAILPOINTS": fp}, wait=False)
        code = m.wait_exit(cap, 60, f"the capture to exit at {fp}")
        assert code == 137, cap.log_text()[-3000:]
        assert "failpoint capture-between-prewrite-and-commit fired" in cap.log_text()
        m.start_capture()
        m.gone.discard("capture")
        m.probe("4 capture restarted", drainers=EARLY)

    with m.step("5 kill -9 the TSO leader"):
        leader = m.tso_leader()
        proc, addr = m.tsos[leader]
        time.sleep(rng.uniform(0.2, 1.5))
        proc.kill9()
        m.gone.add(leader)

        def new_leader() -> bool:
            info = read_leader(m.etcd, c.cluster_id)
            return info is not None and info.name != leader
        wait_until(new_leader, 30, 0.1, what="another TSO to lead")
        m.start_tso(leader, addr)
        m.gone.discard(leader)
        m.probe(f"5 TSO leader {leader} killed", drainers=EARLY)

    # The Spark drainer's first session takes longer than steps 1, 2, 4 and 5 together: they
    # run while it starts (their probes wait for the MySQL drainer only; the Spark drainer reads
    # what they did from the pumps once it is up) and every probe from here on waits for both.
    with m.step("Spark drainer online"):
        m.wait_spark_online({})
        # The test's own JVM on the catalog, for the final comparison: started only now, so it
        # never races the drainer's catalog set-up, and while the remaining steps run.
        session = start_session()
        m.probe("Spark online", timeout=SPARK_START_S)

    with m.step("3 kill -9 the active Spark drainer: the standby takes over"):
        active = m.active_spark()
        other = next(k for k in m.spark if k != active)
        epoch = m.spark_epoch()
        standby_lines = m.spark[active].proc.log_text().count("standby at")
        # A hot standby: its JVM and catalog started while it waited.
        m.wait_prewarmed(m.spark[other].proc)
        time.sleep(rng.uniform(0.3, 3.0))
        m.spark[active].proc.kill9()
        killed = time.monotonic()
        m.gone.add(active)
        wait_until(lambda: m.spark_epoch() > epoch, 60, 0.1, what=f"{other} to take over")
        # The killed one comes back as soon as the other holds the leader key (so it can only
        # stand by): its JVM starts while the other opens the sink, ready for step 6.
        m.spark[active] = c.start_drainer(SPARK, sink="spark", instance=active, wait_online=False)
        m.gone.discard(active)
        wait_until(lambda: "spark sink open" in m.spark[other].proc.log_text(), 120, 0.2,
                   what=f"{other} to open the Spark sink")
        m.notes.append(f"hot standby {other} open {time.monotonic() - killed:.0f}s after the kill")
        m.wait_log(m.spark[active].proc, "standby at", standby_lines, 60)
        m.probe("3 Spark standby took over", timeout=SPARK_START_S)
        assert m.active_spark() == other

    with m.step("6 SIGSTOP the active Spark drainer past its TTL, then SIGCONT"):
        active = m.active_spark()
        other = next(k for k in m.spark if k != active)
        stale = m.spark[active]
        epoch = m.spark_epoch()
        m.wait_prewarmed(m.spark[other].proc)
        standby_lines = stale.proc.log_text().count("standby at")
        opens = m.spark[other].proc.log_text().count("spark sink open")
        stale.proc.signal(signal.SIGSTOP)
        m.gone.add(active)
        try:
            wait_until(lambda: m.spark_epoch() > epoch, 60, 0.1, what=f"{other} to take over")
            new_epoch = m.spark_epoch()
            # Its fence snapshots are on every table before the stale one resumes.
            m.wait_log(m.spark[other].proc, "spark sink open", opens, SPARK_START_S)
        finally:
            stale.proc.signal(signal.SIGCONT)
        code = m.wait_exit(stale.proc, 20, "the stale Spark drainer to exit")
        assert code == EXIT_FENCED, stale.proc.log_text()[-3000:]
        assert "no longer certainly the active instance" in stale.proc.log_text()
        m.spark[active] = c.start_drainer(SPARK, sink="spark", instance=active, wait_online=False)
        m.gone.discard(active)
        m.wait_log(m.spark[active].proc, "standby at", standby_lines, 60)
        m.probe("6 stale Spark drainer fenced", timeout=SPARK_START_S)
        assert m.active_spark() == other
        # The stale epoch committed nothing after the new epoch's fence, on any table.
        bad = stale_commits_after_fence(str(stale.out_dir / "warehouse"), epoch, new_epoch)
        assert not bad, f"snapshots of the stale epoch {epoch} after the fence of {new_epoch}: {bad}"

    with m.step("7 pause and resume a pump; take a pump offline"):
        paused = rng.choice(PUMPS)
        m.ctl("pause-pump", paused, "--wait", "--wait-timeout", "120")
        m.probe(f"7 {paused} paused")
        resumed = c.pumps[paused].proc.log_text().count("resumed: accepting writes")
        m.ctl("update-pump", paused, "--state", "online")
        m.wait_log(c.pumps[paused].proc, "resumed: accepting writes", resumed, 60)
        m.probe(f"7 {paused} resumed")
        off = rng.choice(PUMPS)
        m.ctl("offline-pump", off, "--wait", "--wait-timeout", "120")
        info = m.reg.get(NodeKind.PUMP, off)
        assert info is not None and info.state.value == "offline"
        final = info.status.max_commit_ts
        # Read what it holds before it goes (the runbook: stop it once drainers passed it).
        assert m.pump_log is not None
        wait_until(lambda: m.pump_log.pull(final), 60, 0.2,  # type: ignore[union-attr]
                   what=f"the pumps' own output up to {off}'s final ts")
        handle = c.pumps.pop(off)
        assert handle.proc.stop() == 0, handle.proc.log_text()[-3000:]
        m.probe(f"7 {off} offline")

    with m.step("8 trip a pump's disk threshold, then clear it"):
        full = rng.choice(sorted(c.pumps))
        failovers = m.capture_log_count("fails over to")
        c.pumps[full].proc.stop()
        fp = f"pump-disk-full=raise(0)@{rng.randint(2, 4)}"
        c.start_pump(full, env={"SLUICE_FAILPOINTS": fp},
                     **{"storage.stop-write-at-available-space": 1})
        m.wait_log(c.pumps[full].proc, "failpoint pump-disk-full fired", 0, 60)

        def failed_over() -> bool:
            m.check_alive()
            return m.capture_log_count("fails over to") > failovers
        wait_until(failed_over, 60, 0.1, what=f"the capture to fail over from {full}")
        # The merge keeps moving while one pump refuses new prewrites: it still takes its own
        # FAKEs and the commits of what it holds (docs/operations.md, "disk nearly full").
        m.probe(f"8 {full} disk full", timeout=60, drainers=EARLY)
        c.pumps[full].proc.stop()
        c.start_pump(full)
        m.probe(f"8 {full} disk cleared")

    with m.step("9 stop the workload; compare source, pumps, MariaDB and Spark"):
        assert m.load is not None
        m.load.stop()
        m.probe("9 final")
        want = gtid_range(m.gtid_before, gtid_pos(m.source))
        assert len(want) > 1000, f"only {len(want)} source transactions during the matrix"
        txns = m.pipeline_txns(want)
        assert_exactly_once(txns, want)
        for t in TABLES:
            assert_same_rows(m.source_rows(t), m.downstream_rows(t), f"MariaDB downstream {t}")
        spark = session.result(timeout=SPARK_START_S)
        for t in TABLES:
            cols = [r[0] for r in m.source.execute(f"SHOW COLUMNS FROM {SCHEMA}.`{t}`")]
            assert_same_rows(m.source_rows(t), spark_rows(spark, t, cols), f"Spark {t}")
        keys = changelog_keys(spark)
        twice = duplicates(keys)
        assert not twice, f"{len(twice)} (_commit_ts, _seq) twice in the changelog: {twice[:5]}"
        data = {t.commit_ts for t in txns if any(mu.changes for mu in t.prewrite.mutations)}
        got = {ct for ct, _ in keys}
        assert got == data, (f"changelog transactions differ from the pumps': missing "
                             f"{sorted(data - got)[:5]}, extra {sorted(got - data)[:5]}")
    total = sum(s for _, s in m.timings)
    print(f"[matrix] seed {m.seed}: {len(want)} source transactions, {m.load.key_changes} key "
          f"changes; steps " + ", ".join(f"{n.split()[0]}={s:.0f}s" for n, s in m.timings)
          + f"; total {total:.0f}s; capture in-process restarts "
          + str(m.capture_log_count("capture restarting")) + "; " + "; ".join(m.notes), flush=True)
