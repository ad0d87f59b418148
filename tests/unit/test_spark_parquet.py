"""spark_sink/parquet.py: a batch's files written by pyarrow hold every Spark type the sink maps
MySQL columns to, under their names, and a retried batch replaces its earlier attempt.

(That Spark reads them back as the catalog's types is stated end to end by
tests/integration/test_spark_sink.py, whose workload carries every Datum kind.)"""
from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import parquet
from sluice.spark_sink.tables import META_COLUMNS
from sluice.spark_sink.types import spark_type

UTC = dt.timezone.utc


def test_every_spark_type_the_sink_maps_to_has_an_arrow_type() -> None:
    mysql = ["tinyint", "smallint", "mediumint", "int", "bigint", "year", "bit", "float", "double",
             "decimal", "datetime", "timestamp", "date", "char", "varchar", "text", "enum", "set",
             "json", "time", "binary", "blob", "geometry"]
    types = {spark_type(pb.ColumnInfo(name="c", data_type=t, unsigned=u, precision=p, scale=2,
                                      length=64 if t == "bit" and u else 1))
             for t in mysql for u in (False, True) for p in (10, 65)}
    types |= {t for _, t in META_COLUMNS}
    for t in sorted(types):
        assert parquet.arrow_type(t) is not None, t
    assert parquet.arrow_type("DECIMAL(20,0)") == pa.decimal128(20, 0)
    assert parquet.arrow_type("TIMESTAMP") == pa.timestamp("us", tz="UTC")
    with pytest.raises(ValueError, match="no Arrow type for Spark type 'INTERVAL'"):
        parquet.arrow_type("INTERVAL")


def test_rows_round_trip_and_a_retry_replaces_the_earlier_attempt(tmp_path: Path) -> None:
    cols = [("_op", "STRING"), ("_zero_dates", "ARRAY<STRING>"), ("i8", "TINYINT"),
            ("i64", "BIGINT"), ("d", "DECIMAL(20,0)"), ("x", "DOUBLE"), ("b", "BINARY"),
            ("ts", "TIMESTAMP"), ("day", "DATE")]
    schema = parquet.arrow_schema(cols)
    rows = [("c", None, -128, 2**63 - 1, decimal.Decimal(2**64 - 1), 1.5, bytearray(b"\x00\xff"),
             dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC), dt.date(1000, 1, 1)),
            ("d", ["day"], None, None, None, None, None, None, None)]
    where = tmp_path / "raw" / "e1" / "b7"
    parquet.write_rows(f"file:{where}", schema, [rows[0]] * 3)   # an attempt that crashed
    parquet.write_rows(str(where), schema, rows)
    files = sorted(p.name for p in where.iterdir())
    assert files == ["part-00000.snappy.parquet"]
    got = pq.read_table(where)
    assert got.schema.names == [n for n, _ in cols]
    assert [tuple(r.values()) for r in got.to_pylist()] == [
        tuple(bytes(v) if isinstance(v, bytearray) else v for v in r) for r in rows]
    assert got.schema.field("ts").type == pa.timestamp("us", tz="UTC")
