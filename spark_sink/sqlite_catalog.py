"""The embedded catalog's SQLite file, prepared before any JVM opens it.

Iceberg's JDBC catalog creates its two tables on first use by check-then-act: it asks the
driver whether `iceberg_tables` exists and, if not, runs `CREATE TABLE iceberg_tables (...)`
(no IF NOT EXISTS), then `ALTER TABLE ... ADD COLUMN iceberg_type` for schema version V1 when the
column is missing. Two JVMs opening a fresh catalog at once (a drainer and `sluice spark-sql`, a
drainer and its standby, several test drivers) can both see "missing" and the second one fails
with "table iceberg_tables already exists" (or "duplicate column name") in the middle of a
query's analysis. Creating the tables here first, in one SQLite write transaction, leaves the
JVMs nothing to create: their check finds the tables and the column.

The DDL is Iceberg 1.12's `JdbcUtil` (V0 tables plus the V1 column), which the catalog reads
back unchanged; pyiceberg's SqlCatalog reads the same tables.
"""
from __future__ import annotations

import os
import random
import sqlite3
import time

from sluice.core.errors import ConfigError

_TABLES = (
    "CREATE TABLE IF NOT EXISTS iceberg_tables(catalog_name VARCHAR(255) NOT NULL,"
    "table_namespace VARCHAR(255) NOT NULL,table_name VARCHAR(255) NOT NULL,"
    "metadata_location VARCHAR(1000),previous_metadata_location VARCHAR(1000),"
    "PRIMARY KEY (catalog_name, table_namespace, table_name))",
    "CREATE TABLE IF NOT EXISTS iceberg_namespace_properties(catalog_name VARCHAR(255) NOT NULL,"
    "namespace VARCHAR(255) NOT NULL,property_key VARCHAR(255),property_value VARCHAR(1000),"
    "PRIMARY KEY (catalog_name, namespace, property_key))",
)
_V1_COLUMN = "ALTER TABLE iceberg_tables ADD COLUMN iceberg_type VARCHAR(5)"
# As long as the JDBC URL's busy_timeout: another process may hold the write lock for a commit.
_BUSY_TIMEOUT_S = 30.0


def prepare(path: str) -> None:
    """Create the catalog tables (schema version V1) in the SQLite file at path if missing.
    Safe to call from several processes at once: SQLite serializes the write transactions and
    every statement is conditional on what the transaction itself reads."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    while True:
        try:
            _prepare_once(path)
            return
        except sqlite3.Error as e:
            # SQLite skips the busy handler where waiting could deadlock: two connections that
            # both read a fresh rollback-journal file and both want the exclusive lock to switch
            # it to WAL; one gets "database is locked" at once. Starting over from a fresh
            # connection is safe (every step is conditional) and the other one finishes first.
            if not _is_busy(e) or time.monotonic() >= deadline:
                raise ConfigError(
                    f"spark: cannot prepare the catalog file {path}: {e}") from None
            time.sleep(random.uniform(0.005, 0.05))


def _is_busy(e: sqlite3.Error) -> bool:
    return (e.sqlite_errorcode or 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _prepare_once(path: str) -> None:
    try:
        db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as e:
        raise ConfigError(f"spark: cannot open the catalog file {path}: {e}") from None
    try:
        db.execute("PRAGMA journal_mode=WAL")
        # IMMEDIATE takes the write lock before the column check, so the check and the ALTER
        # are one step for every other process.
        db.execute("BEGIN IMMEDIATE")
        for ddl in _TABLES:
            db.execute(ddl)
        cols = {r[1].lower() for r in db.execute("PRAGMA table_info(iceberg_tables)")}
        if "iceberg_type" not in cols:
            db.execute(_V1_COLUMN)
        db.execute("COMMIT")
    finally:
        db.close()
