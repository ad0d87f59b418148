"""The MySQL sink creates what is missing downstream (issue #21 item 3), through the real
pipeline: source MariaDB with tables that predate the capture -> `sluice capture` (`snapshot-mode
= initial`) -> pumps -> `sluice drainer` (sink mysql, `create-tables` by default) -> an EMPTY
downstream MariaDB.

Before: the first snapshot row stopped the sink with `MySQL error 1146: Table ... doesn't
exist`: a table that existed before the capture started is only declared (a schema snapshot),
never created by a replayed DDL.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.ctl.verify import MySQLSide, MySQLTarget, format_results, verify_tables
from tests.support.mariadb import MariaDBServer
from tests.support.pipeline import Pipeline, differences, pipeline, tables_of, wait_equal

pytestmark = pytest.mark.timeout(240, func_only=True)   # module setup: two MariaDBs + cluster

DB, EMPTY_DB = "legacy", "legacy_empty"
ROWS = 240

# Torture-style shapes: every type family, unsigned/zerofill, a _bin unique key in a _ci table
# (two values equal only case-insensitively), a latin1 column, virtual and persistent generated
# columns, names with spaces and backticks, composite, unique-only and keyless tables.
TABLES = [
    f"""CREATE TABLE {DB}.types (
      id BIGINT UNSIGNED NOT NULL,
      ti TINYINT, si SMALLINT(5) UNSIGNED ZEROFILL, mi MEDIUMINT, i INT NOT NULL DEFAULT 5,
      bo BOOLEAN, dc DECIMAL(65,30), dn DECIMAL(5,2) UNSIGNED, f FLOAT, d DOUBLE,
      bt BIT(7), dt DATE, dtm DATETIME(6), ts TIMESTAMP(3) NULL DEFAULT NULL, tm TIME(2), y YEAR,
      c CHAR(5) CHARACTER SET latin1, vc VARCHAR(30) COLLATE utf8mb4_bin NOT NULL,
      bn BINARY(4), vb VARBINARY(10), tt TINYTEXT, tx TEXT, lt LONGTEXT, bl BLOB,
      e ENUM('a','b','c''q'), st SET('x','y','z'), j JSON,
      g BIGINT AS (i * 2) VIRTUAL,
      gs VARCHAR(60) AS (CONCAT(vc, '-', i)) PERSISTENT,
      PRIMARY KEY (id), UNIQUE KEY uvc (vc), KEY ki (i)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci""",
    f"""CREATE TABLE {DB}.`we!rd tab``le` (
      `sp ace` INT NOT NULL, `ba``ck` VARCHAR(10) NOT NULL, `ü` DECIMAL(20,4),
      PRIMARY KEY (`sp ace`, `ba``ck`))""",
    f"CREATE TABLE {DB}.only_unique (k VARCHAR(12) NOT NULL, v INT, UNIQUE KEY uk (k))",
    f"CREATE TABLE {DB}.keyless (a INT, b VARCHAR(10))",
    f"CREATE TABLE {DB}.composite (a INT NOT NULL, b CHAR(3) NOT NULL, v TEXT, PRIMARY KEY (b, a))",
    f"CREATE TABLE {DB}.never_written (id INT PRIMARY KEY, note VARCHAR(20) NOT NULL)",
    f"CREATE TABLE {DB}.altered_first (id INT PRIMARY KEY, v INT)",
    f"CREATE TABLE {DB}.dropme (id INT PRIMARY KEY)",
]


def type_row(n: int) -> str:
    """One row of `types`; NULLs, zero dates, extremes and odd text by n."""
    dc = "NULL" if n % 7 == 0 else f"'{n}.{n:030d}'"
    dt = "'0000-00-00'" if n % 11 == 0 else f"'2024-{1 + n % 12:02d}-{1 + n % 28:02d}'"
    text = "NULL" if n % 5 == 0 else f"'t\\'{n}\\\\ é'"
    vc = f"'Key{n}'" if n % 2 else f"'key{n - 1 if n else n}'"   # 'Key1' and 'key0' ... distinct under _bin
    return (f"({n}, {(n % 256) - 128}, {n % 65536}, {-n * 1000}, {n}, {n % 2}, {dc}, {n % 1000}.25, "
            f"{n}.5, {n * 1.0e10}, b'{n % 128:07b}', {dt}, '2023-05-06 07:08:09.{n:06d}', "
            f"{'NULL' if n % 3 else f'{chr(39)}2020-01-01 00:00:{n % 60:02d}.123{chr(39)}'}, "
            f"'{'-' if n % 2 else ''}{n % 838}:{n % 60:02d}:01.50', {1901 + n % 254}, "
            f"'é{n % 100}', {vc}, x'{n % 256:02x}00ff01', x'{n:04x}', {text}, REPEAT('x', {n}), "
            f"REPEAT('long', {n}), x'{n:06x}', '{'abc'[n % 3] if n % 3 != 2 else chr(99) + chr(39) + chr(39) + 'q'}', "
            f"'{'x,z' if n % 2 else 'y'}', '{{\"n\": {n}, \"s\": \"v{n}\"}}')")


TYPE_COLUMNS = ("id, ti, si, mi, i, bo, dc, dn, f, d, bt, dt, dtm, ts, tm, y, c, vc, bn, vb, tt, tx, "
                "lt, bl, e, st, j")


def type_rows(first: int, count: int) -> str:
    return f"INSERT INTO {DB}.types ({TYPE_COLUMNS}) VALUES " + ",".join(type_row(n) for n in range(first, first + count))


def make_legacy(source: MariaDBServer) -> None:
    """The source before the capture starts: tables with rows, an empty one, an empty database."""
    for db in (DB, EMPTY_DB):
        source.execute(f"CREATE DATABASE {db}")
    for sql in TABLES:
        source.execute(sql)
    source.execute(type_rows(0, ROWS))
    source.execute(f"INSERT INTO {DB}.`we!rd tab``le` VALUES " + ",".join(
        f"({n}, 'b`{n % 3}', {n}.0001)" for n in range(60)))
    source.execute(f"INSERT INTO {DB}.composite VALUES " + ",".join(
        f"({n}, 'c{n % 4}', REPEAT('v', {n}))" for n in range(80)))
    source.execute(f"INSERT INTO {DB}.dropme VALUES (1), (2)")


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Pipeline]:  # type: ignore[no-untyped-def]
    with pipeline(tmp_path_factory.mktemp("mysql-create"), etcd_module.endpoint,
                  pumps=["pump-1", "pump-2"], producer_id="cap-mysql-create", before_capture=make_legacy,
                  **{"snapshot-mode": "initial", "snapshot-read-only": True,
                     "snapshot-chunk-size": 100}) as p:
        yield p


def index_shapes(server: MariaDBServer, db: str) -> list[tuple]:
    """Primary and unique keys: (table, index, unique, position, column)."""
    return sorted(tuple(r) for r in server.execute(
        "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME FROM "
        "information_schema.STATISTICS WHERE TABLE_SCHEMA=%s AND NON_UNIQUE=0", (db,)))


def column_details(server: MariaDBServer, db: str) -> list[tuple]:
    """Per column: collation (case and accent rules of keys) and generation (expression, kind)."""
    return sorted(tuple(r) for r in server.execute(
        "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME, IS_GENERATED, GENERATION_EXPRESSION, "
        "EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s", (db,)))


def test_initial_snapshot_into_an_empty_downstream_creates_databases_and_tables(pipe: Pipeline) -> None:
    """create-tables: an initial snapshot of tables that predate the capture, into a downstream
    that has none of their databases or tables, then DML and DDL on them (ALTER of a table never
    written, RENAME, TRUNCATE, DROP, CREATE TABLE ... LIKE, CREATE TABLE in a database that had
    no tables) — the downstream ends equal to the source: the same tables, column types,
    nullability, collations, generated columns, primary and unique keys, and rows."""
    assert tables_of(pipe.downstream, DB) == [] and tables_of(pipe.downstream, EMPTY_DB) == []
    drainer = pipe.start_drainer("d-create", [DB, EMPTY_DB], initial_commit_ts=0)
    src = pipe.source
    # After the snapshot's start: rows, then DDL on tables that predate the capture.
    src.execute(type_rows(ROWS, 40))
    src.execute(f"UPDATE {DB}.types SET vc = CONCAT('u', vc), j = JSON_SET(j, '$.u', 1) WHERE id % 4 = 1")
    src.execute(f"DELETE FROM {DB}.types WHERE id % 9 = 2")
    src.execute(f"ALTER TABLE {DB}.types ADD COLUMN extra VARCHAR(10) NOT NULL DEFAULT 'z' AFTER i")
    src.execute(f"UPDATE {DB}.types SET extra = 'set' WHERE id % 3 = 0")
    src.execute(f"ALTER TABLE {DB}.altered_first ADD COLUMN n DATETIME(3) NULL, ADD UNIQUE KEY un (v)")
    src.execute(f"INSERT INTO {DB}.altered_first VALUES (1, 1, '2020-02-02 02:02:02.002'), (2, 2, NULL)")
    src.execute(f"RENAME TABLE {DB}.composite TO {DB}.composite2")
    src.execute(f"INSERT INTO {DB}.composite2 VALUES (1000, 'new', 'after rename')")
    # Rows only after the start: a snapshot skips tables without a primary key (capture's rule).
    src.execute(f"INSERT INTO {DB}.only_unique VALUES " + ",".join(f"('k{n}', {n})" for n in range(50)))
    src.execute(f"INSERT INTO {DB}.keyless VALUES " + ",".join(f"({n % 4}, 'dup')" for n in range(20)))
    src.execute(f"TRUNCATE TABLE {DB}.keyless")
    src.execute(f"INSERT INTO {DB}.keyless VALUES (1, 'again'), (1, 'again')")
    src.execute(f"DROP TABLE {DB}.dropme")
    src.execute(f"CREATE TABLE {DB}.copy LIKE {DB}.types")
    src.execute(f"INSERT INTO {DB}.copy ({TYPE_COLUMNS}, extra) SELECT {TYPE_COLUMNS}, extra "
                f"FROM {DB}.types WHERE id < 10")
    src.execute(f"CREATE TABLE {EMPTY_DB}.fresh (id INT PRIMARY KEY, v VARCHAR(5) COLLATE utf8mb4_bin)")
    src.execute(f"INSERT INTO {EMPTY_DB}.fresh VALUES (1, 'a'), (2, 'A')")
    src.execute(f"UPDATE {DB}.`we!rd tab``le` SET `ü` = -1 WHERE `sp ace` < 10")
    src.execute(f"DELETE FROM {DB}.only_unique WHERE v % 2 = 0")

    for db in (DB, EMPTY_DB):
        wait_equal(pipe, db, timeout=90, watch=(drainer.proc,))
    assert tables_of(pipe.downstream, DB) == ["altered_first", "composite2", "copy", "keyless",
                                              "never_written", "only_unique", "types", "we!rd tab`le"]
    assert tables_of(pipe.downstream, EMPTY_DB) == ["fresh"]
    for db in (DB, EMPTY_DB):
        assert differences(pipe.source, pipe.downstream, db) == []
        assert index_shapes(pipe.downstream, db) == index_shapes(pipe.source, db)
        assert column_details(pipe.downstream, db) == column_details(pipe.source, db)
    # `sluice ctl verify`'s comparison agrees, chunk by chunk (keyless tables as multisets).
    source, target = MySQLSide(pipe.source.dsn()), MySQLTarget(pipe.downstream.dsn())
    try:
        results = verify_tables(source, target, source.tables([DB, EMPTY_DB]), chunk_rows=50)
    finally:
        source.close()
        target.close()
    assert len(results) == 9 and all(r.ok for r in results), format_results(results)
    log = drainer.proc.log_text()
    assert "mysql sink created a missing table" in log and "MySQL error" not in log
    drainer.proc.stop()
