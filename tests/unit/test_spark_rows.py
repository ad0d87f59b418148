"""The Spark sink's native row path (native/src/sparkrows.rs, through SchemaChanges._buffer_txn)
against the all-Python path it replaced (`Txn.rows` + the generated per-table reader +
`_key_changed`, kept as the oracle in tests/support/pysparkrows.py).

Rule: for every transaction both paths buffer the same tuples, `(_op, _commit_ts, _seq,
_schema_ver, _producer, _pos, _ts_ms, _zero_dates, *values)` per table, with values of the same
Python type and repr (1.0 vs 1.00 decimals, -0.0, NaN, date vs datetime, bytearray, aware UTC
datetimes, SET arrays, zero dates named), the same count and last commit_ts — or both raise the
same error type with the same message (MissingSchema, CorruptTxn, the converters' own errors,
a wrong column count). Covered: every Spark column type with its torture values, UUID / INET /
spatial values as the capture emits them, hidden columns (full and visible-only rows), the sink's
column order differing from the shape's, key-changing updates (a delete and an insert), keyless
tables, snapshot chunks and READs, skipped and dropped tables, and random Datums of every kind in
every column (hypothesis).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import math
from typing import Any

import pytest
import sluice_native
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.core.rowcodec import MySQLDateTime, python_to_datum
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.spark_sink import tables as T
from sluice.spark_sink.config import SparkSinkConfig
from sluice.spark_sink.sink import SparkSink, _Buffer
from tests.support.pyposition import py_format_position
from tests.support.pysparkrows import PyRows
from tests.support.rows import Table, binlogs, col, history_of, prewrite_value, schema_txn

UTC = dt.timezone.utc
TORTURE = Table(7, "db", "torture", [
    col("id", "bigint(20)", nullable=False), col("u", "bigint(20) unsigned"), col("ui", "int(10) unsigned"),
    col("ti", "tinyint(4)"), col("d", "double"), col("f", "float"), col("dec", "decimal(65,30)"),
    col("d10", "decimal(10,2)"), col("b", "varbinary(8)"), col("bl", "blob"), col("s", "varchar(20)"),
    col("day", "date"), col("at", "datetime(6)"), col("ts", "timestamp(3)"), col("t", "time(6)"),
    col("j", "json"), col("e", "enum('x','y')"), col("st", "set('a','b')"), col("b1", "bit(1)"),
    col("b64", "bit(64)"), col("yr", "year(4)"), col("uu", "uuid"), col("i4", "inet4"),
    col("i6", "inet6"), col("pt", "point"), col("g", "geometry"), col("gone", "int(11)"),
    col("gen", "int(11)", generated=True)],
    primary=["id"], unique={"uk_s": ["s"]})
HIDDEN = TORTURE.drop_column("gone")          # version 2: `gone` hidden, rows may carry it or not
KEYLESS = Table(8, "db", "bag", [col("a", "int(11)"), col("s", "varchar(8)")])
OTHER = Table(9, "db", "other", [col("id", "int(11)", nullable=False), col("v", "varchar(8)")],
              primary=["id"])
WKB = bytes.fromhex("0101000000000000000000f03f0000000000000040")   # POINT(1 2)

EXTREMES: list[dict[str, Any]] = [
    dict(id=-(2**63), u=2**64 - 1, ui=2**32 - 1, ti=-128, d=-1.5e300, f=0.5,
         dec=decimal.Decimal("-" + "9" * 35 + "." + "9" * 30), d10=decimal.Decimal("-12345678.90"),
         b=b"\x00\xff'", bl=b"", s="ü'\\😀", day=dt.date(2024, 2, 29), at=dt.datetime(2024, 1, 2, 3, 4, 5, 6),
         ts=dt.datetime(2038, 1, 19, 3, 14, 7, 999000, tzinfo=UTC),
         t=-dt.timedelta(hours=838, minutes=59, seconds=59), j='{"a": [1, "ü"]}', e="y", st="a,b",
         b1=1, b64=2**64 - 1, yr=0, uu=bytes.fromhex("123e4567e89b12d3a456426655440000"),
         i4=bytes([10, 0, 0, 1]), i6=bytes(10) + b"\xff\xff\x01\x02\x03\x04",
         pt=b"\x00\x00\x00\x00" + WKB, g=b"\xe6\x10\x00\x00" + WKB, gone=5, gen=None),
    dict(id=2**63 - 1, u=0, ui=0, ti=127, d=-0.0, f=float("inf"), dec=decimal.Decimal("0.000"),
         d10=decimal.Decimal("0.00"), b=b"", s="", day=MySQLDateTime(), at=MySQLDateTime(2020, 0, 15, 1, 2, 3),
         ts=MySQLDateTime(), t=dt.timedelta(hours=838, minutes=59, seconds=59), j="null", e="x",
         st="", b1=0, b64=0, yr=2155, uu=bytes(16), i4=bytes(4), i6=bytes(16), pt=WKB, g=b"\x01",
         gone=None, gen=7),
    dict(id=3, u=2**63, d=float("nan"), dec=decimal.Decimal("1E-30"), s="x" * 20,
         day=MySQLDateTime(2024, 0, 1), at=MySQLDateTime(2020, 1, 0, 0, 0, 0, 1),
         t=-dt.timedelta(microseconds=1), b64=2**63, i6=bytes.fromhex("20010db8000000000000ff0000428329")),
    dict(id=4, at=MySQLDateTime(2020, 2, 30, 25, 61, 61, 999999), day=MySQLDateTime(2023, 2, 29),
         t=dt.timedelta(days=30, microseconds=999999), dec=decimal.Decimal("-0.5")),
    dict(id=5),                                  # every other column NULL
]
POSITION = pb.Position(file_seq=1, offset=4242, file_name="mysql-bin.000001",
                       gtids=[pb.GtidPos(domain_id=0, server_id=1, seq_no=99)], server_id=1,
                       ts_ms=1_700_000_000_123)


def typed(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, [typed(x) for x in v])
    if isinstance(v, float) and math.isnan(v):
        return ("float", "nan")
    return (type(v).__name__, repr(v))


def outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return ("error", type(e), str(e))


def states_for(*tables: Table, skipped: tuple[int, ...] = (), dropped: tuple[int, ...] = ()
               ) -> dict[int, T.TableState]:
    out = {}
    for t in tables:
        s = T.plan(None, t.info, t.schema)[0]
        out[t.table_id] = dataclasses.replace(s, skipped=t.table_id in skipped,
                                              dropped=t.table_id in dropped)
    return out


def buffered(buf: _Buffer) -> Any:
    return ({tid: [typed(r) for r in rows] for tid, rows in sorted(buf.rows.items())}, buf.count,
            buf.last_ts, bool(buf.first_mono))


def native(t: Txn, h: SchemaHistory, states: dict[int, T.TableState]) -> Any:
    sink = SparkSink(SparkSinkConfig(warehouse="/nonexistent"), h, "test", 1, None, owner="test")
    sink._states = dict(states)

    def run() -> Any:
        sink._buffer_txn(t)
        return buffered(sink._buf)
    return outcome(run)


def oracle(t: Txn, h: SchemaHistory, states: dict[int, T.TableState]) -> Any:
    buf = _Buffer()
    py = PyRows(dict(states), h, buf)

    def run() -> Any:
        py.buffer_txn(t)
        return buffered(buf)
    return outcome(run)


def assert_same(t: Txn, h: SchemaHistory, states: dict[int, T.TableState]) -> Any:
    got, want = native(t, h, states), oracle(t, h, states)
    assert got == want
    return got


def joined(value: pb.PrewriteValue, commit_ts: int = 15, position: pb.Position | None = POSITION,
           producer: str = "cap-1") -> Txn:
    pre, com = binlogs(value, commit_ts - 1, commit_ts, producer=producer, position=position)
    return Txn.from_binlogs(pre, com, pump_id="pump-1")


def history(*tables: Table) -> SchemaHistory:
    return history_of([schema_txn(10, *tables)])


def full_row(table: Table, values: dict[str, Any], hidden: pb.Datum) -> pb.Row:
    out = []
    for c in table.columns:
        out.append(hidden if c.hidden else python_to_datum(values.get(c.name), c))
    return pb.Row(columns=out)


def test_every_type_and_torture_value_lands_as_the_python_path_did() -> None:
    h = history(TORTURE)
    states = states_for(TORTURE)
    first, second = EXTREMES[0], EXTREMES[1]
    changes = [TORTURE.insert(**v) for v in EXTREMES]
    changes += [TORTURE.update(first, {"s": "moved"}), TORTURE.update(first, {"id": 77}),
                TORTURE.update(second, {"d": float("nan")}), TORTURE.delete(**second)]
    src = pb.SourceInfo(name="src", ts_ms=1_600_000_000_000)
    for value in (prewrite_value(TORTURE.mutation(*changes), source=src),
                  prewrite_value(TORTURE.mutation(*changes))):
        for pos, producer in ((POSITION, "cap-1"), (None, "")):
            got = assert_same(joined(value, position=pos, producer=producer), h, states)
            assert got[0] == "ok"
    rows = native(joined(prewrite_value(TORTURE.mutation(*changes))), h, states)[1][0][7]
    ops = [(r[1][0][1], r[1][2][1]) for r in rows]
    # the key-changing update is a delete then an insert (_seq 2n, 2n+1); the others are 'u'
    assert ops[5:] == [("'u'", "10"), ("'d'", "12"), ("'c'", "13"), ("'u'", "14"), ("'d'", "16")]
    zero = rows[1][1][7]
    assert zero == ("list", [("str", "'day'"), ("str", "'at'"), ("str", "'ts'")])


def test_hidden_columns_and_the_sinks_column_order() -> None:
    """Rows carrying the hidden column or only the visible ones; a sink table whose columns
    are in another order than the shape's (or lack one) gets each value in its own column."""
    h = history_of([schema_txn(10, TORTURE), schema_txn(12, HIDDEN)])
    vis = {k: v for k, v in EXTREMES[0].items() if k != "gone"}
    full = full_row(HIDDEN, EXTREMES[0], pb.Datum(int=5))
    value = prewrite_value(HIDDEN.mutation(
        pb.RowChange(tp=pb.INSERT, after=full), HIDDEN.insert(**vis),
        pb.RowChange(tp=pb.UPDATE, before=full, after=HIDDEN.row({**vis, "id": 9})),
        pb.RowChange(tp=pb.DELETE, before=HIDDEN.row(vis))))
    for states in (states_for(HIDDEN), states_for(TORTURE)):   # same order / one more column
        assert assert_same(joined(value), h, states)[0] == "ok"
    shuffled = dataclasses.replace(states_for(HIDDEN)[7], columns=tuple(reversed(states_for(HIDDEN)[7].columns[:-3])))
    assert T.row_index(shuffled, HIDDEN.info) is not None
    assert assert_same(joined(value), h, {7: shuffled})[0] == "ok"


def test_keyless_tables_snapshot_chunks_reads_and_several_tables() -> None:
    h = history(TORTURE, KEYLESS, OTHER)
    states = states_for(TORTURE, KEYLESS, OTHER)
    bag = [KEYLESS.insert(a=1, s="x"), KEYLESS.update({"a": 1, "s": "x"}, {"s": "y"}),
           KEYLESS.update({"a": 1, "s": "x"}, {}), KEYLESS.read(a=2, s=None), KEYLESS.delete(a=1, s="y")]
    other = [OTHER.insert(id=1, v="a"), OTHER.update({"id": 1, "v": "a"}, {"v": "b"})]
    for chunk in (False, True):
        value = prewrite_value(KEYLESS.mutation(*bag), OTHER.mutation(*other),
                               TORTURE.mutation(TORTURE.insert(**EXTREMES[2])), snapshot_chunk=chunk)
        got = assert_same(joined(value), h, states)
        assert got[0] == "ok" and got[1][1] == 9   # 8 changes; the keyless changed update: 'd' + 'c'


def test_skipped_dropped_and_unknown_tables() -> None:
    """A skipped table's changes are left out but still count in `_seq`; a dropped table or one
    without Iceberg tables is an error naming it (unless it has no changes); a table unknown to
    the schema history is MissingSchema."""
    h = history(TORTURE, KEYLESS, OTHER)
    value = prewrite_value(OTHER.mutation(OTHER.insert(id=1, v="a")),
                           KEYLESS.mutation(KEYLESS.insert(a=1), KEYLESS.insert(a=2)),
                           OTHER.mutation(OTHER.insert(id=2, v="b")))
    t = joined(value)
    for states in (states_for(OTHER, KEYLESS, skipped=(8,)), states_for(OTHER, KEYLESS, skipped=(9,)),
                   states_for(OTHER, KEYLESS, dropped=(8,)), states_for(OTHER)):
        assert_same(t, h, states)
    got = native(t, h, states_for(OTHER, KEYLESS, skipped=(8,)))
    assert [r[1][2] for r in got[1][0][9]] == [("int", "0"), ("int", "6")]
    assert native(t, h, states_for(OTHER))[0] == "error"
    empty = joined(prewrite_value(KEYLESS.mutation(), OTHER.mutation(OTHER.insert(id=3))))
    assert assert_same(empty, h, states_for(OTHER))[0] == "ok"
    nothing = joined(prewrite_value(KEYLESS.mutation()))
    assert assert_same(nothing, h, states_for(OTHER)) == ("ok", ({}, 0, 0, False))
    missing = joined(prewrite_value(OTHER.mutation(OTHER.insert(id=1))), commit_ts=9)
    assert "no schema for table id 9" in assert_same(missing, h, states_for(OTHER))[2]


def test_every_error_of_the_python_path_is_raised_with_its_type_and_message() -> None:
    h = history_of([schema_txn(10, TORTURE), schema_txn(12, HIDDEN)])
    states = states_for(HIDDEN)
    bad_rows = [
        pb.RowChange(tp=pb.INSERT),                                    # lacks its after image
        pb.RowChange(tp=pb.UPDATE, after=HIDDEN.row({"id": 1})),       # lacks its before image
        pb.RowChange(tp=9, after=HIDDEN.row({"id": 1})),               # unknown type
        pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(int=1)] * 5)),   # wrong count
        pb.RowChange(tp=pb.DELETE, before=pb.Row(columns=[pb.Datum(int=1)] * 40)),
        pb.RowChange(tp=pb.INSERT, after=HIDDEN.row({"id": 1}))]
    for i, ch in enumerate(bad_rows):
        after = list(HIDDEN.row({"id": 2}).columns)
        odd = [pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=after))]
        if i == len(bad_rows) - 1:      # a converter's own errors: text for a timestamp, etc.
            for k, datum in ((12, pb.Datum(str="x")), (0, pb.Datum(str="12x")),
                             (7, pb.Datum(str="1.2.3")), (13, pb.Datum(datetime=pb.DateTimeValue(month=2**32 - 1))),
                             (0, pb.Datum(double=float("inf"))), (8, pb.Datum(time=pb.TimeValue(hours=1)))):
                cols = list(after)
                cols[k] = datum
                got = assert_same(joined(prewrite_value(HIDDEN.mutation(
                    pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=cols))))), h, states)
                assert got[0] == "error", (k, got)
            continue
        got = assert_same(joined(prewrite_value(HIDDEN.mutation(*odd, ch))), h, states)
        assert got[0] == "error", (i, got)


def test_a_transaction_is_buffered_whole_or_not_at_all() -> None:
    """Rows of a transaction decoded before one of its rows fails leave the buffer: what was
    buffered before the transaction stays as it was."""
    h = history(OTHER, KEYLESS)
    sink = SparkSink(SparkSinkConfig(warehouse="/nonexistent"), h, "test", 1, None, owner="test")
    sink._states = states_for(OTHER, KEYLESS)
    sink._buffer_txn(joined(prewrite_value(OTHER.mutation(OTHER.insert(id=1, v="a"))), commit_ts=14))
    before = buffered(sink._buf)
    bad = prewrite_value(OTHER.mutation(OTHER.insert(id=2, v="b")), KEYLESS.mutation(KEYLESS.insert(a=1)),
                         OTHER.mutation(OTHER.insert(id=3, v="c"),
                                        pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(int=1)] * 3))))
    with pytest.raises(Exception, match="has 3 values for 2 columns"):
        sink._buffer_txn(joined(bad))
    assert buffered(sink._buf) == before and sorted(sink._buf.rows) == [9]


values = st.one_of(
    st.none(), st.just(pb.Datum()), st.integers(-(2**63), 2**63 - 1).map(lambda v: pb.Datum(int=v)),
    st.integers(0, 2**64 - 1).map(lambda v: pb.Datum(uint=v)),
    st.floats(allow_nan=True).map(lambda v: pb.Datum(double=v)),
    st.decimals(allow_nan=False, allow_infinity=False).map(lambda v: pb.Datum(decimal=str(v))),
    st.sampled_from(["1e3", "-0", "x", "12", " 7 "]).map(lambda v: pb.Datum(decimal=v)),
    st.binary(max_size=20).map(lambda v: pb.Datum(bytes=v)), st.text(max_size=8).map(lambda v: pb.Datum(str=v)),
    st.sampled_from(["12", "-3", "1.5", "a,b", "2024-01-02"]).map(lambda v: pb.Datum(str=v)),
    st.text(max_size=8).map(lambda v: pb.Datum(json=v)),
    st.builds(pb.DateTimeValue, year=st.integers(-3, 10001), month=st.integers(0, 13), day=st.integers(0, 32),
              hour=st.integers(0, 25), minute=st.integers(0, 61), second=st.integers(0, 61),
              microsecond=st.integers(0, 1_000_001)).map(lambda v: pb.Datum(datetime=v)),
    st.builds(pb.TimeValue, negative=st.booleans(), hours=st.integers(0, 900), minutes=st.integers(0, 99),
              seconds=st.integers(0, 99), microseconds=st.integers(0, 2_000_000)).map(lambda v: pb.Datum(time=v)),
)


def datum(v: pb.Datum | None) -> pb.Datum:
    return pb.Datum(null=True) if v is None else v


RANDOM_HISTORY = history_of([schema_txn(10, TORTURE), schema_txn(12, HIDDEN)])
RANDOM_STATES = states_for(HIDDEN)


@pytest.mark.timeout(300)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([pb.INSERT, pb.UPDATE, pb.DELETE, pb.READ]),
                          st.lists(values, min_size=len(HIDDEN.columns), max_size=len(HIDDEN.columns)),
                          st.booleans(), st.integers(0, 3)), min_size=1, max_size=4),
       st.booleans(), st.booleans())
def test_random_datums_in_random_columns_buffer_as_the_python_path_did(changes: Any, snapshot_chunk: bool,
                                                                       keyless: bool) -> None:
    """Any Datum kind in any column (the converters' other kinds, their errors, zero dates),
    full and visible-only rows, updates keeping or changing the key, keyed or keyless state."""
    h, states = RANDOM_HISTORY, RANDOM_STATES
    if keyless:
        states = {7: dataclasses.replace(states[7], key=())}
    out = []
    for tp, vals, full, same in changes:
        cols = [datum(v) for v in vals]
        if not full:
            cols = [d for d, c in zip(cols, HIDDEN.columns) if not c.hidden]
        before = pb.Row(columns=cols)
        after = pb.Row(columns=cols)
        if same == 1:       # the key (id) changes, or (keyless) any column
            k = before.columns[0].int
            # another int64 (the largest one has no successor)
            after.columns[0].CopyFrom(pb.Datum(int=k + 1 if k < (1 << 63) - 1 else k - 1))
        elif same == 2:     # another column changes
            after.columns[3].CopyFrom(pb.Datum(str="other"))
        ch = pb.RowChange(tp=tp)
        if tp in (pb.UPDATE, pb.DELETE):
            ch.before.CopyFrom(before)
        if tp != pb.DELETE:
            ch.after.CopyFrom(after)
        out.append(ch)
    assert_same(joined(prewrite_value(HIDDEN.mutation(*out), snapshot_chunk=snapshot_chunk)), h, states)


_names = st.sampled_from(["", "mysql-bin.000042", "mysql-bin.000001", "x", "bin.7", "a.b.000042", ".5",
                          "7", "mysql-bin.999999999999999999999999", "bin.7\n", "bin.\u0663", "ü.1"])


@settings(max_examples=300, deadline=None)
@given(st.builds(pb.Position, file_seq=st.sampled_from([0, 1, 7, 42, 5, 2**64 - 1]),
                 offset=st.sampled_from([0, 4, 4242, 2**64 - 1]), file_name=_names,
                 sub_seq=st.sampled_from([0, 1, 2**64 - 1]),
                 gtids=st.lists(st.builds(pb.GtidPos, domain_id=st.sampled_from([0, 1, 2**32 - 1]),
                                          server_id=st.sampled_from([0, 1, 2**32 - 1]),
                                          seq_no=st.sampled_from([0, 99, 2**64 - 1])), max_size=3),
                 mysql_gtid_set=st.sampled_from(["", "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5"]),
                 server_id=st.sampled_from([0, 1, 2**32 - 1]),
                 ts_ms=st.sampled_from([0, -1, 1_700_000_000_123, -(2**63)]),
                 generation=st.sampled_from([0, 2, 2**32 - 1])))
def test_pos_column_text_is_what_format_position_writes(pos: pb.Position) -> None:
    """The `_pos` text written natively from a Position's bytes is the former formatter's, or
    None (then the sink calls format_position) for what only Python writes."""
    text = sluice_native.position_text(pos.SerializeToString())
    if text is None:
        assert pos.mysql_gtid_set or any(ord(ch) > 127 or ch == "\n" for ch in pos.file_name)
    else:
        assert text == py_format_position(pos)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("keyless", [False, True])
def test_random_workload_buffers_as_the_python_path_did(keyless: bool) -> None:
    """RandomWorkload's transactions (inserts, updates, deletes, key changes, every Datum kind,
    with a keyless table) buffer the same tuples on both paths, transaction by transaction."""
    from tests.support.rows import RandomWorkload
    w = RandomWorkload(seed=8, schema="shop", keys=200, max_rows=4, keyless=keyless)
    txns = w.transactions(600, 1 << 40)
    h = history_of(txns)
    states = states_for(*w.tables)
    sink = SparkSink(SparkSinkConfig(warehouse="/nonexistent"), h, "test", 1, None, owner="test")
    sink._states = dict(states)
    buf = _Buffer()
    py = PyRows(dict(states), h, buf)
    for t in txns:
        if t.prewrite.mutations:
            sink._buffer_txn(t)
            py.buffer_txn(t)
    assert buffered(sink._buf)[:3] == buffered(buf)[:3] and sink._buf.count > 600
