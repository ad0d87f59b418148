"""`sluice capture` snapshots at start: a table's existing rows reach the pumps as op=r chunks
reconciled with the binlog while a writer changes it — signal-table windows (DBLog) and
read-only consistent-snapshot chunks — and `snapshot-mode = when_needed` re-snapshots when the
saved position was purged from the source.

One cluster (etcd, TSO, two pumps) and one MariaDB per module (the purge test has its own
MariaDB, so other tests' positions are never purged); what the pumps hold is read with their own
PullBinlogs (`PumpLog`) and applied in commit order (op=r rows as upserts).
"""
from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.capture.snapshot.emit import SNAPSHOT_SUB_SEQ
from sluice.capture.snapshot.signals import SIGNAL_TABLE_DDL
from sluice.drainer.txn import Txn
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS
from tests.support.capture import (PUMPS, PumpLog, assert_same_rows, capture_metrics, final_tables,
                                   source_table, start_capture)
from tests.support.cluster import Cluster, running_cluster
from tests.support.mariadb import MariaDBServer, mariadb_server
from tests.support.procs import Proc, wait_until

pytestmark = pytest.mark.timeout(180)

ROWS = 3000
# Issue #10's initial-snapshot acceptance: 200k rows under a concurrent writer, in both modes.
BIG_ROWS, BIG_CHUNK = 200_000, 8192
_CHUNK_LINE = re.compile(r"snapshot chunk read .*?table=(\S+) chunk=(\d+) rows=(\d+) "
                         r"select_ms=([\d.]+)")


# ------------------------------------------------------------------------------------------------
# helpers (shared with test_snapshot_signals.py and tests/fault/test_snapshot_crash.py)
# ------------------------------------------------------------------------------------------------

def make_table(db: MariaDBServer, schema: str, table: str, rows: int, signal_table: bool = True) -> None:
    """schema.table (id INT PK, balance, note) with ids 1..rows; the sluice.signals table."""
    db.execute(f"CREATE DATABASE IF NOT EXISTS {schema}")
    if signal_table:
        db.execute("CREATE DATABASE IF NOT EXISTS sluice")
        db.execute(SIGNAL_TABLE_DDL.format(table="sluice.signals"))
    db.execute(f"CREATE TABLE {schema}.{table} (id INT PRIMARY KEY, balance BIGINT NOT NULL, "
               "note VARCHAR(32))")
    for lo in range(1, rows + 1, 5000):
        values = ",".join(f"({i},{i * 10},'n{i}')" for i in range(lo, min(rows, lo + 4999) + 1))
        db.execute(f"INSERT INTO {schema}.{table} VALUES {values}")


class Churn:
    """Updates, deletes and inserts on schema.table (autocommit, one per statement) in a thread
    until stopped; records each statement's latency (a table lock would show there)."""

    def __init__(self, db: MariaDBServer, schema: str, table: str, keys: int, seed: int,
                 pace_s: float = 0.01, deletes: bool = True) -> None:
        self.db, self.schema, self.table, self.keys = db, schema, table, keys
        self.rnd = random.Random(seed)
        self.pace_s, self.deletes = pace_s, deletes
        self.stop_event = threading.Event()
        self.latencies: list[float] = []
        self.updated: set[int] = set()
        self.statements = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Churn:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(15)
        assert self.error is None, f"writer failed: {self.error!r}"

    def _run(self) -> None:
        conn = self.db.connect(self.schema)
        next_id = self.keys * 2 + 1
        try:
            with conn.cursor() as cur:
                while not self.stop_event.is_set():
                    k = self.rnd.randrange(1, self.keys + 200)
                    op = self.rnd.random()
                    t0 = time.monotonic()
                    if op < 0.6 or not self.deletes and op < 0.8:
                        cur.execute(f"UPDATE {self.table} SET balance = balance + 1, note = %s "
                                    "WHERE id = %s", (f"u{self.rnd.randrange(1000)}", k))
                        self.updated.add(k)
                    elif op < 0.8:
                        cur.execute(f"DELETE FROM {self.table} WHERE id = %s", (k,))
                        # Deleted and re-inserted: maybe inside one chunk's window.
                        if self.rnd.random() < 0.5:
                            cur.execute(f"INSERT INTO {self.table} VALUES (%s, %s, %s)",
                                        (k, 1, "again"))
                    else:
                        cur.execute(f"INSERT INTO {self.table} VALUES (%s, %s, %s)",
                                    (next_id, 7, "new"))
                        next_id += 1
                    conn.commit()
                    self.latencies.append(time.monotonic() - t0)
                    self.statements += 1
                    if self.pace_s:
                        time.sleep(self.pace_s)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e
        finally:
            conn.close()


def chunk_reads(proc: Proc) -> list[tuple[str, int, int, float]]:
    """(table, chunk index, rows, select ms) of every chunk the capture read, from its log."""
    return [(m[1], int(m[2]), int(m[3]), float(m[4])) for m in _CHUNK_LINE.finditer(proc.log_text())]


def chunk_txns(txns: list[Txn]) -> list[Txn]:
    """The snapshot chunks (op=r rows) among the pumps' transactions, in commit order."""
    return [t for t in txns if t.prewrite.snapshot_chunk and t.prewrite.mutations]


def progress_of(t: Txn) -> pb.SnapshotProgress | None:
    snap = getattr(t, "snapshot", None)
    if snap is not None:
        return snap
    commit = getattr(t, "commit", None)
    if isinstance(commit, pb.Binlog) and commit.HasField("snapshot"):
        return commit.snapshot
    return None


def last_progress(txns: list[Txn]) -> pb.SnapshotProgress | None:
    ps = [p for t in txns if (p := progress_of(t)) is not None]
    return ps[-1] if ps else None


def read_rows(txns: list[Txn], schema: str, table: str) -> dict[Any, int]:
    """id -> how many op=r copies of it the pumps hold."""
    out: dict[Any, int] = {}
    for t in chunk_txns(txns):
        for m in t.prewrite.mutations:
            if (m.schema_name, m.table_name) == (schema, table):
                for ch in m.changes:
                    if ch.tp == pb.READ:
                        key = ch.after.columns[0]
                        k = key.int if key.HasField("int") else key.uint
                        out[k] = out.get(k, 0) + 1
    return out


def wait_folded_equal(log: PumpLog, db: MariaDBServer, producer: str, schema: str, table: str,
                      procs: tuple[Proc, ...], timeout: float = 30,
                      keys: Any = None) -> dict[Any, dict[str, Any]]:
    """Until the pumps' output, applied in commit order, equals the source table (restricted to
    ids for which `keys(id)` holds); then asserted with a readable message."""
    def pick(rows: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
        return {k: v for k, v in rows.items() if keys is None or keys(k)}
    want = pick(source_table(db, schema, table))
    last = [0.0]

    def equal() -> bool:
        # Folding every transaction is the slow part: not after every pull.
        if time.monotonic() - last[0] < 2.0:
            return False
        last[0] = time.monotonic()
        got = pick(final_tables(log.txns(producer)).get((schema, table), {}))
        return set(got) == set(want) and all(
            {c: got[k].get(c) for c in row} == row for k, row in want.items())
    try:
        log.wait_for(equal, timeout, watch=procs)
    except TimeoutError:
        pass    # compared below, with a readable message
    got = pick(final_tables(log.txns(producer)).get((schema, table), {}))
    assert_same_rows(want, got, f"{schema}.{table}")
    return want


def wait_snapshot_finished(log: PumpLog, producer: str, proc: Proc, n: int = 1,
                           timeout: float = 90) -> None:
    """Until the pumps hold a finished progress of `n` different snapshots of the producer (the
    capture logs "snapshot done" before its last chunk is committed)."""
    def finished() -> bool:
        ids = {p.snapshot_id for t in log.txns(producer)
               if (p := progress_of(t)) is not None and p.finished}
        return len(ids) >= n
    log.wait_for(finished, timeout, watch=(proc,), what=f"{producer}'s snapshot to finish")


def fresh_log(cluster: Cluster) -> PumpLog:
    ts = TS(cluster.tso_addrs, cluster.cluster_id)
    try:
        return PumpLog(cluster, ts.get())
    finally:
        ts.close()


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("capture-snapshot"), etcd_module.endpoint, PUMPS) as c:
        yield c


@pytest.mark.parametrize("mode", ["signal-table", "read-only"])
def test_initial_snapshot_with_concurrent_writes_equals_the_source(
        cluster: Cluster, mariadb_module: MariaDBServer, mode: str) -> None:
    """The 200k rows existing before the capture started arrive as op=r chunks while a writer
    updates, deletes, re-inserts and inserts rows of the table, reconciled with the binlog:
    applying everything the pumps committed, in commit order, gives the source table;
    every chunk binlog carries snapshot progress and a sub_seq of 2^32 + n. Read-only mode
    writes nothing to the source (no watermark rows)."""
    db = mariadb_module
    table = f"acct_{mode.replace('-', '_')}"
    producer = f"cap-snap-{mode}"
    make_table(db, "snap", table, BIG_ROWS)
    marks_before = db.execute("SELECT COUNT(*) FROM sluice.signals")[0][0]
    log = fresh_log(cluster)
    churn = Churn(db, "snap", table, BIG_ROWS, seed=5, pace_s=0.002).start()
    settings: dict[str, object] = {
        "snapshot-mode": "initial", "snapshot-chunk-size": BIG_CHUNK,
        "snapshot-parallelism": 2, "filter.include-tables": [rf"snap\.{table}"]}
    if mode == "read-only":
        settings["snapshot-read-only"] = True
    else:
        settings["signal-table"] = "sluice.signals"
    cap = start_capture(cluster, db, producer, **settings)
    try:
        wait_snapshot_finished(log, producer, cap, timeout=240)
        churn.stop()
        assert churn.statements > 200, churn.statements   # the writer ran beside the chunks
        wait_folded_equal(log, db, producer, "snap", table, (cap,), timeout=120)
        txns = log.txns(producer)
        chunks = chunk_txns(txns)
        assert len(chunks) >= BIG_ROWS // BIG_CHUNK
        assert all(not t.prewrite.source.gtid for t in chunks)
        progress = [progress_of(t) for t in chunks]
        assert all(p is not None for p in progress)
        assert progress[-1].finished and progress[-1].tables == [f"snap.{table}"]
        assert progress[-1].mode == mode
        assert progress[-1].rows_done == sum(read_rows(txns, "snap", table).values())
        assert all(t.position.sub_seq >= SNAPSHOT_SUB_SEQ for t in chunks)
        assert "sluice.signals" not in {f"{m.schema_name}.{m.table_name}"
                                        for t in txns for m in t.prewrite.mutations}
        marks = db.execute("SELECT COUNT(*) FROM sluice.signals")[0][0] - marks_before
        if mode == "read-only":
            assert marks == 0, "read-only mode wrote watermark rows to the source"
        else:
            assert marks >= 2 * len(chunks)
        # What a progress bar shows: rows and chunks per table, state, tables left.
        label = f'{{table="snap.{table}"}}'
        wait_until(lambda: capture_metrics(cap)['sluice_capture_snapshot_state{state="finished"}'] == 1,
                   5, 0.2, what="the snapshot state metric to say finished")
        m = capture_metrics(cap)
        # Rows read by the chunk SELECTs; those changed inside a window are dropped after.
        assert m[f"sluice_capture_snapshot_rows_total{label}"] >= progress[-1].rows_done > 0
        assert m[f"sluice_capture_snapshot_chunks_total{label}"] == len(
            [line for line in cap.log_text().splitlines() if "snapshot chunk read" in line])
        assert m["sluice_capture_snapshot_chunk_seconds_count"] >= BIG_ROWS // BIG_CHUNK
        assert m["sluice_capture_snapshot_tables_remaining"] == 0
    finally:
        churn.stop_event.set()
        log.close()
        cap.stop()


def test_when_needed_takes_a_new_snapshot_after_the_saved_position_was_purged(
        cluster: Cluster, tmp_path: Path) -> None:
    """Invariant (modes): a saved position the source has purged is an error — except in
    `when_needed`, which takes a fresh snapshot instead. Rows written while the capture was down
    and purged from the binlog reach the pumps through the new snapshot. A snapshot whose last
    table is empty still records "finished" (a row-less progress transaction)."""
    with mariadb_server(tmp_path / "purge-db", server_id=7) as db:   # purged: not shared
        make_table(db, "gapdb", "acct", 500)
        # Snapshotted last and empty: "finished" is recorded without a chunk.
        db.execute("CREATE TABLE gapdb.zz_empty (id INT PRIMARY KEY)")
        log = fresh_log(cluster)
        base = {"snapshot-mode": "when_needed", "snapshot-chunk-size": 100,
                "signal-table": "sluice.signals", "filter.include-databases": ["gapdb"]}
        cap = start_capture(cluster, db, "cap-purge", name="cap-purge-1", **base)
        wait_snapshot_finished(log, "cap-purge", cap)
        done = [t for t in log.txns("cap-purge") if (p := progress_of(t)) and p.finished]
        assert not done[0].prewrite.mutations, "finished was recorded by a chunk, not the empty table"
        assert list(progress_of(done[0]).tables) == ["gapdb.acct", "gapdb.zz_empty"]
        wait_folded_equal(log, db, "cap-purge", "gapdb", "acct", (cap,))
        assert cap.stop() == 0
        # While it is down: changes, then the binlogs holding them are purged.
        db.execute("UPDATE gapdb.acct SET balance = -balance, note = 'gap' WHERE id % 3 = 0")
        db.execute("INSERT INTO gapdb.acct VALUES (9001, 1, 'gap'), (9002, 2, 'gap')")
        db.execute("FLUSH BINARY LOGS")
        newest = db.execute("SHOW BINARY LOGS")[-1][0]

        def purged() -> bool:
            # A binlog still read by the stopped capture's dump thread is skipped until the
            # server notices the closed connection.
            db.execute(f"PURGE BINARY LOGS TO '{newest}'")
            return len(db.execute("SHOW BINARY LOGS")) == 1
        wait_until(purged, 20, 0.3, what="the old binlogs to be purged")

        refused = start_capture(cluster, db, "cap-purge", name="cap-purge-initial",
                                **{**base, "snapshot-mode": "initial"})
        wait_until(lambda: not refused.alive(), 30, what="the initial-mode capture to refuse")
        assert refused.popen.returncode == 2, refused.log_text()[-2000:]  # type: ignore[union-attr]
        assert "no longer in the source's binlogs" in refused.log_text()

        cap2 = start_capture(cluster, db, "cap-purge", name="cap-purge-2", **base)
        try:
            wait_snapshot_finished(log, "cap-purge", cap2, n=2)
            assert "snapshot new: saved position purged" in cap2.log_text()
            want = wait_folded_equal(log, db, "cap-purge", "gapdb", "acct", (cap2,))
            assert want[9001]["note"] == "gap" and want[3]["note"] == "gap"
            ids = {p.snapshot_id for t in log.txns("cap-purge") if (p := progress_of(t))}
            assert len(ids) == 2, f"want the first and the when_needed snapshot, got {ids}"
        finally:
            log.close()
            cap2.stop()
