"""The Spark sink on real Iceberg tables through a real SparkSession (docs/spark.md)."""
from __future__ import annotations

import decimal
from typing import Any

import pytest

from sluice.core.rowcodec import row_to_dict
from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import SchemaHistory
from sluice.spark_sink.commit import Fenced, OwnedByAnother
from sluice.spark_sink.tables import UnmappableChange
from tests.support.rows import RandomWorkload, Table, col, ddl_txn, prewrite_value, schema_txn, txn
from tests.support.spark import (SparkEnv, drive, expected_changes, expected_rows, history,  # noqa: F401
                                 make_sink, norm, run, spark_env, view_rows)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

T0 = 1 << 40


def test_random_transactions_land_exactly_once(spark_env: SparkEnv) -> None:
    """A micro-batch becomes visible in every table at one commit point: after random
    transactions (inserts, updates, deletes, key changes) over three tables, each current-state
    view equals the model row for row and the changelogs hold every change exactly once."""
    env = spark_env
    w = RandomWorkload(seed=8, schema="shop", keys=200, max_rows=4, keyless=False)
    txns = w.transactions(1200, T0)
    schema = SchemaHistory()
    sink = make_sink(env, "rw", schema, batch_rows=900)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, txns, schema))
    cp = sink.checkpoint()
    assert cp.commit_ts == txns[-1].commit_ts
    assert cp.sink_state["batch"] >= 3  # several micro-batches were committed
    for t in w.tables:
        assert view_rows(env, f"rw_shop.{t.name}", t) == expected_rows(w, t), t.name
    got = []
    for t in w.tables:
        got += [(r[0], r[1], r[2]) for r in env.rows(
            f"SELECT _commit_ts, _seq, _op FROM rw_shop.{t.name}_changelog")]
    want = expected_changes(txns, history(txns))
    assert len(got) == len({(c, s) for c, s, _ in got})  # no (_commit_ts, _seq) twice
    assert sorted(got) == sorted(want)
    # Batches follow commit order: each data snapshot of a changelog carries the highest
    # commit_ts it holds, increasing with the batch number.
    marks = env.rows("SELECT summary['sluice.batch'], summary['sluice.commit-ts'] FROM "
                     "rw_shop.accounts_changelog.snapshots WHERE summary['sluice.commit-ts'] "
                     "IS NOT NULL ORDER BY committed_at")
    assert [int(b) for b, _ in marks] == sorted(int(b) for b, _ in marks)
    assert [int(c) for _, c in marks] == sorted(int(c) for _, c in marks)
    run(sink.close())


ITEMS = Table(301, "inv", "items", [col("id", "int(11)", nullable=False), col("qty", "int(11)"),
                                    col("note", "varchar(20)")], primary=["id"])


def test_restart_skips_committed_transactions(spark_env: SparkEnv) -> None:
    """The sink's commit table is the truth on open: transactions at or below its last commit
    are skipped, not duplicated, even when the drainer resumes from an older checkpoint."""
    env = spark_env
    txns = [schema_txn(T0, ITEMS)] + [
        txn(prewrite_value(ITEMS.mutation(ITEMS.insert(id=i, qty=i, note=f"n{i}"))), T0 + i)
        for i in range(1, 41)]
    schema = SchemaHistory()
    sink = make_sink(env, "rs", schema)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, txns[:30], schema))
    committed = sink.checkpoint().commit_ts
    # A new incarnation, handed the drainer's older checkpoint and every transaction again.
    schema2 = SchemaHistory()
    sink2 = make_sink(env, "rs", schema2)
    run(sink2.open(Checkpoint(T0 - 1)))
    assert sink2.checkpoint().commit_ts == committed
    run(drive(sink2, txns, schema2))
    assert sink2.skipped == 30
    rows = env.rows("SELECT _commit_ts, _seq, count(*) FROM rs_inv.items_changelog "
                    "GROUP BY _commit_ts, _seq HAVING count(*) > 1")
    assert rows == []
    assert env.rows("SELECT count(*) FROM rs_inv.items")[0][0] == 40
    assert sink2.checkpoint().commit_ts == txns[-1].commit_ts


def test_a_full_batch_commits_while_the_next_one_buffers(spark_env: SparkEnv) -> None:
    """A full batch commits in the background: apply() returns while its commit is in flight,
    the checkpoint moves only when the marker is written, flush() waits for everything; a
    background commit's error is raised by the next call and nothing after it lands."""
    import time

    from sluice.core import failpoint
    env = spark_env
    txns = [schema_txn(T0, ITEMS)] + [
        txn(prewrite_value(ITEMS.mutation(ITEMS.insert(id=i, qty=i, note="p"))), T0 + i)
        for i in range(1, 61)]
    schema = history(txns[:1])
    sink = make_sink(env, "pc", schema, batch_rows=20)
    run(sink.open(Checkpoint(0)))
    run(sink.apply(txns[:1]))
    run(sink.flush())
    before = sink.checkpoint().commit_ts   # (the schema alone makes no batch)
    failpoint.enable("spark-before-commit", "1*sleep(2000)")
    try:
        t = time.monotonic()
        run(sink.apply(txns[1:21]))          # fills the batch: its commit sleeps in the thread
        assert time.monotonic() - t < 1.5
        assert sink.checkpoint().commit_ts == before   # not committed yet
        run(sink.apply(txns[21:31]))         # buffered beside the commit in flight
        run(sink.flush())
    finally:
        failpoint.disable("spark-before-commit")
    assert sink.checkpoint().commit_ts == txns[30].commit_ts
    assert env.rows("SELECT count(*) FROM pc_inv.items")[0][0] == 30
    failpoint.enable("spark-before-commit", "1*raise(commit failed)")
    try:
        run(sink.apply(txns[31:51]))         # the batch's commit fails in the background
        with pytest.raises(Exception, match="commit failed"):
            for _ in range(100):
                run(sink.apply(txns[51:52]))   # (the same transaction: never committed)
                time.sleep(0.05)
    finally:
        failpoint.disable("spark-before-commit")
    with pytest.raises(Exception, match="failed earlier"):
        run(sink.flush())
    assert sink.checkpoint().commit_ts == txns[30].commit_ts
    run(sink.close())
    again = make_sink(env, "pc", history(txns[:1]))
    run(again.open(Checkpoint(0)))
    assert again.checkpoint().commit_ts == txns[30].commit_ts
    run(drive(again, txns, history(txns[:1])))
    assert env.rows("SELECT count(*), count(DISTINCT _commit_ts, _seq) FROM pc_inv.items_changelog")[0] \
        == (60, 60)
    run(again.close())


def test_a_checkpoint_during_a_commit_starts_the_next_commit_when_it_ends(spark_env: SparkEnv) -> None:
    """commit_soon (the drainer's checkpoint tick) never waits for a commit in flight, and the
    rows it asked for do not wait for the next tick either: the next commit starts as soon as
    the one in flight ends, and each reports its checkpoint. flush() then finds nothing left,
    and every change lands once."""
    import asyncio
    import time

    from sluice.core import failpoint
    env = spark_env
    txns = [schema_txn(T0, ITEMS)] + [
        txn(prewrite_value(ITEMS.mutation(ITEMS.insert(id=i, qty=i, note="w"))), T0 + i)
        for i in range(1, 21)]
    schema = history(txns[:1])
    sink = make_sink(env, "cw", schema)

    async def go() -> list[int]:
        await sink.open(Checkpoint(0))
        await sink.apply(txns[:1])
        await sink.flush()
        failpoint.enable("spark-before-commit", "1*sleep(1500)")
        try:
            await sink.apply(txns[1:11])
            await sink.commit_soon()                 # starts a commit; the failpoint holds it
            await sink.apply(txns[11:21])
            t = time.monotonic()
            await sink.commit_soon()                 # in flight: returns at once
            assert time.monotonic() - t < 0.5
            assert not sink.idle
            got = []
            while len(got) < 2:                      # no further call: both commits report
                got.append((await asyncio.wait_for(sink.successes().get(), 120)).commit_ts)
        finally:
            failpoint.disable("spark-before-commit")
        assert sink.idle
        await sink.flush()
        await sink.close()
        return got

    assert run(go()) == [txns[10].commit_ts, txns[20].commit_ts]
    assert env.rows("SELECT count(*), count(DISTINCT _commit_ts, _seq) FROM cw_inv.items_changelog")[0] \
        == (20, 20)
    assert env.rows("SELECT count(*) FROM cw_inv.items")[0][0] == 20


def test_ddl_add_drop_widen_recast_then_unmappable_stops(spark_env: SparkEnv) -> None:
    """Schema evolution by field id: ADD, DROP (gone from the current table, kept in the
    changelog), INT -> BIGINT promoted in place, DECIMAL(10,2) -> DECIMAL(12,4) (no Iceberg
    promotion) cast with every value kept while the changelog keeps the old column aside; a
    change Spark cannot cast the MySQL way (BIGINT -> VARBINARY) stops the drainer naming table,
    column and DDL, with everything before it committed."""
    env = spark_env
    v1 = ITEMS
    v2 = v1.add_column(col("price", "decimal(10,2)"))
    v3 = Table(301, "inv", "items", [col("id", "int(11)", nullable=False), col("qty", "bigint(20)"),
                                     *v2.columns[2:]], primary=["id"], version=3)
    v4 = v3.drop_column("note")
    v5 = Table(301, "inv", "items", [*v4.columns[:3], col("price", "decimal(12,4)")],
               primary=["id"], version=5)
    v6 = Table(301, "inv", "items", [col("id", "int(11)", nullable=False), col("qty", "varbinary(8)"),
                                     *v5.columns[2:]], primary=["id"], version=6)
    ts = iter(range(T0, T0 + 1000))
    txns = [schema_txn(next(ts), v1),
            txn(prewrite_value(v1.mutation(v1.insert(id=1, qty=5, note="a"))), next(ts)),
            ddl_txn(next(ts), v2.alter_ddl("ALTER TABLE items ADD price DECIMAL(10,2)")),
            txn(prewrite_value(v2.mutation(v2.insert(id=2, qty=6, note="b", price=decimal.Decimal("1.25")))), next(ts)),
            ddl_txn(next(ts), v3.alter_ddl("ALTER TABLE items MODIFY qty BIGINT")),
            txn(prewrite_value(v3.mutation(v3.insert(id=3, qty=2**40, note="c"))), next(ts)),
            ddl_txn(next(ts), v4.alter_ddl("ALTER TABLE items DROP note")),
            txn(prewrite_value(v4.mutation(v4.update({"id": 1, "qty": 5, "price": None},
                                                     {"qty": 7}))), next(ts)),
            ddl_txn(next(ts), v5.alter_ddl("ALTER TABLE items MODIFY price DECIMAL(12,4)")),
            txn(prewrite_value(v5.mutation(v5.insert(id=4, qty=1, price=decimal.Decimal("0.1234")))),
                next(ts))]
    bad = ddl_txn(next(ts), v6.alter_ddl("ALTER TABLE items MODIFY qty VARBINARY(8)"))
    schema = SchemaHistory()
    sink = make_sink(env, "dd", schema)
    run(sink.open(Checkpoint(0)))
    with pytest.raises(UnmappableChange) as e:
        run(drive(sink, [*txns, bad], schema, per_apply=100))
    assert "inv.items" in str(e.value) and "qty" in str(e.value) and "VARBINARY" in str(e.value)
    # Everything before the DDL is committed; the table follows the last mappable shape.
    assert sink.checkpoint().commit_ts == txns[-1].commit_ts
    got = sorted(tuple(norm(x) for x in r) for r in env.rows("SELECT id, qty, price FROM dd_inv.items"))
    D = decimal.Decimal
    assert got == [(1, 7, None), (2, 6, D("1.25")), (3, 2**40, None), (4, 1, D("0.1234"))]
    schema_of = {f.name: f.dataType.simpleString() for f in env.spark.table("dd_inv.items").schema.fields}
    assert "note" not in schema_of and schema_of["qty"] == "bigint"
    assert schema_of["price"] == "decimal(12,4)"
    cl = {f.name: f.dataType.simpleString() for f in env.spark.table("dd_inv.items_changelog").schema.fields}
    assert cl["note"] == "string" and cl["price"] == "decimal(12,4)" and cl["price__v4"] == "decimal(10,2)"
    assert env.rows("SELECT note, price__v4 FROM dd_inv.items_changelog WHERE id = 2")[0] == ("b", D("1.25"))


def test_a_ddl_adding_or_dropping_several_columns_is_one_schema_commit_per_table(
        spark_env: SparkEnv) -> None:
    """Every ALTER of an Iceberg table is a commit (a metadata version): the columns one DDL
    adds, and those it drops, change the current table in one commit each, and the rows
    before and after land in the right columns (the dropped ones kept in the changelog)."""
    env = spark_env
    v1 = ITEMS
    v2 = v1.add_column(col("a", "int(11)")).add_column(col("b", "varchar(20)"))
    v3 = v2.drop_column("a").drop_column("note")
    ts = iter(range(T0, T0 + 100))
    first = [schema_txn(next(ts), v1),
             txn(prewrite_value(v1.mutation(v1.insert(id=1, qty=1, note="n"))), next(ts))]
    add = [ddl_txn(next(ts), v2.alter_ddl("ALTER TABLE items ADD a INT, ADD b VARCHAR(20)"))]
    mid = [txn(prewrite_value(v2.mutation(v2.insert(id=2, qty=2, note="m", a=5, b="x"))), next(ts))]
    drop = [ddl_txn(next(ts), v3.alter_ddl("ALTER TABLE items DROP a, DROP note"))]
    last = [txn(prewrite_value(v3.mutation(v3.insert(id=3, qty=3, b="y"))), next(ts))]
    schema = SchemaHistory()
    sink = make_sink(env, "mcol", schema)
    run(sink.open(Checkpoint(0)))

    def versions() -> int:
        return env.rows("SELECT count(*) FROM mcol_inv.items.metadata_log_entries")[0][0]
    run(drive(sink, first, schema))
    n0 = versions()
    run(drive(sink, add, schema))
    assert versions() == n0 + 1
    run(drive(sink, mid, schema))
    n1 = versions()
    run(drive(sink, drop, schema))
    assert versions() == n1 + 1
    run(drive(sink, last, schema))
    assert sink.checkpoint().commit_ts == last[-1].commit_ts
    assert sorted(tuple(r) for r in env.rows("SELECT id, qty, b FROM mcol_inv.items")) == \
        [(1, 1, None), (2, 2, "x"), (3, 3, "y")]
    assert [f.name for f in env.spark.table("mcol_inv.items").schema.fields
            if not f.name.startswith("_")] == ["id", "qty", "b"]
    assert sorted(tuple(r) for r in env.rows(
        "SELECT id, note, a, b FROM mcol_inv.items_changelog")) == \
        [(1, "n", None, None), (2, "m", 5, "x"), (3, None, None, "y")]
    run(sink.close())


def test_a_newer_epoch_fences_the_older_writer_which_commits_nothing(spark_env: SparkEnv) -> None:
    """Fencing: a sink of epoch 2 opening the tables commits a fence snapshot to each; the
    epoch-1 writer's next publish loses the compare-and-set, reads the higher epoch and raises
    Fenced; none of its rows reach any table, and the new writer lands every change once."""
    env = spark_env
    txns = [schema_txn(T0, ITEMS)]
    for i in range(1, 61):
        ch = ITEMS.insert(id=i % 25, qty=i, note="x") if i <= 25 else \
            ITEMS.update({"id": i % 25, "qty": i - 25, "note": "x"}, {"qty": i})
        txns.append(txn(prewrite_value(ITEMS.mutation(ch)), T0 + i))
    schema = SchemaHistory()
    a = make_sink(env, "ha", schema, epoch=1)
    run(a.open(Checkpoint(0)))
    run(drive(a, txns[:40], schema))
    q = "SELECT id, qty, note FROM ha_inv.items ORDER BY id"
    before = env.rows(q)
    schema_b = history(txns[:1])
    b = make_sink(env, "ha", schema_b, epoch=2)
    run(b.open(Checkpoint(T0)))
    assert b.checkpoint().sink_state["epoch"] == 2 and b.checkpoint().commit_ts == txns[39].commit_ts
    with pytest.raises(Fenced, match="epoch 2 > ours"):
        run(drive(a, txns[40:50], schema))
    assert env.rows(q) == before
    assert env.rows("SELECT count(*) FROM ha_inv.items_changelog")[0][0] == 39
    run(drive(b, txns, schema_b))
    want = {}
    for t in txns[1:]:
        for ev in t.rows(schema_b):
            r = row_to_dict(ev.after, ev.table_info)
            want[r["id"]] = (r["id"], r["qty"], r["note"])
    assert [tuple(r) for r in env.rows(q)] == [want[k] for k in sorted(want)]
    assert env.rows("SELECT count(*), count(DISTINCT _commit_ts, _seq) FROM ha_inv.items_changelog")[0] \
        == (60, 60)
    # An older epoch cannot even open: the tables carry a newer one.
    c = make_sink(env, "ha", SchemaHistory(), epoch=1)
    with pytest.raises(Fenced):
        run(c.open(Checkpoint(0)))


def test_a_publish_is_a_compare_and_set_on_main_even_between_appends(spark_env: SparkEnv) -> None:
    """Two concurrent writers: A writes its batch on its branch; B appends to main in between
    (an append that Iceberg would happily rebase). A's publish must fail (LostRace), its rows
    must not be on main, and its retry after re-reading lands them once on top of B's."""
    from sluice.spark_sink.catalog import Catalog, Summary
    from sluice.spark_sink.commit import LostRace, Publisher
    env = spark_env
    cat = Catalog(env.spark, env.session_cfg.catalog)
    cat.create_table("cas", "t", [("id", "INT"), ("v", "STRING")], {})
    a = Publisher(cat, "d", 1)
    a.open_table("cas", "t")
    written = []

    def write_a(branch: str) -> None:
        env.spark.createDataFrame([(1, "a")], "id INT, v STRING").writeTo(branch).append()
        # B commits to main between A's write and A's publish.
        with cat.commit_properties(Summary("d", 1, 7, 77).props()):
            env.spark.createDataFrame([(2, "b")], "id INT, v STRING").writeTo(cat.ident("cas", "t")).append()
        written.append(branch)

    with pytest.raises(LostRace):
        a.publish("cas", "t", Summary("d", 1, 1, 10), write_a)
    assert sorted(tuple(r) for r in env.rows("SELECT id, v FROM cas.t")) == [(2, "b")]
    assert a.heads[("cas", "t")].commit_ts == 77   # the skip point B's summary says
    a.publish("cas", "t", Summary("d", 1, 8, 80), lambda br: env.spark.createDataFrame(
        [(1, "a")], "id INT, v STRING").writeTo(br).append())
    assert sorted(tuple(r) for r in env.rows("SELECT id, v FROM cas.t")) == [(1, "a"), (2, "b")]


def test_truncate_rename_drop_create_effects(spark_env: SparkEnv) -> None:
    """DDL effects (docs/spark.md): TRUNCATE empties the current table in stream order (the
    changelog keeps every change plus a `t` row); RENAME moves both tables, history included;
    DROP TABLE drops the current table and keeps the changelog, also for a restarted sink;
    CREATE of the same table id in another shape starts a new incarnation: an empty current
    table in the new shape, the changelog holding both (the old column moved aside)."""
    env = spark_env
    v1 = Table(311, "ddl", "orders", [col("id", "int(11)", nullable=False), col("amt", "int(11)")],
               primary=["id"])
    ts = iter(range(T0, T0 + 1000))

    def ins(t: Table, i: int, amt: Any) -> Any:
        return txn(prewrite_value(t.mutation(t.insert(id=i, amt=amt))), next(ts))

    def tables() -> set[str]:
        return {r["tableName"] for r in env.rows("SHOW TABLES IN dl_ddl")}

    schema = SchemaHistory()
    sink = make_sink(env, "dl", schema)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, [schema_txn(next(ts), v1), ins(v1, 1, 1), ins(v1, 2, 2)], schema))
    assert [tuple(r) for r in env.rows("SELECT id, amt FROM dl_ddl.orders ORDER BY id")] == [(1, 1), (2, 2)]
    # TRUNCATE then an insert, in one apply: only the insert after it remains.
    run(drive(sink, [ddl_txn(next(ts), v1.truncate_ddl("TRUNCATE orders")), ins(v1, 3, 3)], schema))
    assert [tuple(r) for r in env.rows("SELECT id, amt FROM dl_ddl.orders")] == [(3, 3)]
    run(drive(sink, [ddl_txn(next(ts), v1.truncate_ddl("TRUNCATE orders"))], schema))
    assert env.rows("SELECT count(*) FROM dl_ddl.orders")[0][0] == 0
    # RENAME: the tables move, the history moves with them.
    v2 = v1.rename("ddl", "orders2")
    run(drive(sink, [ins(v1, 4, 4), ddl_txn(next(ts), v2.rename_ddl(v1, "RENAME TABLE orders TO orders2")),
                     ins(v2, 5, 5)], schema))
    assert tables() == {"orders2", "orders2_changelog"}
    assert [tuple(r) for r in env.rows("SELECT id, amt FROM dl_ddl.orders2 ORDER BY id")] == [(4, 4), (5, 5)]
    ops = [r[0] for r in env.rows("SELECT _op FROM dl_ddl.orders2_changelog ORDER BY _commit_ts, _seq")]
    assert ops == ["c", "c", "t", "c", "t", "c", "c"]
    # DROP TABLE: the current table goes (and stays gone for a restarted sink); the history stays.
    run(drive(sink, [ddl_txn(next(ts), v2.drop_ddl("DROP TABLE orders2"))], schema))
    assert tables() == {"orders2_changelog"}
    sink2 = make_sink(env, "dl", schema)
    run(sink2.open(Checkpoint(0)))
    assert tables() == {"orders2_changelog"}
    assert env.rows("SELECT count(*) FROM dl_ddl.orders2_changelog")[0][0] == 7
    # CREATE again under the same id with another type for amt: an empty table, new shape.
    v3 = Table(311, "ddl", "orders2", [col("id", "int(11)", nullable=False), col("amt", "varchar(10)")],
               primary=["id"], version=v2.version + 2)
    run(drive(sink2, [ddl_txn(next(ts), v3.create_ddl("CREATE TABLE orders2 ...")), ins(v3, 9, "x")], schema))
    assert [tuple(r) for r in env.rows("SELECT id, amt FROM dl_ddl.orders2")] == [(9, "x")]
    assert env.spark.table("dl_ddl.orders2").schema["amt"].dataType.simpleString() == "string"
    cl = env.rows("SELECT id, amt, amt__v2 FROM dl_ddl.orders2_changelog WHERE _op = 'c' "
                  "ORDER BY _commit_ts")
    assert [tuple(r) for r in cl] == [(1, None, 1), (2, None, 2), (3, None, 3), (4, None, 4),
                                      (5, None, 5), (9, "x", None)]


def test_a_drainer_of_another_name_is_refused_by_the_sink_before_it_writes(
        spark_env: SparkEnv) -> None:
    """Through the sink as the drainer loads it (`drainer_name` in the context): the first
    name owns the tables; another name's open() fails with OwnedByAnother and commits nothing."""
    from sluice.drainer.sink import load_sink
    env = spark_env
    w = RandomWorkload(seed=5, schema="own", keys=20, max_rows=2, keyless=False)
    txns = w.transactions(40, T0)
    schema = SchemaHistory()
    cfg = env.sink_config("own")
    owner = load_sink("spark", cfg, schema=schema, source_name="src", epoch=1, spark=env.spark,
                      drainer_name="d-owner")
    run(owner.open(Checkpoint(0)))
    run(drive(owner, txns, schema))
    before = owner.checkpoint()
    snaps = env.rows("SELECT count(*) FROM m_own._sluice_commits.snapshots")[0][0]
    other = load_sink("spark", cfg, schema=SchemaHistory(), source_name="src", epoch=1,
                      spark=env.spark, drainer_name="d-other")
    with pytest.raises(OwnedByAnother, match="belong to drainer 'd-owner', not 'd-other'"):
        run(other.open(Checkpoint(0)))
    assert env.rows("SELECT count(*) FROM m_own._sluice_commits.snapshots")[0][0] == snaps
    again = load_sink("spark", cfg, schema=SchemaHistory(), source_name="src", epoch=2,
                      spark=env.spark, drainer_name="d-owner")
    run(again.open(Checkpoint(0)))
    assert again.checkpoint().commit_ts == before.commit_ts == txns[-1].commit_ts


def test_a_session_on_another_catalog_is_a_config_error_not_the_active_catalog(
        spark_env: SparkEnv, tmp_path: Any) -> None:
    """One process holds one session: asking it for another catalog under the same name
    (another warehouse, catalog type or URI) is refused by name, never answered with the active
    session (whose catalog the caller would then read and write)."""
    import dataclasses

    from sluice.core.errors import ConfigError
    from sluice.spark_sink.session import session
    env = spark_env
    assert session(env.session_cfg) is env.spark
    assert session(dataclasses.replace(env.session_cfg, app_name="other", log_level="WARN")) \
        is env.spark   # other settings: the active session, as documented
    for other in (dataclasses.replace(env.session_cfg, warehouse=str(tmp_path / "elsewhere")),
                  dataclasses.replace(env.session_cfg, catalog_uri="jdbc:sqlite:/tmp/x.db")):
        with pytest.raises(ConfigError, match="this process's Spark session has spark.sql.catalog.sluice"):
            session(other)
    assert env.rows("SHOW NAMESPACES")   # the active session is untouched


def test_the_pyiceberg_recipe_in_the_docs_reads_what_spark_reads(spark_env: SparkEnv) -> None:
    """docs/spark.md's pyiceberg snippet, run as written against the sink's catalog (no JVM on
    its side), reads the same current-state rows as Spark."""
    import re

    from tests.support.procs import REPO
    env = spark_env
    orders = Table(321, "shop", "orders", [col("id", "int(11)", nullable=False),
                                           col("amt", "decimal(10,2)"), col("note", "varchar(20)")],
                   primary=["id"])
    txns = [schema_txn(T0, orders)] + [
        txn(prewrite_value(orders.mutation(orders.insert(id=i, amt=decimal.Decimal(i) / 4,
                                                         note=f"n{i}"))), T0 + i)
        for i in range(1, 21)]
    txns.append(txn(prewrite_value(orders.mutation(orders.delete(id=3, amt=decimal.Decimal("0.75"),
                                                                 note="n3"))), T0 + 30))
    schema = SchemaHistory()
    sink = make_sink(env, "doc", schema, database="{schema}")
    run(sink.open(Checkpoint(0)))
    run(drive(sink, txns, schema))
    run(sink.close())
    text = (REPO / "docs" / "spark.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", text, re.S)
    scope: dict[str, Any] = {"warehouse": env.warehouse}
    exec(compile(snippet, "docs/spark.md", "exec"), scope)  # noqa: S102 - the doc's own example
    got = sorted((r["id"], r["amt"], r["note"]) for r in scope["orders"].to_pylist())
    want = sorted(tuple(r) for r in env.rows("SELECT id, amt, note FROM shop.orders"))
    assert got == want and len(got) == 19
