"""Application transactions (client/transaction.py, app.py, commit.py, outbox.py, producer.py,
ddl.py) against real etcd, TSO, two pump processes and MariaDB."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pymysql
import pytest

from sluice.client import ddl as ddlmod
from sluice.client import outbox
from sluice.client.producer import OUTBOX_LABEL, ProducerServer
from sluice.client.app import AppProducer
from sluice.client.commit import TxnAborted
from sluice.core import errors, failpoint, rowcodec
from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, NodeStatus, Registry
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from tests.support.binlogs import decode
from tests.support.cluster import CLUSTER_ID, Cluster

pytestmark = pytest.mark.timeout(120)

DB = "txn_it"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path_factory.mktemp("txn"), etcd_module.endpoint)
    try:
        c.start_tso()
        # No fsync: these tests are about ordering and outcomes, not pump durability.
        for i in (1, 2):
            c.start_pump(f"pump-{i}", **{"txn-timeout": 1.0, "storage.sync": False})
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def db(mariadb_module):  # type: ignore[no-untyped-def]
    mariadb_module.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for sql in (
        "CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(32), price DECIMAL(12,2), "
        "  at DATETIME(6) NULL, doc JSON NULL)",
        "CREATE TABLE tags (id INT AUTO_INCREMENT PRIMARY KEY, item_id INT, tag VARCHAR(16))",
        "CREATE TABLE counter (id INT PRIMARY KEY, n BIGINT NOT NULL)",
        "CREATE TABLE shaped (id INT PRIMARY KEY, a VARCHAR(8))",
        "CREATE TABLE rows_ (id INT PRIMARY KEY, v VARCHAR(32))",
    ):
        mariadb_module.execute(sql, database=DB)
    return mariadb_module


def dsn(server, table: str) -> str:  # type: ignore[no-untyped-def]
    return server.dsn(DB) + f"?table={table}"


def new_producer(cluster: Cluster, server, producer_id: str, table: str = "sluice_outbox",  # type: ignore[no-untyped-def]
                 **kw: object) -> AppProducer:
    kw.setdefault("prune_interval_s", 0)
    return AppProducer(cluster.etcd, CLUSTER_ID, producer_id, dsn(server, table), **kw)  # type: ignore[arg-type]


def pull_txns(cluster: Cluster, after: int, upto: int, timeout: float = 30.0) -> list[Txn]:
    """Every transaction committed on any pump in (after, upto], joined, in commit order."""
    txns: list[Txn] = []
    for pump in cluster.pumps.values():
        ch, stub = pump.stub()
        prewrites: dict[int, list[bytes]] = {}
        stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=after),
                                  timeout=timeout)
        try:
            for resp in stream:
                for raw in resp.binlogs:
                    b = decode(raw)
                    if b.tp == pb.PREWRITE:
                        prewrites.setdefault(b.start_ts, []).append(raw)
                    elif b.tp == pb.COMMIT and b.commit_ts <= upto:
                        txns.append(Txn.from_binlogs(prewrites.pop(b.start_ts), raw, pump.node_id))
                if resp.watermark >= upto:
                    break
        finally:
            stream.cancel()
            ch.close()
    return sorted(txns, key=lambda t: t.commit_ts)


def pump_states(cluster: Cluster, start_ts: int) -> dict[str, tuple[int, int]]:
    out = {}
    for pump in cluster.pumps.values():
        ch, stub = pump.stub()
        try:
            r = stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=start_ts), timeout=5)
            out[pump.node_id] = (r.state, r.commit_ts)
        finally:
            ch.close()
    return out


async def wait_for(cond, timeout: float = 15.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not await asyncio.to_thread(cond):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def decided(cluster: Cluster, start_ts: int) -> tuple[int, int] | None:
    """The one pump decision for start_ts (the other pump never saw it), or None while pending."""
    states = pump_states(cluster, start_ts).values()
    held = [s for s in states if s[0] != pb.TXN_NOT_FOUND]
    assert len(held) == 1, states
    return None if held[0][0] == pb.TXN_UNKNOWN else held[0]


@contextlib.contextmanager
def failpoints(**points: str) -> Iterator[None]:
    for name, action in points.items():
        failpoint.enable(name.replace("_", "-"), action)
    try:
        yield
    finally:
        for name in points:
            failpoint.disable(name.replace("_", "-"))


def test_committed_transaction_reaches_the_pumps_with_one_commit_ts(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """Rows, before-images and schema snapshots go out as one prewrite and one commit whose
    commit_ts is the outbox row's; a table's shape is declared once per process."""
    async def scenario() -> tuple[int, int, int, int]:
        async with new_producer(cluster, db, "app-happy") as producer:
            async with producer.transaction() as t1:
                await t1.insert("items", {"id": 1, "v": "one", "price": "10.50",
                                          "doc": '{"a": 1}'})
                await t1.insert(f"{DB}.items", {"id": 2, "v": "two", "price": 3})
                await t1.update("items", 1, {"v": "uno", "at": "2024-02-29 12:00:00.123456"})
                await t1.delete("items", {"id": 2})
                tag = await t1.insert("tags", {"item_id": 1, "tag": "red"})
            assert tag["id"] >= 1
            async with producer.transaction() as t2:
                await t2.update("items", {"id": 1}, {"price": "11.00"})
            return t1.start_ts, t1.commit_ts, t2.start_ts, t2.commit_ts
    s1, c1, s2, c2 = asyncio.run(scenario())
    assert s1 < c1 < c2 and s2 < c2
    got = {t.start_ts: t for t in pull_txns(cluster, s1 - 1, c2)}
    t1, t2 = got[s1], got[s2]
    assert (t1.commit_ts, t2.commit_ts) == (c1, c2)
    assert {(i.schema_name, i.table_name) for i in t1.prewrite.schema_snapshots} == {
        (DB, "items"), (DB, "tags")}
    assert not t2.prewrite.schema_snapshots, "the shape was already declared in this process"
    history = SchemaHistory()
    history.apply(t1)
    rows = [(ev.op, ev.table, ev.before and rowcodec.row_to_dict(ev.before, ev.table_info),
             ev.after and rowcodec.row_to_dict(ev.after, ev.table_info)) for ev in t1.rows(history)]
    import datetime as dt
    import decimal
    assert [(op, table) for op, table, _, _ in rows] == [
        ("c", "items"), ("c", "items"), ("u", "items"), ("d", "items"), ("c", "tags")]
    assert rows[0][3] == {"id": 1, "v": "one", "price": decimal.Decimal("10.50"), "at": None,
                          "doc": '{"a": 1}'}
    assert rows[2][2]["v"] == "one" and rows[2][3]["v"] == "uno"
    assert rows[2][3]["at"] == dt.datetime(2024, 2, 29, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    assert rows[3][2]["id"] == 2 and rows[3][3] is None
    info = history.table_at(t1.prewrite.mutations[0].table_id, c1)
    assert info is not None and [c.data_type for c in info.columns] == [
        "int", "varchar", "decimal", "datetime", "json"]
    assert [ev.op for ev in t2.rows(history)] == ["u"]
    assert db.execute(f"SELECT start_ts, commit_ts FROM {DB}.sluice_outbox WHERE start_ts IN "
                      "(%s, %s) ORDER BY start_ts", (s1, s2)) == [(s1, c1), (s2, c2)]


def test_watermark_at_or_above_commit_ts_aborts_the_db_transaction(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """commit_ts not above an acked watermark: the DB transaction aborts, a Rollback follows."""
    async def scenario() -> int:
        async with new_producer(cluster, db, "app-watermark") as producer:
            txn = producer.transaction()
            with failpoints(txn_watermark_above_commit="1*raise"), pytest.raises(TxnAborted,
                                                                                   match="watermark"):
                async with txn:
                    await txn.insert("rows_", {"id": 100, "v": "never"})
            assert txn.state == "rolled_back"
            return txn.start_ts
    s = asyncio.run(scenario())
    assert db.execute(f"SELECT COUNT(*) FROM {DB}.rows_ WHERE id = 100") == [(0,)]
    assert db.execute(f"SELECT COUNT(*) FROM {DB}.sluice_outbox WHERE start_ts = %s", (s,)) == [(0,)]
    assert decided(cluster, s) == (pb.TXN_ROLLED_BACK, 0)


def test_db_errors_roll_back_in_the_pumps_too(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """A DB error during the DML writes nothing to the pumps; one after the prewrite (before the
    DB COMMIT) rolls the prewrite back."""
    async def scenario() -> int:
        async with new_producer(cluster, db, "app-dberr") as producer:
            async with producer.transaction() as ok:
                await ok.insert("rows_", {"id": 200, "v": "first"})
            with pytest.raises(pymysql.err.IntegrityError):
                async with producer.transaction() as dup:
                    await dup.insert("rows_", {"id": 200, "v": "duplicate"})
            assert decided_none(cluster, dup.start_ts)
            txn = producer.transaction()
            with failpoints(txn_before_db_commit="1*raise(db gone)"), \
                    pytest.raises(errors.FailpointError):
                async with txn:
                    await txn.insert("rows_", {"id": 201, "v": "lost"})
            return txn.start_ts
    s = asyncio.run(scenario())
    assert db.execute(f"SELECT id, v FROM {DB}.rows_ WHERE id IN (200, 201)") == [(200, "first")]
    assert decided(cluster, s) == (pb.TXN_ROLLED_BACK, 0)


def decided_none(cluster: Cluster, start_ts: int) -> bool:
    return all(st == pb.TXN_NOT_FOUND for st, _ in pump_states(cluster, start_ts).values())


def test_ambiguous_commit_is_decided_by_writing_to_the_outbox(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """An error after COMMIT was sent is resolved from the outbox: committed, same commit_ts."""
    async def scenario() -> tuple[int, int]:
        async with new_producer(cluster, db, "app-ambiguous") as producer:
            with failpoints(txn_commit_ambiguous="1*raise(connection lost during COMMIT)"):
                async with producer.transaction() as txn:
                    await txn.insert("rows_", {"id": 300, "v": "maybe"})
            assert txn.state == "committed"
            return txn.start_ts, txn.commit_ts
    s, c = asyncio.run(scenario())
    assert db.execute(f"SELECT v FROM {DB}.rows_ WHERE id = 300") == [("maybe",)]
    assert db.execute(f"SELECT commit_ts FROM {DB}.sluice_outbox WHERE start_ts = %s", (s,)) == [(c,)]
    assert decided(cluster, s) == (pb.TXN_COMMITTED, c)


def test_prewrite_left_open_past_txn_timeout_is_rolled_back_and_the_late_commit_fails(
        cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """TxnStatus decides by writing: the resolver's marker makes the late outbox insert fail, so
    the transaction is neither in the database nor downstream."""
    async def scenario() -> int:
        async with new_producer(cluster, db, "app-late") as producer:
            assert producer.server is not None
            txn = producer.transaction()

            async def run() -> None:
                async with txn:
                    await txn.insert("rows_", {"id": 400, "v": "late"})
            with failpoints(txn_after_prewrite="1*sleep(3000)"):
                task = asyncio.create_task(run())
                await wait_for(lambda: txn.start_ts and any(
                    st == pb.TXN_UNKNOWN for st, _ in pump_states(cluster, txn.start_ts).values()),
                    what="the prewrite to be pending on a pump")
                # What a pump's resolver asks once txn-timeout passed.
                ch = grpc.aio.insecure_channel(producer.server.addr)
                resp = await pbg.ProducerStub(ch).TxnStatus(
                    pb.TxnStatusReq(cluster_id=CLUSTER_ID, start_ts=txn.start_ts), timeout=10)
                await ch.close()
                assert resp.state == pb.TXN_ROLLED_BACK
                with pytest.raises(TxnAborted, match="already decided"):
                    await task
            return txn.start_ts
    s = asyncio.run(scenario())
    assert db.execute(f"SELECT COUNT(*) FROM {DB}.rows_ WHERE id = 400") == [(0,)]
    assert db.execute(f"SELECT commit_ts FROM {DB}.sluice_outbox WHERE start_ts = %s", (s,)) == [(None,)]
    assert decided(cluster, s) == (pb.TXN_ROLLED_BACK, 0)


def test_conflicting_transactions_get_commit_ts_in_db_commit_order(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """Conflicting transactions get commit_ts in their DB commit order: two tasks increment one
    counter; ordered by commit_ts, the counter's after-images are 1, 2, 3, ..."""
    db.execute(f"INSERT INTO {DB}.counter VALUES (1, 0)")
    per_task = 500

    async def scenario() -> tuple[int, int]:
        async with new_producer(cluster, db, "app-counter", pool_size=4) as producer:
            first = await producer.tso.get_ts()

            async def worker() -> None:
                for _ in range(per_task):
                    async with producer.transaction() as txn:
                        row = await txn.get("counter", 1)
                        assert row is not None
                        await txn.update("counter", 1, {"n": row["n"] + 1})
            await asyncio.gather(worker(), worker())
            return first, await producer.tso.get_ts()
    first, last = asyncio.run(scenario())
    assert db.execute(f"SELECT n FROM {DB}.counter WHERE id = 1") == [(2 * per_task,)]
    history = SchemaHistory()
    values = []
    for t in pull_txns(cluster, first, last):
        history.apply(t)
        for ev in t.rows(history):
            if ev.table == "counter":
                values.append(rowcodec.row_to_dict(ev.after, ev.table_info)["n"])
    assert values == list(range(1, 2 * per_task + 1))


def test_ddl_and_schema_snapshots_declare_table_shapes(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """DDL binlogs carry the structured shape after the change; rows after it decode with it."""
    async def scenario() -> tuple[int, int]:
        async with new_producer(cluster, db, "app-ddl") as producer:
            c0 = await producer.declare("shaped")
            async with producer.transaction() as t1:
                await t1.insert("shaped", {"id": 1, "a": "x"})
            await producer.execute_ddl(f"ALTER TABLE {DB}.shaped ADD COLUMN b INT NULL", "shaped")
            async with producer.transaction() as t2:
                await t2.insert("shaped", {"id": 2, "a": "y", "b": 7})
            await producer.execute_ddl(f"RENAME TABLE {DB}.shaped TO {DB}.shaped2", "shaped2",
                                       pb.RENAME_TABLE, old_table="shaped")
            async with producer.transaction() as t3:
                await t3.update("shaped2", 2, {"b": 8})
            return c0, t3.commit_ts
    c0, c3 = asyncio.run(scenario())
    txns = [t for t in pull_txns(cluster, c0 - 1, c3) if t.producer_id == "app-ddl"]
    assert [("ddl" if t.is_ddl else "snap" if t.prewrite.schema_snapshots and not
             t.prewrite.mutations else "rows") for t in txns] == [
        "snap", "rows", "ddl", "rows", "ddl", "rows"]
    snap, r1, alter, r2, rename, r3 = txns
    assert rename.ddl.tp == pb.RENAME_TABLE and (rename.ddl.old_table_name,
                                                 rename.ddl.table_name) == ("shaped", "shaped2")
    assert rename.ddl.table_info.table_id == snap.prewrite.schema_snapshots[0].table_id
    assert not r3.prewrite.schema_snapshots
    assert not r1.prewrite.schema_snapshots and not r2.prewrite.schema_snapshots
    assert alter.ddl.tp == pb.ALTER_TABLE and [c.name for c in alter.ddl.table_info.columns] == [
        "id", "a", "b"]
    assert alter.ddl.table_info.table_id == snap.prewrite.schema_snapshots[0].table_id
    assert alter.ddl.table_info.version > snap.prewrite.schema_snapshots[0].version
    history = SchemaHistory()
    for t in txns:
        history.apply(t)
    assert [rowcodec.row_to_dict(ev.after, ev.table_info) for t in (r1, r2) for ev in t.rows(history)
            ] == [{"id": 1, "a": "x"}, {"id": 2, "a": "y", "b": 7}]
    (ev,) = r3.rows(history)
    assert (ev.table, rowcodec.row_to_dict(ev.after, ev.table_info)) == (
        "shaped2", {"id": 2, "a": "y", "b": 8})


def test_table_ids_are_stable_per_source_schema_table() -> None:
    """a table's id is stable per (source, schema, table)"""
    a = ddlmod.stable_table_id("127.0.0.1:3306", "shop", "items")
    assert a == ddlmod.stable_table_id("127.0.0.1:3306", "shop", "items") and 0 < a < 1 << 62
    assert len({a, ddlmod.stable_table_id("127.0.0.1:3306", "shop", "items2"),
                ddlmod.stable_table_id("127.0.0.1:3307", "shop", "items"),
                ddlmod.stable_table_id("127.0.0.1:3306", "shop2", "items")}) == 4


def test_decide_by_writing_never_gives_a_wrong_answer(db) -> None:  # type: ignore[no-untyped-def]
    """decide-by-writing never gives a wrong answer: committed rows answer committed, absent ones
    are marked rolled back for good, and a row locked by an in-flight commit answers unknown."""
    d = dsn(db, "outbox_decide")
    cfg = outbox.OutboxDSN.parse(d)
    outbox.ensure_table(cfg)
    db.execute(f"INSERT INTO {DB}.outbox_decide VALUES (10, 11), (20, NULL)")
    assert outbox.decide_by_writing(d, 10) == (pb.TXN_COMMITTED, 11)
    assert outbox.decide_by_writing(d, 20) == (pb.TXN_ROLLED_BACK, 0)
    now = int(time.time() * 1000) << 18
    assert outbox.decide_by_writing(d, now) == (pb.TXN_ROLLED_BACK, 0)
    # The marker is durable: the application's own insert of that start_ts now fails.
    conn = cfg.connect(autocommit=False)
    with conn.cursor() as cur, pytest.raises(outbox.AlreadyDecided):
        outbox.record_commit(cur, cfg, now, now + 1)
    conn.rollback()
    # An in-flight commit holds the row lock: unknown, not a guess.
    ts = now + 2
    with conn.cursor() as cur:
        outbox.record_commit(cur, cfg, ts, ts + 1)
    started = time.monotonic()
    assert outbox.decide_by_writing(d, ts, timeout_s=2.0) == (pb.TXN_UNKNOWN, 0)
    assert time.monotonic() - started < 4
    conn.commit()
    assert outbox.decide_by_writing(d, ts) == (pb.TXN_COMMITTED, ts + 1)
    # Too old by the database clock: refused, so a pruned marker can never be outrun.
    with conn.cursor() as cur, pytest.raises(errors.FailedPrecondition, match="max-txn-age"):
        outbox.record_commit(cur, cfg, 40, 41, max_txn_age_s=60)
    conn.rollback()
    conn.close()
    bad = d.replace(f":{db.port}/", f":{db.port + 1 if db.port < 65535 else 1}/")
    with pytest.raises(errors.Unavailable) as e:
        outbox.decide_by_writing(bad, 50, timeout_s=2.0)
    assert db.password not in str(e.value) and "***" in str(e.value)
    assert db.password not in repr(cfg) and db.password not in str(cfg)


def test_outbox_rows_are_pruned_only_behind_the_drainer_checkpoint(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """Rows at or below the min durable checkpoint of non-offline drainers go; the rest stay."""
    etcd = Etcd(cluster.etcd)
    registry = Registry(etcd, CLUSTER_ID)
    cfg = outbox.OutboxDSN.parse(dsn(db, "outbox_prune"))
    outbox.ensure_table(cfg)
    old = (int(time.time() * 1000) - 5000) << 18
    db.execute(f"INSERT INTO {DB}.outbox_prune VALUES (%s, %s), (%s, NULL), (%s, %s), (%s, NULL)",
               (old, old + 10, old + 1, old + 20, old + 30, old + 21))
    try:
        assert outbox.prune_once(cfg, registry, max_txn_age_s=1) == 0, "no drainer: keep all"
        for node_id, checkpoint, state in (("d-1", old + 15, NodeState.ONLINE),
                                           ("d-2", old + 100, NodeState.ONLINE),
                                           ("d-3", old, NodeState.OFFLINE)):
            registry.register(NodeStatus(node_id=node_id, kind=NodeKind.DRAINER, addr="-",
                                         state=state, checkpoint=checkpoint))
        assert outbox.min_drainer_checkpoint(registry) == old + 15
        # Young rows stay even behind the checkpoint (a late insert could still race them).
        assert outbox.prune_once(cfg, registry, max_txn_age_s=3600) == 0
        assert outbox.prune_once(cfg, registry, max_txn_age_s=1) == 2
        assert db.execute(f"SELECT start_ts, commit_ts FROM {DB}.outbox_prune ORDER BY start_ts") == [
            (old + 20, old + 30), (old + 21, None)]
    finally:
        for node_id in ("d-1", "d-2", "d-3"):
            registry.delete(NodeKind.DRAINER, node_id)
        etcd.close()


def test_producer_registers_serves_txn_status_and_keeps_its_status_when_stopped(
        cluster: Cluster) -> None:
    """The status outlives the process; epochs only grow."""
    etcd = Etcd(cluster.etcd)
    registry = Registry(etcd, CLUSTER_ID)
    asked: list[int] = []

    async def decide(start_ts: int) -> tuple[int, int]:
        asked.append(start_ts)
        return pb.TXN_COMMITTED, start_ts + 5

    async def scenario() -> None:
        labels = {OUTBOX_LABEL: "mysql://u:secret@127.0.0.1:1/db?table=t", "app": "x"}
        server = ProducerServer(cluster.etcd, CLUSTER_ID, "prod-reg", decide, labels=labels,
                                alive_ttl_s=2)
        await server.start()
        info = registry.get(NodeKind.PRODUCER, "prod-reg")
        assert info is not None and info.alive and info.status.addr == server.addr
        assert info.status.labels == labels and info.status.state == NodeState.ONLINE
        e0 = info.status.epoch
        assert await server.bump_epoch() == e0 + 1 and await server.bump_epoch() == e0 + 2
        ch = grpc.aio.insecure_channel(server.addr)
        stub = pbg.ProducerStub(ch)
        resp = await stub.TxnStatus(pb.TxnStatusReq(cluster_id=CLUSTER_ID, start_ts=42), timeout=5)
        assert (resp.state, resp.commit_ts, asked) == (pb.TXN_COMMITTED, 47, [42])
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.TxnStatus(pb.TxnStatusReq(cluster_id=CLUSTER_ID + 1, start_ts=42), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await ch.close()
        await server.stop()
        info = registry.get(NodeKind.PRODUCER, "prod-reg")
        assert info is not None and not info.alive
        assert info.status.epoch == e0 + 2 and info.status.labels == labels
        again = ProducerServer(cluster.etcd, CLUSTER_ID, "prod-reg", decide, alive_ttl_s=2)
        await again.start()
        assert again.epoch == e0 + 2, "a restart keeps the epoch; only bump_epoch raises it"
        await again.stop()
    try:
        asyncio.run(scenario())
    finally:
        etcd.close()


def test_outbox_dsn_parses_and_never_shows_its_password() -> None:
    cfg = outbox.OutboxDSN.parse("mysql://app:p%40ss@db.local:3307/shop?table=my_outbox")
    assert (cfg.host, cfg.port, cfg.user, cfg.password, cfg.database, cfg.table) == (
        "db.local", 3307, "app", "p@ss", "shop", "my_outbox")
    assert "p@ss" not in repr(cfg) and "p%40ss" not in str(cfg)
    assert outbox.OutboxDSN.parse(cfg.url()) == cfg
    assert outbox.OutboxDSN.parse("mysql://u@h/db").table == outbox.DEFAULT_TABLE
    from sluice.core.secrets import mask_dsn   # what outbox messages mask a DSN with
    assert mask_dsn("mysql://u:secret@h:1/db") == "mysql://u:***@h:1/db"
    for bad in ("http://u:secret@h/db", "mysql://u:secret@h/", "mysql://u:secret@h/db?table=x;y"):
        with pytest.raises(errors.ConfigError) as e:
            outbox.OutboxDSN.parse(bad)
        assert "secret" not in str(e.value)
