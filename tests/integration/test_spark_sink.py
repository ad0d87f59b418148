"""The Spark sink through a real Derby metastore and a real SparkSession (docs/spark.md)."""
from __future__ import annotations

import datetime as _dt
import decimal
from typing import Any

import pytest

from sluice.core.rowcodec import python_to_datum, row_to_dict
from sluice.drainer.sink import Checkpoint, load_sink
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import types as ST
from sluice.spark_sink.commit import Fenced
from sluice.spark_sink.tables import UnmappableChange, key_of_info
from tests.support.rows import RandomWorkload, Table, col, ddl_txn, prewrite_value, schema_txn, txn
from tests.support.spark import SparkEnv, run, spark_env  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

T0 = 1 << 40


def spark_value(v: Any, c: pb.ColumnInfo) -> Any:
    """What the sink stores for model value v of column c, normalised for comparison."""
    if v is None:
        return None
    st = ST.spark_type(c)
    return norm(ST.converter(st)(python_to_datum(v, c)))


def norm(v: Any) -> Any:
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, _dt.datetime) and v.tzinfo is not None:
        return v.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    if isinstance(v, decimal.Decimal):
        return v.normalize()
    return v


def expected_rows(w: RandomWorkload, t: Table) -> list[tuple]:
    rows = w.model[t.name]
    rows = rows.values() if isinstance(rows, dict) else rows
    return sorted((tuple(spark_value(r.get(c.name), c) for c in t.visible) for r in rows), key=repr)


def view_rows(env: SparkEnv, view: str, t: Table) -> list[tuple]:
    cols = ", ".join(f"`{c.name}`" for c in t.visible)
    return sorted((tuple(norm(x) for x in r) for r in env.rows(f"SELECT {cols} FROM {view}")), key=repr)


def history(txns: list[Txn]) -> SchemaHistory:
    h = SchemaHistory()
    for t in txns:
        h.apply(t)
    return h


async def drive(sink: Any, txns: list[Txn], schema: SchemaHistory, per_apply: int = 50) -> None:
    """Apply like the drainer: schema effects recorded before the batch reaches the sink."""
    for i in range(0, len(txns), per_apply):
        chunk = txns[i:i + per_apply]
        for t in chunk:
            if t.prewrite.schema_snapshots or t.is_ddl:
                schema.apply(t)
        await sink.apply(chunk)
    await sink.flush()


def make_sink(env: SparkEnv, name: str, schema: SchemaHistory, epoch: int = 0, **kw: Any) -> Any:
    cfg = env.sink_config(name, **kw)
    return load_sink("spark", cfg, schema=schema, source_name="src", epoch=epoch, spark=env.spark)


def expected_changes(txns: list[Txn], schema: SchemaHistory) -> list[tuple[int, int, str]]:
    """(commit_ts, _seq, _op) of every change, in commit order, computed from the transactions."""
    out = []
    for t in txns:
        for ev in t.rows(schema):
            key = key_of_info(ev.table_info)
            if ev.op == "u":
                b, a = row_to_dict(ev.before, ev.table_info), row_to_dict(ev.after, ev.table_info)
                changed = (b != a) if not key else any(b[k] != a[k] for k in key)
                if changed:
                    out += [(t.commit_ts, 2 * ev.seq, "d"), (t.commit_ts, 2 * ev.seq + 1, "c")]
                    continue
            out.append((t.commit_ts, 2 * ev.seq, ev.op))
    return out


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
