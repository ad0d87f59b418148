"""Type mapping of the Spark sink (docs/types.md, Spark column) — no Spark session needed."""
from __future__ import annotations

import datetime as _dt
import decimal

import pytest

from sluice.core.rowcodec import MySQLDateTime, python_to_datum
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import types as ST
from sluice.spark_sink.tables import TableState, UnmappableChange, plan
from tests.support import pysparkrows as PR
from tests.support.rows import Table, col

UTC = _dt.timezone.utc


@pytest.mark.parametrize("column_type,spark", [
    # Iceberg has no 8- or 16-bit integers: everything up to INT (and INT-sized unsigned) is INT.
    ("tinyint(4)", "INT"), ("tinyint(3) unsigned", "INT"), ("smallint(6)", "INT"),
    ("smallint(5) unsigned", "INT"), ("mediumint(9)", "INT"), ("mediumint(8) unsigned", "INT"),
    ("int(11)", "INT"), ("int(10) unsigned", "BIGINT"), ("bigint(20)", "BIGINT"),
    ("bigint(20) unsigned", "DECIMAL(20,0)"), ("year(4)", "INT"), ("bit(8)", "BIGINT"),
    ("bit(64)", "DECIMAL(20,0)"), ("float", "DOUBLE"), ("double", "DOUBLE"),
    ("decimal(10,2)", "DECIMAL(10,2)"), ("decimal(38,10)", "DECIMAL(38,10)"),
    ("decimal(65,30)", "STRING"), ("datetime(6)", "TIMESTAMP"), ("timestamp", "TIMESTAMP"),
    ("date", "DATE"), ("time(6)", "STRING"), ("json", "STRING"), ("varchar(10)", "STRING"),
    ("enum('a','b')", "STRING"), ("set('a','b')", "ARRAY<STRING>"), ("varbinary(8)", "BINARY"),
    ("blob", "BINARY"), ("uuid", "STRING"), ("inet4", "STRING"), ("inet6", "STRING"),
    ("point", "BINARY"), ("geometry", "BINARY"), ("polygon", "BINARY"),
])
def test_column_types(column_type: str, spark: str) -> None:
    assert ST.spark_type(col("c", column_type)) == spark


def conv(column_type: str, value: object) -> object:
    c = col("c", column_type)
    info = pb.TableInfo(table_id=1, schema_name="s", table_name="t", columns=[c])
    row = pb.Row(columns=[python_to_datum(value, c)])
    vals, zero = PR.row_values(row, info, ST.plan_columns(info))
    assert PR.row_reader(info)(row, ("m",)) == ("m", zero, *vals)   # the sink's generated reader
    return (vals[0], zero)


def test_every_value_lands_without_loss() -> None:
    """Every value a column can hold lands in its Spark column without loss, or as a
    documented lossless stand-in."""
    assert conv("bigint(20) unsigned", 2**64 - 1) == (decimal.Decimal(2**64 - 1), None)
    assert conv("bigint(20)", -(2**63)) == (-(2**63), None)
    big = decimal.Decimal("-" + "9" * 35 + "." + "1" * 30)
    assert conv("decimal(65,30)", big) == (format(big, "f"), None)
    assert conv("decimal(38,10)", decimal.Decimal("1234567890123456789012345678.0123456789")) == (
        decimal.Decimal("1234567890123456789012345678.0123456789"), None)
    ts = _dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC)
    assert conv("datetime(6)", ts) == (ts, None)
    assert conv("time(6)", -_dt.timedelta(hours=838, minutes=59, seconds=59)) == ("-838:59:59.000000", None)
    assert conv("time(6)", _dt.timedelta(microseconds=1)) == ("00:00:00.000001", None)
    assert conv("json", '{"a": [1, 2]}') == ('{"a": [1, 2]}', None)
    assert conv("varbinary(8)", b"\x00\xff") == (bytearray(b"\x00\xff"), None)
    assert conv("bit(8)", 255) == (255, None)
    assert conv("double", 1e100) == (1e100, None)
    assert conv("date", _dt.date(2024, 2, 29)) == (_dt.date(2024, 2, 29), None)
    assert conv("varchar(8)", "ünï 🚀") == ("ünï 🚀", None)


def test_zero_dates_are_null_with_a_flag() -> None:
    assert conv("date", MySQLDateTime()) == (None, ["c"])
    assert conv("datetime", MySQLDateTime(2021, 6, 0, 10)) == (None, ["c"])
    assert conv("datetime", None) == (None, None)


def test_generated_row_reader_equals_row_values() -> None:
    """The sink's per-table generated reader gives row_values' values, zero-date flags and
    errors for every shape of row: all columns (hidden ones skipped), visible ones only, nulls,
    every Datum kind a column may carry, and a wrong column count."""
    cols = [col("id", "bigint(20)", nullable=False), col("u", "bigint(20) unsigned"),
            col("d", "decimal(10,2)"), col("born", "date"), col("seen", "datetime(6)"),
            col("dur", "time(6)"), col("doc", "json"), col("b", "varbinary(8)"),
            col("r", "double"), col("s", "varchar(8)"), col("bits", "bit(8)")]
    cols.insert(3, col("gone", "int(11)"))
    cols[3].hidden = True   # a dropped column: its Datum stays in full rows, the view skips it
    info = pb.TableInfo(table_id=1, schema_name="s", table_name="t", columns=cols, version=3)
    plans = ST.plan_columns(info)
    reader = PR.row_reader(info, plans)

    def read(row: pb.Row) -> tuple[list[object], list[str] | None]:
        zero, *vals = reader(row, ())
        return vals, zero
    values = [[7, 2**64 - 1, decimal.Decimal("-1.50"), 5, _dt.date(2024, 2, 29),
               _dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC), _dt.timedelta(seconds=-1),
               '{"a": 1}', b"\x00", 1.5, "ü", 3],
              [-(2**63), 0, None, None, MySQLDateTime(), MySQLDateTime(2021, 6, 0), None, None,
               None, None, None, None]]
    for vs in values:
        full = pb.Row(columns=[python_to_datum(v, c) for v, c in zip(vs, cols)])
        visible = pb.Row(columns=[d for d, c in zip(full.columns, cols) if not c.hidden])
        for row in (full, visible):
            assert read(row) == PR.row_values(row, info, plans)
    assert read(full)[1] == ["born", "seen"]
    # Datum kinds beside a column's native one go through its converter, as in row_values.
    odd = pb.Row(columns=[d for d in full.columns])
    odd.columns[0].CopyFrom(pb.Datum(str="12"))
    odd.columns[10].CopyFrom(pb.Datum(int=4))
    assert read(odd) == PR.row_values(odd, info, plans)
    assert read(odd)[0][0] == 12 and read(odd)[0][9] == "4"
    short = pb.Row(columns=list(full.columns)[:5])
    for f in (read, lambda r: PR.row_values(r, info, plans)):
        with pytest.raises(Exception, match="has 5 values for 12 columns"):
            f(short)


def test_uuid_inet_and_spatial_values_as_the_capture_emits_them() -> None:
    """The capture emits UUID / INET4 / INET6 as their fixed-size binary (in text order, as
    MariaDB logs them) and spatial values as MariaDB's storage format (a 4-byte SRID, then
    WKB): they land as canonical text and as the bare WKB."""
    u = bytes.fromhex("123e4567e89b12d3a456426655440000")
    assert conv("uuid", u) == ("123e4567-e89b-12d3-a456-426655440000", None)
    assert conv("inet4", bytes([10, 0, 0, 1])) == ("10.0.0.1", None)
    assert conv("inet6", bytes.fromhex("20010db8000000000000ff0000428329")) == (
        "2001:db8::ff00:42:8329", None)
    assert conv("inet6", bytes(16)) == ("::", None)
    # MariaDB (inet_ntop) prints embedded IPv4 in dotted form; Python 3.11's ipaddress does not.
    assert conv("inet6", bytes(10) + b"\xff\xff\x01\x02\x03\x04") == ("::ffff:1.2.3.4", None)
    assert conv("inet6", bytes(12) + b"\x01\x02\x03\x04") == ("::1.2.3.4", None)
    assert conv("inet6", bytes(15) + b"\x01") == ("::1", None)
    assert conv("inet6", bytes(14) + b"\x01\x02") == ("::102", None)
    wkb = bytes.fromhex("0101000000000000000000f03f0000000000000040")   # POINT(1 2)
    assert conv("point", b"\x00\x00\x00\x00" + wkb) == (bytearray(wkb), None)
    assert conv("geometry", b"\xe6\x10\x00\x00" + wkb) == (bytearray(wkb), None)   # SRID 4326


def test_set_lands_as_an_array_of_its_members() -> None:
    assert conv("set('a','b','c')", "a,c") == (["a", "c"], None)
    assert conv("set('a','b','c')", "") == ([], None)


@pytest.mark.parametrize("old,new,ok", [
    ("INT", "BIGINT", True), ("BIGINT", "INT", False), ("FLOAT", "DOUBLE", True),
    ("DECIMAL(10,2)", "DECIMAL(12,2)", True), ("DECIMAL(10,2)", "DECIMAL(12,4)", False),
    ("DECIMAL(10,2)", "DECIMAL(8,2)", False), ("INT", "STRING", False), ("STRING", "STRING", True),
    ("DATE", "TIMESTAMP", False), ("INT", "DECIMAL(20,0)", False),
])
def test_widening_is_an_iceberg_promotion(old: str, new: str, ok: bool) -> None:
    """widens(): only Iceberg's in-place promotions (int -> bigint, float -> double, decimal
    precision up at the same scale)."""
    assert ST.widens(old, new) is ok


@pytest.mark.parametrize("old,new,ok", [
    ("INT", "STRING", True), ("DECIMAL(10,2)", "STRING", True), ("DATE", "STRING", True),
    ("STRING", "INT", True), ("STRING", "DECIMAL(10,2)", True), ("INT", "DECIMAL(20,0)", True),
    ("DECIMAL(10,2)", "DECIMAL(12,4)", True), ("DECIMAL(10,2)", "DECIMAL(12,1)", False),
    ("DECIMAL(10,0)", "BIGINT", True), ("DECIMAL(10,2)", "INT", False), ("DATE", "TIMESTAMP", True),
    ("BINARY", "STRING", False), ("DOUBLE", "STRING", False), ("STRING", "BINARY", False),
])
def test_castable_keeps_mysqls_values(old: str, new: str, ok: bool) -> None:
    """castable(): a Spark CAST that gives what MySQL's ALTER gives (else the change is
    unmappable)."""
    assert ST.castable(old, new) is ok


def _cols(st: TableState) -> list[tuple[str, str, str]]:
    return [(c.name, c.stype, c.cl) for c in st.columns]


def test_plan_adds_drops_renames_widens_and_recasts_by_column() -> None:
    """plan(): add / drop / rename (by the DDL's RENAME COLUMN or CHANGE) keep each column's
    history; an Iceberg promotion widens in place; another cast renames the changelog's old
    column aside and recasts the current table."""
    t1 = Table(5, "shop", "items", [col("id", "int(11)", nullable=False), col("qty", "int(11)"),
                                    col("note", "varchar(10)")], primary=["id"])
    s1, ops = plan(None, t1.info, "shop")
    assert [o.kind for o in ops] == ["create", "create"]
    assert _cols(s1) == [("id", "INT", "id"), ("qty", "INT", "qty"), ("note", "STRING", "note")]
    t2 = Table(5, "shop", "items", [col("id", "int(11)", nullable=False), col("qty", "bigint(20)"),
                                    col("memo", "varchar(10)"), col("code", "int(11)")],
               primary=["id"], version=2)
    s2, ops = plan(s1, t2.info, "shop", "ALTER TABLE items MODIFY qty BIGINT, "
                                          "CHANGE note memo VARCHAR(10), ADD code INT")
    kinds = {(o.kind, o.table, o.column, o.to) for o in ops}
    assert {("widen", "current", "qty", "BIGINT"), ("rename", "current", "note", "memo"),
            ("add", "current", "code", "INT")} <= kinds
    assert _cols(s2) == [("id", "INT", "id"), ("qty", "BIGINT", "qty"),
                         ("memo", "STRING", "memo"), ("code", "INT", "code")]
    t3 = Table(5, "shop", "items", [col("id", "int(11)", nullable=False), col("qty", "bigint(20)"),
                                    col("memo", "varchar(10)"), col("code", "varchar(12)")],
               primary=["id"], version=3)
    s3, ops = plan(s2, t3.info, "shop", "ALTER TABLE items MODIFY code VARCHAR(12)")
    assert ("rename", "changelog", "code", "code__v2") in {(o.kind, o.table, o.column, o.to)
                                                          for o in ops}
    assert ("recast", "current", "code", "STRING") in {(o.kind, o.table, o.column, o.to)
                                                       for o in ops}
    assert ("code__v2", "INT") in s3.cl_extra
    assert TableState.from_json(s3.to_json()) == s3


def test_plan_of_a_new_incarnation_starts_the_current_table_again() -> None:
    """DROP then CREATE with another shape: the current table is dropped and created in the new
    shape; the changelog keeps the old incarnation's columns (a changed type moved aside)."""
    t1 = Table(6, "s", "t", [col("id", "int(11)", nullable=False), col("x", "int(11)")],
               primary=["id"])
    s1, _ = plan(None, t1.info, "s")
    t2 = Table(6, "s", "t", [col("id", "varchar(10)", nullable=False), col("y", "text")],
               primary=["id"], version=2)
    s2, ops = plan(s1, t2.info, "s", "CREATE TABLE t (id VARCHAR(10) PRIMARY KEY, y TEXT)",
                   new_incarnation=True)
    assert ops[0].kind == "drop_table" and ops[-1].kind == "create"
    assert _cols(s2) == [("id", "STRING", "id"), ("y", "STRING", "y")]
    assert {n for n, _ in s2.cl_extra} == {"id__v1", "x"} and s2.incarnation == 2


def test_unmappable_change_names_table_column_and_ddl() -> None:
    t1 = Table(6, "shop", "notes", [col("id", "int(11)", nullable=False), col("body", "varbinary(9)")],
               primary=["id"])
    s1, _ = plan(None, t1.info, "shop")
    t2 = Table(6, "shop", "notes", [col("id", "int(11)", nullable=False), col("body", "int(11)")],
               primary=["id"], version=2)
    with pytest.raises(UnmappableChange) as e:
        plan(s1, t2.info, "shop", "ALTER TABLE notes MODIFY body INT")
    msg = str(e.value)
    assert "shop.notes" in msg and "body" in msg and "ALTER TABLE notes MODIFY body INT" in msg
    # as-string: a change with no value-keeping cast to its type makes the column STRING.
    d1 = Table(7, "shop", "days", [col("id", "int(11)", nullable=False), col("day", "date")],
               primary=["id"])
    sd, _ = plan(None, d1.info, "shop")
    d2 = Table(7, "shop", "days", [col("id", "int(11)", nullable=False), col("day", "int(11)")],
               primary=["id"], version=2)
    with pytest.raises(UnmappableChange):
        plan(sd, d2.info, "shop", "ALTER TABLE days MODIFY day INT")
    sd2, _ = plan(sd, d2.info, "shop", "ALTER TABLE days MODIFY day INT", policy="as-string")
    assert ("day", "STRING", "day") in _cols(sd2)


def test_as_string_text_is_what_mysql_prints_and_binary_is_base64() -> None:
    """A column kept as STRING by on-unmappable = "as-string" while its source type maps to
    another Spark type: its new values as MySQL prints them, binary and spatial in base64."""
    from sluice.spark_sink.types import plan_columns, text_converter

    def c(name: str, data_type: str, scale: int = 0) -> pb.ColumnInfo:
        return pb.ColumnInfo(name=name, data_type=data_type, column_type=data_type, scale=scale)
    dt = pb.Datum(datetime=pb.DateTimeValue(year=2024, month=1, day=2, hour=3, minute=4,
                                             second=5, microsecond=120000))
    assert text_converter(c("t", "datetime", 3))(dt) == "2024-01-02 03:04:05.120"
    assert text_converter(c("t", "datetime", 0))(dt) == "2024-01-02 03:04:05"
    assert text_converter(c("t", "timestamp", 6))(dt) == "2024-01-02 03:04:05.120000"
    assert text_converter(c("d", "date"))(pb.Datum(datetime=pb.DateTimeValue(year=0))) == "0000-00-00"
    assert text_converter(c("b", "varbinary"))(pb.Datum(bytes=b"\x00\xff")) == "AP8="
    assert text_converter(c("g", "point"))(pb.Datum(bytes=b"\x01")) == "AQ=="
    assert text_converter(c("i", "int"))(pb.Datum(int=-7)) == "-7"
    assert text_converter(c("n", "decimal"))(pb.Datum(decimal="1.50")) == "1.50"
    info = pb.TableInfo(columns=[c("id", "int"), c("q", "varbinary"), c("r", "varbinary")])
    plans = plan_columns(info, {"id": "INT", "q": "STRING", "r": "BINARY"})
    assert [p.stype for p in plans] == ["INT", "STRING", "BINARY"]
    assert plans[1].convert(pb.Datum(bytes=b"\x00\xff")) == "AP8=" and not plans[1].native
