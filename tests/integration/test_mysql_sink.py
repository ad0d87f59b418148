"""The MySQL sink against a real MariaDB downstream (one server per module, a database per test)."""
from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import itertools
import random

import pytest

from sluice.core import failpoint
from sluice.core.errors import FailpointError, StaleEpoch
from sluice.core.rowcodec import MySQLDateTime
from sluice.drainer.sink import Checkpoint, load_sink
from sluice.drainer.sinks.mysql import ApplyError, CreateTableError, MySQLSink, MySQLSinkConfig, SinkFenced
from sluice.drainer.sql import batch_sql, row_sql
from sluice.drainer.translator import Translator
from sluice.drainer.txn import MissingSchema, SchemaHistory
from tests.support.mariadb import MariaDBServer
from tests.support.rows import (RandomWorkload, Table, col, create_sql, ddl_txn, fetch_rows, history_of,
                                prewrite_value, schema_txn, txn)

_names = itertools.count(1)


def fresh_db(server: MariaDBServer, prefix: str) -> str:
    db = f"{prefix}_{next(_names)}"
    server.execute(f"DROP DATABASE IF EXISTS `{db}`")
    server.execute(f"CREATE DATABASE `{db}`")
    return db


def sink_for(server: MariaDBServer, history, cp_schema: str, epoch: int = 1, name: str = "d1",
             **options) -> MySQLSink:
    opts = {"port": server.port, "password": server.password, "checkpoint-schema": cp_schema,
            "worker-count": 16, "txn-batch": 20, **options}
    sink = load_sink("mysql", opts, schema=history, epoch=epoch, source_name=name)
    assert isinstance(sink, MySQLSink)
    return sink


def run(coro):
    return asyncio.run(coro)


async def apply_all(sink: MySQLSink, txns, chunk: int = 100, checkpoint: int = 0) -> None:
    await sink.open(Checkpoint(checkpoint))
    try:
        for i in range(0, len(txns), chunk):
            await sink.apply(txns[i:i + chunk])
        await sink.flush()
    finally:
        await sink.close()


def test_random_transactions_leave_the_downstream_equal_to_the_model(mariadb_module):
    """The downstream checkpoint never runs ahead of the data, and 2,000 random transactions
    (inserts, updates, deletes, primary-key changes, unique-key swaps inside one transaction,
    four tables) applied by 16 workers in batches of 20 leave every table equal to the model."""
    db = fresh_db(mariadb_module, "rnd")
    wl = RandomWorkload(11, db, keys=150)
    txns = wl.transactions(2000, first_ts=1000)
    for t in wl.tables:
        mariadb_module.execute(create_sql(t))
    sink = sink_for(mariadb_module, history_of(txns), f"{db}_cp")
    run(apply_all(sink, txns))
    conn = mariadb_module.connect()
    for t in wl.tables:
        assert fetch_rows(conn, t) == wl.expected(t), t.qualified
    assert sink.checkpoint().commit_ts == txns[-1].commit_ts
    assert sink.conflicts > 0  # the workload does exercise the conflict path
    rows = mariadb_module.execute(f"SELECT MAX(commit_ts) FROM `{db}_cp`.sluice_checkpoint WHERE name='d1'")
    assert rows[0][0] == txns[-1].commit_ts


def test_merged_batches_and_row_by_row_statements_leave_identical_tables(mariadb_module):
    """The statements built for a worker batch leave the downstream exactly as applying the
    batch's changes one by one in order would: a random workload over few keys (so batches
    repeat keys, change primary keys and swap unique values), cut into random batches merged
    into one database (some in safe mode), and applied row by row into another, gives identical
    tables, both equal to the model."""
    rng = random.Random(23)
    merged_db, rows_db = fresh_db(mariadb_module, "merged"), fresh_db(mariadb_module, "rowwise")
    results = {}
    for db in (merged_db, rows_db):
        # The same seed gives the same workload under each database name.
        wl = RandomWorkload(31, db, keys=120, max_rows=6)
        txns = wl.transactions(1200, first_ts=1000)
        for t in wl.tables:
            mariadb_module.execute(create_sql(t))
        history, tr = history_of(txns), Translator()
        changes = [ch for t in txns for ch in tr.translate(t, history)]
        conn = mariadb_module.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION time_zone='+00:00', sql_mode='STRICT_TRANS_TABLES,NO_AUTO_VALUE_ON_ZERO'")
                if db == rows_db:
                    for ch in changes:
                        for stmt in row_sql(ch, False):
                            cur.execute(stmt)
                else:
                    i = 0
                    while i < len(changes):
                        batch = changes[i:i + rng.randint(1, 120)]
                        i += len(batch)
                        cur.execute("START TRANSACTION")
                        for stmt, _ in batch_sql(batch, [rng.random() < 0.2] * len(batch)):
                            cur.execute(stmt)
                        cur.execute("COMMIT")
            results[db] = [fetch_rows(conn, t) for t in wl.tables]
            for t, got in zip(wl.tables, results[db]):
                assert got == wl.expected(t), f"{t.qualified} differs from the model"
        finally:
            conn.close()
    assert results[merged_db] == results[rows_db]


USERS = Table(61, "x", "users", [col("id", "int(11)", nullable=False), col("uk", "varchar(8)"),
                                 col("v", "int(11)")], primary=["id"], unique={"uk": ["uk"]})


def test_tidb_binlog_conflict_cases(mariadb_module):
    db = fresh_db(mariadb_module, "conf")
    u = Table(61, db, "users", USERS.columns, USERS.primary, dict(USERS.unique))
    mariadb_module.execute(create_sql(u))
    steps = [
        # delete id=1 then re-insert id=1, in separate transactions
        [u.insert(id=1, uk="p", v=1)], [u.delete(id=1, uk="p", v=1)], [u.insert(id=1, uk="p", v=2)],
        # a primary-key change 3 -> 4 followed by delete 3 (of a new row 3)
        [u.insert(id=3, uk="q", v=3)], [u.update(dict(id=3, uk="q", v=3), dict(id=4))],
        [u.insert(id=3, uk="r", v=5)], [u.delete(id=3, uk="r", v=5)],
        # two rows swapping a unique-key value (through a third value, as MySQL must)
        [u.insert(id=10, uk="a", v=0)], [u.insert(id=11, uk="b", v=0)],
        [u.update(dict(id=10, uk="a", v=0), dict(uk="c")), u.update(dict(id=11, uk="b", v=0), dict(uk="a")),
         u.update(dict(id=10, uk="c", v=0), dict(uk="b"))],
        # and back, in separate transactions
        [u.update(dict(id=10, uk="b", v=0), dict(uk=None))], [u.update(dict(id=11, uk="a", v=0), dict(uk="b"))],
        [u.update(dict(id=10, uk=None, v=0), dict(uk="a"))],
    ]
    txns = [schema_txn(100, u)] + [txn(prewrite_value(u.mutation(*s)), 200 + i) for i, s in enumerate(steps)]
    for chunk in (1, 3, len(txns)):
        mariadb_module.execute(f"TRUNCATE TABLE `{db}`.users")
        sink = sink_for(mariadb_module, history_of(txns), f"{db}_cp{chunk}")
        run(apply_all(sink, txns, chunk=chunk))
        assert mariadb_module.execute(f"SELECT id, uk, v FROM `{db}`.users ORDER BY id") == [
            (1, "p", 2), (4, "q", 3), (10, "a", 0), (11, "b", 0)]


def test_every_datum_kind_is_stored_exactly(mariadb_module):
    db = fresh_db(mariadb_module, "kinds")
    k = Table(62, db, "kinds", [
        col("id", "bigint(20)", nullable=False), col("u", "bigint(20) unsigned"), col("d", "double"),
        col("dec", "decimal(65,30)"), col("b", "varbinary(8)"), col("s", "varchar(20)"),
        col("day", "date"), col("at", "datetime(6)"), col("ts", "timestamp(6) NULL"),
        col("t", "time(6)"), col("j", "json"), col("e", "enum('x','y')"), col("st", "set('a','b')"),
        col("bits", "bit(12)"), col("yr", "year(4)")], primary=["id"])
    mariadb_module.execute(create_sql(k))
    big = decimal.Decimal("-" + "9" * 35 + "." + "0" * 29 + "1")
    rows = [
        dict(id=-(2**63), u=2**64 - 1, d=-1.5e300, dec=big, b=b"\x00\xff'\\", s="ü'\\\"🚀",
             day=dt.date(2024, 2, 29), at=dt.datetime(2024, 1, 2, 3, 4, 5, 6),
             ts=dt.datetime(2038, 1, 19, 3, 14, 7, 999999), t=dt.timedelta(hours=-838, minutes=-59, seconds=-59),
             j='{"a": [1, null]}', e="y", st="a,b", bits=0xABC, yr=2155),
        dict(id=2, day=MySQLDateTime(), at=MySQLDateTime(2020, 0, 15, 1, 2, 3),
             t=dt.timedelta(hours=100, microseconds=1), yr=0),
        dict(id=3),
    ]
    txns = [schema_txn(10, k), txn(prewrite_value(k.mutation(*[k.insert(**r) for r in rows])), 20)]
    run(apply_all(sink_for(mariadb_module, history_of(txns), f"{db}_cp", **{"worker-count": 2}), txns))
    got = mariadb_module.execute(
        f"SELECT id, u, d, CAST(`dec` AS CHAR), b, s, CAST(day AS CHAR), CAST(at AS CHAR), "
        f"CAST(ts AS CHAR), CAST(t AS CHAR), j, e, st, bits + 0, yr FROM `{db}`.kinds ORDER BY id")
    assert got[0] == (-(2**63), 2**64 - 1, -1.5e300, format(big, "f"), b"\x00\xff'\\", "ü'\\\"🚀",
                      "2024-02-29", "2024-01-02 03:04:05.000006", "2038-01-19 03:14:07.999999",
                      "-838:59:59.000000", '{"a": [1, null]}', "y", "a,b", 0xABC, 2155)
    assert got[1][6:10] == ("0000-00-00", "2020-00-15 01:02:03.000000", None, "100:00:00.000001")
    assert got[1][14] == 0
    assert got[2] == (3,) + (None,) * 14


def test_ddl_mid_stream_is_applied_in_order_and_old_rows_decode_after_a_restart(mariadb_module):
    """Rows are decoded with the table shape in force at their commit_ts, after DDL and after a
    restart from a checkpoint before the DDL."""
    db = fresh_db(mariadb_module, "ddl")
    v1 = Table(63, db, "t", [col("id", "int(11)", nullable=False), col("a", "int(11)")], ["id"])
    v2 = v1.add_column(col("b", "varchar(8)"))
    v3 = v2.drop_column("a")
    v4 = v3.rename(db, "t2")
    v5 = v4._next()  # TRUNCATE: same columns, new version
    txns = [
        txn(prewrite_value(ddl=v1.create_ddl("CREATE TABLE t (id int NOT NULL PRIMARY KEY, a int)")), 10),
        txn(prewrite_value(v1.mutation(v1.insert(id=1, a=1), v1.insert(id=2, a=2))), 20),
        txn(prewrite_value(v1.mutation(v1.update(dict(id=2, a=2), dict(a=22)), v1.insert(id=3, a=3))), 25),
        txn(prewrite_value(ddl=v2.alter_ddl("ALTER TABLE t ADD COLUMN b varchar(8)")), 30),
        txn(prewrite_value(v2.mutation(v2.insert(id=4, a=4, b="four"),
                                       v2.update(dict(id=1, a=1, b=None), dict(b="one")))), 40),
        txn(prewrite_value(ddl=v3.alter_ddl()), 50),  # no text: generated from the shapes
        txn(prewrite_value(v3.mutation(v3.insert(id=5, b="five"), v3.delete(id=3, b=None))), 60),
        txn(prewrite_value(ddl=v4.rename_ddl(v3, f"RENAME TABLE t TO t2")), 70),
        txn(prewrite_value(v4.mutation(v4.update(dict(id=5, b="five"), dict(b="5")))), 80),
        txn(prewrite_value(ddl=v5.truncate_ddl("TRUNCATE TABLE t2")), 90),
        txn(prewrite_value(v5.mutation(v5.insert(id=9, b="nine"))), 100),
    ]
    full = history_of(txns)

    async def scenario() -> None:
        first = sink_for(mariadb_module, full, f"{db}_cp", **{"worker-count": 4})
        await first.open(Checkpoint(0))
        await first.apply(txns[:2])
        await first.flush()
        assert first.checkpoint().commit_ts == 20
        # The next transaction never commits downstream: the process "dies" here.
        failpoint.enable("mysql-sink-before-commit", "raise(crash)")
        try:
            with pytest.raises(FailpointError):
                await first.apply(txns[2:3])
                await first.flush()
        finally:
            failpoint.disable("mysql-sink-before-commit")
            await first.close()
        # Rows of one transaction go to the workers of their keys, so the crash may have left
        # part of transaction 25 applied; the checkpoint stays below it.
        assert set(mariadb_module.execute(f"SELECT id, a FROM `{db}`.t")) <= {(1, 1), (2, 2), (2, 22), (3, 3)}
        assert first.checkpoint().commit_ts == 20
        # Restart: the schema history comes back from the checkpoint bytes with every version;
        # the transaction at 25 is still decoded with v1.
        history = SchemaHistory.from_bytes(full.to_bytes())
        second = sink_for(mariadb_module, history, f"{db}_cp", **{"worker-count": 4})
        await second.open(Checkpoint(20, schema=full.to_bytes()))
        assert second.safe_until >= 25  # the crashed batch was dispatched: replay it safely
        for t in txns[2:]:
            await second.apply([t])
            if t.commit_ts == 60:
                await second.flush()
                assert mariadb_module.execute(f"SELECT id, b FROM `{db}`.t ORDER BY id") == [
                    (1, "one"), (2, None), (4, "four"), (5, "five")]
        await second.flush()
        await second.close()

    run(scenario())
    assert mariadb_module.execute(f"SHOW TABLES FROM `{db}`") == [("t2",)]
    assert mariadb_module.execute(f"SELECT * FROM `{db}`.t2 ORDER BY id") == [(9, "nine")]


def test_a_row_for_a_table_without_schema_stops_clearly_with_nothing_half_applied(mariadb_module):
    db = fresh_db(mariadb_module, "noschema")
    u = Table(64, db, "users", USERS.columns, USERS.primary, dict(USERS.unique))
    ghost = Table(404, db, "ghost", [col("id", "int(11)", nullable=False)], ["id"])
    mariadb_module.execute(create_sql(u))
    good = txn(prewrite_value(u.mutation(u.insert(id=1))), 20)
    bad = txn(prewrite_value(u.mutation(u.insert(id=2)), ghost.mutation(ghost.insert(id=1))), 30)
    history = history_of([schema_txn(10, u)])

    async def scenario() -> None:
        sink = sink_for(mariadb_module, history, f"{db}_cp")
        await sink.open(Checkpoint(0))
        await sink.apply([good])
        with pytest.raises(MissingSchema, match=r"table id 404 .* at commit_ts 30"):
            await sink.apply([bad])
        # The sink stays stopped, and the drainer's checkpoint cannot pass the bad transaction.
        with pytest.raises(MissingSchema):
            await sink.flush()
        assert sink.checkpoint().commit_ts <= 20
        await sink.close()

    run(scenario())
    # The good transaction before it was applied; nothing of the bad one (row 2 is in a
    # table the sink knows) reached the downstream.
    assert mariadb_module.execute(f"SELECT id FROM `{db}`.users") == [(1,)]


def test_safe_mode_true_replays_transactions_already_applied_without_error(mariadb_module):
    """`safe-mode = true` forces safe mode for the whole run: inserts are REPLACE and updates
    DELETE + REPLACE, so transactions whose rows are already downstream (a restored downstream,
    a rewound capture, a second drainer name) apply again without a duplicate-key error and the
    tables end equal to the model; without it the same replay stops on error 1062."""
    db = fresh_db(mariadb_module, "safe")
    wl = RandomWorkload(12, db, keys=80, keyless=False)
    txns = wl.transactions(400, first_ts=1000)
    for t in wl.tables:
        mariadb_module.execute(create_sql(t))
    history = history_of(txns)
    run(apply_all(sink_for(mariadb_module, history, f"{db}_cp", name="first"), txns))
    plain = sink_for(mariadb_module, history, f"{db}_cp", name="plain")
    with pytest.raises(ApplyError, match="MySQL error 1062"):
        run(apply_all(plain, txns))
    replay = sink_for(mariadb_module, history, f"{db}_cp", name="replay", **{"safe-mode": True})
    run(apply_all(replay, txns))
    conn = mariadb_module.connect()
    for t in wl.tables:
        assert fetch_rows(conn, t) == wl.expected(t), t.qualified
    assert replay._m.safe_mode._value.get() == 1   # never left safe mode


def test_a_permanent_error_stops_naming_table_and_commit_ts(mariadb_module):
    db = fresh_db(mariadb_module, "perm")
    u = Table(65, db, "users", USERS.columns, USERS.primary, dict(USERS.unique))
    mariadb_module.execute(create_sql(u))
    mariadb_module.execute(f"INSERT INTO `{db}`.users VALUES (7, 'taken', 0)")
    txns = [schema_txn(10, u), txn(prewrite_value(u.mutation(u.insert(id=6, uk="ok"))), 20),
            txn(prewrite_value(u.mutation(u.insert(id=8, uk="taken"))), 30)]

    async def scenario() -> None:
        sink = sink_for(mariadb_module, history_of(txns), f"{db}_cp", **{"worker-count": 1})
        await sink.open(Checkpoint(0))
        await sink.apply(txns)
        with pytest.raises(ApplyError, match=rf"insert of a row on {db}\.users \(commit_ts 30\) "
                                              rf"failed: MySQL error 1062"):
            await sink.flush()
        await sink.close()

    run(scenario())
    # The failing batch rolled back as a whole.
    assert mariadb_module.execute(f"SELECT id FROM `{db}`.users ORDER BY id") == [(7,)]


def test_a_newer_epoch_fences_the_old_sink_which_then_writes_nothing(mariadb_module):
    """A stale writer writes nothing: after a sink with a higher epoch opens, the first sink's
    next batch fails with SinkFenced, none of its rows reach the downstream, and its reconnecting
    workers leave the new owner's recorded connection ids alone."""
    db = fresh_db(mariadb_module, "fence")
    u = Table(66, db, "users", USERS.columns, USERS.primary, dict(USERS.unique))
    mariadb_module.execute(create_sql(u))
    txns = [schema_txn(10, u)] + [txn(prewrite_value(u.mutation(u.insert(id=i, v=i))), 10 + i)
                                  for i in range(1, 61)]
    history = history_of(txns)

    async def scenario() -> None:
        old = sink_for(mariadb_module, history, f"{db}_cp", epoch=1, **{"worker-count": 4})
        await old.open(Checkpoint(0))
        await old.apply(txns[:21])
        await old.flush()
        new = sink_for(mariadb_module, history, f"{db}_cp", epoch=2, **{"worker-count": 4})
        await new.open(Checkpoint(old.checkpoint().commit_ts))
        recorded = f"SELECT slot, conn_id FROM `{db}_cp`.sluice_checkpoint WHERE name='d1' ORDER BY slot"
        owners = mariadb_module.execute(recorded)
        with pytest.raises(SinkFenced, match="epoch 1 but .*has epoch 2"):
            await old.apply(txns[21:41])
            await old.flush()
        # Its workers' connections were killed; reconnecting, they must not record themselves
        # over the new owner's connection ids (a later takeover kills what is recorded).
        assert mariadb_module.execute(recorded) == owners
        assert isinstance(SinkFenced("x"), StaleEpoch)
        # The old drainer cannot come back with its epoch either.
        stale = sink_for(mariadb_module, history, f"{db}_cp", epoch=1, **{"worker-count": 1})
        with pytest.raises(SinkFenced, match="cannot open with epoch 1: .*already has epoch 2"):
            await stale.open(Checkpoint(0))
        await stale.close()
        assert mariadb_module.execute(f"SELECT COUNT(*) FROM `{db}`.users") == [(20,)]
        await new.apply(txns[21:])
        await new.flush()
        await new.close()
        await old.close()

    run(scenario())
    assert mariadb_module.execute(f"SELECT COUNT(*), MAX(id) FROM `{db}`.users")[0] == (60, 60)
    assert mariadb_module.execute(
        f"SELECT epoch FROM `{db}_cp`.sluice_checkpoint WHERE name='d1' AND slot=-1")[0][0] == 2


def test_a_killed_connection_is_retried_without_losing_or_doubling_rows(mariadb_module):
    db = fresh_db(mariadb_module, "retry")
    u = Table(67, db, "users", USERS.columns, USERS.primary, dict(USERS.unique))
    mariadb_module.execute(create_sql(u))
    txns = [schema_txn(10, u)] + [txn(prewrite_value(u.mutation(u.insert(id=i, v=i))), 10 + i)
                                  for i in range(1, 201)]

    async def scenario() -> None:
        sink = sink_for(mariadb_module, history_of(txns), f"{db}_cp", **{"worker-count": 2})
        await sink.open(Checkpoint(0))
        await sink.apply(txns[:100])
        await sink.flush()
        # Kill the workers' connections behind the sink's back (a network blip, a DBA).
        for (conn_id,) in mariadb_module.execute(
                f"SELECT conn_id FROM `{db}_cp`.sluice_checkpoint WHERE name='d1' AND slot >= 0"):
            mariadb_module.execute(f"KILL CONNECTION {int(conn_id)}")
        await sink.apply(txns[100:])
        await sink.flush()
        await sink.close()

    run(scenario())
    assert mariadb_module.execute(f"SELECT COUNT(*), MAX(id) FROM `{db}`.users")[0] == (200, 200)


def test_create_tables_creates_what_is_missing_and_never_alters_what_exists(mariadb_module):
    """create-tables (the default) creates a declared table and the database it lives in when
    they are missing downstream, with the declared shape (exact column types, nullability,
    collation, primary and unique keys), before the first row; a table that exists keeps its
    own shape even when the declared one differs (only create, never alter). A replay in safe
    mode creates nothing again and leaves the rows equal. With `create-tables = false` the
    missing table is still the downstream's error 1146."""
    db = f"created_{next(_names)}"
    other = fresh_db(mariadb_module, "existing")
    mariadb_module.execute(f"DROP DATABASE IF EXISTS `{db}`")
    fresh = Table(70, db, "fresh", [col("id", "bigint(20) unsigned", nullable=False),
                                    col("k", "varchar(8)", nullable=False), col("v", "decimal(30,10)")],
                  primary=["id"], unique={"uk": ["k"]})
    info = fresh.info
    info.columns[1].charset, info.columns[1].collation = "utf8mb4", "utf8mb4_bin"
    kept = Table(71, other, "kept", [col("id", "int(11)", nullable=False), col("v", "int(11)")], ["id"])
    mariadb_module.execute(f"CREATE TABLE `{other}`.kept (id INT PRIMARY KEY, v INT, mine INT DEFAULT 9)")
    txns = [txn(prewrite_value(snapshots=[info, kept]), 10),
            # 'a' and 'A' are two keys only under the declared _bin collation.
            txn(prewrite_value(fresh.mutation(fresh.insert(id=1, k="a", v=decimal.Decimal("1.5")),
                                              fresh.insert(id=2, k="A")),
                               kept.mutation(kept.insert(id=1, v=2))), 20)]
    history = history_of(txns)
    sink = sink_for(mariadb_module, history, f"{db}_cp")
    run(apply_all(sink, txns))
    assert sink._m.created.labels("database")._value.get() == 1
    assert sink._m.created.labels("table")._value.get() == 1
    assert mariadb_module.execute(
        "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLLATION_NAME, COLUMN_KEY FROM "
        "information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND TABLE_NAME='fresh' ORDER BY ORDINAL_POSITION",
        (db,)) == [("id", "bigint(20) unsigned", "NO", None, "PRI"),
                   ("k", "varchar(8)", "NO", "utf8mb4_bin", "UNI"),
                   ("v", "decimal(30,10)", "YES", None, "")]
    assert mariadb_module.execute(f"SELECT id, k FROM `{db}`.fresh ORDER BY id") == [(1, "a"), (2, "A")]
    assert mariadb_module.execute(f"SELECT * FROM `{other}`.kept") == [(1, 2, 9)]

    replay = sink_for(mariadb_module, history, f"{db}_cp", name="replay", **{"safe-mode": True})
    run(apply_all(replay, txns))
    assert replay._m.created.labels("table")._value.get() == 0
    assert mariadb_module.execute(f"SELECT id, k FROM `{db}`.fresh ORDER BY id") == [(1, "a"), (2, "A")]

    missing = Table(72, other, "missing", [col("id", "int(11)", nullable=False)], ["id"])
    off = [schema_txn(30, missing), txn(prewrite_value(missing.mutation(missing.insert(id=1))), 40)]
    no_create = sink_for(mariadb_module, history_of(off), f"{db}_cp", name="off", **{"create-tables": False})
    with pytest.raises(ApplyError, match=rf"{other}\.missing .*MySQL error 1146"):
        run(apply_all(no_create, off))


def test_a_table_that_cannot_be_created_stops_the_sink_naming_it(mariadb_module):
    """A declared shape the downstream refuses (here a type it does not know) stops the sink
    with CreateTableError naming the table, the commit_ts, the MySQL error and the statement;
    nothing of the transaction's rows is applied."""
    db = fresh_db(mariadb_module, "badshape")
    bad = Table(73, db, "bad", [col("id", "int(11)", nullable=False), col("x", "nosuchtype(3)")], ["id"])
    txns = [txn(prewrite_value(bad.mutation(bad.insert(id=1)), snapshots=[bad]), 10)]
    sink = sink_for(mariadb_module, history_of(txns), f"{db}_cp")
    with pytest.raises(CreateTableError, match=rf"cannot create missing table {db}\.bad \(commit_ts 10\): "
                                               rf"MySQL error \d+: .*statement: CREATE TABLE IF NOT EXISTS"):
        run(apply_all(sink, txns))
    assert mariadb_module.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s", (db,)) == []


def test_a_binlog_create_table_after_the_declaration_of_the_current_shape_replaces_it(mariadb_module):
    """A capture started from an old binlog position declares each table's current shape first
    and then streams the binlog's own CREATE TABLE / RENAME of it: the empty table create-tables
    made from the declaration gives way to the DDL (no "table exists" error outside safe mode),
    and the later ALTER brings the downstream to the source's shape with every row."""
    db = fresh_db(mariadb_module, "earliest")
    v1 = Table(80, db, "t", [col("id", "int(11)", nullable=False), col("v", "int(11)")], ["id"])
    now = v1.add_column(col("w", "varchar(5)"))          # the shape at capture start
    a = Table(81, db, "a", [col("id", "int(11)", nullable=False)], ["id"])
    b = a.rename(db, "b")
    txns = [schema_txn(10, now, b),
            ddl_txn(20, v1.create_ddl("CREATE TABLE t (id INT PRIMARY KEY, v INT)")),
            txn(prewrite_value(v1.mutation(v1.insert(id=1, v=1))), 30),
            ddl_txn(40, now.alter_ddl("ALTER TABLE t ADD COLUMN w VARCHAR(5)")),
            txn(prewrite_value(now.mutation(now.insert(id=2, v=2, w="x"))), 50),
            ddl_txn(60, a.create_ddl("CREATE TABLE a (id INT PRIMARY KEY)")),
            txn(prewrite_value(a.mutation(a.insert(id=7))), 70),
            ddl_txn(80, b.rename_ddl(a, "RENAME TABLE a TO b"))]
    sink = sink_for(mariadb_module, history_of(txns), f"{db}_cp", **{"worker-count": 2})
    run(apply_all(sink, txns, chunk=3))
    assert mariadb_module.execute(f"SELECT * FROM `{db}`.t ORDER BY id") == [(1, 1, None), (2, 2, "x")]
    assert mariadb_module.execute(f"SELECT * FROM `{db}`.b") == [(7,)]
    assert sorted(r[0] for r in mariadb_module.execute(
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s", (db,))) == ["b", "t"]
