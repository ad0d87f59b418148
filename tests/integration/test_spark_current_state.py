"""How a keyed current table takes a batch (`current-state`, docs/spark.md "Current-state
methods"): only keys the table may already hold are removed before the append of the last
images, by a DELETE or by an equality-delete file; both leave the rows MERGE INTO leaves."""
from __future__ import annotations

import datetime
import decimal
import json
import subprocess
from typing import Any

import pytest

from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import SchemaHistory
from sluice.spark_sink import writer as W
from tests.support.rows import RandomWorkload, Table, col, prewrite_value, schema_txn, txn
from tests.support.spark import (SparkEnv, child_env, drive, expected_rows, make_sink,  # noqa: F401
                                 pyiceberg_catalog, run, spark_env, spark_sql_argv, view_rows)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

T0 = 1 << 40
METHODS = (W.MERGE, W.DELETE_KEYS, W.EQUALITY_DELETES)

# A composite key of the types an equality-delete file must match exactly: decimal, datetime,
# binary, string.
PARTS = Table(331, "inv", "parts", [
    col("lot", "decimal(12,3)", nullable=False), col("made", "datetime(6)", nullable=False),
    col("code", "varbinary(8)", nullable=False), col("name", "varchar(16)", nullable=False),
    col("qty", "int(11)")], primary=["lot", "made", "code", "name"])


def _key(i: int) -> dict[str, Any]:
    return {"lot": decimal.Decimal(i) / 8, "made": datetime.datetime(2026, 1, 1 + i % 28, 3, 4, 5, i),
            "code": bytes([i % 256, 7]), "name": f"p{i}"}


def _sink(env: SparkEnv, name: str, how: str, schema: SchemaHistory) -> Any:
    sink = make_sink(env, name, schema)
    sink.current_by = how
    return sink


def _ops(env: SparkEnv, table: str) -> list[tuple[str, dict[str, str]]]:
    """(operation, summary) of every snapshot of table (main and the sink's branch), oldest
    first."""
    return [(r[0], dict(r[1])) for r in env.rows(
        f"SELECT operation, summary FROM {table}.snapshots ORDER BY committed_at, snapshot_id")]


def test_an_insert_only_batch_removes_nothing_and_a_mixed_batch_only_existing_keys(
        spark_env: SparkEnv) -> None:
    """A key whose first change in the batch is an insert is absent from the table, so its batch
    commits no DELETE (and no equality-delete file): an insert-only batch adds only append
    snapshots. A mixed batch removes exactly the keys whose first change is an update, delete
    or snapshot read (an insert-then-update key is not removed), and every method leaves the
    rows MERGE INTO leaves."""
    env = spark_env
    first = [txn(prewrite_value(PARTS.mutation(*[PARTS.insert(**_key(i), qty=i)
                                                  for i in range(1, 11)])), T0 + 1)]
    k = _key
    mixed = [
        txn(prewrite_value(PARTS.mutation(
            PARTS.update({**k(1), "qty": 1}, {**k(1), "qty": 100}),      # u: removed
            PARTS.delete(**k(2), qty=2),                                  # d: removed
            PARTS.insert(**k(20), qty=20),                                # c: not removed
            PARTS.insert(**k(21), qty=21))), T0 + 2),                     # c then u: not removed
        txn(prewrite_value(PARTS.mutation(
            PARTS.update({**k(21), "qty": 21}, {**k(21), "qty": 210}),
            # a key change 3 -> 22: a d of 3 (removed) and a c of 22 (not removed)
            PARTS.update({**k(3), "qty": 3}, {**k(22), "qty": 3}),
            PARTS.read(**k(4), qty=44),                                   # r: upsert, removed
            PARTS.insert(**k(2), qty=222))), T0 + 3),                     # d then c: removed
    ]
    got = {}
    for how in METHODS:
        name = f"is{METHODS.index(how)}"
        schema = SchemaHistory()
        sink = _sink(env, name, how, schema)
        run(sink.open(Checkpoint(0)))
        run(drive(sink, [schema_txn(T0, PARTS)], schema))
        run(drive(sink, first, schema))
        table = f"{name}_inv.parts"
        if how != W.MERGE:
            ops = _ops(env, table)
            assert {op for op, _ in ops} == {"append"}, ops
            assert not any(int(s.get("added-equality-deletes", "0")) for _, s in ops)
        before = len(_ops(env, table))
        run(drive(sink, mixed, schema))
        new = _ops(env, table)[before:]
        if how == W.DELETE_KEYS:
            # the DELETE (position deletes on merge-on-read) removed keys 1, 2, 3, 4
            assert sum(int(s.get("added-position-deletes", "0")) for _, s in new) == 4, new
        elif how == W.EQUALITY_DELETES:
            # keys 1, 2, 3, 4 in the file; 20, 21, 22 (insert first) not
            assert [int(s["added-equality-deletes"]) for _, s in new
                    if "added-equality-deletes" in s] == [4], new
            assert not any(int(s.get("added-position-deletes", "0")) for _, s in new)
        got[how] = view_rows(env, table, PARTS)
        run(sink.close())
    assert got[W.DELETE_KEYS] == got[W.MERGE]
    assert got[W.EQUALITY_DELETES] == got[W.MERGE]
    qty = sorted(r[-1] for r in got[W.MERGE])
    assert qty == sorted([100, 222, 3, 44, 5, 6, 7, 8, 9, 10, 20, 210])


@pytest.mark.timeout(1200)
def test_the_same_random_workload_gives_equal_tables_by_every_method(spark_env: SparkEnv) -> None:
    """Random transactions (inserts, updates, deletes, key changes, small batches so keys recur
    across batches) through DELETE and equality deletes leave the same current tables, each
    equal to the model (MERGE's rows: the test above); a second JVM (`sluice spark-sql`) reads
    the equality-delete tables as this one does."""
    env = spark_env
    w = RandomWorkload(seed=21, schema="shop", keys=60, max_rows=4, keyless=False)
    txns = w.transactions(150, T0)
    got: dict[str, dict[str, list[tuple]]] = {}
    for how in (W.DELETE_KEYS, W.EQUALITY_DELETES):
        name = f"rw{METHODS.index(how)}"
        schema = SchemaHistory()
        sink = make_sink(env, name, schema, batch_rows=80)
        sink.current_by = how
        run(sink.open(Checkpoint(0)))
        run(drive(sink, txns, schema))
        assert sink.checkpoint().sink_state["batch"] >= 4
        got[how] = {t.name: view_rows(env, f"{name}_shop.{t.name}", t) for t in w.tables}
        run(sink.close())
    for t in w.tables:
        want = expected_rows(w, t)
        assert want, t.name
        for how in got:
            assert got[how][t.name] == want, (how, t.name)
    eq = f"rw{METHODS.index(W.EQUALITY_DELETES)}_shop"
    n_eq = env.rows(f"SELECT count(*) FROM {eq}.accounts.all_delete_files "
                    "WHERE content = 2")[0][0]
    assert n_eq >= 3   # equality-delete files, not position deletes, did the work
    # One statement: `sluice spark-sql` prints the last statement's rows.
    query = " UNION ALL ".join(f"SELECT {i} AS t, count(*) AS n, sum(hash(*)) AS h FROM "
                               f"{eq}.{t.name}" for i, t in enumerate(w.tables))
    proc = subprocess.run(spark_sql_argv(env.warehouse, query), cwd=env.workdir,
                          env=child_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    other = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    mine = sorted([r[0], r[1], r[2]] for r in env.rows(query))
    assert sorted([o["t"], o["n"], o["h"]] for o in other) == mine, other
    assert len(mine) == len(w.tables) and all(n for _, n, _ in mine)


def test_pyiceberg_refuses_an_equality_delete_table_until_maintenance_folds_the_deletes(
        spark_env: SparkEnv) -> None:
    """pyiceberg 0.12 cannot read equality deletes (docs/spark.md): it raises instead of
    returning rows the deletes should hide, so `current-state = "delete"` stays the default.
    The sink's maintenance (`rewrite_data_files`, here over 6 small data files) rewrites the
    data files with the deletes applied and leaves no live delete file: pyiceberg then reads
    what Spark reads."""
    env = spark_env
    kv = Table(332, "inv", "kv", [col("id", "int(11)", nullable=False), col("v", "int(11)")],
               primary=["id"])
    schema = SchemaHistory()
    sink = _sink(env, "pq", W.EQUALITY_DELETES, schema)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, [schema_txn(T0, kv)], schema))
    for b in range(6):   # a batch per transaction: 6 data files, 5 equality-delete files
        run(drive(sink, [txn(prewrite_value(kv.mutation(
            *([kv.update({"id": b * 10 - 10, "v": 0}, {"id": b * 10 - 10, "v": 1})] if b else []),
            *[kv.insert(id=b * 10 + i, v=0) for i in range(10)])), T0 + 1 + b)], schema))
    live = "SELECT count(*) FROM pq_inv.kv.delete_files WHERE content = 2"
    assert env.rows(live)[0][0] == 5
    want = sorted(tuple(r) for r in env.rows("SELECT id, v FROM pq_inv.kv"))
    assert len(want) == 60 and sum(v for _, v in want) == 5
    with pytest.raises(ValueError, match="does not yet support equality deletes"):
        pyiceberg_catalog(env.warehouse).load_table("pq_inv.kv").scan().to_arrow()
    sink.maintain()
    assert env.rows(live)[0][0] == 0
    got = pyiceberg_catalog(env.warehouse).load_table("pq_inv.kv").scan().to_arrow()
    assert sorted(zip(got.column("id").to_pylist(), got.column("v").to_pylist())) == want
    run(sink.close())
