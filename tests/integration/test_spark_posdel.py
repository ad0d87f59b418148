"""current-state = "delete" without a Spark job (spark_sink/positions.py, docs/spark.md "Direct
writes"): the driver finds the rows of the keys a batch changes in the branch's data files
(their key columns, read by field id and cached per immutable file) and commits their position
deletes with the last images in ONE row delta. The tables equal the model and what the Spark
DELETE path gives, on every key shape; pyiceberg reads the same rows."""
from __future__ import annotations

import datetime
import decimal

import pytest

from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import SchemaHistory
from sluice.spark_sink.positions import live_files, local_path
from sluice.spark_sink.tables import sql_str
from tests.support.rows import RandomWorkload, Table, col, ddl_txn, prewrite_value, schema_txn, txn
from tests.support.spark import (SparkEnv, drive, expected_rows, make_sink, norm,  # noqa: F401
                                 pyiceberg_catalog, run, spark_env, view_rows)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

T0 = 1 << 42


def operations(env: SparkEnv, table: str) -> list[str]:
    return [r[0] for r in env.rows(f"SELECT operation FROM {table}.snapshots ORDER BY committed_at")]


def test_position_deletes_by_the_driver_equal_the_spark_delete(spark_env: SparkEnv) -> None:
    """Random transactions (updates, deletes, key changes over keys that recur across small
    batches) on a bigint key, a composite (int, varchar) key and a varchar unique key: the
    driver's position deletes leave every current table equal to the model and to a sink that
    deletes through Spark; its current tables hold position-delete files and no snapshot of a
    Spark DELETE (one row delta per batch: `overwrite`), the other's do; pyiceberg reads the
    same rows as Spark."""
    env = spark_env
    w = RandomWorkload(seed=33, schema="shop", keys=50, max_rows=4, keyless=False)
    txns = w.transactions(160, T0)
    got = {}
    sinks = {}
    for name, positions in (("pd", True), ("sd", False)):
        schema = SchemaHistory()
        sink = make_sink(env, name, schema, batch_rows=70)
        if not positions:
            sink.key_cache = None        # no positions: the Spark DELETE path
        run(sink.open(Checkpoint(0)))
        run(drive(sink, txns, schema))
        assert sink.checkpoint().sink_state["batch"] >= 4
        got[name] = {t.name: view_rows(env, f"{name}_shop.{t.name}", t) for t in w.tables}
        sinks[name] = sink
    for t in w.tables:
        want = expected_rows(w, t)
        assert want, t.name
        assert got["pd"][t.name] == want, t.name
        assert got["sd"][t.name] == want, t.name
        mine, spark = operations(env, f"pd_shop.{t.name}"), operations(env, f"sd_shop.{t.name}")
        assert "delete" not in mine and "overwrite" in mine, (t.name, mine)
        assert "delete" in spark, (t.name, spark)
        n = env.rows(f"SELECT count(*) FROM pd_shop.{t.name}.all_delete_files WHERE content = 1")[0][0]
        assert n >= 3, (t.name, n)
    cache = sinks["pd"].key_cache
    assert cache.hits > cache.reads > 0   # each data file read once, then from the cache
    cat = pyiceberg_catalog(env.warehouse)
    for t in w.tables:
        arrow = cat.load_table(f"pd_shop.{t.name}").scan().to_arrow()
        assert arrow.num_rows == len(got["pd"][t.name]), t.name
        ids = sorted(arrow.column(t.visible[0].name).to_pylist(), key=repr)
        assert ids == sorted((r[0] for r in got["pd"][t.name]), key=repr), t.name
    for s in sinks.values():
        run(s.close())


ORDERS = Table(501, "typ", "orders", [
    col("region", "varchar(8)", nullable=False), col("amount", "decimal(12,2)", nullable=False),
    col("at", "datetime(6)", nullable=False), col("v", "int(11)")],
    primary=["region", "amount", "at"])


def test_typed_composite_keys_and_a_renamed_key_column(spark_env: SparkEnv) -> None:
    """A (varchar, decimal, datetime(6)) key, one batch per transaction: updates and deletes
    find their rows in the files of earlier batches (microsecond timestamps and negative
    decimals compare exactly); after RENAME COLUMN of a key column the older files still match
    by field id."""
    env = spark_env
    v1 = ORDERS
    v2 = Table(501, "typ", "orders", [col("zone", "varchar(8)", nullable=False), *v1.columns[1:]],
               primary=["zone", "amount", "at"], version=2)
    D = decimal.Decimal
    at = [datetime.datetime(2024, 5, 1, 12, 0, 0, us) for us in (0, 1, 999999)]
    ts = iter(range(T0, T0 + 100))

    def rows(t: Table, *changes) -> object:   # type: ignore[no-untyped-def]
        return txn(prewrite_value(t.mutation(*changes)), next(ts))
    txns = [schema_txn(next(ts), v1),
            rows(v1, *(v1.insert(region=r, amount=D(a), at=x, v=i)
                       for i, (r, a, x) in enumerate([("eu", "1.00", at[0]), ("eu", "1.00", at[1]),
                                                      ("us", "2.50", at[2]), ("us", "-0.01", at[0])]))),
            rows(v1, v1.update({"region": "eu", "amount": D("1.00"), "at": at[1], "v": 1},
                               {"v": 11}),
                 v1.delete(region="us", amount=D("-0.01"), at=at[0], v=3)),
            ddl_txn(next(ts), v2.alter_ddl("ALTER TABLE orders RENAME COLUMN region TO zone")),
            rows(v2, v2.delete(zone="eu", amount=D("1.00"), at=at[0], v=0),
                 v2.update({"zone": "us", "amount": D("2.50"), "at": at[2], "v": 2}, {"v": 22}),
                 v2.insert(zone="eu", amount=D("1.00"), at=at[0], v=100))]
    schema = SchemaHistory()
    sink = make_sink(env, "tk", schema)
    run(sink.open(Checkpoint(0)))
    for t in txns:   # one batch per transaction: every later one looks positions up
        run(drive(sink, [t], schema))
        run(sink.flush())
    got = sorted(tuple(norm(x) for x in r) for r in env.rows("SELECT zone, amount, at, v FROM tk_typ.orders"))
    assert got == sorted([("eu", D("1.00"), at[1], 11), ("us", D("2.50"), at[2], 22),
                          ("eu", D("1.00"), at[0], 100)])
    assert "delete" not in operations(env, "tk_typ.orders")
    assert sink.paths[("tk_typ", "orders")] == "direct"
    run(sink.close())


def test_a_rewrite_of_main_under_the_positions_is_refused_and_the_batch_redone(
        spark_env: SparkEnv, caplog: pytest.LogCaptureFixture) -> None:
    """Another writer rewrites every data file of main (rewrite_data_files, as maintenance in
    another process would) after the sink found its positions in the old files' history: the
    row delta lands on the sink's branch but main cannot be fast-forwarded to it (the rewrite is
    not its ancestor), the branch goes back to main's new head and the batch's positions are
    found again in the rewritten files (read anew); the tables equal the model, with position
    deletes and no Spark DELETE."""
    env = spark_env
    w = RandomWorkload(seed=71, schema="rw", keys=20, max_rows=3, keyless=False)
    txns = w.transactions(80, T0)
    schema = SchemaHistory()
    sink = make_sink(env, "rw", schema, batch_rows=40)
    run(sink.open(Checkpoint(0)))
    half = len(txns) // 2
    run(drive(sink, txns[:half], schema))
    run(sink.flush())
    reads = sink.key_cache.reads
    cat = sink.catalog
    for t in w.tables:
        name = sql_str(cat.ident("rw_rw", t.name))
        env.rows(f"CALL {cat.name}.system.rewrite_data_files(table => {name}, "
                 "options => map('min-input-files', '1', 'rewrite-all', 'true'))")
        assert "replace" in operations(env, f"rw_rw.{t.name}"), t.name
    with caplog.at_level("WARNING", logger="sluice.spark_sink.commit"):
        run(drive(sink, txns[half:], schema))
        run(sink.flush())
    lost = [r for r in caplog.records if "lost a race" in r.getMessage()]
    assert lost, "the fast-forward over the rewrite was not refused"
    assert sink.key_cache.reads > reads     # the rewritten files' keys were read
    cached = {k[0] for k in sink.key_cache._items}
    for t in w.tables:   # files the rewrite removed left the cache
        ice = cat.iceberg_table("rw_rw", t.name)
        live = {local_path(f) for f in live_files(ice, sink.publisher.branch)[0]}
        root = local_path(str(ice.location()))
        assert root is not None
        mine = {p for p in cached if p.startswith(root.rstrip("/") + "/")}
        assert mine and mine <= live, (t.name, mine - live)
    for t in w.tables:
        want = expected_rows(w, t)
        assert view_rows(env, f"rw_rw.{t.name}", t) == want, t.name
        assert "delete" not in operations(env, f"rw_rw.{t.name}"), t.name
        assert sink.paths[("rw_rw", t.name)] == "direct", t.name
    run(sink.close())
