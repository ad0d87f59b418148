"""The drainer's native Prewrite decode (native/src/prewrite.rs, through Translator.translate)
against the all-Python path it replaced (`Txn.rows` + `decode_row`, kept as the oracle in
tests/support/pytranslate.py).

Rule: for every transaction both paths give the same row changes — same kinds, tables, and
values of the same Python type and repr (so 1.0 vs 1.00 decimals, -0.0, NaN, date vs datetime
differ) — or both raise the same error type with the same message. Covered: every Datum kind,
the torture values (integer extremes, uint64 max, 65-digit decimals, zero dates and zero parts,
TIME -838:59:59, BIT widths, utf8mb4, NULLs, hidden and generated columns), snapshot chunks,
malformed changes, and random rows (hypothesis, RandomWorkload). Malformed bytes are a named
error (CorruptTxn / sluice_native.DecodeError), never a crash or a silent None.
"""
from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sluice_native
from sluice.core.rowcodec import MySQLDateTime
from sluice.drainer.translator import Translator
from sluice.drainer.txn import CorruptTxn, SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb
from tests.support import pytranslate
from tests.support.rows import (RandomWorkload, Table, binlogs, col, history_of, prewrite_value,
                                schema_txn, txn)

TORTURE = Table(7, "db", "torture", [
    col("id", "bigint(20)", nullable=False), col("u", "bigint(20) unsigned"), col("ti", "tinyint(4)"),
    col("d", "double"), col("f", "float"), col("dec", "decimal(65,30)"), col("dec0", "decimal(65,0)"),
    col("b", "varbinary(8)"), col("s", "varchar(20)"), col("day", "date"), col("at", "datetime(6)"),
    col("ts", "timestamp(3)"), col("t", "time(6)"), col("j", "json"), col("e", "enum('x','y')"),
    col("st", "set('a','b')"), col("b1", "bit(1)"), col("b12", "bit(12)"), col("b64", "bit(64)"),
    col("yr", "year(4)"), col("gone", "int(11)"), col("gen", "int(11)", generated=True)],
    primary=["id"], unique={"uk_s": ["s"]})
HIDDEN = TORTURE.drop_column("gone")          # version 2: `gone` hidden, rows may carry it or not

EXTREMES: list[dict[str, Any]] = [
    dict(id=-(2**63), u=2**64 - 1, ti=-128, d=-1.5e300, f=0.5,
         dec=decimal.Decimal("-" + "9" * 35 + "." + "9" * 30), dec0=decimal.Decimal("9" * 65),
         b=b"\x00\xff'", s="ü'\\😀", day=dt.date(2024, 2, 29), at=dt.datetime(2024, 1, 2, 3, 4, 5, 6),
         ts=dt.datetime(2038, 1, 19, 3, 14, 7, 999000, tzinfo=dt.timezone.utc),
         t=-dt.timedelta(hours=838, minutes=59, seconds=59), j='{"a": [1, "ü"]}', e="y", st="a,b",
         b1=1, b12=0xABC, b64=2**64 - 1, yr=0, gone=5, gen=None),
    dict(id=2**63 - 1, u=0, ti=127, d=-0.0, f=float("inf"), dec=decimal.Decimal("0.000"),
         dec0=decimal.Decimal("-1"), b=b"", s="", day=MySQLDateTime(), at=MySQLDateTime(2020, 0, 15, 1, 2, 3),
         ts=MySQLDateTime(), t=dt.timedelta(hours=838, minutes=59, seconds=59), j="null", e="x",
         st="", b1=0, b12=0, b64=0, yr=2155, gone=None, gen=7),
    dict(id=3, u=2**63, d=float("nan"), dec=decimal.Decimal("1E-30"), s="x" * 20,
         day=MySQLDateTime(2024, 0, 1), at=MySQLDateTime(2020, 1, 0, 0, 0, 0, 1),
         t=-dt.timedelta(microseconds=1), b12=1, b64=2**63),
    dict(id=4, at=MySQLDateTime(2020, 2, 30, 25, 61, 61, 999999), day=MySQLDateTime(2023, 2, 29),
         t=dt.timedelta(days=30, microseconds=999999), dec=decimal.Decimal("-0.5")),
    dict(id=5),                                  # every other column NULL
]


def typed(v: Any) -> Any:
    if isinstance(v, tuple):
        return tuple(typed(x) for x in v)
    if isinstance(v, float) and math.isnan(v):
        return ("float", "nan")
    return (type(v).__name__, repr(v))


def outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return ("error", type(e), str(e))


def native(t: Txn, h: SchemaHistory) -> Any:
    return [(c.kind, c.shape.sql_name, typed(c.before), typed(c.after), c.keys)
            for c in Translator().translate(t, h)]


def oracle(t: Txn, h: SchemaHistory) -> Any:
    return [(k, name, typed(b), typed(a), keys) for k, name, b, a, keys in pytranslate.translate_values(t, h)]


def assert_same(t: Txn, h: SchemaHistory) -> Any:
    got, want = outcome(lambda: native(t, h)), outcome(lambda: oracle(t, h))
    assert got == want
    return got


def history() -> SchemaHistory:
    return history_of([schema_txn(10, TORTURE), txn(prewrite_value(ddl=HIDDEN.alter_ddl()), 20)])


def full_row(table: Table, values: dict[str, Any], hidden: pb.Datum) -> pb.Row:
    """A row carrying the hidden columns' datums too (an image written before the DROP)."""
    vis = iter(table.row(values).columns)
    return pb.Row(columns=[hidden if c.hidden else next(vis) for c in table.columns])


# ------------------------------------------------------------------------------------------------
# torture values
# ------------------------------------------------------------------------------------------------

def test_every_datum_kind_and_torture_value_decodes_as_the_python_path_did():
    """Integer extremes, uint64 max, 65-digit decimals, zero dates and zero parts, TIME
    -838:59:59, BIT widths, utf8mb4, NULLs, generated columns: same values, same types."""
    h = history()
    changes = [TORTURE.insert(**r) for r in EXTREMES]
    changes += [TORTURE.update(EXTREMES[0], {"id": 9, "s": "ß"}), TORTURE.delete(**EXTREMES[1]),
                TORTURE.read(**EXTREMES[2])]
    got = assert_same(txn(prewrite_value(TORTURE.mutation(*changes)), 15), h)
    assert got[0] == "ok" and len(got[1]) == len(changes)
    # Spot checks that the comparison is about the documented values, not two equal mistakes.
    [ins] = Translator().translate(txn(prewrite_value(TORTURE.mutation(TORTURE.insert(**EXTREMES[1]))), 15), h)
    assert ins.after[9:13] == ("0000-00-00", "2020-00-15 01:02:03.000000", "0000-00-00 00:00:00.000000",
                               dt.timedelta(hours=838, minutes=59, seconds=59))
    [ins0] = Translator().translate(txn(prewrite_value(TORTURE.mutation(TORTURE.insert(**EXTREMES[0]))), 15), h)
    assert ins0.after[12] == -dt.timedelta(hours=838, minutes=59, seconds=59)
    assert ins0.after[16:19] == (1, 0xABC, 2**64 - 1) and ins0.after[1] == 2**64 - 1
    assert type(ins0.after[9]) is dt.date and ins0.after[11].tzinfo is None


def test_hidden_columns_are_dropped_whether_the_row_carries_them_or_not():
    """A row of the full width (hidden datums included) and one of the visible width decode to
    the same visible values; the snapshot chunk's inserts are upserts."""
    h = history()
    vis = {k: v for k, v in EXTREMES[0].items() if k != "gone"}
    changes = [pb.RowChange(tp=pb.INSERT, after=full_row(HIDDEN, vis, pb.Datum(int=99))),
               HIDDEN.insert(**vis),
               pb.RowChange(tp=pb.UPDATE, before=full_row(HIDDEN, vis, pb.Datum(null=True)),
                            after=HIDDEN.row(dict(vis, id=8))),
               pb.RowChange(tp=pb.DELETE, before=full_row(HIDDEN, vis, pb.Datum(str="x")))]
    got = assert_same(txn(prewrite_value(HIDDEN.mutation(*changes)), 25), h)
    assert got[0] == "ok" and got[1][0][3] == got[1][1][3] and len(got[1][0][3]) == len(HIDDEN.visible)
    chunk = assert_same(txn(prewrite_value(HIDDEN.mutation(HIDDEN.insert(**vis)), snapshot_chunk=True), 26), h)
    assert chunk[1][0][0] == "upsert"


RAW_DATUMS = [
    pb.Datum(), pb.Datum(null=True), pb.Datum(null=False), pb.Datum(int=0), pb.Datum(uint=0),
    pb.Datum(double=0.0), pb.Datum(decimal="1.50"), pb.Datum(decimal=" 7 "), pb.Datum(decimal="NaN"),
    pb.Datum(bytes=b""), pb.Datum(bytes=b"\x01" * 9), pb.Datum(str=""), pb.Datum(json="[]"),
    pb.Datum(datetime=pb.DateTimeValue()), pb.Datum(datetime=pb.DateTimeValue(year=-5, month=13, day=40)),
    pb.Datum(datetime=pb.DateTimeValue(year=10000, month=1, day=1)),
    pb.Datum(datetime=pb.DateTimeValue(year=2024, month=2, day=29, hour=24)),
    pb.Datum(datetime=pb.DateTimeValue(year=2024, month=1, day=1, microsecond=1_000_000)),
    pb.Datum(time=pb.TimeValue()), pb.Datum(time=pb.TimeValue(negative=True)),
    pb.Datum(time=pb.TimeValue(hours=4_000_000_000, minutes=99, seconds=99, microseconds=4_000_000_000)),
    pb.Datum(time=pb.TimeValue(negative=True, microseconds=1)),
]


@pytest.mark.parametrize("column", ["u", "d", "dec", "b", "s", "day", "at", "t", "j", "b12", "b64"])
def test_raw_datums_of_any_kind_in_any_column_decode_as_the_python_path_did(column):
    """Datums as a producer could write them, whatever the column's type: empty, explicit null,
    kinds the column would not get, out-of-range dates and parts (text), BIT wider than 8 bytes,
    TIME parts beyond their ranges — same value or same error as the Python path."""
    h = history()
    base = TORTURE.row({"id": 1})
    pos = [c.name for c in TORTURE.visible].index(column)
    changes = []
    for d in RAW_DATUMS:
        row = pb.Row()
        row.CopyFrom(base)
        row.columns[pos].CopyFrom(d)
        changes.append(pb.RowChange(tp=pb.INSERT, after=row))
    for c in changes:
        assert_same(txn(prewrite_value(TORTURE.mutation(c)), 15), h)


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------

def test_every_error_of_the_python_path_is_raised_with_its_type_and_message():
    """CorruptTxn for a change lacking its image or of unknown type (row numbers count across
    mutations, op r in a snapshot chunk), the codec's InvalidArgument for a wrong column count
    and for undecodable decimal text, MissingSchema for an unknown table — in the old order."""
    h = history()
    ok = TORTURE.mutation(TORTURE.insert(id=1), TORTURE.insert(id=2))
    row = TORTURE.row({"id": 1})
    short = pb.Row(columns=list(row.columns)[:3])
    bad_dec = pb.Row()
    bad_dec.CopyFrom(row)
    bad_dec.columns[5].CopyFrom(pb.Datum(decimal="12x"))
    stranger = Table(404, "db", "ghost", [col("id", "int(11)")], ["id"])
    cases = [
        [ok, TORTURE.mutation(pb.RowChange(tp=pb.INSERT))],
        [ok, TORTURE.mutation(pb.RowChange(tp=pb.READ))],
        [TORTURE.mutation(pb.RowChange(tp=pb.UPDATE, after=row))],
        [TORTURE.mutation(pb.RowChange(tp=pb.UPDATE, before=row))],
        [TORTURE.mutation(pb.RowChange(tp=pb.DELETE, after=row))],
        [TORTURE.mutation(pb.RowChange(tp=7, after=row))],
        [TORTURE.mutation(pb.RowChange(tp=pb.MUTATION_TYPE_UNSPECIFIED, after=row))],
        [TORTURE.mutation(pb.RowChange(tp=pb.INSERT, after=short))],
        [TORTURE.mutation(pb.RowChange(tp=pb.DELETE, before=pb.Row()))],
        [TORTURE.mutation(pb.RowChange(tp=pb.INSERT, after=bad_dec))],
        [stranger.mutation(stranger.insert(id=1))],
        # order: a bad row before an unknown table / a lacking image still reports those first
        [TORTURE.mutation(pb.RowChange(tp=pb.INSERT, after=short)), stranger.mutation(stranger.insert(id=1))],
        [TORTURE.mutation(pb.RowChange(tp=pb.INSERT, after=bad_dec)), TORTURE.mutation(pb.RowChange(tp=pb.DELETE))],
    ]
    seen = set()
    for muts in cases:
        for snapshot_chunk in (False, True):
            got = assert_same(txn(prewrite_value(*muts, snapshot_chunk=snapshot_chunk), 15), h)
            assert got[0] == "error", muts
            seen.add(got[1].__name__)
    assert seen == {"CorruptTxn", "InvalidArgument", "MissingSchema"}
    got = outcome(lambda: native(txn(prewrite_value(ok, TORTURE.mutation(pb.RowChange(tp=pb.DELETE)),
                                                    snapshot_chunk=True), 15), h))
    assert got[0] == "error" and "op d row #2 of table id 7 lacks its before image" in got[2]


def test_malformed_payload_bytes_are_a_named_error_never_a_crash():
    """Bytes that are not a PrewriteValue: the walk and the decoder raise DecodeError naming the
    byte, and the translator turns it into CorruptTxn naming the transaction."""
    h = history()
    good = prewrite_value(TORTURE.mutation(TORTURE.insert(**EXTREMES[0]))).SerializeToString()
    nested = b"\x0b" * 200_000      # start-group tags without end: bounded, not a stack overflow
    for bad in (b"\x12", b"\x12\x05\x08", b"\x12\x02\x2a\x09", b"\x0f", b"\x12\x01\x80", good[:-3], nested):
        with pytest.raises(sluice_native.DecodeError, match="undecodable"):
            snapshot, muts = sluice_native.prewrite_mutations(bad)
            for _, _, _, _, start, end, _, _ in muts:
                Translator().shape(h.table_at(7, 15)).decoder.decode(bad, start, end)
    t0 = txn(prewrite_value(TORTURE.mutation(TORTURE.insert(id=1))), 15)
    # Bytes the join never let through (it checks them, tests/unit/test_txn_lazy.py): set by
    # hand, to prove the walk's own refusal still names the transaction.
    corrupt = t0.with_prewrite(t0.prewrite)
    corrupt._payload = good[:-3]
    with pytest.raises(CorruptTxn, match="start_ts 14, commit_ts 15.*undecodable"):
        Translator().translate(corrupt, h)
    # A datetime part beyond a C int: the old path's bare OverflowError is now a named error.
    huge = pb.Row()
    huge.CopyFrom(TORTURE.row({"id": 1}))
    huge.columns[10].CopyFrom(pb.Datum(datetime=pb.DateTimeValue(year=2020, month=1, day=1,
                                                                 microsecond=3_000_000_000)))
    t = txn(prewrite_value(TORTURE.mutation(pb.RowChange(tp=pb.INSERT, after=huge))), 15)
    with pytest.raises(OverflowError):
        oracle(t, h)
    with pytest.raises(CorruptTxn, match="db.torture .*part beyond 2147483647: 2020-1-1 0:0:0.3000000000"):
        Translator().translate(t, h)


def test_a_transaction_rebuilt_with_another_prewrite_decodes_that_prewrite():
    """The table filter replaces a Txn's PrewriteValue (Txn.with_prewrite): the native decode
    then reads the new message's rows, never the bytes the old one was parsed from."""
    h = history_of([schema_txn(10, TORTURE, KEEP)])
    t = txn(prewrite_value(TORTURE.mutation(TORTURE.insert(id=1)), KEEP.mutation(KEEP.insert(id=2)),
                           TORTURE.mutation(TORTURE.delete(id=3))), 15)
    kept = pb.PrewriteValue()
    kept.CopyFrom(t.prewrite)
    del kept.mutations[:]
    kept.mutations.append(t.prewrite.mutations[1])
    filtered = t.with_prewrite(kept)
    got = assert_same(filtered, h)
    assert got[0] == "ok" and [(k, name) for k, name, *_ in got[1]] == [("insert", "`db`.`keep`")]
    assert len(Translator().translate(t, h)) == 3


KEEP = Table(8, "db", "keep", [col("id", "int(11)", nullable=False)], ["id"])


def test_a_prewrite_in_several_parts_decodes_from_the_joined_bytes():
    """A huge transaction's prewrite arrives in parts (any order); the native decode reads the
    joined PrewriteValue exactly as the Python path reads the parsed one."""
    h = history()
    value = prewrite_value(*(TORTURE.mutation(TORTURE.insert(**dict(r, id=i * 10 + j)))
                             for i in range(4) for j, r in enumerate(EXTREMES)))
    prewrites, commit = binlogs(value, 14, 15, parts=5)
    t = Txn.from_binlogs(list(reversed(prewrites)), commit, pump_id="pump-1")
    got = assert_same(t, h)
    assert got[0] == "ok" and len(got[1]) == 4 * len(EXTREMES)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=64))
def test_random_bytes_never_crash_the_native_walk_or_decoder(data):
    """Whatever the bytes, the native side returns or raises one of its named errors."""
    decoder = sluice_native.MutationDecoder(4, [0, 2, 3], [0, 1, 2])
    for target in (lambda: sluice_native.prewrite_mutations(data), lambda: decoder.decode(data, 0, len(data))):
        try:
            target()
        except (sluice_native.DecodeError, sluice_native.ColumnCountError, sluice_native.DecimalTextError):
            pass


# ------------------------------------------------------------------------------------------------
# random rows
# ------------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_random_workload_transactions_decode_as_the_python_path_did(seed):
    """RandomWorkload (inserts, updates, deletes, key changes over four tables, every Datum
    kind): the whole translation — kinds, tables, values, causality keys — is the old one's."""
    wl = RandomWorkload(seed, "rnd", keys=40, max_rows=6)
    txns = wl.transactions(25, 100)
    h = history_of(txns[:1])
    for t in txns[1:]:
        assert_same(t, h)


values = st.one_of(
    st.none(), st.integers(-(2**63), 2**63 - 1).map(lambda v: pb.Datum(int=v)),
    st.integers(0, 2**64 - 1).map(lambda v: pb.Datum(uint=v)),
    st.floats(allow_nan=True).map(lambda v: pb.Datum(double=v)),
    st.decimals(allow_nan=False, allow_infinity=False).map(lambda v: pb.Datum(decimal=str(v))),
    st.binary(max_size=12).map(lambda v: pb.Datum(bytes=v)), st.text(max_size=8).map(lambda v: pb.Datum(str=v)),
    st.text(max_size=8).map(lambda v: pb.Datum(json=v)),
    st.builds(pb.DateTimeValue, year=st.integers(-3, 10001), month=st.integers(0, 13), day=st.integers(0, 32),
              hour=st.integers(0, 25), minute=st.integers(0, 61), second=st.integers(0, 61),
              microsecond=st.integers(0, 1_000_001)).map(lambda v: pb.Datum(datetime=v)),
    st.builds(pb.TimeValue, negative=st.booleans(), hours=st.integers(0, 2**32 - 1), minutes=st.integers(0, 99),
              seconds=st.integers(0, 99), microseconds=st.integers(0, 2**32 - 1)).map(lambda v: pb.Datum(time=v)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([pb.INSERT, pb.UPDATE, pb.DELETE, pb.READ]),
                          st.lists(values, min_size=len(HIDDEN.columns), max_size=len(HIDDEN.columns)),
                          st.booleans()), min_size=1, max_size=4), st.booleans())
def test_random_datums_in_random_columns_decode_as_the_python_path_did(changes, snapshot_chunk):
    """Any Datum kind in any column of the torture table (hidden column included or not)."""
    h = history()
    out = []
    for tp, datums, full in changes:
        cols = [d if d is not None else pb.Datum(null=True) for d in datums]
        if not full:
            cols = [d for d, c in zip(cols, HIDDEN.columns) if not c.hidden]
        row = pb.Row(columns=cols)
        out.append(pb.RowChange(tp=tp, before=row if tp in (pb.UPDATE, pb.DELETE) else None,
                                after=row if tp != pb.DELETE else None))
    assert_same(txn(prewrite_value(HIDDEN.mutation(*out), snapshot_chunk=snapshot_chunk), 25), h)
