"""The MySQL sink's statement building (drainer/sql.py: native literals, native/src/sqltext.rs,
and statement heads built once per shape) against the all-Python builder it replaced (kept as
the oracle in tests/support/pysql.py).

Rule: for every batch of row changes, safe mode or not, both builders give the very same
statements, byte for byte, carrying the same changes (`batch_sql`, `ordered_sql`, `row_sql`);
every value is written as the former `literal` wrote it, and a value SQL cannot hold is the same
error with the same message. Covered: the torture values of every Datum kind (integer extremes,
uint64 max, 65-digit decimals, zero dates as text, TIME beyond 24 hours and negative, BIT,
utf8mb4, every escaped character, lone surrogates, NULLs, hidden and generated columns), the
random workload (primary-key changes, unique-key swaps, composite and unique-only identities, a
keyless table), the sysbench shape, and random rows and batches (hypothesis).
"""
from __future__ import annotations

import datetime as dt
import decimal
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sluice_native
from sluice.core.rowcodec import MySQLDateTime
from sluice.drainer import sql
from sluice.drainer.translator import DELETE, INSERT, UPDATE, UPSERT, RowChange, Translator, shape_of
from tests.support import pysql
from tests.support.rows import RandomWorkload, Table, col, history_of, prewrite_value, schema_txn, txn
from tests.support.sysbench_rows import SysbenchWorkload
from tests.unit.test_native_drainer_decode import EXTREMES, HIDDEN, TORTURE


def outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return ("error", type(e), str(e))


def statements(out: list[tuple[str, list[RowChange]]]) -> list[tuple[str, list[int]]]:
    return [(stmt, [id(c) for c in carried]) for stmt, carried in out]


def assert_same_sql(changes: list[RowChange], each_row: bool = True) -> None:
    for safe in (False, True):
        flags = [safe] * len(changes)
        assert outcome(lambda: statements(sql.batch_sql(changes, flags))) == \
            outcome(lambda: statements(pysql.batch_sql(changes, flags)))
        assert outcome(lambda: statements(sql.ordered_sql(changes, flags))) == \
            outcome(lambda: statements(pysql.ordered_sql(changes, flags)))
        for ch in changes if each_row else ():
            assert outcome(lambda: sql.row_sql(ch, safe)) == outcome(lambda: pysql.row_sql(ch, safe))


class Odd(str):
    """A str subclass: the former `literal` refuses it (exact types only); so must the new."""


TORTURE_VALUES: list[Any] = [
    None, 0, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**64), 10**40, True, False,
    "", "plain", "'", '"', "\\", "\x00", "\n", "\r", "\x1a", "a'b\"c\\d\x00e\nf\rg\x1ah",
    "ü'\\😀", "\u2028", "\ud800", "x\udfffy'", "\x7f\x01",
    b"", b"\x00\xff'\\", bytes(range(256)),
    1.5, -0.0, 1e300, 5e-324, 0.1, float("inf"), float("nan"),
    decimal.Decimal("-" + "9" * 35 + "." + "9" * 30), decimal.Decimal("1E-30"), decimal.Decimal("0.000"),
    dt.date(2024, 2, 29), dt.datetime(2024, 1, 2, 3, 4, 5, 6), dt.datetime(2038, 1, 19, 3, 14, 7),
    dt.timedelta(hours=838, minutes=59, seconds=59), -dt.timedelta(microseconds=1),
    dt.timedelta(days=30, microseconds=999999), "0000-00-00", "2020-00-15 01:02:03",
    bytearray(b"ab'"), memoryview(b"\x00z"), Odd("x"), object(), [1], dt.time(1, 2, 3),
]


@pytest.mark.parametrize("value", TORTURE_VALUES, ids=lambda v: f"{type(v).__name__}:{v!r}"[:40])
def test_every_torture_value_is_written_as_the_former_literal_wrote_it(value):
    """Every value becomes the same SQL text as the former literal, or the same error."""
    assert outcome(lambda: sluice_native.sql_list([value], sql.literal)) == \
        outcome(lambda: pysql.literal(value))
    assert outcome(lambda: sluice_native.sql_values([(value, 1), (2, value)], None, sql.literal)) == \
        outcome(lambda: f"({pysql.literal(value)},1),(2,{pysql.literal(value)})")
    assert outcome(lambda: sluice_native.sql_values([(0, value, 1)], [2, 1], sql.literal, False)) == \
        outcome(lambda: f"1,{pysql.literal(value)}")


def test_a_literal_that_is_not_a_str_is_a_type_error_not_a_crash():
    """The Python literal is what the native code defers to; if it misbehaves that is an error."""
    with pytest.raises(TypeError):
        sluice_native.sql_list([1.5], lambda v: 7)
    with pytest.raises(TypeError):
        sluice_native.sql_values([[1, 2]], None, sql.literal)   # rows are tuples
    with pytest.raises(IndexError):
        sluice_native.sql_values([(1,)], [3], sql.literal)


def translated(txns: list, h) -> list[RowChange]:
    tr = Translator()
    return [c for t in txns for c in tr.translate(t, h)]


def test_torture_rows_build_the_same_statements_as_the_former_builder():
    """Inserts, updates (in place, moving the unique key, moving the primary key), deletes and
    snapshot reads of the torture rows: the same statements, safe mode or not."""
    rows = [{k: v for k, v in r.items() if k != "gen"} for r in EXTREMES]
    moved = [{**r, "id": r["id"] + 1 if r["id"] < 2**63 - 1 else 9, "s": None} for r in rows]
    ts = 100
    txns = [schema_txn(ts, TORTURE)]
    for r, m in zip(rows, moved):
        ts += 1
        txns.append(txn(prewrite_value(TORTURE.mutation(TORTURE.insert(**r))), ts))
        ts += 1
        txns.append(txn(prewrite_value(TORTURE.mutation(TORTURE.update(r, {"ti": 1}),
                                                         TORTURE.update({**r, "ti": 1}, m))), ts))
        ts += 1
        txns.append(txn(prewrite_value(TORTURE.mutation(TORTURE.delete(**m))), ts))
        ts += 1
        txns.append(txn(prewrite_value(TORTURE.mutation(TORTURE.read(**r)), snapshot_chunk=True), ts))
    changes = translated(txns, history_of(txns))
    assert len(changes) == 5 * len(rows)
    for i in range(len(changes)):
        assert_same_sql(changes[i:i + 5])
    assert_same_sql(changes)


def test_hidden_and_generated_columns_build_the_same_statements():
    """A version with a hidden column and a generated one: only writable columns are written."""
    r = {k: v for k, v in EXTREMES[0].items() if k not in ("gen", "gone")}
    txns = [schema_txn(10, HIDDEN), txn(prewrite_value(HIDDEN.mutation(
        HIDDEN.insert(**r), HIDDEN.update(r, {"ti": 2}), HIDDEN.delete(**{**r, "ti": 2}))), 11)]
    changes = translated(txns, history_of(txns))
    assert sql.batch_sql(changes[:2], [False] * 2)
    assert_same_sql(changes[:2])
    assert_same_sql(changes)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("keyless", [True, False])
def test_random_workload_batches_build_the_same_statements(seed, keyless):
    """RandomWorkload (pk changes, unique swaps, composite and unique-only identities, keyless)
    cut into worker batches of several sizes: the same statements."""
    wl = RandomWorkload(seed, "db", keys=40, keyless=keyless)
    txns = wl.transactions(300, first_ts=1000)
    changes = translated(txns, history_of(txns))
    for size in (1, 7, 20, 120):
        for i in range(0, len(changes), size):
            assert_same_sql(changes[i:i + size], each_row=size == 1)


def test_sysbench_batches_build_the_same_statements():
    """The sysbench oltp_write_only shape in batches of 20 rows: the same statements."""
    wl = SysbenchWorkload(5, "sb", rows=50)
    txns = wl.transactions(200, first_ts=1000)
    changes = translated(txns, history_of(txns))
    for i in range(0, len(changes), 20):
        assert_same_sql(changes[i:i + 20], each_row=i == 0)


def test_more_rows_than_one_statement_holds_are_split_the_same_way():
    """Past MAX_ROWS_PER_STATEMENT rows a table's DELETE/INSERT/upsert split at the same rows."""
    t = Table(30, "db", "big", [col("id", "int(11)", nullable=False), col("v", "varchar(8)")], ["id"])
    n = sql.MAX_ROWS_PER_STATEMENT + 3
    value = prewrite_value(t.mutation(*[t.insert(id=i, v=f"v{i}") for i in range(n)],
                                      *[t.update({"id": i, "v": "x"}, {"v": "y"}) for i in range(n, 2 * n)],
                                      *[t.delete(id=i, v="z") for i in range(2 * n, 3 * n)]))
    txns = [schema_txn(10, t), txn(value, 11)]
    changes = translated(txns, history_of(txns))
    assert len(sql.batch_sql(changes, [False] * len(changes))) == 6
    assert_same_sql(changes)


# --------------------------------------------------------------------------------------------
# Random rows and batches
# --------------------------------------------------------------------------------------------

SHAPES = {
    "one": shape_of(Table(40, "db", "one", [col("id", "varchar(8)", nullable=False), col("u", "int(11)"),
                                            col("v", "varchar(8)")], ["id"], {"uk_u": ["u"]}).info),
    "two": shape_of(Table(41, "db", "two", [col("a", "int(11)", nullable=False),
                                            col("b", "varchar(8)", nullable=False),
                                            col("v", "varbinary(8)")], ["a", "b"]).info),
    "uniq": shape_of(Table(42, "db", "uniq", [col("k", "int(11)", nullable=True), col("v", "double")],
                           unique={"uk_k": ["k"]}).info),
    "none": shape_of(Table(43, "db", "none", [col("x", "int(11)"), col("y", "varchar(8)")]).info),
}

keys = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "A", "a ", "ä", "b", "\ud800"]))
values = st.one_of(st.none(), st.integers(-(2**64), 2**64), st.text(max_size=6), st.binary(max_size=4),
                   st.floats(allow_nan=False, allow_infinity=False), st.decimals(allow_nan=False, allow_infinity=False),
                   st.dates(), st.booleans())


def _row(draw, name: str) -> tuple:
    if name == "one":
        return (draw(keys), draw(st.one_of(st.none(), st.integers(0, 3))), draw(values))
    if name == "two":
        return (draw(st.integers(0, 2)), draw(keys), draw(values))
    if name == "uniq":
        return (draw(st.one_of(st.none(), st.integers(0, 3))), draw(values))
    return (draw(st.one_of(st.none(), st.integers(0, 2))), draw(values))


@st.composite
def changes_strategy(draw) -> list[RowChange]:
    out = []
    for _ in range(draw(st.integers(1, 25))):
        name = draw(st.sampled_from(sorted(SHAPES)))
        shape = SHAPES[name]
        kind = draw(st.sampled_from([INSERT, UPDATE, DELETE, UPSERT]))
        before = _row(draw, name) if kind in (UPDATE, DELETE) else None
        after = _row(draw, name) if kind in (INSERT, UPDATE, UPSERT) else None
        out.append(RowChange(kind, shape, 1, before, after, ()))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes_strategy())
def test_random_batches_build_the_same_statements_as_the_former_builder(changes):
    """Random batches over identities of one text column, two columns, a nullable unique key
    and none, with keys that fold together: the same statements, or the same error."""
    assert_same_sql(changes)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(values, values, values), max_size=8), st.booleans())
def test_random_rows_are_written_as_the_former_literal_wrote_them(rows, parens):
    """Random values of every kind: sql_values equals the former per-value literals."""
    if parens:
        expect = ",".join("(" + ",".join(pysql.literal(v) for v in r) + ")" for r in rows)
    else:
        expect = ",".join(pysql.literal(v) for r in rows for v in (r[2], r[0]))
    assert outcome(lambda: sluice_native.sql_values(rows, None if parens else [2, 0], sql.literal, parens)) == \
        outcome(lambda: expect)


def test_a_random_mix_of_tables_in_one_batch_keeps_table_name_order():
    """Tables are written in name order in both builders (the old rule, kept)."""
    rng = random.Random(3)
    changes = []
    for _ in range(60):
        name = rng.choice(["one", "two", "uniq"])
        row = {"one": (rng.choice("abc"), rng.randint(0, 5), "v"), "two": (rng.randint(0, 3), "k", b"v"),
               "uniq": (rng.randint(0, 9), 1.5)}[name]
        changes.append(RowChange(INSERT, SHAPES[name], 1, None, row, ()))
    out = sql.batch_sql(changes, [False] * len(changes))
    names = [stmt.split(" INTO ")[1].split(" ")[0] for stmt, _ in out if stmt.startswith("INSERT")]
    assert names == sorted(names)
    assert_same_sql(changes)


def test_literal_of_a_zero_date_text_and_mysql_datetime():
    """Zero dates reach SQL as text (MySQLDateTime is not a literal type: the decoder turns it
    into text first); both builders say so the same way."""
    assert outcome(lambda: sluice_native.sql_list([MySQLDateTime()], sql.literal)) == \
        outcome(lambda: pysql.literal(MySQLDateTime()))
