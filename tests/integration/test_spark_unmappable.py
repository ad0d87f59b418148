"""on-unmappable policies of the Spark sink (docs/spark.md "DDL"): `skip-table` drops one
table's changes from the unmappable change on and keeps every other table going; `as-string`
makes the column STRING with every value kept; a skipped table that a later DDL takes up
again starts a new incarnation: its current table restarts empty in the new shape (its old rows
missed the skipped deletes, so they cannot be trusted), its changelog keeps every column."""
from __future__ import annotations

import datetime

import pytest

from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import SchemaHistory
from tests.support.rows import Table, col, ddl_txn, prewrite_value, schema_txn, txn
from tests.support.spark import SparkEnv, drive, make_sink, norm, run, spark_env  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

T0 = 1 << 41


def items(table_id: int, name: str, qty: str = "int(11)", version: int = 1,
          extra: tuple = ()) -> Table:
    return Table(table_id, "pol", name, [col("id", "int(11)", nullable=False), col("qty", qty),
                                         *extra], primary=["id"], version=version)


def test_skip_table_and_as_string_then_the_skipped_table_taken_up_again(spark_env: SparkEnv) -> None:
    """skip-table: table a's changes are dropped after its unmappable ALTER while c goes on;
    as-string: b's and d's columns become STRING, old values cast, new ones as MySQL prints
    them (binary in base64); a's next DDL takes it up again as a new incarnation: its current
    table holds only the rows after (not the stale ones the skipped delete should have
    removed), its changelog keeps the old column aside and gains the new ones."""
    env = spark_env
    a1, b1, c1, d1 = items(401, "a"), items(402, "b"), items(403, "c"), items(404, "d")
    a2 = items(401, "a", "varbinary(8)", version=2)   # INT -> VARBINARY: no cast keeps MySQL's values
    b2 = items(402, "b", "varbinary(8)", version=2)
    d2 = items(404, "d", "datetime(3)", version=2)   # INT -> DATETIME: no cast either
    a3 = items(401, "a", "varbinary(8)", version=3, extra=(col("note", "varchar(10)"),))
    ts = iter(range(T0, T0 + 1000))

    def rows(*muts) -> object:   # type: ignore[no-untyped-def]
        return txn(prewrite_value(*muts), next(ts))
    txns = [schema_txn(next(ts), a1, b1, c1, d1),
            rows(a1.mutation(a1.insert(id=1, qty=1), a1.insert(id=2, qty=2)),
                 b1.mutation(b1.insert(id=1, qty=10)), c1.mutation(c1.insert(id=1, qty=100)),
                 d1.mutation(d1.insert(id=1, qty=7))),
            ddl_txn(next(ts), a2.alter_ddl("ALTER TABLE a MODIFY qty VARBINARY(8)")),
            ddl_txn(next(ts), b2.alter_ddl("ALTER TABLE b MODIFY qty VARBINARY(8)")),
            ddl_txn(next(ts), d2.alter_ddl("ALTER TABLE d MODIFY qty DATETIME(3)")),
            rows(d2.mutation(d2.insert(id=2, qty=datetime.datetime(2024, 1, 2, 3, 4, 5, 120000)))),
            # Skipped for a: a delete the current table never sees, an insert it never gets.
            rows(a2.mutation(a2.delete(id=1, qty=b"1"), a2.insert(id=3, qty=b"3")),
                 b2.mutation(b2.insert(id=2, qty=b"\x00\xff")), c1.mutation(c1.insert(id=2, qty=200))),
            ddl_txn(next(ts), a3.alter_ddl("ALTER TABLE a ADD note VARCHAR(10)")),
            rows(a3.mutation(a3.insert(id=4, qty=b"4", note="new")))]
    schema = SchemaHistory()
    sink = make_sink(env, "un", schema, on_unmappable="skip-table",
                     table_on_unmappable={"pol.b": "as-string", "pol.d": "as-string"})
    run(sink.open(Checkpoint(0)))
    run(drive(sink, txns, schema))
    assert sink.checkpoint().commit_ts == txns[-1].commit_ts

    def current(t: str, cols: str = "id, qty") -> list[tuple]:
        return sorted(tuple(norm(x) for x in r) for r in env.rows(f"SELECT {cols} FROM un_pol.{t}"))
    # The other tables never stopped.
    assert current("c") == [(1, 100), (2, 200)]
    # as-string: the column is STRING; the old value cast, the new one as MySQL's bytes as text.
    types = {f.name: f.dataType.simpleString() for f in env.spark.table("un_pol.b").schema.fields}
    assert types["qty"] == "string", types
    assert current("b") == [(1, "10"), (2, "AP8=")]   # binary is no text: base64
    # A datetime as MySQL prints it in its column (3 fractional digits).
    assert current("d") == [(1, "7"), (2, "2024-01-02 03:04:05.120")]
    # The skipped table, taken up again by the ADD COLUMN: a new incarnation, only rows after.
    assert current("a", "id, qty, note") == [(4, b"4", "new")]
    cl = {f.name: f.dataType.simpleString() for f in env.spark.table("un_pol.a_changelog").schema.fields}
    assert cl["note"] == "string" and cl["qty"] == "binary", cl
    ops = sorted((r[0], r[1]) for r in env.rows("SELECT id, _op FROM un_pol.a_changelog"))
    assert ops == [(1, "c"), (2, "c"), (4, "c")]   # the skipped period is not in the changelog
    run(sink.close())
