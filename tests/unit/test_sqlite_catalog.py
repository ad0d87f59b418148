"""The embedded catalog's tables exist before any JVM opens the file (spark_sink/sqlite_catalog.py).

Iceberg's JDBC catalog creates them by check-then-act; JVMs opening a fresh catalog at once
raced it ("table iceberg_tables already exists"). Several processes preparing the same fresh
file at once all succeed and leave exactly Iceberg's V1 tables.
"""
from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest

from sluice.core.errors import ConfigError
from sluice.spark_sink import sqlite_catalog

V1_COLUMNS = ["catalog_name", "table_namespace", "table_name", "metadata_location",
              "previous_metadata_location", "iceberg_type"]


ROUNDS = 40
WORKERS = 12


def _prepare_each_round(root: str, barrier, results) -> None:  # type: ignore[no-untyped-def]
    """Prepare a fresh catalog per round, released together with every other worker."""
    failures = []
    for i in range(ROUNDS):
        barrier.wait(30)
        try:
            sqlite_catalog.prepare(f"{root}/round-{i}/wh/catalog.db")
        except ConfigError as e:
            failures.append(str(e))
    results.put(failures)


@pytest.mark.timeout(120)
def test_processes_preparing_a_fresh_catalog_at_once_all_succeed(tmp_path: Path) -> None:
    """Twelve processes released together on a fresh file, forty times: none fails, every file
    has the V1 tables. Without the retry 17-32 of the 480 prepares failed here (three runs):
    SQLite's deadlock avoidance answers "database is locked" at once, without the busy wait,
    to one of two connections switching the same fresh file to WAL."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=_prepare_each_round, args=(str(tmp_path), barrier, results))
             for _ in range(WORKERS)]
    for p in procs:
        p.start()
    failures = [results.get(timeout=100) for _ in procs]
    for p in procs:
        p.join(10)
    assert [p.exitcode for p in procs] == [0] * WORKERS
    failed = [message for worker in failures for message in worker]
    assert failed == [], f"{len(failed)} of {ROUNDS * WORKERS} prepares failed: {failed[:2]}"
    for i in range(ROUNDS):
        db = sqlite3.connect(tmp_path / f"round-{i}" / "wh" / "catalog.db")
        assert [r[1] for r in db.execute("PRAGMA table_info(iceberg_tables)")] == V1_COLUMNS
        assert [r[1] for r in db.execute("PRAGMA table_info(iceberg_namespace_properties)")] == [
            "catalog_name", "namespace", "property_key", "property_value"]
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.close()


def test_a_v0_catalog_gets_the_v1_column_and_keeps_its_rows(tmp_path: Path) -> None:
    """A catalog created without iceberg_type (by an older writer) gains the column once; its
    rows stay; preparing again changes nothing."""
    path = str(tmp_path / "catalog.db")
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE iceberg_tables(catalog_name VARCHAR(255) NOT NULL,"
               "table_namespace VARCHAR(255) NOT NULL,table_name VARCHAR(255) NOT NULL,"
               "metadata_location VARCHAR(1000),previous_metadata_location VARCHAR(1000),"
               "PRIMARY KEY (catalog_name, table_namespace, table_name))")
    db.execute("INSERT INTO iceberg_tables VALUES ('sluice', 'shop', 'stock', '/m/1.json', NULL)")
    db.commit()
    db.close()
    sqlite_catalog.prepare(path)
    sqlite_catalog.prepare(path)
    db = sqlite3.connect(path)
    assert [r[1] for r in db.execute("PRAGMA table_info(iceberg_tables)")] == V1_COLUMNS
    assert db.execute("SELECT * FROM iceberg_tables").fetchall() == [
        ("sluice", "shop", "stock", "/m/1.json", None, None)]


def test_a_catalog_path_that_cannot_be_a_file_is_a_config_error(tmp_path: Path) -> None:
    """A directory where the catalog file should be: a ConfigError naming the path."""
    path = tmp_path / "catalog.db"
    path.mkdir()
    with pytest.raises(ConfigError, match="catalog file .*catalog.db"):
        sqlite_catalog.prepare(str(path))
