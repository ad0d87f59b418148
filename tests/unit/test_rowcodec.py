from __future__ import annotations

import datetime as dt
import decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.core.errors import InvalidArgument
from sluice.core.rowcodec import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    MySQLDateTime,
    datum_to_json,
    datum_to_python,
    key_of,
    python_to_datum,
    row_to_dict,
    unique_keys_of,
)
from sluice.proto import sluice_pb2 as pb

UTC = dt.timezone.utc


def col(name: str, data_type: str, **kw) -> pb.ColumnInfo:
    return pb.ColumnInfo(name=name, data_type=data_type, **kw)


BIGINT = col("i", "bigint")
UBIGINT = col("u", "bigint", unsigned=True)
DOUBLE = col("f", "double")
DECIMAL = col("d", "decimal", precision=65, scale=30)
BLOB = col("b", "blob")
VARCHAR = col("s", "varchar", length=255)
DATE = col("dt", "date")
DATETIME = col("dtm", "datetime", scale=6)
TIMESTAMP = col("ts", "timestamp", scale=6)
TIME = col("t", "time", scale=6)
JSON = col("j", "json")

DIGITS65 = "12345678901234567890123456789012345.678901234567890123456789012345"[:66]

# (datum, column, expected python value, expected JSON value)
CASES = [
    (pb.Datum(null=True), BIGINT, None, None),
    (pb.Datum(int=INT64_MIN), BIGINT, INT64_MIN, INT64_MIN),
    (pb.Datum(int=INT64_MAX), BIGINT, INT64_MAX, INT64_MAX),
    (pb.Datum(int=0), BIGINT, 0, 0),
    (pb.Datum(uint=UINT64_MAX), UBIGINT, UINT64_MAX, UINT64_MAX),
    (pb.Datum(uint=0), UBIGINT, 0, 0),
    (pb.Datum(double=-1.5e308), DOUBLE, -1.5e308, -1.5e308),
    (pb.Datum(double=5e-324), DOUBLE, 5e-324, 5e-324),
    (pb.Datum(decimal=DIGITS65), DECIMAL, decimal.Decimal(DIGITS65), DIGITS65),
    (pb.Datum(decimal="-" + "9" * 65), DECIMAL, decimal.Decimal("-" + "9" * 65), "-" + "9" * 65),
    (pb.Datum(decimal="0.000000000000000000000000000001"), DECIMAL,
     decimal.Decimal("1E-30"), "0.000000000000000000000000000001"),
    (pb.Datum(decimal="1.10"), DECIMAL, decimal.Decimal("1.10"), "1.10"),
    (pb.Datum(bytes=b"\x00\xff\x10"), BLOB, b"\x00\xff\x10", "AP8Q"),
    (pb.Datum(bytes=b""), BLOB, b"", ""),
    (pb.Datum(str="utf8mb4 \U0001F600 ü"), VARCHAR, "utf8mb4 \U0001F600 ü", "utf8mb4 \U0001F600 ü"),
    (pb.Datum(str=""), VARCHAR, "", ""),
    (pb.Datum(datetime=pb.DateTimeValue(year=2024, month=2, day=29)), DATE,
     dt.date(2024, 2, 29), "2024-02-29"),
    (pb.Datum(datetime=pb.DateTimeValue()), DATE, MySQLDateTime(), "0000-00-00"),
    (pb.Datum(datetime=pb.DateTimeValue(year=2020, month=0, day=15)), DATE,
     MySQLDateTime(2020, 0, 15), "2020-00-15"),
    (pb.Datum(datetime=pb.DateTimeValue(year=9999, month=12, day=31, hour=23, minute=59, second=59,
                                        microsecond=999999)), DATETIME,
     dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), "9999-12-31T23:59:59.999999Z"),
    (pb.Datum(datetime=pb.DateTimeValue(year=1970, month=1, day=1, second=1, microsecond=5)),
     TIMESTAMP, dt.datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=UTC), "1970-01-01T00:00:01.000005Z"),
    (pb.Datum(datetime=pb.DateTimeValue()), DATETIME, MySQLDateTime(), "0000-00-00T00:00:00Z"),
    (pb.Datum(datetime=pb.DateTimeValue()), TIMESTAMP, MySQLDateTime(), "0000-00-00T00:00:00Z"),
    (pb.Datum(datetime=pb.DateTimeValue(year=2021, month=6, day=0, hour=10)), DATETIME,
     MySQLDateTime(2021, 6, 0, 10), "2021-06-00T10:00:00.000000Z"),
    (pb.Datum(time=pb.TimeValue(negative=True, hours=838, minutes=59, seconds=59)), TIME,
     -dt.timedelta(hours=838, minutes=59, seconds=59), "-838:59:59.000000"),
    (pb.Datum(time=pb.TimeValue(hours=838, minutes=59, seconds=59)), TIME,
     dt.timedelta(hours=838, minutes=59, seconds=59), "838:59:59.000000"),
    (pb.Datum(time=pb.TimeValue(negative=True, microseconds=1)), TIME,
     -dt.timedelta(microseconds=1), "-00:00:00.000001"),
    (pb.Datum(time=pb.TimeValue(hours=25, minutes=1, seconds=2, microseconds=300000)), TIME,
     dt.timedelta(hours=25, minutes=1, seconds=2, microseconds=300000), "25:01:02.300000"),
    (pb.Datum(time=pb.TimeValue()), TIME, dt.timedelta(0), "00:00:00.000000"),
    (pb.Datum(json='{"a":[1,"\U0001F600"]}'), JSON, '{"a":[1,"\U0001F600"]}', '{"a":[1,"\U0001F600"]}'),
]


@pytest.mark.parametrize("datum,column,value,_json", CASES,
                         ids=[f"{c[1].data_type}-{i}" for i, c in enumerate(CASES)])
def test_every_datum_kind_round_trips_without_loss(datum, column, value, _json):
    """Every Datum kind round-trips without loss: python_to_datum(datum_to_python(d, col), col) == d."""
    got = datum_to_python(datum, column)
    assert got == value
    assert type(got) is type(value)
    assert python_to_datum(got, column) == datum


@pytest.mark.parametrize("datum,column,_value,expected", CASES,
                         ids=[f"{c[1].data_type}-{i}" for i, c in enumerate(CASES)])
def test_json_encoding(datum, column, _value, expected):
    assert datum_to_json(datum, column) == expected


@settings(max_examples=100, deadline=None)
@given(st.one_of(
    st.integers(INT64_MIN, INT64_MAX).map(lambda v: (pb.Datum(int=v), BIGINT)),
    st.integers(0, UINT64_MAX).map(lambda v: (pb.Datum(uint=v), UBIGINT)),
    st.decimals(allow_nan=False, allow_infinity=False, places=20).map(
        lambda v: (pb.Datum(decimal=format(v, "f")), DECIMAL)),
    st.datetimes(timezones=st.just(UTC)).map(lambda v: (python_to_datum(v), DATETIME)),
    st.tuples(st.booleans(), st.integers(0, 838), st.integers(0, 59), st.integers(0, 59),
              st.integers(0, 999999)).filter(lambda t: any(t[1:]) or not t[0]).map(
        lambda t: (pb.Datum(time=pb.TimeValue(negative=t[0], hours=t[1], minutes=t[2], seconds=t[3],
                                              microseconds=t[4])), TIME)),
    st.text().map(lambda v: (pb.Datum(str=v), VARCHAR)),
))
def test_round_trip_property(case):
    datum, column = case
    assert python_to_datum(datum_to_python(datum, column), column) == datum


def test_python_values_without_a_column_pick_the_natural_kind():
    assert python_to_datum(5) == pb.Datum(int=5)
    assert python_to_datum(UINT64_MAX) == pb.Datum(uint=UINT64_MAX)
    assert python_to_datum(True) == pb.Datum(int=1)
    assert python_to_datum(decimal.Decimal("1E+3")) == pb.Datum(decimal="1000")
    assert python_to_datum(dt.date(2000, 1, 2)) == pb.Datum(
        datetime=pb.DateTimeValue(year=2000, month=1, day=2))
    aware = dt.datetime(2000, 1, 1, 2, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert python_to_datum(aware).datetime == pb.DateTimeValue(year=2000, month=1, day=1)
    assert python_to_datum({"a": 1}, JSON) == pb.Datum(json='{"a":1}')
    assert python_to_datum("3.50", DECIMAL) == pb.Datum(decimal="3.50")


@pytest.mark.parametrize("value,column", [
    (UINT64_MAX + 1, None), (INT64_MIN - 1, None), (-1, UBIGINT), (object(), None),
    (decimal.Decimal("NaN"), None), ("abc", DECIMAL),
])
def test_unencodable_values_are_refused(value, column):
    with pytest.raises(InvalidArgument):
        python_to_datum(value, column)


def test_non_finite_double_never_makes_invalid_json():
    assert datum_to_json(pb.Datum(double=float("inf")), DOUBLE) == "inf"
    assert datum_to_json(pb.Datum(double=float("nan")), DOUBLE) == "nan"


TABLE = pb.TableInfo(
    table_id=7, schema_name="shop", table_name="orders", version=3,
    columns=[col("id", "bigint"), col("region", "varchar"), col("old", "int", hidden=True),
             col("email", "varchar", nullable=True), col("note", "text", nullable=True)],
    indexes=[pb.IndexInfo(name="PRIMARY", columns=["id", "region"], primary=True),
             pb.IndexInfo(name="uk_email", columns=["email"], unique=True),
             pb.IndexInfo(name="ix_note", columns=["note"])],
)


def row(*values) -> pb.Row:
    return pb.Row(columns=[python_to_datum(v) for v in values])


def test_row_to_dict_by_name_skipping_hidden_columns():
    full = row(1, "eu", 99, "a@x", b"\x01")
    assert row_to_dict(full, TABLE) == {"id": 1, "region": "eu", "email": "a@x", "note": b"\x01"}
    assert row_to_dict(full, TABLE, json=True) == {"id": 1, "region": "eu", "email": "a@x", "note": "AQ=="}
    # A row may also leave hidden columns out entirely.
    assert row_to_dict(row(1, "eu", "a@x", None), TABLE) == {"id": 1, "region": "eu", "email": "a@x",
                                                              "note": None}
    with pytest.raises(InvalidArgument, match=r"shop\.orders .*has 2 values"):
        row_to_dict(row(1, "eu"), TABLE)


def test_keys():
    r = row(1, "eu", 0, "a@x", "n")
    assert key_of(r, TABLE) == (1, "eu")
    assert unique_keys_of(r, TABLE) == [("PRIMARY", (1, "eu")), ("uk_email", ("a@x",))]
    # NULL in a unique key never conflicts in MySQL, so it is no key at all.
    assert unique_keys_of(row(2, "us", 0, None, "n"), TABLE) == [("PRIMARY", (2, "us"))]
    keyless = pb.TableInfo(table_name="log", columns=[col("msg", "text")])
    assert key_of(row("hi"), keyless) is None
    assert unique_keys_of(row("hi"), keyless) == []
