"""Snapshots reconciled with the binlog against a real MariaDB while a writer changes the table.

Each test loads a table, takes the GTID position, starts the capture's own BinlogReader from it
(the model starts empty), snapshots the table in chunks while a writer updates, deletes and
inserts — aiming at chunk boundaries and at keys of the chunks being read, deleting and
re-inserting inside one window — and applies, in emission order, binlog changes and emitted
chunk rows (op=r as upserts) to an in-memory model. At the end the model equals the source.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any


from sluice.capture.reader import BinlogReader
from sluice.capture.schema import SchemaTracker, TableFilter
from sluice.capture.snapshot.chunks import ChunkSplitter, SplitOptions
from sluice.capture.snapshot.emit import SNAPSHOT_SUB_SEQ, ChunkEmission
from sluice.capture.snapshot.keys import SnapshotTable, key_of_row, load_shape
from sluice.capture.snapshot.readonly import ConsistentReadHold
from sluice.capture.snapshot.reader import RowConverter, snapshot_connect
from sluice.capture.snapshot.signals import SIGNAL_TABLE_DDL
from sluice.capture.snapshot.window import WindowReconciler, split_signals
from sluice.capture.snapshot.worker import TableRun, run_read_only, run_signal_table
from sluice.core import rowcodec
from sluice.core.position import compare, format_position
from sluice.proto import sluice_pb2 as pb
from tests.support.mariadb import MariaDBServer

ROWS = 20_000
CHUNK = 1000


def conn_args(db: MariaDBServer) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": db.port, "user": db.user, "password": db.password}


class Model:
    """key -> row values; binlog changes and op=r rows applied in emission order."""

    def __init__(self, shape: SnapshotTable) -> None:
        self.shape = shape
        self.rows: dict[tuple, tuple] = {}
        self.chunks = 0
        self.dropped = 0
        self.positions: list[pb.Position] = []

    def values(self, row: pb.Row) -> tuple:
        return tuple(rowcodec.datum_to_python(d, c) for d, c in zip(row.columns, self.shape.columns))

    def apply_mutation(self, m: pb.TableMutation) -> None:
        if (m.schema_name, m.table_name) != (self.shape.key.db, self.shape.key.table):
            return
        for ch in m.changes:
            if ch.tp in (pb.UPDATE, pb.DELETE):
                self.rows.pop(key_of_row(ch.before, self.shape), None)
            if ch.tp in (pb.UPDATE, pb.INSERT):
                self.rows[key_of_row(ch.after, self.shape)] = self.values(ch.after)

    def apply_chunk(self, e: ChunkEmission) -> None:
        self.chunks += 1
        self.dropped += e.dropped
        for r in e.rows:
            self.rows[key_of_row(r, self.shape)] = self.values(r)


def source_rows(db: MariaDBServer, shape: SnapshotTable) -> dict[tuple, tuple]:
    conn = snapshot_connect(conn_args(db))
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {shape.key.sql_table}")
            conv = RowConverter(shape.columns)
            out = {}
            for r in cur.fetchall():
                row = conv.row(r)
                out[key_of_row(row, shape)] = tuple(
                    rowcodec.datum_to_python(d, c) for d, c in zip(row.columns, shape.columns))
            return out
    finally:
        conn.close()


class Writer(threading.Thread):
    """Updates, deletes, inserts; half of them aimed at the chunks being read and their bounds."""

    def __init__(self, db: MariaDBServer, dbname: str, targets: Callable[[], list[int]]) -> None:
        super().__init__(daemon=True)
        self.db, self.dbname, self.targets = db, dbname, targets
        self.stop = threading.Event()
        self.ops = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rnd = random.Random(10)
        conn = self.db.connect(self.dbname)
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    hot = self.targets()
                    k = rnd.choice(hot) if hot and rnd.random() < 0.6 else rnd.randint(1, ROWS + 500)
                    op = rnd.random()
                    if op < 0.4:
                        cur.execute("UPDATE items SET v = %s, n = n + 1 WHERE id = %s",
                                    (f"u{self.ops}", k))
                    elif op < 0.6:
                        cur.execute("DELETE FROM items WHERE id = %s", (k,))
                    elif op < 0.8:
                        # delete and re-insert the same key, two transactions, likely one window
                        cur.execute("DELETE FROM items WHERE id = %s", (k,))
                        cur.execute("INSERT INTO items VALUES (%s, %s, 0)", (k, f"re{self.ops}"))
                    else:
                        cur.execute("INSERT IGNORE INTO items VALUES (%s, %s, 0)", (k, f"i{self.ops}"))
                    self.ops += 1
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            self.error = e
        finally:
            conn.close()


class ReaderThread(threading.Thread):
    """The capture's BinlogReader from a GTID state; hands each SourceTxn to `on_txn` until the
    marker table gets a row."""

    def __init__(self, db: MariaDBServer, gtid: str, on_txn: Callable[[Any], None]) -> None:
        super().__init__(daemon=True)
        self.reader = BinlogReader(conn_args(db), replica_server_id=7301,
                                   tracker=SchemaTracker("src", TableFilter()), gtid_state=gtid,
                                   heartbeat_s=0.5)
        self.on_txn = on_txn
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            for txn in self.reader.transactions():
                self.on_txn(txn)
                if any(m.table_name == "marker" for m in txn.mutations):
                    break
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            self.error = e
        finally:
            self.finished.set()
            self.reader.close()


def setup_table(db: MariaDBServer, name: str) -> None:
    db.execute(f"DROP DATABASE IF EXISTS {name}")
    db.execute(f"CREATE DATABASE {name}")
    db.execute(f"CREATE TABLE {name}.items (id BIGINT PRIMARY KEY, v VARCHAR(32), n INT)")
    db.execute(f"INSERT INTO items SELECT seq, CONCAT('v', seq), seq FROM seq_1_to_{ROWS}",
               database=name)
    db.execute(f"ANALYZE TABLE {name}.items")
    db.execute(f"CREATE TABLE {name}.marker (id INT PRIMARY KEY)")
    db.execute(f"CREATE TABLE {name}.other (id INT PRIMARY KEY, x INT)")
    db.execute(SIGNAL_TABLE_DDL.format(table=f"{name}.sig"))


def hot_keys(splitter: ChunkSplitter, state: dict[str, Any]) -> Callable[[], list[int]]:
    """Wrap the splitter so the writer aims at bounds and keys of chunks being read."""
    orig = splitter.next_chunk

    def next_chunk():  # type: ignore[no-untyped-def]
        c = orig()
        if c is not None:
            lo = c.lower[0] if c.lower else 1
            hi = c.upper[0]
            state["hot"] = [lo, lo + 1, hi, hi + 1, *(random.randint(lo, hi) for _ in range(6))]
        return c
    splitter.next_chunk = next_chunk  # type: ignore[method-assign]
    return lambda: state.get("hot", [])


def finish(db: MariaDBServer, name: str, writer: Writer, reader: ReaderThread) -> None:
    writer.stop.set()
    writer.join(30)
    assert writer.error is None, writer.error
    db.execute(f"INSERT INTO {name}.marker VALUES (1)")
    assert reader.finished.wait(60), "binlog reader did not reach the marker"
    assert reader.error is None, reader.error


def test_signal_table_windows_reconcile_with_concurrent_writes(mariadb_module: MariaDBServer) -> None:
    """Invariant: a chunk row is emitted (op=r, at the high watermark's position) only if no
    binlog change between the chunk's low and high watermark touched its key; so applying
    everything emitted in order gives the source's final state (parallelism 2, live writer)."""
    db, name = mariadb_module, "snap_sig"
    setup_table(db, name)
    gtid = str(db.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")
    conn = snapshot_connect(conn_args(db))
    shape = load_shape(conn, name, "items")
    model = Model(shape)
    rec = WindowReconciler()
    order: list[pb.Position] = []

    def on_txn(txn: Any) -> None:
        data, signals = split_signals(txn.mutations, f"{name}.sig")
        for m in data:
            model.apply_mutation(m)
        order.append(txn.position)
        for e in rec.feed(txn.position, data, signals):
            model.apply_chunk(e)
            order.append(e.position)

    reader = ReaderThread(db, gtid, on_txn)
    reader.start()
    splitter = ChunkSplitter(conn, shape.key, SplitOptions(chunk_size=CHUNK))
    assert splitter.strategy == "even"
    writer = Writer(db, name, hot_keys(splitter, {}))
    writer.start()
    run = TableRun(shape, splitter, estimated_rows=ROWS)
    t0 = time.monotonic()
    run_signal_table(run, rec, lambda: snapshot_connect(conn_args(db)), f"{name}.sig",
                     parallelism=2)
    took = time.monotonic() - t0
    finish(db, name, writer, reader)
    conn.close()

    assert run.chunks == model.chunks >= ROWS // CHUNK
    assert writer.ops > 20, f"the writer made only {writer.ops} changes in {took:.1f}s"
    assert model.dropped > 0, "no chunk row was ever dropped: the writer missed every window"
    assert model.rows == source_rows(db, shape)
    # Emission order is position order: each chunk right after its high watermark transaction.
    assert all(compare(a, b) < 0 for a, b in zip(order, order[1:]))
    assert any(p.sub_seq >= SNAPSHOT_SUB_SEQ for p in order)


def test_read_only_chunks_are_held_in_binlog_order(mariadb_module: MariaDBServer) -> None:
    """Invariant: a chunk read inside START TRANSACTION WITH CONSISTENT SNAPSHOT equals the source
    at its binlog position p and is emitted after every transaction before p and before every one
    at or after p; nothing is written to the source, and no table is locked (an ALTER TABLE of
    another table and writes to the snapshotted table go through during the snapshot)."""
    db, name = mariadb_module, "snap_ro"
    setup_table(db, name)
    gtid = str(db.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")
    conn = snapshot_connect(conn_args(db))
    shape = load_shape(conn, name, "items")
    model = Model(shape)
    # The capture passes its resume position; here the GTID state the reader starts from, so a
    # chunk emitted before the first transaction is still ordered.
    hold = ConsistentReadHold(start_position=pb.Position(gtids=[
        pb.GtidPos(domain_id=int(d), server_id=int(s), seq_no=int(n))
        for d, s, n in (g.split("-") for g in gtid.split(","))]))
    order: list[pb.Position] = []
    sig_rows_before = db.execute(f"SELECT COUNT(*) FROM {name}.sig")[0][0]

    def apply(released: list) -> None:
        for r in released:
            if r.chunk is not None:
                model.apply_chunk(r.chunk)
                order.append(r.chunk.position)
            else:
                for m in r.txn.mutations:
                    model.apply_mutation(m)
                order.append(r.txn.position)

    def on_txn(txn: Any) -> None:
        apply(hold.offer(txn, txn.position))
        if any(m.table_name == "marker" for m in txn.mutations):
            a = reader.reader.assembler
            apply(hold.reader_at(a.file_seq, a.last_event_end))

    reader = ReaderThread(db, gtid, on_txn)
    reader.start()
    splitter = ChunkSplitter(conn, shape.key, SplitOptions(chunk_size=CHUNK))
    writer = Writer(db, name, hot_keys(splitter, {}))
    writer.start()
    blocked: list[float] = []

    def ddl_during_snapshot() -> None:
        # Started once the snapshot is under way: neither statement may wait for it.
        while run.chunks < 3:
            time.sleep(0.01)
        t = time.monotonic()
        db.execute(f"ALTER TABLE {name}.other ADD COLUMN y INT")
        blocked.append(time.monotonic() - t)
        t = time.monotonic()
        db.execute(f"UPDATE {name}.items SET n = -1 WHERE id = 5")
        blocked.append(time.monotonic() - t)

    run = TableRun(shape, splitter, estimated_rows=ROWS)
    ddl = threading.Thread(target=ddl_during_snapshot, daemon=True)
    ddl.start()
    run_read_only(run, hold, lambda: snapshot_connect(conn_args(db)), parallelism=2)
    ddl.join(60)
    finish(db, name, writer, reader)
    apply(hold.poll())
    conn.close()

    assert hold.pending == 0 and hold.held == 0
    assert run.chunks == model.chunks >= ROWS // CHUNK
    assert model.rows == source_rows(db, shape)
    bad = [(format_position(a), format_position(b)) for a, b in zip(order, order[1:])
           if compare(a, b) >= 0]
    assert not bad, bad[:5]
    assert db.execute(f"SELECT COUNT(*) FROM {name}.sig")[0][0] == sig_rows_before
    assert len(blocked) == 2 and max(blocked) < 5.0, blocked
