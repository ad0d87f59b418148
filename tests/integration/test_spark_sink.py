"""The Spark sink through a real Derby metastore and a real SparkSession (docs/spark.md)."""
from __future__ import annotations

import decimal
from typing import Any

import pytest

from sluice.core.rowcodec import row_to_dict
from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import SchemaHistory
from sluice.spark_sink.commit import Fenced
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
    # Batches follow commit order: a later batch never holds an earlier commit_ts.
    per_batch = env.rows("SELECT _batch, min(_commit_ts), max(_commit_ts) FROM "
                         "rw_shop.accounts_changelog GROUP BY _batch ORDER BY _batch")
    for a, b in zip(per_batch, per_batch[1:]):
        assert a[2] < b[1]
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
    the checkpoint moves only when the commit point is written, flush() waits for everything;
    a background commit's error is raised by the next call and nothing after it lands."""
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
    failpoint.enable("spark-after-files", "1*sleep(2000)")
    try:
        t = time.monotonic()
        run(sink.apply(txns[1:21]))          # fills the batch: its commit sleeps in the thread
        assert time.monotonic() - t < 1.5
        assert sink.checkpoint().commit_ts == before   # not committed yet
        run(sink.apply(txns[21:31]))         # buffered beside the commit in flight
        run(sink.flush())
    finally:
        failpoint.disable("spark-after-files")
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


def test_ddl_add_drop_widen_then_unmappable_stops(spark_env: SparkEnv) -> None:
    env = spark_env
    v1 = ITEMS
    v2 = v1.add_column(col("price", "decimal(10,2)"))
    v3 = Table(301, "inv", "items", [col("id", "int(11)", nullable=False), col("qty", "bigint(20)"),
                                     *v2.columns[2:]], primary=["id"], version=3)
    v4 = v3.drop_column("note")
    v5 = Table(301, "inv", "items", [col("id", "int(11)", nullable=False), col("qty", "varbinary(8)"),
                                     *v4.columns[2:]], primary=["id"], version=5)
    ts = iter(range(T0, T0 + 1000))
    txns = [schema_txn(next(ts), v1),
            txn(prewrite_value(v1.mutation(v1.insert(id=1, qty=5, note="a"))), next(ts)),
            ddl_txn(next(ts), v2.alter_ddl("ALTER TABLE items ADD price DECIMAL(10,2)")),
            txn(prewrite_value(v2.mutation(v2.insert(id=2, qty=6, note="b", price=decimal.Decimal("1.25")))), next(ts)),
            ddl_txn(next(ts), v3.alter_ddl("ALTER TABLE items MODIFY qty BIGINT")),
            txn(prewrite_value(v3.mutation(v3.insert(id=3, qty=2**40, note="c"))), next(ts)),
            ddl_txn(next(ts), v4.alter_ddl("ALTER TABLE items DROP note")),
            txn(prewrite_value(v4.mutation(v4.update({"id": 1, "qty": 5, "price": None},
                                                     {"qty": 7}))), next(ts))]
    bad = ddl_txn(next(ts), v5.alter_ddl("ALTER TABLE items MODIFY qty VARBINARY(8)"))
    schema = SchemaHistory()
    sink = make_sink(env, "dd", schema)
    run(sink.open(Checkpoint(0)))
    with pytest.raises(UnmappableChange) as e:
        run(drive(sink, [*txns, bad], schema, per_apply=100))
    assert "inv.items" in str(e.value) and "qty" in str(e.value) and "VARBINARY" in str(e.value)
    # Everything before the DDL is committed; the view follows the last mappable shape.
    assert sink.checkpoint().commit_ts == txns[-1].commit_ts
    got = sorted(tuple(norm(x) for x in r) for r in env.rows("SELECT id, qty, price FROM dd_inv.items"))
    assert got == [(1, 7, None), (2, 6, decimal.Decimal("1.25")), (3, 2**40, None)]
    cols = [f.name for f in env.spark.table("dd_inv.items").schema.fields]
    assert "note" not in cols and env.spark.table("dd_inv.items").schema["qty"].dataType.simpleString() == "bigint"


def test_compaction_keeps_results_and_fence_hides_stale_batch(spark_env: SparkEnv) -> None:
    """Compaction swaps the base in one catalog operation with identical results; a writer with
    a higher epoch fences a stalled older one, whose batch never becomes visible."""
    from sluice.core import failpoint
    from sluice.spark_sink.commit import CommitRecord
    from sluice.spark_sink.compaction import compact
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
    st = a._states[301]
    a._states[301] = compact(a, st)
    assert a._states[301].base_version == 1
    assert env.rows(q) == before
    # A stalls between its files (registered) and its commit point.
    failpoint.enable("spark-before-commit", "1*raise(stalled)")
    try:
        with pytest.raises(Exception, match="stalled"):
            run(drive(a, txns[40:50], schema))
    finally:
        failpoint.disable("spark-before-commit")
    schema_b = history(txns[:1])
    b = make_sink(env, "ha", schema_b, epoch=2)
    run(b.open(Checkpoint(T0)))
    fence = b.checkpoint()
    assert fence.sink_state["epoch"] == 2 and fence.commit_ts == txns[39].commit_ts
    assert env.rows(q) == before  # A's batch is not visible, and B's recovery removed it
    assert not any("_epoch=1" in r[0] and f"_batch={fence.sink_state['batch']}" in r[0]
                   for r in env.rows("SHOW PARTITIONS m_ha.t301_raw"))
    stale = CommitRecord(batch=fence.sink_state["batch"], epoch=1, commit_ts=txns[49].commit_ts,
                         positions={}, schema_versions={})
    with pytest.raises(Fenced):
        a.committer.commit(stale)
    run(drive(b, txns, schema_b))
    want = {}
    for t in txns[1:]:
        for ev in t.rows(schema_b):
            r = row_to_dict(ev.after, ev.table_info)
            want[r["id"]] = (r["id"], r["qty"], r["note"])
    assert [tuple(r) for r in env.rows(q)] == [want[k] for k in sorted(want)]
    assert env.rows("SELECT count(*), count(DISTINCT _commit_ts, _seq) FROM ha_inv.items_changelog")[0] \
        == (60, 60)


def test_truncate_rename_drop_create_effects(spark_env: SparkEnv) -> None:
    """DDL effects (docs/spark.md): TRUNCATE empties the current state from the batch that
    commits it (the changelog keeps every change plus a `t` marker); RENAME moves both views,
    history included; DROP TABLE removes the views, also for a restarted sink, and keeps the raw
    history; CREATE of the same table id starts an empty table whose columns start fresh."""
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
    # TRUNCATE then an insert, in one batch: only the insert after it remains.
    run(drive(sink, [ddl_txn(next(ts), v1.truncate_ddl("TRUNCATE orders")), ins(v1, 3, 3)], schema))
    assert [tuple(r) for r in env.rows("SELECT id, amt FROM dl_ddl.orders")] == [(3, 3)]
    # TRUNCATE alone in its batch: the table is empty.
    run(drive(sink, [ddl_txn(next(ts), v1.truncate_ddl("TRUNCATE orders"))], schema))
    assert env.rows("SELECT count(*) FROM dl_ddl.orders")[0][0] == 0
    # RENAME: the views move, the history moves with them.
    v2 = v1.rename("ddl", "orders2")
    run(drive(sink, [ins(v1, 4, 4), ddl_txn(next(ts), v2.rename_ddl(v1, "RENAME TABLE orders TO orders2")),
                     ins(v2, 5, 5)], schema))
    assert tables() == {"orders2", "orders2_changelog"}
    assert [tuple(r) for r in env.rows("SELECT id, amt FROM dl_ddl.orders2 ORDER BY id")] == [(4, 4), (5, 5)]
    ops = [r[0] for r in env.rows("SELECT _op FROM dl_ddl.orders2_changelog ORDER BY _commit_ts, _seq")]
    assert ops == ["c", "c", "t", "c", "t", "c", "c"]
    # DROP TABLE: the views go (and stay gone for a restarted sink); the raw history stays.
    run(drive(sink, [ddl_txn(next(ts), v2.drop_ddl("DROP TABLE orders2"))], schema))
    assert tables() == set()
    sink2 = make_sink(env, "dl", schema)
    run(sink2.open(Checkpoint(0)))
    assert tables() == set()
    assert env.rows("SELECT count(*) FROM m_dl.t311_raw")[0][0] == 7
    # CREATE again under the same id with another type for amt: an empty table, fresh columns.
    v3 = Table(311, "ddl", "orders2", [col("id", "int(11)", nullable=False), col("amt", "varchar(10)")],
               primary=["id"], version=v2.version + 2)
    run(drive(sink2, [ddl_txn(next(ts), v3.create_ddl("CREATE TABLE orders2 ...")), ins(v3, 9, "x")], schema))
    assert [tuple(r) for r in env.rows("SELECT id, amt FROM dl_ddl.orders2")] == [(9, "x")]
    assert env.spark.table("dl_ddl.orders2").schema["amt"].dataType.simpleString() == "string"


def test_partitions_registered_on_the_metastore_client_equal_the_sql_statements(
        spark_env: SparkEnv, tmp_path: Any) -> None:
    """The sink registers partitions on the Hive metastore client (spark_sink.catalog): the
    partition, its qualified location, its storage and the rows read through it are what
    `ALTER TABLE ... ADD IF NOT EXISTS PARTITION ... LOCATION` gives; adding it again is a no-op,
    and without IF NOT EXISTS it is PartitionExists (the commit point), on both paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sluice.core.errors import SluiceError
    from sluice.spark_sink.catalog import PartitionAdder, PartitionExists
    env = spark_env
    env.spark.sql("CREATE DATABASE IF NOT EXISTS pa_meta")
    env.spark.sql(f"CREATE TABLE pa_meta.t (a BIGINT, _batch BIGINT, _epoch BIGINT) USING parquet "
                  f"PARTITIONED BY (_batch, _epoch) LOCATION '{tmp_path / 't'}'")
    for b in (1, 2):
        (tmp_path / f"b{b}").mkdir()
        pq.write_table(pa.table({"a": [b * 10, b * 10 + 1]}), tmp_path / f"b{b}" / "f.parquet")
    direct = PartitionAdder(env.spark)
    # the spec's order is not the table's: the values go by name
    direct.add("pa_meta", "t", {"_epoch": 7, "_batch": 1}, str(tmp_path / "b1"))
    direct.add("pa_meta", "t", {"_batch": 1, "_epoch": 7}, str(tmp_path / "b1"))   # exists: no-op
    with pytest.raises(PartitionExists):
        direct.add("pa_meta", "t", {"_batch": 1, "_epoch": 7}, str(tmp_path / "b1"),
                   if_not_exists=False)
    with pytest.raises(SluiceError, match="partition columns"):
        direct.add("pa_meta", "t", {"_batch": 3}, str(tmp_path / "b3"))
    assert direct._direct, "the metastore-client path fell back to SQL"
    by_sql = PartitionAdder(env.spark)
    by_sql._direct = False
    by_sql.add("pa_meta", "t", {"_batch": 2, "_epoch": 7}, str(tmp_path / "b2"))
    with pytest.raises(PartitionExists):
        by_sql.add("pa_meta", "t", {"_batch": 2, "_epoch": 7}, str(tmp_path / "b2"),
                   if_not_exists=False)
    assert [r[0] for r in env.rows("SHOW PARTITIONS pa_meta.t")] == ["_batch=1/_epoch=7",
                                                                    "_batch=2/_epoch=7"]
    described = {}
    for b in (1, 2):
        rows = env.rows(f"DESCRIBE FORMATTED pa_meta.t PARTITION (_batch={b}, _epoch=7)")
        described[b] = [(r[0], r[1]) for r in rows
                        if r[0] not in ("Created Time", "Last Access", "Partition Values",
                                        "Partition Parameters", "Partition Statistics")]
    assert ("Location", f"file:{tmp_path / 'b1'}") in described[1]
    assert [(k, v.replace("/b1", "/b2")) for k, v in described[1]] == described[2]
    assert sorted(tuple(r) for r in env.rows("SELECT a, _batch FROM pa_meta.t")) == [
        (10, 1), (11, 1), (20, 2), (21, 2)]


def test_commit_point_admits_one_writer_per_batch(spark_env: SparkEnv, tmp_path: Any) -> None:
    """The commit point is the metastore's refusal of an existing `_sluice_commits` partition:
    batch B commits once; a writer of an older epoch is Fenced without changing the committed
    record, a second writer of the same epoch gets CommitConflict. The tables belong to the
    first drainer name that opened them (epochs are counted per name, so another name could
    share an epoch): another name is refused before it writes anything."""
    from sluice.spark_sink.commit import CommitConflict, CommitRecord, Committer, OwnedByAnother
    from sluice.spark_sink.layout import Files, Layout
    env = spark_env
    layout = Layout(str(tmp_path / "root"), "cp_meta", "cp_{schema}", "src")
    files = Files(env.spark)
    first = Committer(env.spark, layout, files)
    assert first.open(2, owner="drainer-a") is None
    first.commit(CommitRecord(batch=1, epoch=2, commit_ts=10, positions={"p": "a"},
                              schema_versions={}))
    second = Committer(env.spark, layout, files)
    with pytest.raises(Fenced, match="committed by epoch 2"):
        second.commit(CommitRecord(batch=1, epoch=1, commit_ts=12, positions={},
                                   schema_versions={}))
    assert [(r.batch, r.epoch, r.commit_ts, r.positions) for r in second.read()] == [
        (1, 2, 10, {"p": "a"})]
    with pytest.raises(CommitConflict, match="batch 1 is already committed"):
        second.commit(CommitRecord(batch=1, epoch=2, commit_ts=11, positions={},
                                   schema_versions={}))
    with pytest.raises(OwnedByAnother, match="belong to drainer 'drainer-a', not 'drainer-b'"):
        Committer(env.spark, layout, files).open(3, owner="drainer-b")
    assert [r.batch for r in first.read()] == [1]   # no fence batch from the refused one
    assert Committer(env.spark, layout, files).open(3, owner="drainer-a") is not None


def test_a_drainer_of_another_name_is_refused_by_the_sink_before_it_writes(
        spark_env: SparkEnv) -> None:
    """Through the sink as the drainer loads it (`drainer_name` in the context): the first
    name owns the tables; another name's open() fails with OwnedByAnother and commits nothing."""
    from sluice.drainer.sink import load_sink
    from sluice.spark_sink.commit import OwnedByAnother
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
    other = load_sink("spark", cfg, schema=SchemaHistory(), source_name="src", epoch=1,
                      spark=env.spark, drainer_name="d-other")
    with pytest.raises(OwnedByAnother, match="belong to drainer 'd-owner', not 'd-other'"):
        run(other.open(Checkpoint(0)))
    again = load_sink("spark", cfg, schema=SchemaHistory(), source_name="src", epoch=2,
                      spark=env.spark, drainer_name="d-owner")
    run(again.open(Checkpoint(0)))
    assert again.checkpoint().commit_ts == before.commit_ts == txns[-1].commit_ts


def test_a_session_on_another_metastore_is_a_config_error_not_the_active_catalog(
        spark_env: SparkEnv) -> None:
    """One JVM holds one Hive metastore: asking this process for a session on another one
    (another Derby server, database or the embedded one) is refused by name, never answered
    with the active session (whose catalog the caller would then read and write)."""
    import dataclasses

    from sluice.core.errors import ConfigError
    from sluice.spark_sink.session import session
    env = spark_env
    assert session(env.session_cfg) is env.spark
    assert session(dataclasses.replace(env.session_cfg, app_name="other", log_level="WARN")) \
        is env.spark   # other settings: the active session, as documented
    for other in (dataclasses.replace(env.session_cfg, metastore="127.0.0.1:1"),
                  dataclasses.replace(env.session_cfg, metastore_db="elsewhere"),
                  dataclasses.replace(env.session_cfg, metastore="")):
        with pytest.raises(ConfigError, match="uses the metastore jdbc:derby://127.0.0.1:"):
            session(other)
    assert env.rows("SHOW DATABASES")   # the active session is untouched
