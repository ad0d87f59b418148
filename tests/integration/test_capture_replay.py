"""Source transactions of awkward shapes replayed end to end (issue #9's acceptance): source
MariaDB -> capture -> pumps -> `sluice drainer` (sink mysql) -> downstream MariaDB, exact rows.

One pipeline per module (tests/support/pipeline.py); each test has its own database and its own
drainer. Rows are compared typed (pymysql's Decimal/datetime/timedelta/bytes/int/float values plus
an IS NULL flag per column), never as strings.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.pipeline import Pipeline, pipeline, typed_rows, wait_equal

pytestmark = pytest.mark.timeout(120, func_only=True)   # module setup: two MariaDBs + cluster


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Pipeline]:  # type: ignore[no-untyped-def]
    with pipeline(tmp_path_factory.mktemp("capture-replay"), etcd_module.endpoint,
                  pumps=["pump-1", "pump-2"], producer_id="cap-replay") as p:
        yield p


def run_sql(p: Pipeline, *statements: str, sql_mode: str | None = None) -> None:
    conn = p.source.connect()
    try:
        with conn.cursor() as cur:
            if sql_mode is not None:
                cur.execute("SET SESSION sql_mode=%s", (sql_mode,))
            for s in statements:
                cur.execute(s)
    finally:
        conn.close()


def binlog_events_of_last_txn(p: Pipeline, table_prefix: str) -> list[tuple[str, str]]:
    """(event type, info) of the source binlog's last transaction that touched `table_prefix`."""
    file = p.source.execute("SHOW MASTER STATUS")[0][0]
    events = [(r[2], r[5]) for r in p.source.execute(f"SHOW BINLOG EVENTS IN '{file}'")]
    starts = [i for i, (tp, _) in enumerate(events) if tp == "Gtid"]
    for s in reversed(starts):
        end = next((i for i in range(s + 1, len(events)) if events[i][0] in ("Xid", "Query")
                    and (events[i][0] == "Xid" or events[i][1].startswith("COMMIT"))), len(events))
        txn = events[s:end + 1]
        if any(tp == "Table_map" and table_prefix in info for tp, info in txn):
            return txn
    raise AssertionError(f"no transaction on {table_prefix} in {file}")


def test_one_transaction_touching_three_tables(pipe: Pipeline) -> None:
    """One source transaction inserting, updating and deleting in three tables (a primary key, a
    composite key, a unique key only) is replayed downstream exactly."""
    db = pipe.fresh_db("three")
    drainer = pipe.start_drainer("d-three", db)
    run_sql(pipe,
            f"CREATE DATABASE `{db}`",
            f"CREATE TABLE `{db}`.a (id INT PRIMARY KEY, v VARCHAR(10))",
            f"CREATE TABLE `{db}`.b (k1 INT, k2 VARCHAR(4), n BIGINT, PRIMARY KEY (k1, k2))",
            f"CREATE TABLE `{db}`.c (u VARCHAR(8) NOT NULL, w DOUBLE, UNIQUE KEY (u))",
            f"INSERT INTO `{db}`.a VALUES (1, 'one'), (2, 'two')",
            f"INSERT INTO `{db}`.c VALUES ('x', 1.5)",
            "START TRANSACTION",
            f"INSERT INTO `{db}`.a VALUES (3, 'three')",
            f"INSERT INTO `{db}`.b VALUES (1, 'p', -5), (1, 'q', 9223372036854775807)",
            f"UPDATE `{db}`.c SET u = 'y', w = -0.25 WHERE u = 'x'",
            f"DELETE FROM `{db}`.a WHERE id = 1",
            f"UPDATE `{db}`.b SET n = n + 1 WHERE k2 = 'p'",
            f"INSERT INTO `{db}`.c VALUES ('z', NULL)",
            "COMMIT")
    events = binlog_events_of_last_txn(pipe, f"{db}.")
    mapped = {info.rsplit("(", 1)[-1].rstrip(")").replace("`", "")
              for tp, info in events if tp == "Table_map"}
    assert {f"{db}.a", f"{db}.b", f"{db}.c"} <= mapped, events
    wait_equal(pipe, db, timeout=120, watch=(drainer.proc,))
    assert typed_rows(pipe.downstream, db, "a")[0][:2] == (2, "two")
    drainer.proc.stop()


def test_table_maps_interleaved_mid_transaction(pipe: Pipeline) -> None:
    """A transaction whose TableMaps come mid-transaction (a new table after rows of another,
    and a multi-table UPDATE mapping two tables at once) is replayed downstream exactly."""
    db = pipe.fresh_db("interleave")
    drainer = pipe.start_drainer("d-interleave", db)
    run_sql(pipe,
            f"CREATE DATABASE `{db}`",
            f"CREATE TABLE `{db}`.p (id INT PRIMARY KEY, q_id INT, v INT)",
            f"CREATE TABLE `{db}`.q (id INT PRIMARY KEY, label VARCHAR(16))",
            f"CREATE TABLE `{db}`.r (id BIGINT UNSIGNED PRIMARY KEY, note TEXT)",
            "START TRANSACTION",
            f"INSERT INTO `{db}`.p VALUES (1, 10, 0), (2, 20, 0)",
            f"INSERT INTO `{db}`.q VALUES (10, 'ten'), (20, 'twenty')",
            f"UPDATE `{db}`.p SET v = 1 WHERE id = 1",
            f"UPDATE `{db}`.p JOIN `{db}`.q ON p.q_id = q.id SET p.v = p.v + 10, "
            f"q.label = CONCAT(q.label, '!')",
            f"INSERT INTO `{db}`.r VALUES (18446744073709551615, 'max')",
            f"DELETE FROM `{db}`.q WHERE id = 20",
            f"INSERT INTO `{db}`.p VALUES (3, NULL, 3)",
            "COMMIT")
    events = binlog_events_of_last_txn(pipe, f"{db}")
    kinds = [tp for tp, _ in events]
    first_rows = next(i for i, k in enumerate(kinds) if k.endswith("_rows_v1") or k.endswith("_rows"))
    assert "Table_map" in kinds[first_rows:], f"no TableMap after the first rows event: {kinds}"
    wait_equal(pipe, db, timeout=120, watch=(drainer.proc,))
    assert typed_rows(pipe.downstream, db, "q")[0][:2] == (10, "ten!")
    drainer.proc.stop()


def test_mixed_innodb_and_myisam_transaction(pipe: Pipeline) -> None:
    """A transaction mixing InnoDB and MyISAM rows (MariaDB logs the non-transactional part as
    its own BEGIN ... COMMIT group without an XID) and autocommitted MyISAM statements are
    replayed downstream exactly, MyISAM table included."""
    db = pipe.fresh_db("mixed")
    drainer = pipe.start_drainer("d-mixed", db)
    run_sql(pipe,
            f"CREATE DATABASE `{db}`",
            f"CREATE TABLE `{db}`.inno (id INT PRIMARY KEY, v VARCHAR(8)) ENGINE=InnoDB",
            f"CREATE TABLE `{db}`.isam (id INT PRIMARY KEY, v VARCHAR(8)) ENGINE=MyISAM",
            f"INSERT INTO `{db}`.isam VALUES (100, 'auto')",
            "START TRANSACTION",
            f"INSERT INTO `{db}`.inno VALUES (1, 'i1'), (2, 'i2')",
            f"INSERT INTO `{db}`.isam VALUES (1, 'm1'), (2, 'm2')",
            f"UPDATE `{db}`.inno SET v = 'i1b' WHERE id = 1",
            f"UPDATE `{db}`.isam SET v = 'm2b' WHERE id = 2",
            f"DELETE FROM `{db}`.inno WHERE id = 2",
            "COMMIT",
            f"DELETE FROM `{db}`.isam WHERE id = 100",
            f"INSERT INTO `{db}`.isam VALUES (3, 'm3')")
    wait_equal(pipe, db, timeout=120, watch=(drainer.proc,))
    assert [r[:2] for r in typed_rows(pipe.downstream, db, "isam")] == [(1, "m1"), (2, "m2b"), (3, "m3")]
    engines = dict(pipe.downstream.execute(
        "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s", (db,)))
    assert engines == {"inno": "InnoDB", "isam": "MyISAM"}
    drainer.proc.stop()


ALL_TYPES = """CREATE TABLE `{db}`.alltypes (
  id INT NOT NULL PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  d65 DECIMAL(65,30), d10 DECIMAL(10,0), d52 DECIMAL(5,2) UNSIGNED, f FLOAT, dbl DOUBLE,
  dt0 DATETIME, dt3 DATETIME(3), dt6 DATETIME(6), ts0 TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL,
  t0 TIME, t3 TIME(3), t6 TIME(6), dte DATE, y YEAR,
  e ENUM('a','b','ç'), st SET('x','y','z'), b1 BIT(1), b13 BIT(13), b64 BIT(64), j JSON,
  c CHAR(10), vc VARCHAR(100), txt TEXT, lt LONGTEXT, lat VARCHAR(20) CHARACTER SET latin1,
  bn BINARY(4), vb VARBINARY(16), bl BLOB, mbl MEDIUMBLOB
) ENGINE=InnoDB"""

COLUMNS = ("id, ti, tiu, si, siu, mi, miu, i, iu, bi, biu, d65, d10, d52, f, dbl, dt0, dt3, dt6, "
           "ts0, ts6, t0, t3, t6, dte, y, e, st, b1, b13, b64, j, c, vc, txt, lt, lat, bn, vb, bl, mbl")

ROWS = [
    # every column NULL
    "(1" + ", NULL" * 40 + ")",
    # minimums and negatives
    "(2, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, "
    "'-99999999999999999999999999999999999.999999999999999999999999999999', -9999999999, 0.00, "
    "-3.40282e38, -1.7976931348623157e308, '1000-01-01 00:00:00', '1000-01-01 00:00:00.000', "
    "'1000-01-01 00:00:00.000000', '1970-01-01 00:00:01', '1970-01-01 00:00:01.000000', "
    "'-838:59:59', '-838:59:58.999', '-838:59:59.000000', '1000-01-01', 1901, 'a', '', b'0', "
    "b'0', b'0', '[]', '', '', '', '', '', x'00000000', x'', x'', x'')",
    # maximums
    "(3, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, "
    "9223372036854775807, 18446744073709551615, "
    "'99999999999999999999999999999999999.999999999999999999999999999999', 9999999999, 999.99, "
    "3.40282e38, 1.7976931348623157e308, '9999-12-31 23:59:59', '9999-12-31 23:59:59.999', "
    "'9999-12-31 23:59:59.999999', '2038-01-19 03:14:07', '2038-01-19 03:14:07.999999', "
    "'838:59:59', '838:59:58.999', '838:59:59.000000', '9999-12-31', 2155, 'ç', 'x,y,z', b'1', "
    "b'1111111111111', x'FFFFFFFFFFFFFFFF', '{\"k\": [1, 2.5, \"é\", null, true], \"e\": {}}', "
    "'abcdefghij', 'emoji 😀🚀 ünïcødé', REPEAT('long text ', 500), REPEAT('🚀', 5000), "
    "'Ça coûte 5 €', x'FF00FF00', x'00FF00FF00FF', x'DEADBEEF00', REPEAT(x'00FF', 40000))",
    # zero dates, YEAR 0000, fractions, TIME beyond 24 h and negative with a fraction
    "(4, 0, 1, -1, 1, -1, 1, -1, 1, -1, 9223372036854775808, "
    "'0.000000000000000000000000000001', 0, 0.01, 1.17549e-38, 5e-324, '0000-00-00 00:00:00', "
    "'0000-00-00 00:00:00.000', '2024-00-15 12:00:00.000001', '0000-00-00 00:00:00', "
    "'2024-02-29 12:34:56.000001', '100:00:00', '-00:00:00.001', '-01:02:03.456789', "
    "'0000-00-00', 0, 'b', 'y', b'1', b'1010101010101', b'1', '\"just a string\"', 'a', "
    "' trailing ', 'line\\nbreak\\ttab \\\\ back', '', 'naïve', x'00', x'00', x'00', x'00')",
    # ordinary values
    "(5, 12, 200, 1234, 40000, -100000, 100000, 123456789, 3000000000, -1234567890123, "
    "12345678901234567890, '-123.456000000000000000000000000001', 42, 12.34, 0.1, -2.5e-7, "
    "'2024-05-01 10:20:30', '2024-05-01 10:20:30.123', '2024-05-01 10:20:30.000100', "
    "'2024-05-01 10:20:30', '2024-05-01 10:20:30.654321', '24:00:01', '-25:00:00.5', "
    "'12:34:56.000007', '2024-05-01', 2024, 'b', 'x,z', b'0', b'11', b'10000000', "
    "'{\"a\": 1}', 'c', 'vc', 'text', 'longtext', 'latin1 ÿ', x'01020304', x'0A0B', x'0C', x'0D')",
]


def test_all_types_round_trip_exactly(pipe: Pipeline) -> None:
    """Every type round-trips to the downstream exactly — NULLs, signed/unsigned extremes,
    DECIMAL(65,30), FLOAT/DOUBLE, fractional-second DATETIME/TIMESTAMP/TIME, TIME beyond 24 h
    and negative, zero dates, YEAR, ENUM/SET, BIT(64), JSON, utf8mb4 with emoji, latin1,
    binary and blobs — inserted, updated (every column) and deleted."""
    db = pipe.fresh_db("types")
    drainer = pipe.start_drainer("d-types", db)
    run_sql(pipe,
            f"CREATE DATABASE `{db}`",
            ALL_TYPES.format(db=db),
            *(f"INSERT INTO `{db}`.alltypes ({COLUMNS}) VALUES {row}" for row in ROWS),
            # an update of every column (row 5 takes row 3's values), a row to NULLs and back
            f"UPDATE `{db}`.alltypes a JOIN `{db}`.alltypes b ON b.id = 3 SET "
            + ", ".join(f"a.{c} = b.{c}" for c in COLUMNS.split(", ")[1:]) + " WHERE a.id = 5",
            f"INSERT INTO `{db}`.alltypes ({COLUMNS}) VALUES "
            + ROWS[3].replace("(4,", "(6,", 1),
            f"UPDATE `{db}`.alltypes SET " + ", ".join(f"{c} = NULL" for c in COLUMNS.split(", ")[1:])
            + " WHERE id = 6",
            f"INSERT INTO `{db}`.alltypes ({COLUMNS}) VALUES " + ROWS[1].replace("(2,", "(7,", 1),
            f"DELETE FROM `{db}`.alltypes WHERE id = 7",
            sql_mode="")
    source_rows = typed_rows(pipe.source, db, "alltypes")
    assert len(source_rows) == 6
    wait_equal(pipe, db, timeout=120, watch=(drainer.proc,))
    drainer.proc.stop()
