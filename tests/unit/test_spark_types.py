"""Type mapping of the Spark sink (docs/types.md, Spark column) — no Spark session needed."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal

import pytest

from sluice.core.rowcodec import MySQLDateTime, python_to_datum
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import types as ST
from sluice.spark_sink.layout import Layout
from sluice.spark_sink.tables import (TableState, UnmappableChange, all_changes_sql, changelog_sql,
                                      evolve, phys_index)
from tests.support.rows import Table, col

UTC = _dt.timezone.utc


@pytest.mark.parametrize("column_type,spark", [
    ("tinyint(4)", "TINYINT"), ("tinyint(3) unsigned", "SMALLINT"), ("smallint(6)", "SMALLINT"),
    ("smallint(5) unsigned", "INT"), ("mediumint(9)", "INT"), ("int(11)", "INT"),
    ("int(10) unsigned", "BIGINT"), ("bigint(20)", "BIGINT"),
    ("bigint(20) unsigned", "DECIMAL(20,0)"), ("year(4)", "SMALLINT"), ("bit(8)", "BIGINT"),
    ("bit(64)", "DECIMAL(20,0)"), ("float", "DOUBLE"), ("double", "DOUBLE"),
    ("decimal(10,2)", "DECIMAL(10,2)"), ("decimal(38,10)", "DECIMAL(38,10)"),
    ("decimal(65,30)", "STRING"), ("datetime(6)", "TIMESTAMP"), ("timestamp", "TIMESTAMP"),
    ("date", "DATE"), ("time(6)", "STRING"), ("json", "STRING"), ("varchar(10)", "STRING"),
    ("enum('a','b')", "STRING"), ("varbinary(8)", "BINARY"), ("blob", "BINARY"),
])
def test_column_types(column_type: str, spark: str) -> None:
    assert ST.spark_type(col("c", column_type)) == spark


def conv(column_type: str, value: object) -> object:
    c = col("c", column_type)
    info = pb.TableInfo(table_id=1, schema_name="s", table_name="t", columns=[c])
    row = pb.Row(columns=[python_to_datum(value, c)])
    vals, zero = ST.row_values(row, info, ST.plan_columns(info))
    assert ST.row_reader(info)(row, ("m",)) == ("m", zero, *vals)   # the sink's generated reader
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
    reader = ST.row_reader(info, plans)

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
            assert read(row) == ST.row_values(row, info, plans)
    assert read(full)[1] == ["born", "seen"]
    # Datum kinds beside a column's native one go through its converter, as in row_values.
    odd = pb.Row(columns=[d for d in full.columns])
    odd.columns[0].CopyFrom(pb.Datum(str="12"))
    odd.columns[10].CopyFrom(pb.Datum(int=4))
    assert read(odd) == ST.row_values(odd, info, plans)
    assert read(odd)[0][0] == 12 and read(odd)[0][9] == "4"
    short = pb.Row(columns=list(full.columns)[:5])
    for f in (read, lambda r: ST.row_values(r, info, plans)):
        with pytest.raises(Exception, match="has 5 values for 12 columns"):
            f(short)


@pytest.mark.parametrize("old,new,ok", [
    ("INT", "BIGINT", True), ("BIGINT", "INT", False), ("INT", "DECIMAL(20,0)", True),
    ("BIGINT", "DECIMAL(18,0)", False), ("DECIMAL(10,2)", "DECIMAL(12,4)", True),
    ("DECIMAL(10,2)", "DECIMAL(12,1)", False), ("INT", "STRING", True), ("STRING", "INT", False),
    ("DATE", "TIMESTAMP", True), ("BINARY", "STRING", False), ("SMALLINT", "DOUBLE", True),
])
def test_widening(old: str, new: str, ok: bool) -> None:
    assert ST.widens(old, new) is ok


def test_schema_evolution_adds_physical_columns_only() -> None:
    layout = Layout("/tmp/x", "sluice", "{schema}", "src")
    t1 = Table(5, "shop", "items", [col("id", "int(11)", nullable=False), col("qty", "int(11)"),
                                    col("note", "varchar(10)")], primary=["id"])
    s1 = evolve(None, t1.info, layout)
    assert [p for p, _ in s1.phys_columns()] == ["id", "qty", "note"]
    t2 = t1.add_column(col("price", "decimal(10,2)"))
    s2 = evolve(s1, t2.info, layout)
    # Widen qty: a new physical column of the wider type; the old one stays.
    t3 = Table(5, "shop", "items", [*t2.columns[:1], col("qty", "bigint(20)"), *t2.columns[2:]],
               primary=["id"], version=3)
    s3 = evolve(s2, t3.info, layout)
    assert s3.phys_columns()[:4] == s2.phys_columns()  # append-only
    qty = next(c for c in s3.columns if c.name == "qty")
    assert qty.stype == "BIGINT" and [p for p, _ in qty.phys] == ["qty", "qty__bigint"]
    # Rows of version 1 still go to the INT column, rows of version 3 to the BIGINT one.
    names = [p for p, _ in s3.phys_columns()]
    assert [names[i] for i in phys_index(s3, t1.info)] == ["id", "qty", "note"]
    assert [names[i] for i in phys_index(s3, t3.info)] == ["id", "qty__bigint", "note", "price"]
    assert names == ["id", "qty", "note", "price", "qty__bigint"]
    t4 = t3.drop_column("note")
    s4 = evolve(s3, t4.info, layout)
    assert [c.name for c in s4.visible] == ["id", "qty", "price"]
    assert TableState.from_json(s4.to_json()) == s4


def test_unmappable_change_names_table_column_and_ddl() -> None:
    layout = Layout("/tmp/x", "sluice", "{schema}", "src")
    t1 = Table(6, "shop", "notes", [col("id", "int(11)", nullable=False), col("body", "text")],
               primary=["id"])
    s1 = evolve(None, t1.info, layout)
    t2 = Table(6, "shop", "notes", [col("id", "int(11)", nullable=False), col("body", "int(11)")],
               primary=["id"], version=2)
    with pytest.raises(UnmappableChange) as e:
        evolve(s1, t2.info, layout, "ALTER TABLE notes MODIFY body INT")
    msg = str(e.value)
    assert "shop.notes" in msg and "body" in msg and "ALTER TABLE notes MODIFY body INT" in msg


def test_the_changelog_view_reads_the_merged_changelog_once_with_a_constant_boundary() -> None:
    """A reader resolves a view's text once but lists each table it names separately: the
    changelog view names the merged changelog once, with the boundary between merged and raw
    batches a constant of its text, so one query can never mix two merge generations (the
    boundary read from the merged files in a second subquery could, and counted batches twice).
    A state written before the boundary was kept loads without it (the views read raw)."""
    layout = Layout("/tmp/x", "sluice", "{schema}", "src")
    t = Table(6, "shop", "orders", [col("id", "int(11)", nullable=False)], primary=["id"])
    st = dataclasses.replace(evolve(None, t.info, layout), base_version=2, base_upto=40,
                             hist_upto=40)
    sql = changelog_sql(st, layout)
    assert sql.count(layout.hist(6)) == 1
    assert "`_batch` <= 40" in sql and "r.`_batch` > 40" in sql and "max(" not in sql
    assert layout.hist(6) not in all_changes_sql(dataclasses.replace(st, hist_upto=0), layout)
    legacy = st.to_json().replace('"hist_upto":40', '"hist":true')
    assert TableState.from_json(legacy).hist_upto == 0
