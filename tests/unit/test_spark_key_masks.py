"""writer.key_masks: which keys a keyed current table must remove before the append of the
batch's last images (docs/spark.md "Current-state methods")."""
from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st_

from sluice.spark_sink import tables as T
from sluice.spark_sink import writer as W
from tests.support.rows import Table, col

KV = Table(7, "s", "t", [col("id", "int(11)", nullable=False), col("v", "int(11)")],
           primary=["id"])
BIN = Table(8, "s", "b", [col("k", "varbinary(8)", nullable=False), col("n", "int(11)"),
                          col("v", "int(11)")], primary=["k", "n"])


def _row(op: str, cts: int, seq: int, *values: Any) -> tuple:
    return (op, cts, seq, 1, None, None, None, None, *values)


def test_a_key_first_inserted_in_the_batch_is_not_removed() -> None:
    """delete marks each key's last change unless the key's first change is an insert: an
    insert, insert-then-update and insert-then-delete are not removed; an update, a delete, a
    snapshot read (an upsert) and a delete-then-insert are; a binary composite key compares
    as bytes."""
    st, _ = T.plan(None, KV.info, "s")
    rows = [_row("c", 1, 0, 1, 1), _row("c", 1, 2, 2, 2), _row("u", 1, 4, 2, 3),
            _row("c", 1, 6, 3, 3), _row("d", 2, 0, 3, 3), _row("u", 2, 2, 4, 4),
            _row("d", 2, 4, 5, 5), _row("r", 3, 0, 6, 6), _row("d", 3, 2, 7, 7),
            _row("c", 3, 4, 7, 8)]
    latest, delete = W.key_masks(st, rows)
    assert latest == [True, False, True, False, True, True, True, True, False, True]
    assert [r[8] for r, d in zip(rows, delete) if d] == [4, 5, 6, 7]
    sb, _ = T.plan(None, BIN.info, "s")
    rows = [_row("c", 1, 0, bytearray(b"a"), 1, 0), _row("u", 1, 2, bytearray(b"a"), 1, 1),
            _row("u", 1, 4, bytearray(b"b"), 1, 1)]
    assert W.key_masks(sb, rows) == ([False, True, True], [False, False, True])


def _apply(table: Counter, rows: list[tuple], latest: list[bool], remove: list[bool]) -> Counter:
    """What the sink does to the current table: remove the marked keys, append the last
    non-delete images."""
    gone = {r[8] for r, m in zip(rows, remove) if m}
    out = Counter({k: n for k, n in table.items() if k[0] not in gone})
    for r, m in zip(rows, latest):
        if m and r[0] != "d":
            out[(r[8], r[9])] += 1
    return out


@settings(max_examples=300, deadline=None)
@given(st_.lists(st_.integers(0, 7), max_size=6, unique=True),
       st_.lists(st_.tuples(st_.integers(0, 4), st_.integers(0, 7), st_.integers(0, 7)),
                 max_size=30))
def test_removing_only_keys_not_inserted_first_keeps_the_source_state(
        start: list[int], steps: list[tuple[int, int, int]]) -> None:
    """For any batch a source with a unique key can produce (inserts of absent keys, updates,
    deletes and key changes of present ones, snapshot reads of any key) on a table equal to the
    source before it, removing the `delete` keys then appending each key's last image leaves
    exactly the source's rows after the batch, each key once."""
    st, _ = T.plan(None, KV.info, "s")
    source = {k: 0 for k in start}
    table = Counter((k, 0) for k in start)
    rows: list[tuple] = []
    seq = 0

    def emit(op: str, k: int, v: int) -> None:
        nonlocal seq
        rows.append(_row(op, 10 + seq // 4, seq % 4 * 2, k, v))
        seq += 1
    for kind, k, x in steps:
        if kind == 0 and k not in source:
            source[k] = x
            emit("c", k, x)
        elif kind == 1 and k in source:
            source[k] = x
            emit("u", k, x)
        elif kind == 2 and k in source:
            emit("d", k, source.pop(k))
        elif kind == 3 and k in source and x not in source:   # key change k -> x
            emit("d", k, source[k])
            source[x] = source.pop(k)
            emit("c", x, source[x])
        elif kind == 4:
            source[k] = x
            emit("r", k, x)
    latest, remove = W.key_masks(st, rows)
    assert _apply(table, rows, latest, remove) == Counter(source.items())
    # Removing every changed key (the sink before the insert-first rule) agrees.
    assert _apply(table, rows, latest, latest) == Counter(source.items())
