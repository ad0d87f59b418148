"""`sluice capture` as a process: MariaDB -> capture -> two pumps (-> drainer file sink), exactly once.

One cluster (etcd, TSO, two pumps) and one MariaDB per module; each test has its own database,
producer id and capture process, and reads back only what was committed after its start.
What the pumps hold is read with their own PullBinlogs (`PumpLog`), decoded the drainer's way
(Txn.from_binlogs + SchemaHistory) and compared with the source.

The helpers (`start_capture`, `PumpLog`, `SourceLoad`, ...) live in tests/support/capture.py.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.drainer.txn import SchemaHistory, Txn
from tests.support.binlogs import TS
from tests.support.capture import (PUMPS, assert_exactly_once, assert_file_sink_matches,
                                   assert_same_rows, assert_source_order, capture_metrics,
                                   final_tables, gtid_key, gtid_of, gtid_pos, gtid_range,
                                   kill_binlog_dumps, PumpLog, read_file_sink_txns, source_table,
                                   SourceLoad, start_capture, wait_streaming)
from tests.support.cluster import Cluster, running_cluster
from tests.support.ctl import Result, ctl_in
from tests.support.mariadb import MariaDBServer
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path_factory.mktemp("capture"), etcd_module.endpoint, PUMPS) as c:
        yield c


@pytest.fixture
def pump_log(cluster: Cluster) -> Iterator[PumpLog]:
    ts = TS(cluster.tso_addrs, cluster.cluster_id)
    log = PumpLog(cluster, ts.get())
    ts.close()
    yield log
    log.close()


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------

def test_start_at_a_timestamp_captures_what_was_committed_from_then_on(
        cluster: Cluster, mariadb_module: MariaDBServer, pump_log: PumpLog) -> None:
    """`start-position = timestamp:T` captures exactly the source transactions committed at or
    after T (first in the module: it reads the source's binlog from its oldest file)."""
    db = mariadb_module
    load = SourceLoad(db, "since", seed=51)
    load.create()
    load.run(40)
    load.ddl("ALTER TABLE since.acct ADD COLUMN email VARCHAR(64) NULL")   # skipped, yet shapes
    load.extra_acct_column = True
    load.run(20)
    # Binlog timestamps have 1 s resolution: T is a whole second, nothing is committed in
    # [T - 1, T) after the first batch.
    t = int(time.time()) + 1
    time.sleep(t - time.time() + 0.05)
    before = gtid_pos(db)
    load.run(40)
    want = gtid_range(before, gtid_pos(db))
    load.close()
    cap = start_capture(cluster, db, "cap-since", **{"start-position": f"timestamp:{t}"})

    def data(txns: list[Txn]) -> list[str]:
        return [gtid_of(t) for t in txns if t.prewrite.mutations or t.is_ddl]
    pump_log.wait_for(lambda: set(want) <= set(data(pump_log.txns("cap-since"))), 60, watch=(cap,))
    txns = pump_log.txns("cap-since")
    assert sorted(data(txns), key=gtid_key) == want
    assert_source_order(txns)
    # Rows written after T, behind a DDL that was skipped, decode with the shape declared
    # downstream (the source's current rows, for the keys written after T).
    got = final_tables(txns)[("since", "acct")]
    acct = source_table(db, "since", "acct")
    assert got and set(got) <= set(acct)
    assert all(got[k] == acct[k] for k in got)
    cap.stop()


def test_pipeline_exactly_once_in_source_order_with_ddl(cluster: Cluster, mariadb_module: MariaDBServer,
                                                        pump_log: PumpLog) -> None:
    """Every source transaction is committed to the pumps exactly once, in source order, and its
    rows decode (with the DDL in between) to the source's final table contents."""
    db = mariadb_module
    load = SourceLoad(db, "pipe", seed=11)
    load.create()
    db.execute("CREATE TABLE pipe.quiet (id INT PRIMARY KEY, doc JSON, code VARCHAR(8) UNIQUE)")
    before = gtid_pos(db)
    drainer = cluster.start_drainer("drainer-pipe", sink="file", **{"initial-commit-ts": pump_log.after["pump-1"]})
    cap = start_capture(cluster, db, "cap-pipe")
    wait_streaming(cap)
    load.run(1000)
    # The replication connection is lost mid-stream: the capture reconnects from the GTID after
    # the last transaction it read, without a restart and without re-reading anything.
    assert kill_binlog_dumps(db) >= 1   # (a just-stopped capture's may linger a moment)
    load.run(500)
    wait_streaming(cap, nth=2)
    # DDL mid-stream, under the capture's feet.
    load.ddl("ALTER TABLE pipe.acct ADD COLUMN email VARCHAR(64) NULL")
    load.extra_acct_column = True
    load.ddl("RENAME TABLE pipe.item TO pipe.item2")
    load.names["item"] = "item2"
    load.ddl("CREATE TABLE pipe.tmp (id INT PRIMARY KEY, v INT)")
    load.ddl("INSERT INTO pipe.tmp VALUES (1, 1), (2, 2)")
    load.ddl("TRUNCATE TABLE pipe.log")
    load.ddl("DROP TABLE pipe.tmp")
    load.run(1500)
    after = gtid_pos(db)
    load.close()
    want = gtid_range(before, after)
    assert len(want) > 3000

    def all_there() -> bool:
        return set(want) <= {gtid_of(t) for t in pump_log.txns("cap-pipe")}
    pump_log.wait_for(all_there, 90, watch=(cap,))
    txns = pump_log.txns("cap-pipe")
    assert_exactly_once(txns, want)
    assert_source_order(txns)
    assert {t.pump_id for t in txns} == set(PUMPS), "groups should spread over both pumps"
    text = cap.log_text()
    for state in ("connected", "streaming", "reconnecting"):
        assert f"capture {state}" in text
    assert text.count("capture reconnecting") == 1 and "capture failed" not in text
    # Caught up (the source sends heartbeats, nothing waits): the source lag reads 0.
    wait_until(lambda: capture_metrics(cap)["sluice_capture_source_lag_seconds"] == 0.0, 10,
               0.2, what="the capture's source lag to reach 0")
    assert capture_metrics(cap)["sluice_capture_reconnects_total"] == 1

    # The first-start schema snapshot declares every captured table, written or not.
    first = txns[0]
    assert not gtid_of(first) and not first.prewrite.mutations
    declared = {(i.schema_name, i.table_name): i for i in first.prewrite.schema_snapshots}
    assert {("pipe", n) for n in ("acct", "item", "log", "quiet")} <= set(declared)
    quiet = declared[("pipe", "quiet")]
    assert [c.name for c in quiet.columns] == ["id", "doc", "code"]
    assert quiet.columns[1].data_type == "json"
    assert any(i.unique and list(i.columns) == ["code"] for i in quiet.indexes)

    state = final_tables(txns)
    for table in ("acct", "item2", "log"):
        assert_same_rows(source_table(db, "pipe", table), state.get(("pipe", table), {}), table)
    assert ("pipe", "item") not in state and ("pipe", "tmp") not in state

    assert_file_sink_matches(drainer.out_dir, txns)
    cap.stop()
    drainer.proc.stop()


def test_slow_reader_gets_the_whole_binlog_before_the_source_closes(mariadb_module: MariaDBServer) -> None:
    """A non-blocking read gets every transaction even when the source finishes sending and
    closes the connection long before the reader has read it all (no reset drops the tail)."""
    from sluice.capture.reader import BinlogReader
    from sluice.capture.schema import SchemaTracker, TableFilter
    db = mariadb_module
    db.execute("CREATE DATABASE slow")
    db.execute("CREATE TABLE slow.big (id INT PRIMARY KEY, doc TEXT)")
    before = gtid_pos(db)
    conn = db.connect("slow")
    try:
        with conn.cursor() as cur:
            # ~1.2 MB of binlog: more than the reader's socket receive window.
            for i in range(300):
                cur.execute("INSERT INTO big VALUES (%s, REPEAT('x', 4000))", (i,))
    finally:
        conn.close()
    want = gtid_range(before, gtid_pos(db))
    reader = BinlogReader({"host": "127.0.0.1", "port": db.port, "user": db.user,
                           "password": db.password}, replica_server_id=4343,
                          tracker=SchemaTracker("slow", TableFilter()), gtid_state=before,
                          blocking=False)
    got = []
    try:
        for txn in reader.transactions():
            if not got:
                time.sleep(1.0)   # the server sends the rest and ends the dump meanwhile
            got.append(txn.gtid)
    finally:
        reader.close()
    assert got == want


def test_a_stream_the_source_refuses_fails_with_the_source_s_message(mariadb_module: MariaDBServer) -> None:
    """A binlog stream the source refuses (a GTID it does not hold) fails with the server's own
    error, not as a lost connection to retry."""
    from sluice.capture.reader import BinlogReader, SourceRefused
    from sluice.capture.schema import SchemaTracker, TableFilter
    db = mariadb_module
    reader = BinlogReader({"host": "127.0.0.1", "port": db.port, "user": db.user,
                           "password": db.password}, replica_server_id=4344,
                          tracker=SchemaTracker("x", TableFilter()), gtid_state="0-1-999999999")
    try:
        with pytest.raises(SourceRefused, match="1236.*0-1-999999999.*not in the master's binlog"):
            for _ in reader.transactions():
                pass
    finally:
        reader.close()


def test_fenced_capture_is_refused_and_exits(cluster: Cluster, mariadb_module: MariaDBServer,
                                             pump_log: PumpLog) -> None:
    """A capture fenced by a newer one with the same producer id has its writes refused
    (FAILED_PRECONDITION) and exits with an error naming the takeover; nothing is duplicated."""
    db = mariadb_module
    load = SourceLoad(db, "fence", seed=12)
    load.create()
    before = gtid_pos(db)
    # The old capture parks between a group's prewrites and its commits (the 3rd group).
    old = start_capture(cluster, db, "cap-fence", name="cap-fence-old", env={
        "SLUICE_FAILPOINTS": "capture-between-prewrite-and-commit=1*sleep(4000)@3"})
    wait_streaming(old)
    stop = threading.Event()
    writer = threading.Thread(target=load.run, args=(100000, stop, 0.002), daemon=True)
    writer.start()
    try:
        wait_until(lambda: "failpoint capture-between-prewrite-and-commit fired" in old.log_text(),
                   30, what="the old capture to park between prewrite and commit")
        old.signal(signal.SIGSTOP)
        new = start_capture(cluster, db, "cap-fence", name="cap-fence-new")
        wait_streaming(new)
        old.signal(signal.SIGCONT)
        wait_until(lambda: not old.alive(), 30, what="the fenced capture to exit")
    finally:
        stop.set()
        writer.join(10)
    assert old.popen.returncode == 1, old.log_text()[-3000:]  # type: ignore[union-attr]
    text = old.log_text()
    assert "capture fenced" in text and "epoch" in text, text[-3000:]
    assert "FailedPrecondition" in text or "FAILED_PRECONDITION" in text or "recorded epoch" in text, text[-3000:]
    after = gtid_pos(db)
    load.close()
    want = gtid_range(before, after)

    def all_there() -> bool:
        return set(want) <= {gtid_of(t) for t in pump_log.txns("cap-fence")}
    pump_log.wait_for(all_there, 60, watch=(new,))
    txns = pump_log.txns("cap-fence")
    assert_exactly_once(txns, want)
    assert_source_order(txns)
    new.stop()


def test_two_sources_merge_into_one_pump_cluster(cluster: Cluster, mariadb_module: MariaDBServer,
                                                 pump_log: PumpLog, tmp_path: Path) -> None:
    """Two sources (different server ids and GTID domains) captured into one pump cluster are
    both fully present, each in its own source order, merged in commit order by the drainer
    (one of them started at `earliest` after its first binlogs were purged)."""
    other = MariaDBServer(tmp_path / "db2", server_id=2, extra_args=["--gtid-domain-id=2"]).start()
    try:
        loads = [SourceLoad(mariadb_module, "two_a", seed=21), SourceLoad(other, "two_b", seed=22)]
        for load in loads:
            load.create()
        # The second source starts at `earliest` on binlogs whose first files were purged: from
        # the oldest binlog's GTID list (an empty start state is refused by MariaDB then).
        other.execute("FLUSH BINARY LOGS")
        newest = other.execute("SHOW BINARY LOGS")[-1][0]
        other.execute(f"PURGE BINARY LOGS TO '{newest}'")
        befores = [gtid_pos(mariadb_module), gtid_pos(other)]
        drainer = cluster.start_drainer("drainer-two", sink="file",
                                        **{"initial-commit-ts": pump_log.after["pump-1"]})
        # Small groups (no minimum interval), so that the two captures' groups interleave.
        caps = [start_capture(cluster, mariadb_module, "cap-two-a", **{"group-min-interval-ms": 0}),
                start_capture(cluster, other, "cap-two-b", **{"start-position": "earliest",
                                                              "group-min-interval-ms": 0})]
        for cap in caps:
            wait_streaming(cap)
        threads = [threading.Thread(target=load.run, args=(400,)) for load in loads]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        afters = [gtid_pos(mariadb_module), gtid_pos(other)]
        for load in loads:
            load.close()
        wants = [gtid_range(b, a) for b, a in zip(befores, afters)]
        assert {gtid_key(g)[0] for g in wants[0]} == {0} and {gtid_key(g)[0] for g in wants[1]} == {2}

        def all_there() -> bool:
            return all(set(w) <= {gtid_of(t) for t in pump_log.txns(p)}
                       for w, p in zip(wants, ("cap-two-a", "cap-two-b")))
        pump_log.wait_for(all_there, 60, watch=tuple(caps))
        for want, producer in zip(wants, ("cap-two-a", "cap-two-b")):
            txns = pump_log.txns(producer)
            assert_exactly_once(txns, want)
            assert_source_order(txns)
            assert {t.prewrite.source.server_id for t in txns if gtid_of(t)} == {gtid_key(want[0])[1]}
        merged = [t for t in pump_log.txns() if t.producer_id in ("cap-two-a", "cap-two-b")]
        producers = [t.producer_id for t in merged if gtid_of(t)]
        switches = sum(1 for a, b in zip(producers, producers[1:]) if a != b)
        assert switches > 2, "the two sources' transactions should interleave in commit order"
        assert_file_sink_matches(drainer.out_dir, merged)
        for cap in caps:
            cap.stop()
        drainer.proc.stop()
    finally:
        other.stop()


def test_position_set_rewinds_the_capture_and_the_drainer_applies_the_rewound_stream(
        cluster: Cluster, mariadb_module: MariaDBServer, pump_log: PumpLog) -> None:
    """Deliberate rewinds reset the drainer's per-producer filter (DESIGN §2.9): `ctl position
    set` on a stopped capture makes it re-read exactly what follows the given GTID, at a higher
    generation, and a running drainer applies those transactions again instead of dropping them
    as already applied; later starts resume after the rewound stream."""
    db = mariadb_module
    load = SourceLoad(db, "rewind", seed=61)
    load.create()
    before = gtid_pos(db)
    drainer = cluster.start_drainer("drainer-rewind", sink="file",
                                    **{"initial-commit-ts": pump_log.after["pump-1"]})
    cap = start_capture(cluster, db, "cap-rewind")
    wait_streaming(cap)
    load.run(150)
    mid = gtid_pos(db)
    load.run(150)
    after = gtid_pos(db)
    first, again = gtid_range(before, after), gtid_range(mid, after)
    pump_log.wait_for(lambda: set(first) <= {gtid_of(t) for t in pump_log.txns("cap-rewind")},
                      60, watch=(cap,))

    def ctl(*args: str) -> Result:
        return ctl_in(cluster.etcd, cluster.cluster_id, *args)
    refused = ctl("position", "set", "cap-rewind", mid)
    assert refused.code == 2 and "is alive: stop the capture first" in refused.err, refused
    cap.stop()
    bad = ctl("position", "set", "cap-rewind", "mysql-bin.000001:4")
    assert bad.code == 2 and "no MariaDB GTID state" in bad.err, bad
    shown = ctl("position", "show", "cap-rewind", "--json")
    assert shown.code == 0, shown
    doc = shown.json()
    assert doc["alive"] is False and doc["pending_rewind"] is None
    assert f"gtid={after}" in doc["resumes_after"], doc
    assert ctl("position", "set", "cap-rewind", mid).code == 0
    assert ctl("position", "show", "cap-rewind", "--json").json()["pending_rewind"].endswith(
        f"gtid={mid} gen=1")

    cap = start_capture(cluster, db, "cap-rewind")
    wait_streaming(cap)
    load.run(50)
    last = gtid_pos(db)
    load.close()
    tail = gtid_range(after, last)

    def rewound() -> list[Txn]:
        return [t for t in pump_log.txns("cap-rewind") if t.position is not None and t.position.generation == 1]
    pump_log.wait_for(lambda: set(again + tail) <= {gtid_of(t) for t in rewound()}, 60,
                      watch=(cap,))
    txns = pump_log.txns("cap-rewind")
    # Exactly what follows `mid` was read again, once, in source order, at generation 1.
    assert_exactly_once(rewound(), again + tail)
    assert_source_order(rewound())
    assert_exactly_once([t for t in txns if t.position is None or t.position.generation == 0], first)
    assert ctl("position", "show", "cap-rewind", "--json").json()["pending_rewind"] is None

    # The drainer's filter let the rewound stream through: `again` twice, the rest once.
    def applied() -> Counter[str]:
        return Counter(t["id"] for t in read_file_sink_txns(drainer.out_dir))
    wait_until(lambda: set(tail) <= set(applied()), 60, 0.3, what="the drainer to apply the tail")
    counts = applied()
    assert {g for g in first + tail if counts[g] != (2 if g in again else 1)} == set()

    # A plain restart resumes after the rewound stream: nothing is read a third time.
    cap.stop()
    cap = start_capture(cluster, db, "cap-rewind")
    wait_streaming(cap)
    time.sleep(1.0)
    pump_log.pull(pump_log.ts.get())
    assert_exactly_once(rewound(), again + tail)
    cap.stop()
    drainer.proc.stop()


def test_restart_behind_a_ddl_decodes_rows_on_both_sides_of_it(
        cluster: Cluster, mariadb_module: MariaDBServer, pump_log: PumpLog) -> None:
    """A capture restarted at a position before DDL it has not read yet (it was down while the
    DDL ran) decodes the rows before each DDL with the old shape and those after with the new:
    shapes come from the binlog's TableMaps and the parsed DDL, never from the source's current
    schema. The pumps' rows then fold to the source's final tables."""
    db = mariadb_module
    load = SourceLoad(db, "behind", seed=71)
    load.create()
    before = gtid_pos(db)
    cap = start_capture(cluster, db, "cap-behind")
    wait_streaming(cap)
    load.run(60)
    first = gtid_range(before, gtid_pos(db))
    pump_log.wait_for(lambda: set(first) <= {gtid_of(t) for t in pump_log.txns("cap-behind")},
                      60, watch=(cap,))
    assert cap.stop() == 0
    # While it is down: rows in the old shapes, then DDL, then rows in the new shapes.
    load.run(60)
    load.ddl("ALTER TABLE behind.acct ADD COLUMN email VARCHAR(64) NULL")
    load.extra_acct_column = True
    load.ddl("ALTER TABLE behind.log MODIFY msg VARCHAR(200)")
    load.run(60)
    load.ddl("ALTER TABLE behind.log ADD COLUMN lvl INT NULL")
    load.run(60)
    after = gtid_pos(db)
    load.close()
    want = gtid_range(before, after)
    cap = start_capture(cluster, db, "cap-behind")
    pump_log.wait_for(lambda: set(want) <= {gtid_of(t) for t in pump_log.txns("cap-behind")},
                      60, watch=(cap,))
    txns = pump_log.txns("cap-behind")
    assert_exactly_once(txns, want)
    assert_source_order(txns)
    state = final_tables(txns)
    for table in ("acct", "item", "log"):
        assert_same_rows(source_table(db, "behind", table), state.get(("behind", table), {}), table)
    # Rows re-read from before the DDL carry the old shape (no `email`), those after it the new.
    acct_cols = {len(m.changes[0].after.columns or m.changes[0].before.columns)
                 for t in txns for m in t.prewrite.mutations if m.table_name == "acct" and m.changes}
    assert acct_cols == {4, 5}, acct_cols
    cap.stop()


def test_the_next_group_is_prewritten_while_the_previous_commit_is_in_flight(
        cluster: Cluster, mariadb_module: MariaDBServer, pump_log: PumpLog) -> None:
    """Two groups in flight (capture/streaming.py): with every Commit write held 300 ms
    (failpoint capture-before-commit-write) and groups of 10, whole groups pile up behind the
    commit and their prewrites are acknowledged meanwhile (sluice_capture_groups_overlapped_total),
    and every source transaction still reaches the pumps exactly once, in source order (group
    k+1's commits wait for group k's)."""
    db = mariadb_module
    load = SourceLoad(db, "ovl", seed=21)
    load.create()
    before = gtid_pos(db)
    cap = start_capture(cluster, db, "cap-ovl",
                        env={"SLUICE_FAILPOINTS": "capture-before-commit-write=sleep(300)"},
                        **{"start-position": f"gtid:{before}", "group-max-txns": 10})
    wait_streaming(cap)
    load.run(400)
    want = gtid_range(before, gtid_pos(db))
    load.close()
    pump_log.wait_for(lambda: set(want) <= {gtid_of(t) for t in pump_log.txns("cap-ovl")}, 120,
                      watch=(cap,))
    txns = pump_log.txns("cap-ovl")
    assert_exactly_once(txns, want)
    assert_source_order(txns)
    assert capture_metrics(cap)["sluice_capture_groups_overlapped_total"] >= 1
    cap.stop()


def test_a_busy_source_starts_a_group_at_most_every_min_interval(
        cluster: Cluster, mariadb_module: MariaDBServer, pump_log: PumpLog) -> None:
    """group-min-interval-ms: while transactions keep coming, a group starts at most once per
    interval — fewer, larger groups, since each group costs TSO requests, two pump RPCs and
    per-group work whatever its size —, every transaction still reaches the pumps exactly once
    and in source order, and a transaction after a quiet spell longer than the interval goes
    out at once (group-max-wait-ms), not an interval later."""
    db = mariadb_module
    load = SourceLoad(db, "mingap", seed=23)
    load.create()
    before = gtid_pos(db)
    interval = 1.0
    cap = start_capture(cluster, db, "cap-mingap",
                        **{"start-position": f"gtid:{before}",
                           "group-min-interval-ms": int(interval * 1000)})
    wait_streaming(cap)
    m0 = capture_metrics(cap)
    t0 = time.monotonic()
    load.run(200, pace_s=0.01)     # a steady trickle of a few seconds
    elapsed = time.monotonic() - t0
    want = gtid_range(before, gtid_pos(db))
    pump_log.wait_for(lambda: set(want) <= {gtid_of(t) for t in pump_log.txns("cap-mingap")}, 60,
                      watch=(cap,))
    txns = pump_log.txns("cap-mingap")
    assert_exactly_once(txns, want)
    assert_source_order(txns)
    m1 = capture_metrics(cap)
    groups = m1["sluice_capture_groups_total"] - m0["sluice_capture_groups_total"]
    # + 2: the group the trickle's first transaction opened and the one its last ended.
    assert 1 <= groups <= elapsed / interval + 2, (groups, elapsed)

    time.sleep(interval * 1.5)
    done = m1["sluice_capture_transactions_total"]
    sent = time.monotonic()
    load.run(1)
    wait_until(lambda: capture_metrics(cap)["sluice_capture_transactions_total"] > done, 10, 0.02,
               what="the lone transaction committed to the pumps")
    assert time.monotonic() - sent < interval * 0.8, "a quiet source's transaction waits no interval"
    load.close()
    cap.stop()
