"""`sluice ctl verify` between two real MariaDB servers (source and downstream).

Invariant (ctl/verify.py): a table is reported as matching only when the target holds exactly
the source's rows — every key of the source with equal values, and no other key (the last chunk
is open above, so rows past the source's greatest key are counted too).
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.ctl import main as cli
from sluice.ctl import verify as v
from tests.support.mariadb import MariaDBServer
from tests.support.procs import REPO, sluice_argv

pytestmark = pytest.mark.mariadb

DB = "vshop"
SCHEMA = [
    f"CREATE DATABASE {DB} CHARACTER SET utf8mb4",
    f"""CREATE TABLE {DB}.customers (id INT PRIMARY KEY, name VARCHAR(64) CHARACTER SET utf8mb4,
        balance DECIMAL(12,2), joined DATETIME(6), flags BIGINT UNSIGNED, photo VARBINARY(8),
        nap TIME(3), born DATE)""",
    f"""CREATE TABLE {DB}.order_lines (order_id INT, line SMALLINT, sku VARCHAR(16), qty INT,
        PRIMARY KEY (order_id, line))""",
    f"CREATE TABLE {DB}.tags (code VARCHAR(8) PRIMARY KEY, label VARCHAR(32))",
    f"CREATE TABLE {DB}.events (kind VARCHAR(8), n INT)",
]
ROWS = [
    f"""INSERT INTO {DB}.customers VALUES
        (1, 'Zoë Åström', 10.50, '2024-02-29 23:59:59.123456', 18446744073709551615, x'00ff',
         '-12:30:00.250', '1999-12-31'),
        (2, '東京', -0.01, '1970-01-01 00:00:00.000001', 0, NULL, '838:59:59', NULL),
        (3, 'plain', NULL, NULL, NULL, '', NULL, '2000-01-01')""",
    f"INSERT INTO {DB}.customers (id, name, balance) VALUES "
    + ", ".join(f"({i}, 'c{i}', {i}.25)" for i in range(4, 24)),
    f"INSERT INTO {DB}.order_lines VALUES (1, 1, 'a', 2), (1, 2, 'b', 1), (2, 1, 'a', 5), "
    "(3, 1, 'c', 1), (3, 2, 'd', 9), (3, 3, 'e', 4)",
    f"INSERT INTO {DB}.tags VALUES ('b', 'bee'), ('A', 'ay'), ('é', 'e acute'), ('z', 'zed')",
    f"INSERT INTO {DB}.events VALUES ('x', 1), ('x', 1), ('y', 2)",
]


def load(server: MariaDBServer) -> None:
    server.execute(f"DROP DATABASE IF EXISTS {DB}")
    for sql in SCHEMA + ROWS:
        server.execute(sql)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory,
            mariadb_module: MariaDBServer) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    target = MariaDBServer(tmp_path_factory.mktemp("verify-target"), server_id=2,
                           binlog=False).start()
    try:
        load(mariadb_module)           # the source never changes in this module
        yield mariadb_module, target
    finally:
        target.stop()


@pytest.fixture
def same(servers: tuple[MariaDBServer, MariaDBServer]) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    """The target holds the same vshop tables as the source (reloaded for each test)."""
    load(servers[1])
    yield servers


def run_verify(source: MariaDBServer, target: MariaDBServer, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["ctl", "verify", "--source", source.dsn(), "--target", target.dsn(),
                         "--chunk-rows", "3", *extra])
    return code, out.getvalue(), err.getvalue()


def results(source: MariaDBServer, target: MariaDBServer) -> dict[str, v.TableResult]:
    src, dst = v.MySQLSide(source.dsn()), v.MySQLTarget(target.dsn())
    try:
        return {r.table: r for r in v.verify_tables(src, dst, v_tables(), chunk_rows=3)}
    finally:
        src.close()
        dst.close()


def v_tables() -> list[str]:
    return [f"{DB}.customers", f"{DB}.order_lines", f"{DB}.tags", f"{DB}.events"]


def test_equal_tables_match_chunk_by_chunk(same: tuple[MariaDBServer, MariaDBServer]) -> None:
    """A table is reported as matching only when the target holds exactly the source's rows."""
    source, target = same
    code, out, err = run_verify(source, target, "--tables", ",".join(v_tables()))
    assert code == 0, out + err
    assert "all 4 tables match" in out, out
    got = results(source, target)
    assert got[f"{DB}.customers"].chunks >= 7 and got[f"{DB}.customers"].rows == 23
    assert got[f"{DB}.order_lines"].key == ("order_id", "line")
    assert got[f"{DB}.events"].key == () and "multiset" in got[f"{DB}.events"].note
    # JSON output: one object, every table with its counts.
    code, out, _ = run_verify(source, target, "--tables", ",".join(v_tables()), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["match"] is True
    assert {t["table"]: t["rows"] for t in doc["tables"]}[f"{DB}.tags"] == 4


def test_changed_missing_and_extra_rows_are_named(same: tuple[MariaDBServer, MariaDBServer]) -> None:
    """Each kind of difference fails verify and names the key: changed, missing, extra."""
    source, target = same
    # Changed: a microsecond of a DATETIME(6), an accent in a utf8mb4 string.
    target.execute(f"UPDATE {DB}.customers SET joined = '2024-02-29 23:59:59.123457' WHERE id = 1")
    target.execute(f"UPDATE {DB}.tags SET label = 'e aigu' WHERE code = 'é'")
    # Missing in the target: one line of a composite key.
    target.execute(f"DELETE FROM {DB}.order_lines WHERE order_id = 3 AND line = 2")
    # Extra in the target, above the source's greatest key (the open last chunk).
    target.execute(f"INSERT INTO {DB}.customers (id, name) VALUES (1000, 'ghost')")
    # A keyless table with one duplicate fewer.
    target.execute(f"DELETE FROM {DB}.events WHERE kind = 'x' LIMIT 1")

    code, out, err = run_verify(source, target, "--tables", ",".join(v_tables()))
    assert code == 1, out + err
    got = results(source, target)
    cust = got[f"{DB}.customers"]
    assert cust.status == "mismatch"
    assert {(d.kind, d.key) for d in cust.differences} == {("changed", "id=1"),
                                                           ("extra", "id=1000")}
    assert [(d.kind, d.key) for d in got[f"{DB}.order_lines"].differences] == [
        ("missing", "order_id=3, line=2")]
    assert [(d.kind, d.key) for d in got[f"{DB}.tags"].differences] == [("changed", "code='é'")]
    assert [d.kind for d in got[f"{DB}.events"].differences] == ["missing"]
    assert "customers: changed  id=1" in out and "customers: extra    id=1000" in out, out
    assert "order_lines: missing  order_id=3, line=2" in out, out
    assert "0 of 4 tables match" in out


def test_values_compare_in_the_spark_canonical_form() -> None:
    """Source values are compared as the Spark columns hold them (docs/types.md)."""
    import datetime as dt
    import decimal

    from sluice.proto import sluice_pb2 as pb

    def col(data_type: str, column_type: str, **kw: object) -> object:
        # As core.table.read_table_info describes these columns.
        return pb.ColumnInfo(name="c", data_type=data_type, column_type=column_type,
                             nullable=True, unsigned="unsigned" in column_type, **kw)
    cols = [col("bigint", "bigint(20) unsigned"), col("time", "time(3)", scale=3),
            col("decimal", "decimal(12,2)", precision=12, scale=2),
            col("datetime", "datetime(6)", scale=6)]
    src = v.SourceValues(cols).row([18446744073709551615, dt.timedelta(hours=-1),
                                    decimal.Decimal("10.50"),
                                    dt.datetime(2024, 1, 1, 0, 0, 0, 5)])
    spark = tuple(v.canonical(x) for x in [
        decimal.Decimal("18446744073709551615"), "-01:00:00.000000", decimal.Decimal("10.5"),
        dt.datetime(2024, 1, 1, 0, 0, 0, 5, tzinfo=dt.timezone.utc)])
    assert src == spark


def test_bad_dsn_exits_2_with_one_line(servers: tuple[MariaDBServer, MariaDBServer]) -> None:
    """Bad usage is one line on stderr and exit code 2, never a traceback."""
    source, target = servers
    out = subprocess.run(sluice_argv("ctl", "verify", "--source", "postgres://x@127.0.0.1/db",
                                     "--target", target.dsn()),
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "--source" in out.stderr, out.stderr
    bad_password = source.dsn().replace(source.password, "wrong")
    out2 = io.StringIO()
    with contextlib.redirect_stderr(out2):
        code = cli.main(["ctl", "verify", "--source", bad_password, "--target", target.dsn()])
    assert code == 2 and "cannot connect" in out2.getvalue() and "wrong" not in out2.getvalue()


def test_a_table_missing_in_the_target_is_a_mismatch(
        same: tuple[MariaDBServer, MariaDBServer], tmp_path: Path) -> None:
    """A source table the target does not have fails verify and says so."""
    source, target = same
    target.execute(f"DROP TABLE {DB}.tags")
    code, out, err = run_verify(source, target, "--tables", f"{DB}.tags,{DB}.order_lines")
    assert code == 1, out + err
    assert f"{DB}.tags: no such table in the target" in out, out
