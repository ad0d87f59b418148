"""The MySQL sink's native causality keys (native/src/causality.rs, ApplyShape.keys) against the
former Python `row_keys` (tests/support/pytranslate.py).

Rule: for every row image the native keys are exactly the strings the Python built — the same
folding of text (ASCII lower case natively; everything else, above all Unicode case folding, by
drainer.translator.fold itself), of ints beyond 64 bits, bools, decimals, floats, bytes, dates,
NULLs — in the same order and with the same de-duplication (an insert's keys once each, an
update's before-image keys then the after-image keys not among them, a delete's as they come).
A mismatch would put two conflicting rows in different workers.
"""
from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.drainer.translator import shape_of
from sluice.proto import sluice_pb2 as pb
from tests.support.pytranslate import row_keys


def info(name: str, cols: list[tuple[str, str, bool]], indexes: list[tuple[str, list[str], bool, bool]]
         ) -> pb.TableInfo:
    return pb.TableInfo(
        table_id=1, schema_name="dß", table_name=name, version=1,
        columns=[pb.ColumnInfo(name=n, data_type=t, nullable=nullable) for n, t, nullable in cols],
        indexes=[pb.IndexInfo(name=i, columns=c, primary=p, unique=u) for i, c, p, u in indexes])


COLS = [("a", "varchar", False), ("b", "varchar", True), ("c", "bigint", True), ("d", "blob", True)]
SHAPES = [
    shape_of(info("pk1", COLS, [("PRIMARY", ["a"], True, True), ("uk_b", ["b"], False, True)])),
    shape_of(info("pk2", COLS, [("PRIMARY", ["a", "c"], True, True), ("uk_bd", ["b", "d"], False, True),
                                ("ix", ["c"], False, False)])),
    # no primary key, a NOT NULL unique key is the identity
    shape_of(info("nn", COLS, [("uk_a", ["a"], False, True), ("uk_c", ["c"], False, True)])),
    # only nullable unique keys: no identity, the full image
    shape_of(info("nullable", COLS, [("uk_b", ["b"], False, True)])),
    shape_of(info("none", COLS, [])),
    # two unique indexes on the same column: keys differ by index name
    shape_of(info("twice", COLS, [("PRIMARY", ["c"], True, True), ("uk_c", ["c"], False, True)])),
]

TORTURE: list[Any] = [
    None, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**70), True, False,
    "", " ", "Abc  ", "ABC", "abc\x00 ", "a\tb ", "ß", "SS", "ẞ", "İ", "ı", "ﬁ", "Σσς", "é", "é",
    "Å", "Ǆ", "ǅ", "ﬀ ", "ü😀 ", "\ud800", "a\udfff", "ΐ", "ᾼ", "Ⅻ", "①", "\u0345", "k", "K",
    b"", b"\x00\xff", b"Ab", decimal.Decimal("1.0"), decimal.Decimal("1.00"), decimal.Decimal("-0.50"),
    decimal.Decimal("1E+3"), 1.0, -0.0, 0.5, float("inf"), float("nan"), dt.date(2024, 2, 29),
    dt.datetime(2020, 1, 2, 3, 4, 5, 6), dt.timedelta(hours=-838), "0000-00-00",
]


def oracle(shape, tp: str, before, after) -> tuple[str, ...]:
    """Translator.translate's former key lists, per kind of change."""
    if tp == "update":
        keys = row_keys(shape, before)
        for k in row_keys(shape, after):
            if k not in keys:
                keys.append(k)
        return tuple(keys)
    if tp == "delete":
        return tuple(row_keys(shape, before))
    return tuple(dict.fromkeys(row_keys(shape, after)))


def check(shape, before: tuple, after: tuple) -> None:
    assert shape.keys.keys(before) == oracle(shape, "delete", before, None)
    assert shape.keys.insert_keys(after) == oracle(shape, "insert", None, after)
    assert shape.keys.update_keys(before, after) == oracle(shape, "update", before, after)


def test_torture_values_give_the_python_keys():
    n = len(TORTURE)
    for shape in SHAPES:
        for i, v in enumerate(TORTURE):
            w = TORTURE[(i * 7 + 3) % n]
            check(shape, (v, w, v, w), (w, v, TORTURE[(i + 1) % n], v))
            check(shape, (v, v, v, v), (v, v, v, v))


def test_case_accent_and_space_variants_share_a_key():
    """The folding itself (a _ci unique index treats these as one value downstream)."""
    shape = SHAPES[0]
    for a, b in [("Abc", "abc  "), ("STRASSE", "straße"), ("Café", "cafe"), ("ﬁ", "FI")]:
        assert shape.keys.keys((a, None, 1, None)) == shape.keys.keys((b, None, 2, None))


values = st.one_of(
    st.none(), st.integers(), st.booleans(), st.text(max_size=6),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=4).map(lambda s: s + " " * 2),
    st.text(alphabet=st.characters(min_codepoint=0xC0, max_codepoint=0x2FFF), max_size=5),
    st.text(alphabet=st.characters(categories=["Lu", "Ll", "Lt", "Mn"]), max_size=5),
    st.binary(max_size=6), st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.floats(), st.dates(), st.sampled_from(TORTURE))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SHAPES), st.tuples(values, values, values, values),
       st.tuples(values, values, values, values))
def test_random_values_give_the_python_keys(shape, before, after):
    check(shape, before, after)
