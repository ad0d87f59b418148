"""The native per-transaction reader (native/src/txnscan.rs) on a real MariaDB binlog, against
the per-event path (the same reader with the scanner off): the torture rows of every type,
transactions over several tables with TableMaps re-sent, UPDATEs, DELETEs, DDL between
transactions (shapes change), MyISAM groups ending in a COMMIT query, a filtered table, the
loop-mark table, and transactions bigger than one 256 KB read — the same SourceTxns byte for byte,
the same Assembler state after them, and most transactions read whole."""
from __future__ import annotations

import pytest

from sluice.capture.reader import BinlogReader, SourceTxn
from sluice.capture.schema import SchemaTracker, TableFilter
from tests.integration.test_capture_reader import ALL_TYPES, gtid_pos, insert_all_types
from tests.support.mariadb import MariaDBServer

SOURCE = "src"


def view(t: SourceTxn) -> tuple:
    return (t.position.SerializeToString(), t.gtid, t.server_id, t.ts_ms, t.file, t.offset,
            [(m.table_id, m.schema_name, m.table_name, m.table_version, m.count,
              m.SerializeToString()) for m in t.mutations],
            [s.SerializeToString() for s in t.schema_snapshots],
            [d.SerializeToString() for d in t.ddls], t.size, t.prewrite_values(SOURCE))


def read(db: MariaDBServer, start: str, native: bool) -> tuple[list[tuple], int, tuple]:
    flt = TableFilter(exclude_tables=[r"txs\.skipped"], ignored=["txs.sluice_mark"])
    reader = BinlogReader({"host": "127.0.0.1", "port": db.port, "user": db.user,
                           "password": db.password}, replica_server_id=4300 + native,
                          tracker=SchemaTracker(SOURCE, flt), gtid_state=start, blocking=False)
    if not native:
        reader._stream._scanner = None   # the per-event path: the differential oracle
    try:
        txns = [view(t) for t in reader.transactions()]
    finally:
        reader.close()
    a = reader.assembler
    return txns, reader.events, (a.last_event_end, a.last_event_ts, a.gtid_state, a.file, a.where())


@pytest.mark.timeout(300)
def test_native_transactions_match_the_per_event_path(mariadb_module: MariaDBServer) -> None:
    """Whole transactions read natively are the per-event path's, byte for byte (see the module
    docstring for the workload); the native reader hands Python far fewer items."""
    db = mariadb_module
    db.execute("CREATE DATABASE txs")
    start = gtid_pos(db)
    db.execute(ALL_TYPES.format(db="txs"))
    for t in ("a", "b", "skipped", "sluice_mark"):
        db.execute(f"CREATE TABLE txs.{t} (id INT PRIMARY KEY, v VARCHAR(2000), n BIGINT)")
    db.execute("CREATE TABLE txs.isam (id INT PRIMARY KEY, v TEXT) ENGINE=MyISAM")
    conn = db.connect("txs")
    try:
        with conn.cursor() as cur:
            insert_all_types(cur)
            for rnd in range(3):
                cur.execute("UPDATE all_types SET vc = CONCAT(IFNULL(vc, ''), 'x'), d10 = d10 + 1, "
                            "dtm = dtm, j = j")
                for k in range(20):
                    conn.begin()
                    i = rnd * 100 + k
                    cur.execute("INSERT INTO a (id, v, n) VALUES (%s, %s, %s)", (i, f"a{i} ✓", -i))
                    cur.execute("INSERT INTO b VALUES (%s, %s, NULL)", (i, "b" * (i % 50)))
                    cur.execute("UPDATE a SET n = n * 2 WHERE id = %s", (i,))
                    cur.execute("INSERT INTO skipped VALUES (%s, 's', 1)", (i,))
                    if k % 7 == 3:
                        cur.execute("INSERT INTO sluice_mark VALUES (%s, 'm', 1)", (i,))
                    if k % 5 == 0:
                        cur.execute("DELETE FROM b WHERE id = %s", (i,))
                    conn.commit()
                    if k % 9 == 4:
                        cur.execute("INSERT INTO isam VALUES (%s, 'i')", (i,))
                conn.begin()   # one transaction of ~600 KB: more than one read of the stream
                for k in range(300):
                    cur.execute("INSERT INTO b VALUES (%s, %s, %s)",
                                (10_000 * (rnd + 1) + k, "big" * 600, k))
                conn.commit()
                cur.execute(f"ALTER TABLE a ADD COLUMN c{rnd} INT NULL DEFAULT {rnd}")
            cur.execute("DELETE FROM all_types WHERE id = 1")
    finally:
        conn.close()
    by_event, events_a, state_a = read(db, start, native=False)
    native, events_b, state_b = read(db, start, native=True)
    assert len(native) == len(by_event) > 70
    for i, (got, want) in enumerate(zip(native, by_event, strict=True)):
        assert got == want, f"transaction {i} differs"
    assert state_b == state_a
    # The 60 small transactions hold 9-12 events each, one item when read whole; the first after
    # each DDL (shapes resolved again) and the big ones (not finished by one read) go event by
    # event. Most small ones whole: more than 300 items fewer.
    assert events_a - events_b > 300, (events_a, events_b)
