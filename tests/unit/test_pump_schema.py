"""Schema pins: which transactions carry schema, how GC keeps them, and the preamble read."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from sluice.core.errors import OutOfRange
from sluice.proto import sluice_pb2 as pb
from sluice.pump.storage.gc import retained_pins
from sluice.pump.storage.schema import multipart_schema_tables, schema_tables
from sluice.pump.storage.storage import Storage, StorageOptions
from tests.unit.test_pump_reader import decode_chunk
from tests.unit.test_storage import cm, fk, pw


def _rows(table_id: int, n: int) -> pb.TableMutation:
    return pb.TableMutation(table_id=table_id, schema_name="db", table_name=f"t{table_id}",
                            changes=[pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[
                                pb.Datum(int=i), pb.Datum(str="x" * 40)])) for i in range(n)])


def _value(ddl_table: int = 0, snapshot_tables: tuple[int, ...] = (), rows: int = 0) -> bytes:
    pv = pb.PrewriteValue(schema_version=3)
    if rows:
        pv.mutations.append(_rows(99, rows))
    if ddl_table:
        pv.ddl.CopyFrom(pb.DDL(tp=pb.CREATE_TABLE, table_id=ddl_table, schema_name="db",
                               table_name=f"t{ddl_table}", query="create table ..."))
    for t in snapshot_tables:
        pv.schema_snapshots.append(pb.TableInfo(table_id=t, schema_name="db", table_name=f"t{t}",
                                                columns=[pb.ColumnInfo(name="a")]))
    if rows:
        pv.mutations.append(_rows(98, rows))
    return pv.SerializeToString()


def _split(value: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(c % (len(value) + 1) for c in cuts)), len(value)]
    return [value[a:b] for a, b in zip(bounds, bounds[1:])]


def _parts_of(value: bytes, start_ts: int, cuts: list[int]) -> list[bytes]:
    chunks = _split(value, cuts)
    return [pw(start_ts, c, part_no=i, part_count=len(chunks)) for i, c in enumerate(chunks)]


def _in_memory(parts: list[bytes]) -> list[tuple]:
    return [(lambda off, n, b=p: b[off:off + n], len(p)) for p in parts]


@settings(max_examples=60, deadline=None)
@given(hst.integers(0, 3), hst.lists(hst.integers(1, 5), max_size=3, unique=True),
       hst.integers(0, 30), hst.lists(hst.integers(0, 1 << 20), max_size=6))
def test_every_declared_table_is_found_however_the_value_is_split(
        ddl: int, snaps: list[int], rows: int, cuts: list[int]) -> None:
    """Every table whose shape a transaction declares — a `ddl` (field 3) or a
    `schema_snapshots` entry (field 4) of its PrewriteValue, whether the value is stored in one
    part or split over the parts of a multi-part prewrite — is reported."""
    snaps = [10 + s for s in snaps]
    value = _value(ddl, tuple(snaps), rows)
    want = set(([ddl] if ddl else []) + snaps)
    assert set(schema_tables(value)) == want
    assert set(multipart_schema_tables(_in_memory(_parts_of(value, 5, cuts)))) == want


def test_garbage_values_are_not_pinned() -> None:
    junk = [pw(5, bytes(200), part_no=0, part_count=2), pw(5, b"\xff" * 50, part_no=1,
                                                         part_count=2)]
    assert multipart_schema_tables(_in_memory(junk)) == ()
    assert schema_tables(b"\x00\x01garbage") == ()


def test_retained_pins_keep_the_latest_at_or_below_safe_and_all_later() -> None:
    pins = {1: ((10, frozenset({1})), (20, frozenset({2})), (30, frozenset({3}))),
            2: ((40, frozenset({4})),)}
    kept, dropped = retained_pins(pins, 25)
    assert kept == {1: ((20, frozenset({2})), (30, frozenset({3}))),
                    2: ((40, frozenset({4})),)}
    assert dropped == [(1, 10)]
    assert retained_pins(pins, 5) == (pins, [])


def _storage(path: Path) -> Storage:
    # segment_size=1: every record in a segment of its own, so GC can delete around pins
    return Storage.open(path, StorageOptions(segment_size=1))


def preamble(st: Storage, after: int) -> list[pb.Binlog]:
    reader = st.open_schema_reader(after)
    out: list[pb.Binlog] = []
    while True:
        chunk = reader.next_chunk(1 << 20)
        assert chunk.covered == after
        out += decode_chunk(chunk.frames)
        if chunk.exhausted:
            return out


def test_multi_part_schema_transactions_are_pinned_across_restart_and_gc(tmp_path: Path) -> None:
    value = _value(ddl_table=7, snapshot_tables=(8,), rows=200)
    parts = _parts_of(value, 10, [len(value) // 3, 2 * len(value) // 3])
    random.Random(1).shuffle(parts)          # parts may arrive in any order
    with _storage(tmp_path) as st:
        for p in parts:
            st.write_blocking([p])
        st.write_blocking([fk(11)])
    with _storage(tmp_path) as st:           # the commit comes after a restart
        st.write_blocking([cm(10, 12)])
        for s in range(20, 30, 2):
            st.write_blocking([pw(s, _value(rows=5)), cm(s, s + 1)])
        st.write_blocking([fk(40)])
        assert st.schema_commits(100) == [12]
        stats = asyncio.run(st.gc(35))
        assert stats.gc_ts == 35 and len(stats.deleted_segments) >= 10
        assert len(stats.kept_schema_segments) == 4, "all three parts and the commit stay"
        got = preamble(st, 35)
        assert [(b.tp, b.part_no) for b in got] == [(pb.PREWRITE, 0), (pb.PREWRITE, 1),
                                                    (pb.PREWRITE, 2), (pb.COMMIT, 0)]
        joined = b"".join(b.prewrite_value for b in got if b.tp == pb.PREWRITE)
        assert joined == value


def test_gc_keeps_the_schema_a_reader_at_the_gc_ts_needs(tmp_path: Path) -> None:
    """For every table, the latest schema transaction at or below the safe ts and every later
    one stay pinned; older ones are released."""
    with _storage(tmp_path) as st:
        st.write_blocking([pw(10, _value(ddl_table=7)), cm(10, 11)])   # v1 of table 7
        st.write_blocking([pw(12, _value(ddl_table=8)), cm(12, 13)])   # table 8
        st.write_blocking([pw(14, _value(ddl_table=7)), cm(14, 15)])   # v2 of table 7
        st.write_blocking([pw(16, _value(ddl_table=7)), cm(16, 40)])   # v3, long transaction
        st.write_blocking([fk(50)])
        assert st.schema_commits(12) == [11]
        assert st.schema_commits(20) == [13, 15]
        assert st.schema_commits(45) == [13, 40]
        stats = asyncio.run(st.gc(20))
        # v1's segments are free (v2 is at or below 20); v2 and table 8 stay; v3 is above.
        assert {11} & set(st.schema_commits(100)) == set()
        assert stats.deleted_segments == (1, 2), stats
        assert [b.start_ts for b in preamble(st, 20)] == [12, 12, 14, 14]
        assert [b.start_ts for b in preamble(st, 45)] == [12, 12, 16, 16]
        with pytest.raises(OutOfRange):
            preamble(st, 19)   # below the GC ts: refused like any read
    with _storage(tmp_path) as st:
        assert st.schema_commits(45) == [13, 40], "pins survive a restart"
        assert [b.start_ts for b in preamble(st, 20)] == [12, 12, 14, 14]
