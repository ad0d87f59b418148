"""A producer's binlogs built as wire bytes (client/binlogs.py, capture/writer.py).

Rule: the PREWRITE and COMMIT bytes the capture writes for a group are exactly the bytes the
former message path (pb.Binlog with a pb.Position copied per pump transaction; the oracle in
tests/support/pywriter.py) serialized — on torture positions (several GTID domains, 64-bit
extremes, sub_seq of snapshot chunks, non-ASCII file names, generations of a rewind), snapshot
progress recorded at the carrying transaction's position, multi-table statements (sub_seq per
pump transaction), empty transactions, any producer id and epoch — and each COMMIT repeats its
PREWRITE's producer, epoch, position, snapshot progress and ts_ms.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.capture.assembler import SourceTxn
from sluice.capture.payload import RowsMutation
from sluice.capture.writer import group_prewrites, pump_txns, stamped
from sluice.client import binlogs
from sluice.proto import sluice_pb2 as pb
from tests.support import pywriter

U32, U64, I64 = (1 << 32) - 1, (1 << 64) - 1, (1 << 63) - 1


def txn(pos: pb.Position, snapshot: pb.SnapshotProgress | None, kind: str) -> SourceTxn:
    """A source transaction of one `kind`: "rows" (one pump transaction), "tables" (a statement
    on three tables: three pump transactions at one position, the schema snapshot with the
    first), "empty" (filtered out: only its position goes on)."""
    mutations: tuple[RowsMutation, ...] = ()
    ddls: tuple[pb.DDL, ...] = ()
    snaps: tuple[pb.TableInfo, ...] = ()
    if kind == "rows":
        m = RowsMutation(7, "d", "t", 2)
        m.add(b"\x2a\x02\x08\x01", 1)
        m.add(b"\x2a\x00" * 100, 100)
        mutations = (m,)
    elif kind == "tables":
        ddls = tuple(pb.DDL(tp=pb.DROP_TABLE, schema_name="d", table_name=t,
                            query="DROP TABLE a, b, ü") for t in ("a", "b", "ü"))
        snaps = (pb.TableInfo(table_id=9, schema_name="d", table_name="a", version=1),)
    return SourceTxn(position=pos, gtid="0-1-99", server_id=1, ts_ms=1_700_000_000_000,
                     file=pos.file_name, offset=pos.offset, mutations=mutations,
                     schema_snapshots=snaps, ddls=ddls, size=10, snapshot=snapshot)


def position(file_seq: int = 0, offset: int = 0, sub_seq: int = 0, file_name: str = "",
             gtids: tuple[tuple[int, int, int], ...] = (), mysql_gtid_set: str = "",
             ts_ms: int = 0, server_id: int = 0, generation: int = 0) -> pb.Position:
    p = pb.Position(file_seq=file_seq, offset=offset, sub_seq=sub_seq, file_name=file_name,
                    mysql_gtid_set=mysql_gtid_set, ts_ms=ts_ms, server_id=server_id,
                    generation=generation)
    for d, s, n in gtids:
        p.gtids.add(domain_id=d, server_id=s, seq_no=n)
    return p


TORTURE = [
    position(),
    position(file_seq=1, offset=4),
    position(file_seq=U64, offset=U64, sub_seq=U64 - 8, file_name="mariadb-bin.000042",
             gtids=((0, 1, 99), (1, 2, 5), (U32, U32, U64)), ts_ms=I64, server_id=U32),
    position(file_seq=7, offset=1 << 40, sub_seq=(1 << 32) + 3, file_name="bín-lög.ñ✓",
             gtids=((0, 0, 0),), ts_ms=-1, server_id=1),
    position(file_seq=3, offset=127, file_name="x" * 300, gtids=tuple((d, d + 1, d * 1000)
                                                                        for d in range(20))),
    position(file_seq=2, offset=128, mysql_gtid_set="3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5",
             ts_ms=1_700_000_000_000, server_id=128, generation=3),
]


def progress(recorded: pb.Position | None = None, **fields: object) -> pb.SnapshotProgress:
    p = pb.SnapshotProgress(**fields)  # type: ignore[arg-type]
    if recorded is not None:
        p.recorded_at.CopyFrom(recorded)
    return p


SNAPSHOTS = [
    None,
    progress(),
    progress(snapshot_id="s-1", tables=["d.t", "d.ü"], current_table="d.ü", chunks_done=U64,
             rows_done=12, finished=False, paused=True, mode="read-only",
             additional_conditions=["d.t\tWHERE id > 5"]),
    progress(position(file_seq=1, offset=9, generation=2), snapshot_id="old", finished=True),
]


def old_and_new(group: list[SourceTxn], producer_id: str, epoch: int, generation: int,
                first_start: int, now_ms: int, commit_ts: int
                ) -> tuple[list[bytes], list[bytes], list[binlogs.Encoded], list[binlogs.Encoded]]:
    old_p = pywriter.prewrites(pywriter.pump_txns(group, "src"), producer_id, epoch, generation,
                               first_start, now_ms)
    old_c = pywriter.commits(old_p, commit_ts)
    new_p = group_prewrites(pump_txns(group, "src", generation),
                            binlogs.identity(producer_id, epoch), first_start, now_ms)
    new_c = [binlogs.commit_of(p, commit_ts + i) for i, p in enumerate(new_p)]
    return ([b.SerializeToString() for b in old_p], [b.SerializeToString() for b in old_c],
            new_p, new_c)


def check(group: list[SourceTxn], producer_id: str = "capture-1", epoch: int = 3,
          generation: int = 0, first_start: int = 1 << 50, now_ms: int = 1_700_000_000_123,
          commit_ts: int = (1 << 50) + 1000) -> None:
    old_p, old_c, new_p, new_c = old_and_new(group, producer_id, epoch, generation, first_start,
                                             now_ms, commit_ts)
    assert [e.raw for e in new_p] == old_p
    assert [e.raw for e in new_c] == old_c
    for i, (p, c) in enumerate(zip(new_p, new_c)):
        assert (p.tp, p.start_ts, p.commit_ts) == (pb.PREWRITE, first_start + i, 0)
        assert (c.tp, c.start_ts, c.commit_ts) == (pb.COMMIT, first_start + i, commit_ts + i)
        assert binlogs.encode(pb.Binlog.FromString(c.raw)).raw == c.raw


def test_torture_positions_and_snapshot_progress_give_the_old_paths_bytes() -> None:
    """Every torture position, with and without snapshot progress, with a multi-table statement
    (three pump transactions at one position), an empty transaction inside and one at the end
    of the group, and with or without a rewind's generation: the same bytes as the old path."""
    for generation in (0, 1, U32):
        for pos in TORTURE:
            for snap in SNAPSHOTS:
                group = [txn(pos, snap, "rows"),
                         txn(pos, None, "tables"),
                         txn(pos, None, "empty"),
                         txn(TORTURE[2], snap, "rows"),
                         txn(pos, snap, "tables"),
                         txn(TORTURE[1], None, "empty")]
                check(group, generation=generation)
    # producer ids and epochs at their edges
    for producer_id, epoch in (("", 0), ("ü-capture", I64), ("p" * 200, 1)):
        check([txn(TORTURE[2], SNAPSHOTS[2], "rows")], producer_id, epoch)


def test_the_source_transaction_is_left_as_it_was() -> None:
    """Building the bytes does not change the reader's position or snapshot progress objects
    (the snapshotter and the lag still read them)."""
    pos, snap = position(file_seq=1, offset=4, gtids=((0, 1, 2),)), progress(snapshot_id="s")
    before = (pos.SerializeToString(), snap.SerializeToString())
    pump_txns([txn(pos, snap, "tables"), txn(pos, None, "rows")], "src", generation=5)
    assert (pos.SerializeToString(), snap.SerializeToString()) == before


def test_a_stamped_item_matches_the_old_write_items() -> None:
    """An item written outside a group (the declaration of seeded tables) gets the generation
    on its position and, only when set, on its progress's recorded_at — as write_items did."""
    for generation, value in ((0, b"val"), (9, b"val"), (9, b"")):
        for snap in SNAPSHOTS:
            pos = position(file_seq=4, offset=44, gtids=((0, 1, 2),))
            item = stamped(value, pos, snap, generation)
            old_pos, old_snap = pb.Position(), None
            old_pos.CopyFrom(pos)
            if snap is not None:
                old_snap = pb.SnapshotProgress()
                old_snap.CopyFrom(snap)
            old = pywriter.prewrites([(value, old_pos, old_snap)], "p", 1, generation, 10, 20)
            new = group_prewrites([item], binlogs.identity("p", 1), 10, 20)
            assert new[0].raw == old[0].SerializeToString()


def test_message_binlogs_pass_through_unchanged() -> None:
    """A message binlog (applications, rollbacks) is its own serialization; the COMMIT of a
    message prewrite repeats its fields as the old path did."""
    p = pb.Binlog(tp=pb.PREWRITE, start_ts=5, prewrite_value=b"x", producer_id="app",
                  producer_epoch=2, position=TORTURE[3], ts_ms=77)
    e = binlogs.encode(p)
    assert (e.tp, e.start_ts, e.commit_ts, e.raw) == (pb.PREWRITE, 5, 0, p.SerializeToString())
    assert binlogs.encode(e) is e
    assert binlogs.commit_of(e, 9).raw == pywriter.commits([p], 9)[0].SerializeToString()


_u32 = st.integers(0, U32)
_u64 = st.integers(0, U64)
_i64 = st.integers(-(1 << 63), I64)
_text = st.text(max_size=20)
_positions = st.builds(
    position, file_seq=_u64, offset=_u64, sub_seq=st.integers(0, U64 - 8), file_name=_text,
    gtids=st.lists(st.tuples(_u32, _u32, _u64), max_size=4).map(tuple), mysql_gtid_set=_text,
    ts_ms=_i64, server_id=_u32, generation=st.one_of(st.just(0), _u32))
_progress = st.one_of(st.none(), st.builds(
    progress, st.one_of(st.none(), _positions), snapshot_id=_text,
    tables=st.lists(_text, max_size=3), current_table=_text, chunks_done=_u64, rows_done=_u64,
    finished=st.booleans(), paused=st.booleans(), mode=_text))
_txns = st.builds(txn, _positions, _progress, st.sampled_from(["rows", "tables", "empty"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group=st.lists(_txns, min_size=1, max_size=6), producer_id=_text,
       epoch=st.integers(0, I64), generation=st.one_of(st.just(0), _u32),
       first_start=st.integers(1, 1 << 62), now_ms=_i64, commit_ts=st.integers(1, 1 << 62))
def test_random_groups_give_the_old_paths_bytes(group: list[SourceTxn], producer_id: str,
                                                 epoch: int, generation: int, first_start: int,
                                                 now_ms: int, commit_ts: int) -> None:
    """Random groups (any position, progress, values, producer, epoch, generation, timestamps):
    PREWRITE and COMMIT bytes equal to the old message path's."""
    check(group, producer_id, epoch, generation, first_start, now_ms, commit_ts)


@settings(max_examples=500, deadline=None)
@given(n=st.one_of(st.integers(-(1 << 63), U64), st.integers(0, 1 << 15), st.just(1 << 50)))
def test_int_field_is_the_key_and_the_varint(n: int) -> None:
    """core/wire.int_field (its high varint bytes cached) is the key byte then the value's
    varint (a negative int64 as its 64-bit two's complement), and nothing for 0 — also for the
    neighbours of a value seen before."""
    from sluice.core.wire import int_field, varint
    for m in (n, n + 1, n + 128):
        if m > U64:
            continue
        assert int_field(0x10, m) == (bytes((0x10,)) + varint(m & U64) if m else b"")
