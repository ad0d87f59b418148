"""`sluice spark-sql` in a second JVM on the catalog a sink writes (docs/spark.md, "Reading").

A sink in this process commits two batches over two tables; then `sluice spark-sql` runs as a
user runs it, in its own process and JVM, on the same warehouse: a plain query, `--tables`, and
`--as-of` between the two batches (every table as the first batch left it).
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.drainer.sink import Checkpoint
from tests.support.procs import sluice_argv
from tests.support.rows import Table, col, prewrite_value, schema_txn, txn
from tests.support.spark import (SparkEnv, child_env, drive, history, make_sink, run,  # noqa: F401
                                 spark_env, spark_sql_argv)

# A loaded 2-core machine: the module's session + two batches took 350 s, each child JVM 40-90 s.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

T0 = 1 << 41
ITEMS = Table(501, "shop", "items", [col("id", "int(11)", nullable=False), col("qty", "int(11)")],
              primary=["id"])
NOTES = Table(502, "shop", "notes", [col("id", "int(11)", nullable=False),
                                     col("body", "varchar(20)")], primary=["id"])


class SqlChild:
    """`sluice spark-sql --json ... args` started in a child process (its own JVM); its output
    goes to files (not pipes nobody reads while other children are waited for)."""

    def __init__(self, warehouse: str, cwd: Path, name: str, *args: str) -> None:
        self.stdout, self.stderr = cwd / f"{name}.out", cwd / f"{name}.err"
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(spark_sql_argv(warehouse, *args), cwd=cwd,
                                         env=child_env(), stdout=out, stderr=err, text=True)

    def result(self, timeout: float = 600) -> tuple[int, str, str]:
        """(exit code, stdout, stderr)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child, by pid
            self.proc.wait()
            raise
        return self.proc.returncode, self.stdout.read_text(), self.stderr.read_text()


def json_rows(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def two_batches(spark_env: SparkEnv) -> dict[str, int]:
    """Batch 1: items 1-5 and notes 1-3 inserted. Batch 2: item 1 updated, item 2 deleted,
    item 6 inserted, note 1 updated, note 4 inserted. Returns both batches' commit_ts."""
    env = spark_env
    first = [schema_txn(T0, ITEMS, NOTES)]
    first += [txn(prewrite_value(ITEMS.mutation(ITEMS.insert(id=i, qty=i * 10))), T0 + i)
              for i in range(1, 6)]
    first += [txn(prewrite_value(NOTES.mutation(NOTES.insert(id=i, body=f"n{i}"))), T0 + 10 + i)
              for i in range(1, 4)]
    second = [
        txn(prewrite_value(ITEMS.mutation(ITEMS.update({"id": 1, "qty": 10}, {"id": 1, "qty": 100}),
                                          ITEMS.delete(id=2, qty=20), ITEMS.insert(id=6, qty=60)),
                           NOTES.mutation(NOTES.update({"id": 1, "body": "n1"},
                                                       {"id": 1, "body": "edited"}))), T0 + 100),
        txn(prewrite_value(NOTES.mutation(NOTES.insert(id=4, body="n4"))), T0 + 101)]
    schema = history(first[:1])
    sink = make_sink(env, "sq", schema)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, first, schema))
    b1 = sink.checkpoint().commit_ts
    run(drive(sink, second, schema))
    b2 = sink.checkpoint().commit_ts
    run(sink.close())
    assert (b1, b2) == (T0 + 13, T0 + 101)
    return {"b1": b1, "b2": b2}


AS_OF_QUERY = ("SELECT 'items' AS t, id, CAST(qty AS STRING) AS v FROM items UNION ALL "
               "SELECT 'notes', id, body FROM sq_shop_notes UNION ALL "
               "SELECT 'items_changelog', count(*), CAST(max(_commit_ts) AS STRING) "
               "FROM items_changelog")


@pytest.fixture(scope="module")
def children(spark_env: SparkEnv, two_batches: dict[str, int],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SqlChild]]:
    """The `sluice spark-sql` runs the tests below check, started together once both batches
    are committed: a JVM start each, so they overlap instead of queueing; each test reads its
    own child's result."""
    cwd = tmp_path_factory.mktemp("spark-sql")
    w, b1, b2 = spark_env.warehouse, two_batches["b1"], two_batches["b2"]
    runs: dict[str, SqlChild] = {}
    try:
        runs["plain"] = SqlChild(w, cwd, "plain", "SELECT id, qty FROM sq_shop.items ORDER BY id")
        runs["tables"] = SqlChild(w, cwd, "tables", "--tables")
        runs["as-of"] = SqlChild(w, cwd, "as-of", "--as-of", str(b2 - 1),
                                 "--meta-database", "m_sq", AS_OF_QUERY)
        runs["before"] = SqlChild(w, cwd, "before", "--as-of", str(b1 - 1),
                                  "--meta-database", "m_sq", "SELECT 1")
        yield runs
    finally:
        for c in runs.values():
            if c.proc.poll() is None:
                c.proc.kill()  # our own children, by pid
                c.proc.wait()


def test_plain_query_in_a_second_jvm(children: dict[str, SqlChild]) -> None:
    """`sluice spark-sql --warehouse W "SELECT ..."` reads the current tables the sink
    committed, from another process and JVM on the same catalog."""
    code, out, err = children["plain"].result()
    assert code == 0, err[-3000:]
    assert [(r["id"], r["qty"]) for r in json_rows(out)] == [
        (1, 100), (3, 30), (4, 40), (5, 50), (6, 60)]


def test_tables_lists_every_table_with_its_last_commit(two_batches: dict[str, int],
                                                       children: dict[str, SqlChild]) -> None:
    """`--tables` names every table of the sink's namespaces with its kind and the commit_ts
    of the newest batch that wrote it (notes took part in both batches, as did items)."""
    code, out, err = children["tables"].result()
    assert code == 0, err[-3000:]
    got = {(r["namespace"], r["table"]): (r["kind"], r["commit_ts"]) for r in json_rows(out)
           if r["namespace"] in ("sq_shop", "m_sq")}
    b2 = two_batches["b2"]
    assert got == {("sq_shop", "items"): ("current", b2),
                   ("sq_shop", "items_changelog"): ("changelog", b2),
                   ("sq_shop", "notes"): ("current", b2),
                   ("sq_shop", "notes_changelog"): ("changelog", b2),
                   ("m_sq", "_sluice_commits"): ("commits", b2)}


def test_as_of_shows_every_table_at_one_batch_boundary(two_batches: dict[str, int],
                                                       children: dict[str, SqlChild]) -> None:
    """`--as-of TS` between the batches: every table (current and changelog, plain and
    `<db>_<table>` names) shows the first batch's state, and stderr names that batch."""
    b1 = two_batches["b1"]
    code, out, err = children["as-of"].result()
    assert code == 0, err[-3000:]
    assert f"the views show batch 1 (commit_ts {b1}" in err, err[-3000:]
    got = sorted((r["t"], r["id"], r["v"]) for r in json_rows(out))
    assert got == sorted([("items", i, str(i * 10)) for i in range(1, 6)]
                         + [("notes", i, f"n{i}") for i in range(1, 4)]
                         + [("items_changelog", 5, str(T0 + 5))])
    # Before the first batch there is nothing to show: a clear error, exit 1.
    code, out, err = children["before"].result()
    assert code == 1 and "no batch was committed at or before it" in err, err[-3000:]


@pytest.mark.mariadb
def test_verify_compares_a_source_with_the_current_tables(spark_env: SparkEnv,
                                                          two_batches: dict[str, int],
                                                          mariadb_module: Any) -> None:
    """`ctl verify`'s Spark target reads the sink's Iceberg current tables: a source holding
    the same rows matches; a changed row and a row the source no longer has are named."""
    from sluice.ctl import verify as v
    src = mariadb_module
    src.execute("DROP DATABASE IF EXISTS shop")
    src.execute("CREATE DATABASE shop")
    src.execute("CREATE TABLE shop.items (id INT PRIMARY KEY, qty INT)")
    src.execute("CREATE TABLE shop.notes (id INT PRIMARY KEY, body VARCHAR(20))")
    src.execute("INSERT INTO shop.items VALUES (1, 100), (3, 30), (4, 40), (5, 50), (6, 60)")
    src.execute("INSERT INTO shop.notes VALUES (1, 'edited'), (2, 'n2'), (3, 'n3'), (4, 'n4')")
    target = v.SparkTarget(spark_env.spark, "sq_{schema}", catalog=spark_env.session_cfg.catalog)

    def check() -> dict[str, v.TableResult]:
        side = v.MySQLSide(src.dsn())
        try:
            return {r.table: r for r in v.verify_tables(side, target, ["shop.items", "shop.notes"],
                                                        chunk_rows=2)}
        finally:
            side.close()

    got = check()
    assert [(r.status, r.rows, r.target_rows) for r in got.values()] == [
        ("match", 5, 5), ("match", 4, 4)]
    src.execute("UPDATE shop.items SET qty = 31 WHERE id = 3")
    src.execute("DELETE FROM shop.notes WHERE id = 4")
    got = check()
    assert [(d.kind, d.key) for d in got["shop.items"].differences] == [("changed", "id=3")]
    assert [(d.kind, d.key) for d in got["shop.notes"].differences] == [("extra", "id=4")]


def test_a_meta_database_named_like_the_catalog_commits_and_maintains(spark_env: SparkEnv) -> None:
    """The defaults (catalog "sluice", meta-database "sluice") work: Iceberg procedures get
    catalog-qualified table names, so the marker table `sluice.sluice._sluice_commits` is not
    read as table `_sluice_commits` of catalog `sluice` (the demo's drainer stopped on that)."""
    from sluice.drainer.sink import load_sink
    from sluice.spark_sink.config import SparkSinkConfig
    env = spark_env
    cfg = SparkSinkConfig(master=env.session_cfg.master, warehouse=env.warehouse,
                          shuffle_partitions=2, database="mc_{schema}", batch_interval=3600.0,
                          maintenance_every=0)
    assert cfg.meta_database == cfg.catalog == "sluice"
    txns = [schema_txn(T0, ITEMS)] + [
        txn(prewrite_value(ITEMS.mutation(ITEMS.insert(id=i, qty=i))), T0 + i) for i in range(1, 4)]
    schema = history(txns[:1])
    sink = load_sink("spark", cfg, schema=schema, source_name="src", epoch=0, spark=env.spark,
                     drainer_name="")
    run(sink.open(Checkpoint(0)))
    run(drive(sink, txns, schema))
    assert sink.checkpoint().commit_ts == T0 + 3
    sink.maintain()                      # every table, the marker table included
    run(sink.close())
    assert env.rows("SELECT count(*) FROM sluice.sluice._sluice_commits")[0][0] == 1
    assert env.rows("SELECT count(*) FROM mc_shop.items")[0][0] == 3


def test_a_warehouse_without_a_catalog_is_a_clear_error(tmp_path: Path) -> None:
    """A --warehouse that holds no catalog is refused before a JVM starts (a typo would
    otherwise show an empty catalog)."""
    out = subprocess.run(sluice_argv("spark-sql", "--warehouse", str(tmp_path / "nope"),
                                     "SELECT 1"), cwd=tmp_path, env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "no catalog at" in out.stderr and "catalog.db" in out.stderr, out.stderr


@pytest.mark.parametrize("argv, message", [
    (["SELECT 1"], "give --config (the Spark drainer's TOML) or --warehouse DIR"),
    (["--warehouse", "w"], "give SQL to run (or --tables to list the tables)"),
    (["--warehouse", "w", "--tables", "SELECT 1"], "--tables takes no SQL and no --as-of"),
    (["--warehouse", "w", "--limit", "0", "SELECT 1"], "--limit must be positive"),
])
def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path, argv: list[str],
                                              message: str) -> None:
    """A command line that cannot work is refused with one line naming the problem (exit 2),
    before a JVM starts."""
    out = subprocess.run(sluice_argv("spark-sql", *argv), cwd=tmp_path, env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sluice spark-sql: ") and message in lines[0], \
        out.stderr
