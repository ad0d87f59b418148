"""MariaDB -> `sluice capture` -> pumps -> `sluice drainer` (`sink = "spark"`) -> Iceberg tables.

Real processes only: a MariaDB source (row binlog, FULL metadata), etcd, a TSO, two pumps, the
capture and a drainer whose Spark sink writes an Iceberg warehouse in tmp (the embedded SQLite
catalog); this test process reads the same catalog with its own Spark session (a second JVM on
the same SQLite file). One pipeline per module; each test uses its own source database.

The rule every test checks (issue #19, acceptance): what the source holds reaches Spark equal,
row for row, under the documented type mapping (docs/types.md, "Spark" column), through the DDL
a MariaDB user runs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import decimal
import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.capture import start_capture, wait_streaming
from tests.support.cluster import Cluster, DrainerHandle, fresh_ts, running_cluster
from tests.support.mariadb import MariaDBServer
from tests.support.spark import TEST_CONF

# Generous: Spark queries take 1-20 s each on a loaded 2-core machine, and the first test also
# waits for the module's pipeline (two JVMs, a MariaDB, the cluster).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

os.environ["TZ"] = "UTC"
time.tzset()
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

PUMPS = ["pump-1", "pump-2"]


@dataclasses.dataclass
class SparkPipeline:
    cluster: Cluster
    source: MariaDBServer
    drainer: DrainerHandle
    capture: Any
    spark: Any
    warehouse: Path

    def src(self, sql: str, args: Any = None, database: str | None = None) -> list[tuple]:
        """One statement on the source, autocommit, in UTC (TIMESTAMP values read as UTC)."""
        conn = self.source.connect(database, init_command="SET time_zone='+00:00'")
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()

    def script(self, *sql: str, database: str | None = None, sql_mode: str | None = None) -> None:
        """Statements in order on one connection (autocommit: each its own transaction)."""
        conn = self.source.connect(database, init_command="SET time_zone='+00:00'")
        try:
            with conn.cursor() as cur:
                if sql_mode is not None:
                    cur.execute("SET SESSION sql_mode=%s", (sql_mode,))
                for s in sql:
                    cur.execute(s)
        finally:
            conn.close()

    def rows(self, sql: str) -> list[tuple]:
        return [tuple(r) for r in self.spark.sql(sql).collect()]

    def table_exists(self, db: str, table: str) -> bool:
        return bool(self.spark.sql(f"SHOW TABLES IN {db} LIKE '{table}'").collect()) \
            if self.spark.catalog.databaseExists(db) else False

    def failure_log(self) -> str:
        """The drainer's and the capture's error lines (their JVM noise left out)."""
        out = []
        for proc in (self.drainer.proc, self.capture):
            lines = [ln for ln in proc.log_text().splitlines()
                     if " ERROR " in ln or ln.startswith("sluice ")]
            out.append(f"--- {proc.name}:\n" + "\n".join(lines[-15:]))
        return "\n".join(out)

    def watch(self) -> None:
        for proc in (self.capture, self.drainer.proc):
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited:\n{self.failure_log()}")

    def wait_rows(self, want: Callable[[], list[tuple]], sql: str, timeout: float = 300,
                  what: str = "") -> list[tuple]:
        """Until Spark's `sql` returns want() (both sorted by repr); fails with the last
        difference and the drainer's errors (at once if the drainer or the capture exited)."""
        got: Any = None
        exp: Any = None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.watch()
            try:
                got = sorted(self.rows(sql), key=repr)
            except Exception as e:  # noqa: BLE001 - a table not there yet: keep waiting
                got = f"query failed: {str(e).splitlines()[0][:300]}"
            exp = sorted(want(), key=repr)
            if got == exp:
                return got  # type: ignore[no-any-return]
            time.sleep(0.5)
        raise AssertionError(f"{what or sql}:\nspark:  {got}\nsource: {exp}\n"
                             f"{self.failure_log()}")


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[SparkPipeline]:  # type: ignore[no-untyped-def]
    from sluice.spark_sink.config import SessionConfig
    from sluice.spark_sink.session import session
    work = tmp_path_factory.mktemp("spark-capture")
    source = MariaDBServer(work / "source", server_id=1)
    spark = None
    try:
        source.start()
        with running_cluster(work / "cluster", etcd_module.endpoint, PUMPS) as cluster:
            cap = start_capture(cluster, source, "cap-spark")
            wait_streaming(cap)
            drainer = cluster.start_drainer(
                "d-spark", sink="spark", wait_online=False, **{
                    "initial-commit-ts": fresh_ts(cluster), "to.batch-interval": 1.0,
                    "to.maintenance-every": 0})
            warehouse = drainer.out_dir / "warehouse"
            # The test's own JVM on the same catalog, started while the drainer's starts;
            # the catalog cache off: each query sees the drainer's newest commit.
            spark = session(SessionConfig(
                master="local[1]", warehouse=str(warehouse), log_level="ERROR",
                shuffle_partitions=1, app_name="sluice-test-reader",
                spark_conf={**TEST_CONF, "spark.driver.memory": "512m",
                            "spark.sql.catalog.sluice.cache-enabled": "false"}))
            cluster.wait_drainer_online(drainer, timeout=180)
            yield SparkPipeline(cluster, source, drainer, cap, spark, warehouse)
    finally:
        if spark is not None:
            spark.stop()
        with contextlib.suppress(Exception):
            source.stop()


# ------------------------------------------------------------------------------------------------
# the documented mapping, applied to the source's (pymysql) values
# ------------------------------------------------------------------------------------------------

def time_text(v: dt.timedelta) -> str:
    """docs/types.md: TIME -> STRING "[-]HH:MM:SS.ffffff", hours may exceed 24."""
    us = v.days * 86_400_000_000 + v.seconds * 1_000_000 + v.microseconds
    sign = "-" if us < 0 else ""
    us = abs(us)
    s, f = divmod(us, 1_000_000)
    return f"{sign}{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{f:06d}"


def f32(v: float) -> float:
    """A FLOAT column's value as a double (the 32-bit value widened, exactly)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def bits(v: bytes) -> int:
    return int.from_bytes(v, "big")


# ------------------------------------------------------------------------------------------------
# (b) and (f): types
# ------------------------------------------------------------------------------------------------

def test_uuid_inet_and_spatial_columns_read_back_as_text_and_wkb(pipe: SparkPipeline) -> None:
    """MariaDB UUID, INET4 and INET6 land as their canonical text (what `SELECT col` prints) and
    POINT / GEOMETRY / POLYGON as WKB (the source's `ST_AsWKB(col)`, no SRID prefix), equal row
    for row; NULLs stay NULL."""
    db = "sc_b"
    pipe.script(
        f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.g (id INT PRIMARY KEY, u UUID, a4 INET4, a6 INET6, p POINT, "
        "g GEOMETRY, pg POLYGON)",
        f"INSERT INTO {db}.g VALUES "
        "(1, '123e4567-e89b-12d3-a456-426655440000', '10.0.0.1', '2001:db8::ff00:42:8329', "
        " ST_GeomFromText('POINT(1 2)'), ST_GeomFromText('LINESTRING(0 0, 1 1, 2 5)'), "
        " ST_GeomFromText('POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))')),"
        "(2, 'ffffffff-0000-1111-8000-000000000001', '255.255.255.255', '::ffff:1.2.3.4', "
        " ST_GeomFromText('POINT(-1.5 1e10)', 4326), ST_GeomFromText('POINT(3 4)'), "
        " ST_GeomFromText('POLYGON((0 0, 9 0, 9 9, 0 0), (1 1, 2 1, 2 2, 1 1))')),"
        "(3, UUID(), '0.0.0.0', '::', NULL, NULL, NULL),"
        "(5, NULL, '127.0.0.1', '::1.2.3.4', NULL, NULL, NULL), (6, NULL, NULL, '::1', NULL, NULL, NULL),"
        "(7, NULL, NULL, '::102', NULL, NULL, NULL), (8, NULL, NULL, 'fe80::1:0:0:1', NULL, NULL, NULL),"
        "(4, NULL, NULL, NULL, ST_GeomFromText('POINT(0 0)'), "
        " ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1), LINESTRING(0 0, 1 1))'), NULL)",
        f"UPDATE {db}.g SET a4 = '192.168.1.1', u = '00000000-0000-0000-0000-000000000000' "
        "WHERE id = 3")

    def want() -> list[tuple]:
        return [(i, u, a4, a6, p and bytearray(p), g and bytearray(g), pg and bytearray(pg))
                for i, u, a4, a6, p, g, pg in pipe.src(
                    f"SELECT id, CAST(u AS CHAR), CAST(a4 AS CHAR), CAST(a6 AS CHAR), "
                    f"ST_AsWKB(p), ST_AsWKB(g), ST_AsWKB(pg) FROM {db}.g")]
    got = pipe.wait_rows(want, f"SELECT id, u, a4, a6, p, g, pg FROM {db}.g",
                         what="sc_b.g equal to the source")
    assert len(got) == 8
    types = {f.name: f.dataType.simpleString() for f in pipe.spark.table(f"{db}.g").schema.fields}
    assert [types[c] for c in ("u", "a4", "a6", "p", "g", "pg")] == \
        ["string"] * 3 + ["binary"] * 3


TYPES_DDL = (
    "CREATE TABLE {db}.ty (id INT PRIMARY KEY, "
    "ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT, "
    "miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED, "
    "fl FLOAT, db DOUBLE, d1 DECIMAL(10,2), d65 DECIMAL(65,30), b1 BIT(1), b64 BIT(64), "
    "st SET('a','b','c'), en ENUM('x','y','z'), yr YEAR, tm TIME(6), tm0 TIME, dte DATE, "
    "dtm DATETIME(6), tsp TIMESTAMP(6) NULL DEFAULT NULL, ch CHAR(5), vc VARCHAR(20), tx TEXT, "
    "bn BINARY(4), vb VARBINARY(10), bl BLOB, js JSON, u UUID, a4 INET4, a6 INET6, p POINT)")
TYPES_COLS = ("id ti tiu si siu mi miu i iu bi biu fl db d1 d65 b1 b64 st en yr tm tm0 dte dtm "
              "tsp ch vc tx bn vb bl js u a4 a6 p").split()
TYPES_ROWS = [
    "(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, "
    " -3.4e38, -1.7976931348623157e308, -99999999.99, "
    " '-99999999999999999999999999999999999.999999999999999999999999999999', b'0', 0, '', 'x', "
    " 1901, '-838:59:59.000000', '-00:00:01', '1000-01-01', '1000-01-01 00:00:00.000000', "
    " '1970-01-01 00:00:01.000000', '', '', '', x'00000000', '', '', '[]', "
    " '00000000-0000-0000-0000-000000000000', '0.0.0.0', '::', ST_GeomFromText('POINT(0 0)'))",
    "(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, "
    " 9223372036854775807, 18446744073709551615, 3.4e38, 1.7976931348623157e308, 99999999.99, "
    " '99999999999999999999999999999999999.999999999999999999999999999999', b'1', "
    " 18446744073709551615, 'a,b,c', 'z', 2155, '838:59:59.000000', '100:00:00', "
    " '9999-12-31', '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999999', "
    " 'abcde', 'ünïcødé 🚀 ok', REPEAT('🙂', 300), x'ff00ff00', x'000102', x'00ff', "
    " '{\"k\": [1, 2.5, \"🚀\", null], \"n\": {\"a\": true}}', "
    " 'ffffffff-ffff-ffff-ffff-ffffffffffff', '255.255.255.255', "
    " 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', ST_GeomFromText('POINT(-1.5 2.25)', 4326))",
    "(3, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1.1, 0.1, 0.01, "
    " '0.000000000000000000000000000001', b'0', 1, 'b', 'y', 0, '-12:34:56.789012', "
    " '25:00:00', '2024-02-29', '2024-02-29 12:34:56.123456', '2024-02-29 12:34:56.654321', "
    " 'a', 'b', 'c', x'01', x'', x'', '\"s\"', '123e4567-e89b-12d3-a456-426655440000', "
    " '10.1.2.3', '2001:db8::1', NULL)",
    "(4" + ", NULL" * 35 + ")",
    # zero dates (sql_mode ''): NULL in Spark and named in _zero_dates
    "(5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, b'1', 1, 'c', 'x', 2000, '00:00:00', "
    " '00:00:00', '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00', 'z', 'z', 'z', "
    " x'7f', x'7f', x'7f', '{}', NULL, NULL, NULL, NULL)",
    "(6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, b'1', 1, 'a,c', 'x', 2000, '00:00:00', "
    " '00:00:00', '2020-00-15', '2021-06-00 10:00:00', NULL, 'z', 'z', 'z', x'7f', x'7f', "
    " x'7f', '{}', NULL, NULL, NULL, NULL)",
]
ZERO_DATE_COLS = ("dte", "dtm", "tsp")


def expected_types_row(r: tuple) -> tuple:
    """One source row (TYPES_COLS order, uuid/inet as text, POINT as ST_AsWKB, d65 as text)
    under docs/types.md's Spark mapping, followed by `_zero_dates`."""
    v = dict(zip(TYPES_COLS, r))
    zero = [c for c in ZERO_DATE_COLS if isinstance(v[c], str)]   # pymysql: invalid date -> str
    for c in zero:
        v[c] = None
    out: dict[str, Any] = dict(v)
    if v["biu"] is not None:
        out["biu"] = decimal.Decimal(v["biu"])
    if v["fl"] is not None:
        out["fl"] = f32(v["fl"])
    for c in ("b1", "b64"):
        if v[c] is not None:
            out[c] = bits(v[c])
    if v["b64"] is not None:
        out["b64"] = decimal.Decimal(out["b64"])
    if v["st"] is not None:
        out["st"] = [m for m in v["st"].split(",") if m] if isinstance(v["st"], str) \
            else [m for m in sorted(v["st"]) if m]   # pymysql may give a Python set
    for c in ("tm", "tm0"):
        if v[c] is not None:
            out[c] = time_text(v[c])
    return (*(out[c] for c in TYPES_COLS), zero or None)


def test_every_mariadb_type_reads_back_from_spark_equal_to_the_source(pipe: SparkPipeline) -> None:
    """Every MariaDB column type (integers signed/unsigned at their extremes, FLOAT, DOUBLE,
    DECIMAL(10,2) and DECIMAL(65,30), BIT(1), BIT(64), SET, ENUM, YEAR, TIME negative / beyond
    24 h / fractional, DATE, DATETIME(6), TIMESTAMP(6), CHAR/VARCHAR/TEXT with emoji,
    BINARY/VARBINARY/BLOB, JSON, UUID, INET4, INET6, POINT) and NULL in each: every value read
    back from Spark equals the source's under docs/types.md (BIGINT UNSIGNED and BIT(64) as
    DECIMAL(20,0), DECIMAL(65) and TIME as exact text, SET as an array, FLOAT widened exactly,
    zero dates NULL with the column named in `_zero_dates`)."""
    db = "sc_f"
    pipe.script(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}",
                TYPES_DDL.format(db=db), sql_mode="")
    pipe.script(*(f"INSERT INTO {db}.ty VALUES {r}" for r in TYPES_ROWS), sql_mode="")
    # An update and a delete through the same types.
    pipe.script(f"UPDATE {db}.ty SET tm = '-00:00:00.5', st = 'a,b', js = '{{\"x\": 1}}', "
                f"biu = 18446744073709551614, u = UUID() WHERE id = 3",
                f"INSERT INTO {db}.ty (id) VALUES (7)", f"DELETE FROM {db}.ty WHERE id = 7",
                sql_mode="")
    exprs = {"d65": "CAST(d65 AS CHAR)", "u": "CAST(u AS CHAR)", "a4": "CAST(a4 AS CHAR)",
             "a6": "CAST(a6 AS CHAR)", "p": "ST_AsWKB(p)"}
    src_sql = f"SELECT {', '.join(exprs.get(c, c) for c in TYPES_COLS)} FROM {db}.ty"

    def want() -> list[tuple]:
        return [expected_types_row(r) for r in pipe.src(src_sql)]
    got = pipe.wait_rows(want, f"SELECT {', '.join(TYPES_COLS)}, _zero_dates FROM {db}.ty",
                         what="sc_f.ty equal to the source under the mapping")
    assert len(got) == 6
    zero = {r[0]: r[-1] for r in got}
    assert zero[5] == ["dte", "dtm", "tsp"] and zero[6] == ["dte", "dtm"] and zero[1] is None
    types = {f.name: f.dataType.simpleString() for f in pipe.spark.table(f"{db}.ty").schema.fields}
    assert {c: types[c] for c in ("ti", "tiu", "si", "mi", "iu", "bi", "biu", "fl", "d1", "d65",
                                  "b1", "b64", "st", "en", "yr", "tm", "dte", "dtm", "tsp", "bn",
                                  "js", "u", "a4", "p")} == {
        "ti": "int", "tiu": "int", "si": "int", "mi": "int", "iu": "bigint", "bi": "bigint",
        "biu": "decimal(20,0)", "fl": "double", "d1": "decimal(10,2)", "d65": "string",
        "b1": "bigint", "b64": "decimal(20,0)", "st": "array<string>", "en": "string",
        "yr": "int", "tm": "string", "dte": "date", "dtm": "timestamp", "tsp": "timestamp",
        "bn": "binary", "js": "string", "u": "string", "a4": "string", "p": "binary"}


# ------------------------------------------------------------------------------------------------
# (a), (c), (d): the four cases of issue #19
# ------------------------------------------------------------------------------------------------

def test_drop_and_create_with_another_shape_starts_a_new_incarnation(pipe: SparkPipeline) -> None:
    """`DROP TABLE t` then `CREATE TABLE t` of another shape (INT key -> VARCHAR key): the
    current table holds the new incarnation's rows only, with the new types; the changelog
    holds both incarnations' changes."""
    db = "sc_a"
    pipe.script(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}",
                f"CREATE TABLE {db}.t (id INT PRIMARY KEY, x INT)",
                f"INSERT INTO {db}.t VALUES (1, 10), (2, 20), (3, 30)",
                f"UPDATE {db}.t SET x = 21 WHERE id = 2",
                f"DROP TABLE {db}.t",
                f"CREATE TABLE {db}.t (id VARCHAR(10) PRIMARY KEY, y TEXT)",
                f"INSERT INTO {db}.t VALUES ('a', 'first'), ('b', '🚀')",
                f"UPDATE {db}.t SET y = 'second' WHERE id = 'a'")
    pipe.wait_rows(lambda: pipe.src(f"SELECT id, y FROM {db}.t"), f"SELECT id, y FROM {db}.t",
                   what="sc_a.t: the new incarnation")
    fields = {f.name: f.dataType.simpleString() for f in pipe.spark.table(f"{db}.t").schema.fields}
    assert fields == {"id": "string", "y": "string", "_commit_ts": "bigint",
                      "_zero_dates": "array<string>"}
    ops = pipe.rows(f"SELECT _op, _schema_ver FROM {db}.t_changelog")
    versions = sorted({v for _, v in ops})
    assert len(versions) == 2, ops
    by_ver = {v: sorted(o for o, w in ops if w == v) for v in versions}
    assert by_ver == {versions[0]: ["c", "c", "c", "u"], versions[1]: ["c", "c", "u"]}, by_ver
    new = pipe.rows(f"SELECT id, y FROM {db}.t_changelog WHERE _schema_ver = {versions[1]} "
                    "AND _op = 'c'")
    assert sorted(new) == [("a", "first"), ("b", "🚀")]


def test_ctas_then_add_primary_key_keeps_every_row(pipe: SparkPipeline) -> None:
    """`CREATE TABLE c AS SELECT ...` (9 rows) then `ALTER TABLE c ADD PRIMARY KEY (id)` and
    updates: all 9 rows are in Spark, with the updated values."""
    db = "sc_c"
    pipe.script(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}",
                f"CREATE TABLE {db}.src (id INT NOT NULL, v VARCHAR(10))",
                f"INSERT INTO {db}.src VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(1, 10)),
                f"CREATE TABLE {db}.c AS SELECT * FROM {db}.src",
                f"ALTER TABLE {db}.c ADD PRIMARY KEY (id)",
                f"UPDATE {db}.c SET v = 'upd' WHERE id IN (2, 5)",
                f"UPDATE {db}.c SET id = 10 WHERE id = 9")
    got = pipe.wait_rows(lambda: pipe.src(f"SELECT id, v FROM {db}.c"), f"SELECT id, v FROM {db}.c",
                         what="sc_c.c: every CTAS row")
    assert len(got) == 9


def test_rename_moves_the_history_and_a_new_table_takes_the_old_name(pipe: SparkPipeline) -> None:
    """`RENAME TABLE a TO b; UPDATE b; DELETE FROM b; CREATE TABLE a (...)`: b holds all its
    rows, b's changelog has a's pre-rename changes too, and a is the new table only."""
    db = "sc_d"
    pipe.script(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}",
                f"CREATE TABLE {db}.a (id INT PRIMARY KEY, v INT)",
                f"INSERT INTO {db}.a VALUES (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)",
                f"UPDATE {db}.a SET v = 40 WHERE id = 4",
                f"RENAME TABLE {db}.a TO {db}.b",
                f"UPDATE {db}.b SET v = v + 100 WHERE id = 2",
                f"DELETE FROM {db}.b WHERE id = 3",
                f"CREATE TABLE {db}.a (id INT PRIMARY KEY, w VARCHAR(5))",
                f"INSERT INTO {db}.a VALUES (7, 'new')")
    pipe.wait_rows(lambda: pipe.src(f"SELECT id, v FROM {db}.b"), f"SELECT id, v FROM {db}.b",
                   what="sc_d.b: every row")
    pipe.wait_rows(lambda: pipe.src(f"SELECT id, w FROM {db}.a"), f"SELECT id, w FROM {db}.a",
                   what="sc_d.a: the new table")
    ops_b = sorted(r[0] for r in pipe.rows(f"SELECT _op FROM {db}.b_changelog"))
    assert ops_b == ["c"] * 5 + ["d"] + ["u"] * 2, ops_b
    ops_a = sorted(r[0] for r in pipe.rows(f"SELECT _op FROM {db}.a_changelog"))
    assert ops_a == ["c"], ops_a


# ------------------------------------------------------------------------------------------------
# (e): every DDL of item 4
# ------------------------------------------------------------------------------------------------

def test_every_ddl_keeps_spark_equal_to_the_source(pipe: SparkPipeline) -> None:
    """Rows interleaved with ADD / DROP / RENAME COLUMN (and CHANGE), widenings (INT -> BIGINT,
    FLOAT -> DOUBLE, DECIMAL precision, VARCHAR length), a non-widening change (INT ->
    VARCHAR), TRUNCATE, and DROP DATABASE / CREATE DATABASE: at the end every table in Spark
    equals the source, row for row."""
    db, db2 = "sc_e", "sc_e2"
    t = f"{db}.t"
    pipe.script(
        f"DROP DATABASE IF EXISTS {db}", f"DROP DATABASE IF EXISTS {db2}", f"CREATE DATABASE {db}",
        f"CREATE TABLE {t} (id INT PRIMARY KEY, a INT, b FLOAT, c DECIMAL(10,2), d VARCHAR(10), "
        "e INT, f INT)",
        f"INSERT INTO {t} VALUES (1, 1, 1.5, 1.25, 'one', 11, 111), (2, 2, 2.25, 2.5, 'two', 22, 222)",
        f"ALTER TABLE {t} ADD COLUMN g VARCHAR(20) NULL",
        f"INSERT INTO {t} VALUES (3, 3, 3.5, 3.75, 'three', 33, 333, 'gee')",
        f"UPDATE {t} SET g = 'g1' WHERE id = 1",
        f"ALTER TABLE {t} DROP COLUMN f",
        f"INSERT INTO {t} VALUES (4, 4, 4.5, 4.5, 'four', 44, 'g4')",
        f"ALTER TABLE {t} RENAME COLUMN e TO e2",
        f"UPDATE {t} SET e2 = 222 WHERE id = 2",
        f"ALTER TABLE {t} CHANGE d dd VARCHAR(10)",
        f"INSERT INTO {t} VALUES (5, 5, 5.5, 5.5, 'five', 55, NULL)",
        f"ALTER TABLE {t} MODIFY a BIGINT",
        f"INSERT INTO {t} VALUES (6, 9000000000, 6.5, 6.5, 'six', 66, 'g6')",
        f"ALTER TABLE {t} MODIFY b DOUBLE",
        f"UPDATE {t} SET b = 0.1 WHERE id = 6",
        f"ALTER TABLE {t} MODIFY c DECIMAL(14,2)",
        f"INSERT INTO {t} VALUES (7, 7, 7.5, 123456789012.34, 'seven', 77, 'g7')",
        f"ALTER TABLE {t} MODIFY dd VARCHAR(40)",
        f"UPDATE {t} SET dd = 'a longer text than ten' WHERE id = 7",
        f"ALTER TABLE {t} MODIFY e2 VARCHAR(12)",
        f"UPDATE {t} SET e2 = 'not a number' WHERE id = 1",
        f"DELETE FROM {t} WHERE id = 4",
        # TRUNCATE of another table, then rows again
        f"CREATE TABLE {db}.tr (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.tr VALUES (1, 1), (2, 2), (3, 3)",
        f"TRUNCATE TABLE {db}.tr",
        f"INSERT INTO {db}.tr VALUES (2, 20), (4, 40)",
        # DROP DATABASE / CREATE DATABASE, the table again with another shape
        f"CREATE DATABASE {db2}",
        f"CREATE TABLE {db2}.k (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {db2}.k VALUES (1, 1), (2, 2)",
        f"DROP DATABASE {db2}",
        f"CREATE DATABASE {db2}",
        f"CREATE TABLE {db2}.k (id BIGINT PRIMARY KEY, s VARCHAR(5))",
        f"INSERT INTO {db2}.k VALUES (3, 'x')")
    pipe.wait_rows(lambda: pipe.src(f"SELECT id, a, b, c, dd, e2, g FROM {t}"),
                   f"SELECT id, a, b, c, dd, e2, g FROM {t}", what="sc_e.t after every DDL")
    fields = {f.name: f.dataType.simpleString() for f in pipe.spark.table(t).schema.fields}
    assert fields == {"id": "int", "a": "bigint", "b": "double", "c": "decimal(14,2)",
                      "dd": "string", "e2": "string", "g": "string", "_commit_ts": "bigint",
                      "_zero_dates": "array<string>"}
    pipe.wait_rows(lambda: pipe.src(f"SELECT id, v FROM {db}.tr"), f"SELECT id, v FROM {db}.tr",
                   what="sc_e.tr after TRUNCATE")
    assert "t" in {r[0] for r in pipe.rows(f"SELECT _op FROM {db}.tr_changelog")}
    pipe.wait_rows(lambda: pipe.src(f"SELECT id, s FROM {db2}.k"), f"SELECT id, s FROM {db2}.k",
                   what="sc_e2.k after DROP / CREATE DATABASE")
