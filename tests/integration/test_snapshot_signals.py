"""Snapshot signals in a running capture: Debezium's signal table (execute with regexes and an
additional condition, pause, resume, stop) and the etcd channel written by `sluice ctl snapshot`
for a source user without write privileges (read-only chunks, raced by a writer); and no table
lock: writers and a concurrent ALTER TABLE are never blocked longer than one chunk query.

One cluster (etcd, TSO, two pumps) and one MariaDB per module; what the pumps hold is read with
their own PullBinlogs.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator

import pymysql
import pytest

from sluice.capture.snapshot.readonly import CHUNK_FAILPOINT
from sluice.proto import sluice_pb2 as pb
from tests.integration.test_capture_snapshot import (Churn, chunk_reads, chunk_txns, fresh_log,
                                                     last_progress, make_table, read_rows,
                                                     wait_folded_equal, wait_snapshot_finished)
from tests.support.capture import PUMPS, start_capture, wait_streaming
from tests.support.cluster import Cluster, running_cluster
from tests.support.ctl import ctl_in
from tests.support.mariadb import MariaDBServer
from tests.support.procs import Proc, sluice_argv, wait_until

pytestmark = pytest.mark.timeout(180)

LOCK_SLACK_S = 1.0    # scheduling noise on a loaded 2-core machine, far below a snapshot's length


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("snapshot-signals"), etcd_module.endpoint, PUMPS) as c:
        yield c


def _signal(db: MariaDBServer, sid: str, tp: str, data: object = None) -> None:
    db.execute("INSERT INTO sluice.signals VALUES (%s, %s, %s)",
               (sid, tp, json.dumps(data) if data is not None else None))


class Alters:
    """ALTER TABLE ... ADD COLUMN on another table in a loop; each statement's latency."""

    def __init__(self, db: MariaDBServer, table: str, every_s: float = 0.2) -> None:
        self.db, self.table, self.every_s = db, table, every_s
        self.latencies: list[float] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conn = self.db.connect()     # one connection: only the statement is timed
        try:
            with conn.cursor() as cur:
                i = 0
                while not self.stop_event.wait(self.every_s) and i < 30:
                    t0 = time.monotonic()
                    cur.execute(f"ALTER TABLE {self.table} ADD COLUMN c{i} INT NULL")
                    self.latencies.append(time.monotonic() - t0)
                    i += 1
        finally:
            conn.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(15)


def _assert_never_blocked(cap: Proc, churn: Churn, alters: Alters, snapshot_s: float) -> None:
    chunk_s = max(ms for _, _, _, ms in chunk_reads(cap)) / 1000
    assert alters.latencies and churn.latencies
    # A lock held across the snapshot would have blocked a statement longer than the bound.
    assert snapshot_s > chunk_s + LOCK_SLACK_S
    worst = max(max(churn.latencies), max(alters.latencies))
    assert worst <= chunk_s + LOCK_SLACK_S, (
        f"a statement was blocked {worst:.2f}s, longer than one chunk query ({chunk_s:.2f}s): "
        f"writes max {max(churn.latencies):.2f}s, ALTERs "
        f"{[round(x, 2) for x in alters.latencies]}")


def test_execute_snapshot_signal_selects_tables_by_regex_with_a_condition(
        cluster: Cluster, mariadb_module: MariaDBServer) -> None:
    """An execute-snapshot row in the signal table (inserted by `sluice ctl snapshot execute
    --signal-table ... --source ...`) snapshots exactly the tables its regex matches, only the
    rows its additional condition selects, reconciled with the binlog while a writer changes one
    of them; writers and an ALTER on another table are never blocked longer than one chunk
    query."""
    db = mariadb_module
    make_table(db, "sigdb", "t1", 1200)
    make_table(db, "sigdb", "t2", 800)
    make_table(db, "sigdb", "other", 50)
    log = fresh_log(cluster)
    cap = start_capture(cluster, db, "cap-sig", env={"SLUICE_FAILPOINTS": f"{CHUNK_FAILPOINT}=sleep(150)"},
                        **{"snapshot-chunk-size": 300, "signal-table": "sluice.signals",
                           "filter.include-databases": ["sigdb"]})
    churn = alters = None
    try:
        wait_streaming(cap)
        churn = Churn(db, "sigdb", "t1", 1200, seed=3).start()
        alters = Alters(db, "sigdb.other")
        source = f"mysql://{db.user}:{db.password}@127.0.0.1:{db.port}"
        sent = ctl_in(cluster.etcd, cluster.cluster_id, "snapshot", "execute", "--producer",
                      "cap-sig", "--tables", r"sigdb\.t[12]", "--condition", "id % 2 = 0",
                      "--signal-table", "sluice.signals", "--source", source)
        assert sent.code == 0, sent
        assert db.execute("SELECT type FROM sluice.signals WHERE id LIKE 'ctl-%'") == \
            [("execute-snapshot",)]
        t0 = time.monotonic()
        wait_snapshot_finished(log, "cap-sig", cap)
        snapshot_s = time.monotonic() - t0
        churn.stop()
        alters.stop()
        txns = log.txns("cap-sig")
        t2 = read_rows(txns, "sigdb", "t2")
        assert sorted(t2) == list(range(2, 801, 2)), "t2: want exactly its even ids as op=r"
        assert all(k % 2 == 0 for k in read_rows(txns, "sigdb", "t1"))
        assert not read_rows(txns, "sigdb", "other")
        wait_folded_equal(log, db, "cap-sig", "sigdb", "t1", (cap,), keys=lambda k: k % 2 == 0)
        p = last_progress(log.txns("cap-sig"))
        assert p is not None and p.finished and list(p.tables) == ["sigdb.t1", "sigdb.t2"]
        assert p.mode == "signal-table"
        _assert_never_blocked(cap, churn, alters, snapshot_s)
    finally:
        for w in (churn, alters):
            if w is not None:
                w.stop_event.set()
        log.close()
        cap.stop()


def test_pause_resume_and_stop_signals(cluster: Cluster, mariadb_module: MariaDBServer) -> None:
    """pause-snapshot stops reading chunks after the ones in flight (recorded as paused),
    resume-snapshot continues, stop-snapshot finishes the snapshot before its last chunk."""
    db = mariadb_module
    make_table(db, "pausedb", "big", 3000)
    log = fresh_log(cluster)
    cap = start_capture(cluster, db, "cap-pause", env={"SLUICE_FAILPOINTS": f"{CHUNK_FAILPOINT}=sleep(150)"},
                        **{"snapshot-chunk-size": 100, "signal-table": "sluice.signals",
                           "filter.include-databases": ["pausedb"]})

    def recorded(paused: bool, finished: bool = False) -> None:
        def check() -> bool:
            p = last_progress(log.txns("cap-pause"))
            return p is not None and p.paused == paused and p.finished == finished
        log.wait_for(check, 30, watch=(cap,), what=f"paused={paused} finished={finished} recorded")

    try:
        wait_streaming(cap)
        _signal(db, "p-exec", "execute-snapshot", {"data-collections": [r"pausedb\.big"]})
        wait_until(lambda: len(chunk_reads(cap)) >= 3, 30, what="3 chunks read")
        _signal(db, "p-pause", "pause-snapshot")
        recorded(paused=True)
        n_paused = len(chunk_reads(cap))
        time.sleep(1.0)   # 6 chunks' worth of failpoint delay: none may be read meanwhile
        assert len(chunk_reads(cap)) <= n_paused + 1, "chunks were read while paused"
        n_paused = len(chunk_reads(cap))
        _signal(db, "p-resume", "resume-snapshot")
        wait_until(lambda: len(chunk_reads(cap)) >= n_paused + 2, 30, what="chunks after resume")
        # Paused again, so the stop below lands before the last chunk however fast chunks are.
        _signal(db, "p-pause-2", "pause-snapshot")
        recorded(paused=True)
        _signal(db, "p-stop", "stop-snapshot", {"data-collections": [r"pausedb\..*"]})
        recorded(paused=False, finished=True)
        n_stopped = len(chunk_reads(cap))
        assert n_stopped < 30, "the snapshot ran to its end before stop-snapshot"
        _signal(db, "p-resume-2", "resume-snapshot")   # ignored: nothing runs any more
        time.sleep(0.5)
        assert len(chunk_reads(cap)) == n_stopped, "chunks were read after the stop"
        p = last_progress(log.txns("cap-pause"))
        assert p is not None and p.finished and p.rows_done < 3000
        assert cap.alive()
    finally:
        log.close()
        cap.stop()


def _ctl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sluice_argv("ctl", "--etcd", cluster.etcd, "--cluster-id",
                                      str(cluster.cluster_id), *args),
                          capture_output=True, text=True, timeout=60)


def test_etcd_signal_snapshots_a_read_only_source_and_no_stale_row_wins(
        cluster: Cluster, mariadb_module: MariaDBServer) -> None:
    """`sluice ctl snapshot execute` reaches a capture whose source user cannot write, through
    etcd; the chunks are read in consistent snapshots while a writer updates rows of the chunk
    being read (a failpoint delays each SELECT after its position p): older chunk rows are
    emitted at p, before the newer binlog changes, so no stale row wins downstream."""
    db = mariadb_module
    make_table(db, "rodb", "acct", 1000, signal_table=False)
    make_table(db, "rodb", "other", 10, signal_table=False)
    db.execute("CREATE USER IF NOT EXISTS 'snapro'@'127.0.0.1' IDENTIFIED BY 'ro'")
    db.execute("GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'snapro'@'127.0.0.1'")
    ro = pymysql.connect(host="127.0.0.1", port=db.port, user="snapro", password="ro")
    with pytest.raises(pymysql.err.OperationalError, match="1142"):
        ro.cursor().execute("INSERT INTO rodb.acct VALUES (99999, 0, 'x')")
    ro.close()
    log = fresh_log(cluster)
    cap = start_capture(cluster, db, "cap-ro", env={"SLUICE_FAILPOINTS": f"{CHUNK_FAILPOINT}=sleep(300)"},
                        **{"source.user": "snapro", "source.password": "ro",
                           "snapshot-chunk-size": 100, "filter.include-databases": ["rodb"]})
    churn = alters = None
    try:
        wait_streaming(cap)
        churn = Churn(db, "rodb", "acct", 1000, seed=9, pace_s=0.005).start()
        alters = Alters(db, "rodb.other")
        r = _ctl(cluster, "snapshot", "execute", "--producer", "cap-ro", "--tables", r"rodb\.acct",
                 "--condition", "id <= 900", "--wait", "30")
        assert r.returncode == 0, r.stderr
        t0 = time.monotonic()
        wait_snapshot_finished(log, "cap-ro", cap)
        snapshot_s = time.monotonic() - t0
        churn.stop()
        alters.stop()
        want = wait_folded_equal(log, db, "cap-ro", "rodb", "acct", (cap,), keys=lambda k: k <= 900)
        txns = log.txns("cap-ro")
        read = read_rows(txns, "rodb", "acct")
        assert read and max(read) <= 900
        # The race happened: chunks hold older values than the source's final ones, and yet the
        # final state above is the source's.
        read_balance = {ch.after.columns[0].int: ch.after.columns[1].int
                        for t in chunk_txns(txns) for m in t.prewrite.mutations
                        for ch in m.changes if ch.tp == pb.READ}
        stale = [k for k, bal in read_balance.items() if k in want and want[k]["balance"] != bal]
        assert stale, "no chunk read raced a writer: the test proved nothing"
        p = last_progress(txns)
        assert p is not None and p.finished and p.mode == "read-only"
        s = _ctl(cluster, "snapshot", "status", "--producer", "cap-ro", "--json")
        assert s.returncode == 0, s.stderr
        status = json.loads(s.stdout)
        assert status["pending_signals"] == []
        wait_until(lambda: json.loads(_ctl(cluster, "snapshot", "status", "--producer", "cap-ro",
                                           "--json").stdout)["snapshot"]["finished"], 10,
                   what="the published progress to say finished")
        _assert_never_blocked(cap, churn, alters, snapshot_s)
    finally:
        for w in (churn, alters):
            if w is not None:
                w.stop_event.set()
        log.close()
        cap.stop()

