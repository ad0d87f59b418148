"""`sluice capture` with `snapshot-mode = "initial"`: a table's existing rows reach the pumps as
op=r chunks reconciled with the binlog (DBLog signal-table windows), while a writer changes it.

One cluster (etcd, TSO, two pumps) and one MariaDB per module; what the pumps hold is read with
their own PullBinlogs (`PumpLog`) and applied in commit order (op=r rows as upserts).
"""
from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest

from sluice.capture.snapshot.emit import SNAPSHOT_SUB_SEQ
from sluice.capture.snapshot.signals import SIGNAL_TABLE_DDL
from sluice.drainer.txn import Txn
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS
from tests.support.capture import (PUMPS, PumpLog, assert_same_rows, final_tables, source_table,
                                   start_capture)
from tests.support.cluster import Cluster, running_cluster
from tests.support.mariadb import MariaDBServer

pytestmark = pytest.mark.timeout(120)

ROWS = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("capture-snapshot"), etcd_module.endpoint, PUMPS) as c:
        yield c


def _writer(db: MariaDBServer, stop: threading.Event, seed: int) -> None:
    """Updates, deletes and inserts on snap.acct until stopped (autocommit, one per statement)."""
    rnd = random.Random(seed)
    conn = db.connect("snap")
    try:
        with conn.cursor() as cur:
            next_id = ROWS + 1
            while not stop.is_set():
                k = rnd.randrange(1, ROWS + 200)
                op = rnd.random()
                if op < 0.5:
                    cur.execute("UPDATE acct SET balance = balance + 1, note = %s WHERE id = %s",
                                (f"u{rnd.randrange(1000)}", k))
                elif op < 0.7:
                    cur.execute("DELETE FROM acct WHERE id = %s", (k,))
                else:
                    cur.execute("INSERT INTO acct VALUES (%s, %s, %s)", (next_id, 7, "new"))
                    next_id += 1
                conn.commit()
    finally:
        conn.close()


def test_initial_snapshot_with_concurrent_writes_equals_the_source(
        cluster: Cluster, mariadb_module: MariaDBServer) -> None:
    """Rows existing before the capture started arrive as op=r chunks, reconciled with the
    binlog: applying everything the pumps committed, in commit order, gives the source table;
    every chunk binlog carries snapshot progress and a sub_seq of 2^32 + n."""
    db = mariadb_module
    db.execute("CREATE DATABASE IF NOT EXISTS snap")
    db.execute("CREATE DATABASE IF NOT EXISTS sluice")
    db.execute(SIGNAL_TABLE_DDL.format(table="sluice.signals"))
    db.execute("CREATE TABLE snap.acct (id INT PRIMARY KEY, balance BIGINT NOT NULL, "
               "note VARCHAR(32))")
    values = ",".join(f"({i},{i * 10},'n{i}')" for i in range(1, ROWS + 1))
    db.execute(f"INSERT INTO snap.acct VALUES {values}")
    ts = TS(cluster.tso_addrs, cluster.cluster_id)
    log = PumpLog(cluster, ts.get())
    ts.close()
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(db, stop, 5), daemon=True)
    writer.start()
    cap = start_capture(cluster, db, "cap-snap", **{
        "snapshot-mode": "initial", "snapshot-chunk-size": 256, "signal-table": "sluice.signals",
        "filter.include-databases": ["snap"]})
    try:
        def snapshot_done() -> bool:
            return "snapshot done" in cap.log_text()
        log.wait_for(snapshot_done, 60, watch=(cap,), what="the snapshot to finish")
        stop.set()
        writer.join(10)
        want = source_table(db, "snap", "acct")

        def caught_up() -> bool:
            got = final_tables(log.txns("cap-snap")).get(("snap", "acct"), {})
            return got == {k: {c: got[k].get(c) for c in row} for k, row in want.items()} \
                if set(got) == set(want) else False
        try:
            log.wait_for(caught_up, 30, watch=(cap,))
        except TimeoutError:
            pass    # compared below, with a readable message
        txns = log.txns("cap-snap")
        assert_same_rows(want, final_tables(txns)[("snap", "acct")], "snap.acct")
        chunks = [t for t in txns if t.prewrite.snapshot_chunk]
        assert len(chunks) >= ROWS // 256
        assert all(not t.prewrite.source.gtid for t in chunks)
        progress = [_commit_snapshot(t) for t in chunks]
        assert all(p is not None for p in progress)
        assert progress[-1].finished and progress[-1].tables == ["snap.acct"]
        assert progress[-1].rows_done == sum(
            sum(1 for ch in m.changes if ch.tp == pb.READ) for t in chunks for m in t.prewrite.mutations)
        assert all(t.position.sub_seq >= SNAPSHOT_SUB_SEQ for t in chunks)
        assert "sluice.signals" not in {f"{m.schema_name}.{m.table_name}"
                                        for t in txns for m in t.prewrite.mutations}
    finally:
        stop.set()
        log.close()
        cap.stop()


def _commit_snapshot(t: Txn) -> pb.SnapshotProgress | None:
    snap = getattr(t, "snapshot", None)
    if snap is not None:
        return snap
    commit = getattr(t, "commit", None)
    if isinstance(commit, pb.Binlog) and commit.HasField("snapshot"):
        return commit.snapshot
    return None
