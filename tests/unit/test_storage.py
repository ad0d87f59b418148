"""The pump storage facade: write rules, atomic batches, recovery, GC, reads."""
from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from sluice.core.errors import (AlreadyExists, CorruptRecord, FailedPrecondition,
                                InvalidArgument, OutOfRange, ResourceExhausted, SluiceError,
                                StaleEpoch)
from sluice.proto import sluice_pb2 as pb
from sluice.pump.storage.storage import Storage, StorageOptions
from sluice.pump.storage.vlog import encode_record


def pw(start_ts: int, value: bytes = b"v", part_no: int = 0, part_count: int = 0,
       producer: str = "", epoch: int = 0, ddl_table: int = 0) -> bytes:
    if ddl_table:
        value = pb.PrewriteValue(ddl=pb.DDL(tp=pb.CREATE_TABLE, table_id=ddl_table,
                                            query="create table t (a int)")).SerializeToString()
    return pb.Binlog(tp=pb.PREWRITE, start_ts=start_ts, prewrite_value=value, part_no=part_no,
                     part_count=part_count, producer_id=producer,
                     producer_epoch=epoch).SerializeToString()


def cm(start_ts: int, commit_ts: int, producer: str = "", epoch: int = 0,
       offset: int | None = None, snapshot: str = "") -> bytes:
    b = pb.Binlog(tp=pb.COMMIT, start_ts=start_ts, commit_ts=commit_ts, producer_id=producer,
                  producer_epoch=epoch)
    if offset is not None:
        b.position.CopyFrom(pb.Position(file_seq=1, offset=offset))
    if snapshot:
        b.snapshot.CopyFrom(pb.SnapshotProgress(snapshot_id=snapshot, chunks_done=3))
    return b.SerializeToString()


def rb(start_ts: int) -> bytes:
    return pb.Binlog(tp=pb.ROLLBACK, start_ts=start_ts).SerializeToString()


def fk(ts: int) -> bytes:
    return pb.Binlog(tp=pb.FAKE, start_ts=ts, commit_ts=ts).SerializeToString()


def served(st: Storage, after: int = 0) -> list[tuple[int, int, int]]:
    """(commit_ts, type, start_ts) of everything iter_committed yields."""
    out = []
    for commit_ts, payload in st.iter_committed(after):
        b = pb.Binlog.FromString(payload)
        out.append((commit_ts, b.tp, b.start_ts))
    return out


def state(st: Storage) -> tuple:
    return (list(st._db.iterator()), st._vlog.end, st.served_watermark,
            dict(st._sorter.pending))


@pytest.fixture
def st(tmp_path: Path):
    s = Storage.open(tmp_path / "pump", StorageOptions(segment_size=1 << 20))
    yield s
    s.close()


def test_write_join_and_commit_order(st: Storage) -> None:
    assert st.write_blocking([pw(5), pw(7)]) == 0
    assert st.write_blocking([cm(7, 9)]) == 4
    assert served(st) == [], "9 waits for the unresolved prewrite 5"
    assert st.write_blocking([cm(5, 10), fk(12)]) == 12
    assert served(st) == [(9, pb.PREWRITE, 7), (9, pb.COMMIT, 7), (10, pb.PREWRITE, 5),
                          (10, pb.COMMIT, 5), (12, pb.FAKE, 12)]
    assert served(st, after=9) == served(st)[2:]
    assert st.max_commit_ts == 12
    assert st.get_commit(7) == (pb.TXN_COMMITTED, 9)
    assert st.get_commit(8) == (pb.TXN_NOT_FOUND, 0)


def test_identical_retry_is_stored_once(st: Storage) -> None:
    st.write_blocking([pw(5, b"a")])
    st.write_blocking([pw(5, b"a")])
    st.write_blocking([cm(5, 6)])
    before = state(st)
    assert st.write_blocking([pw(5, b"a"), cm(5, 6)]) == 6
    assert state(st)[:2] == before[:2], "a retry stores nothing"
    assert served(st) == [(6, pb.PREWRITE, 5), (6, pb.COMMIT, 5)]


def test_different_content_under_a_used_start_ts_already_exists(st: Storage) -> None:
    st.write_blocking([pw(5, b"a")])
    with pytest.raises(AlreadyExists):
        st.write_blocking([pw(5, b"b")])
    st.write_blocking([cm(5, 6)])
    with pytest.raises(AlreadyExists, match="commit_ts=6"):
        st.write_blocking([cm(5, 7)])
    st.write_blocking([pw(3)])
    with pytest.raises(AlreadyExists, match="another transaction"):
        st.write_blocking([cm(3, 6)])
    with pytest.raises(AlreadyExists):
        st.write_blocking([rb(5)])


def test_rule_violations_have_their_status(st: Storage) -> None:
    with pytest.raises(FailedPrecondition, match="without its prewrite"):
        st.write_blocking([cm(5, 6)])
    with pytest.raises(FailedPrecondition, match="without its prewrite"):
        st.write_blocking([rb(5)])
    st.write_blocking([fk(100)])
    st.write_blocking([pw(50)])
    with pytest.raises(FailedPrecondition, match="served watermark"):
        st.write_blocking([cm(50, 99)])
    with pytest.raises(InvalidArgument, match="commit_ts 50 <= start_ts 50"):
        st.write_blocking([cm(50, 50)])
    with pytest.raises(InvalidArgument, match="malformed"):
        st.write_blocking([b"\xff\xff\xff"])
    with pytest.raises(InvalidArgument, match="unknown binlog type"):
        st.write_blocking([pb.Binlog(tp=9, start_ts=3).SerializeToString()])
    with pytest.raises(InvalidArgument, match="start_ts 0"):
        st.write_blocking([pw(0)])
    with pytest.raises(InvalidArgument, match="start_ts -3"):
        st.write_blocking([pw(-3)])
    with pytest.raises(InvalidArgument, match="part_no 2 >= part_count 2"):
        st.write_blocking([pw(60, part_no=2, part_count=2)])
    with pytest.raises(InvalidArgument, match="start_ts == commit_ts"):
        st.write_blocking([pb.Binlog(tp=pb.FAKE, start_ts=200, commit_ts=201)
                           .SerializeToString()])
    st.write_blocking([pw(70, part_no=0, part_count=2)])
    with pytest.raises(FailedPrecondition, match="before all parts"):
        st.write_blocking([cm(70, 300)])
    with pytest.raises(AlreadyExists, match="part_count"):
        st.write_blocking([pw(70, part_no=1, part_count=3)])


def test_oversized_binlog_tells_the_producer_to_split(tmp_path: Path) -> None:
    with Storage.open(tmp_path, StorageOptions(max_binlog_size=1000)) as st:
        with pytest.raises(InvalidArgument, match="split the prewrite into parts"):
            st.write_blocking([pw(5, b"x" * 2000)])


def test_in_flight_budget_answers_resource_exhausted(tmp_path: Path) -> None:
    with Storage.open(tmp_path, StorageOptions(max_inflight_bytes=1000)) as st:
        with pytest.raises(ResourceExhausted, match="budget"):
            st.write_blocking([pw(5, b"x" * 600), pw(6, b"x" * 600)])
        assert st.write_blocking([pw(5, b"x" * 600)]) == 0
        assert st.stats()["inflight_bytes"] == 0


def test_low_disk_guard_refuses_writes_and_reads_continue(tmp_path: Path) -> None:
    """Below stop-write-at-available-space only new PREWRITEs (and empty probe writes) are
    refused: COMMITs, ROLLBACKs and FAKEs still land, so this pump's transactions resolve and its
    watermark keeps moving instead of stalling every drainer's merge; a restarted producer can
    still record its epoch (GetProducerPosition), so it recovers and fences older epochs."""
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5), cm(5, 6), pw(8)])
    free = psutil.disk_usage(str(tmp_path)).free
    with Storage.open(tmp_path, StorageOptions(stop_write_at_available_space=free + (1 << 40))
                      ) as st:
        with pytest.raises(ResourceExhausted, match="stop-write-at-available-space"):
            st.write_blocking([pw(7)])
        with pytest.raises(ResourceExhausted):
            st.write_blocking([])                      # a producer's probe: "not here"
        with pytest.raises(ResourceExhausted):
            st.write_blocking([cm(8, 9), pw(9)])       # a batch with a prewrite in it
        assert st.get_commit(8)[0] != pb.TXN_COMMITTED
        asyncio.run(st.write([fk(10)]))
        st.write_blocking([cm(8, 12)])
        assert st.get_commit(8) == (pb.TXN_COMMITTED, 12)
        assert asyncio.run(st.record_producer_epoch("cap", 3))[2] == 3
        assert served(st) == [(6, pb.PREWRITE, 5), (6, pb.COMMIT, 5), (10, pb.FAKE, 10),
                              (12, pb.PREWRITE, 8), (12, pb.COMMIT, 8)]


def test_a_batch_is_atomic_all_or_none(st: Storage) -> None:
    st.write_blocking([pw(1), cm(1, 2)])
    before = state(st)
    for bad in (cm(99, 100), b"garbage\xff", pw(1, b"other"), pw(-1)):
        with pytest.raises(SluiceError):
            st.write_blocking([pw(10), pw(11, part_no=0, part_count=2), cm(10, 12), bad])
        assert state(st) == before
        assert st.get_commit(10) == (pb.TXN_NOT_FOUND, 0)


def test_a_bad_request_fails_alone_in_its_group(st: Storage) -> None:
    async def main() -> list:
        # Hold the committer so that the four writes queue up and form one group.
        hold = asyncio.ensure_future(st._call(lambda: time.sleep(0.3)))
        await asyncio.sleep(0.05)
        groups = st.stats()["groups"]
        results = await asyncio.gather(
            st.write([pw(10)]), st.write([pw(11), cm(11, 12)]), st.write([cm(55, 56)]),
            st.write([pw(13)]), return_exceptions=True)
        await hold
        assert st.stats()["groups"] == groups + 1
        return results
    results = asyncio.run(main())
    assert isinstance(results[2], FailedPrecondition)
    assert all(isinstance(r, int) for i, r in enumerate(results) if i != 2)
    assert {u.start_ts for u in st.unresolved()} == {10, 13}
    assert st.get_commit(11) == (pb.TXN_COMMITTED, 12)


def test_producer_epoch_and_position(st: Storage) -> None:
    async def main() -> None:
        assert await st.record_producer_epoch("cap", 3) == (None, None, 3)
        with pytest.raises(StaleEpoch):
            await st.write([pw(5, producer="cap", epoch=2)])
        await st.write([pw(5, producer="cap", epoch=3)])
        await st.write([cm(5, 6, producer="cap", epoch=3, offset=400, snapshot="s1")])
        await st.write([pw(7, producer="cap", epoch=3), cm(7, 8, producer="cap", epoch=3,
                                                             offset=500)])
        pos, snap, epoch = await st.record_producer_epoch("cap", 4)
        assert (pos.offset, snap.snapshot_id, snap.chunks_done, epoch) == (500, "s1", 3, 4)
        with pytest.raises(StaleEpoch):
            await st.record_producer_epoch("cap", 3)
        with pytest.raises(StaleEpoch):
            await st.write([pw(9, producer="cap", epoch=3)])
    asyncio.run(main())


def test_resolve_unresolved_and_get_commit(st: Storage) -> None:
    async def main() -> None:
        await st.write([pw(5, producer="cap"), pw(6), pw(8, part_count=2)])
        assert st.get_commit(5) == (pb.TXN_UNKNOWN, 0)
        assert [u.start_ts for u in st.unresolved()] == [5, 6, 8]
        assert st.unresolved(older_than_s=3600) == []
        assert st.unresolved()[0].producer_id == "cap"
        await st.resolve(5, 10)
        await st.resolve(6, None)
        await st.resolve(8, None)  # an incomplete multi-part prewrite can be rolled back
        assert await st.resolve(6, None) == 10, "the same decision again is OK"
        with pytest.raises(AlreadyExists):
            await st.resolve(5, 11)
    asyncio.run(main())
    assert st.get_commit(5) == (pb.TXN_COMMITTED, 10)
    assert st.get_commit(6) == (pb.TXN_ROLLED_BACK, 0)
    assert st.unresolved() == []
    assert served(st) == [(10, pb.PREWRITE, 5), (10, pb.COMMIT, 5)]
    with pytest.raises(AlreadyExists, match="rolled back"):
        st.write_blocking([pw(8, part_no=1, part_count=2)])


def test_listener_and_read_committed(st: Storage) -> None:
    seen: list[int] = []
    st.add_listener(seen.append)
    for s in range(10, 20, 2):
        st.write_blocking([pw(s, b"x" * 100), cm(s, s + 1)])
    assert seen == [11, 13, 15, 17, 19]
    out, covered = st.read_committed(0, max_bytes=100)
    assert len(out) == 2 and covered == 11, "stops at a transaction boundary"
    out, covered = st.read_committed(11, max_bytes=1)
    assert len(out) == 2 and covered == 13, "always at least one whole transaction"
    out, covered = st.read_committed(13, max_bytes=1 << 20)
    assert len(out) == 6 and covered == 19
    assert st.read_committed(19, 100) == ([], 19)


def test_recovery_keeps_state_and_drops_unindexed_tail(tmp_path: Path) -> None:
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5), pw(7), cm(7, 9), pw(20, part_no=0, part_count=2)])
        st.write_blocking([cm(5, 10)])
        end = st._vlog.end
        expected = served(st)
    seg = tmp_path / "vlog" / f"{end.segment:06d}.log"
    with open(seg, "ab") as f:  # a record written but never indexed, and a torn one
        f.write(encode_record(cm(20, 30)) + encode_record(b"x" * 50)[:20])
    with Storage.open(tmp_path) as st:
        assert seg.stat().st_size == end.offset
        assert served(st) == expected
        assert st.served_watermark == 10
        assert [(u.start_ts, u.parts_received, u.part_count) for u in st.unresolved()] == \
            [(20, 1, 2)]
        with pytest.raises(FailedPrecondition, match="before all parts"):
            st.write_blocking([cm(20, 30)])
        st.write_blocking([pw(20, part_no=1, part_count=2), cm(20, 30)])
        assert served(st, 10) == [(30, pb.PREWRITE, 20)] * 2 + [(30, pb.COMMIT, 20)]


def test_corruption_before_the_tail_refuses_to_open(tmp_path: Path) -> None:
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5, b"a" * 100), pw(6, b"b" * 100)])
    seg = tmp_path / "vlog" / "000001.log"
    data = bytearray(seg.read_bytes())
    data[30] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptRecord) as e:
        Storage.open(tmp_path)
    assert e.value.path == str(seg) and e.value.offset == 0


def test_unknown_format_version_is_refused(tmp_path: Path) -> None:
    Storage.open(tmp_path).close()
    import plyvel
    db = plyvel.DB(str(tmp_path / "index"))
    db.put(b"mformat_version", b"99")
    db.close()
    with pytest.raises(FailedPrecondition, match="format version '99' is not supported"):
        Storage.open(tmp_path)


def test_multi_part_200mib_transaction_round_trip_with_bounded_memory(tmp_path: Path) -> None:
    part, n_parts = 4 << 20, 50
    proc = psutil.Process()
    with Storage.open(tmp_path, StorageOptions(segment_size=64 << 20)) as st:
        base = proc.memory_info().rss
        peak = base
        for i in range(n_parts):
            st.write_blocking([pw(100, struct.pack(">I", i) * (part // 4), part_no=i,
                                  part_count=n_parts)])
            peak = max(peak, proc.memory_info().rss)
        st.write_blocking([cm(100, 101)])
        got = 0
        for i, (commit_ts, payload) in enumerate(st.iter_committed(0)):
            b = pb.Binlog.FromString(payload)
            if i < n_parts:
                assert (b.tp, b.part_no, commit_ts) == (pb.PREWRITE, i, 101)
                assert b.prewrite_value[:4] == struct.pack(">I", i) == b.prewrite_value[-4:]
                got += len(b.prewrite_value)
            else:
                assert b.tp == pb.COMMIT
            peak = max(peak, proc.memory_info().rss)
        assert got == part * n_parts
        assert st.stats()["storage_bytes"] > part * n_parts
    assert peak - base < 80 << 20, f"RSS grew by {(peak - base) >> 20} MiB for 200 MiB"


# -- GC: segment_size=1 puts every record in a segment of its own (record k -> segment k) ----

def _gc_storage(tmp_path: Path) -> Storage:
    return Storage.open(tmp_path, StorageOptions(segment_size=1))


def test_gc_keeps_segments_with_commits_above_the_safe_ts(tmp_path: Path) -> None:
    with _gc_storage(tmp_path) as st:
        for p in (pw(10), cm(10, 20), fk(30), pw(40), cm(40, 50), fk(60)):
            st.write_blocking([p])
        stats = asyncio.run(st.gc(25))
        assert stats.deleted_segments == (1, 2) and stats.gc_ts == 25
        assert stats.index_entries_deleted == 3  # prewrite, commit, t-record of start_ts 10
        assert sorted(os.listdir(tmp_path / "vlog")) == [f"{i:06d}.log" for i in range(3, 7)]
        with pytest.raises(OutOfRange):
            served(st, 0)
        assert served(st, 25) == [(30, pb.FAKE, 30), (50, pb.PREWRITE, 40),
                                  (50, pb.COMMIT, 40), (60, pb.FAKE, 60)]
    with _gc_storage(tmp_path) as st:
        assert st.gc_ts == 25
        with pytest.raises(OutOfRange):
            st.read_committed(24, 100)


def test_gc_frees_rolled_back_prewrites(tmp_path: Path) -> None:
    with _gc_storage(tmp_path) as st:
        for p in (pw(10), rb(10), fk(20), fk(30)):
            st.write_blocking([p])
        stats = asyncio.run(st.gc(25))
        assert stats.deleted_segments == (1, 2, 3)
        assert st.get_commit(10) == (pb.TXN_NOT_FOUND, 0)


def test_gc_keeps_a_long_transactions_prewrite(tmp_path: Path) -> None:
    with _gc_storage(tmp_path) as st:
        for p in (pw(10), pw(12), cm(12, 14), cm(10, 30), fk(40)):
            st.write_blocking([p])
        stats = asyncio.run(st.gc(20))
        assert stats.deleted_segments == (2, 3), "segment 1 holds prewrite 10, committed at 30"
        assert served(st, 20) == [(30, pb.PREWRITE, 10), (30, pb.COMMIT, 10),
                                  (40, pb.FAKE, 40)]


def test_gc_never_passes_unresolved_prewrites_or_the_watermark(tmp_path: Path) -> None:
    with _gc_storage(tmp_path) as st:
        for p in (pw(10), fk(20), pw(22), cm(22, 24), fk(30)):
            st.write_blocking([p])
        assert st.served_watermark == 9
        stats = asyncio.run(st.gc(100))
        # Nothing could be deleted, so the GC ts (below which reads are refused) stays put.
        assert stats.deleted_segments == () and stats.gc_ts == 0
        asyncio.run(st.resolve(10, None))
        stats = asyncio.run(st.gc(100))
        assert stats.gc_ts == 30, "capped at the watermark"
        assert stats.deleted_segments == (1, 2, 3, 4, 5), "the active segment 6 stays"


def test_gc_keeps_the_latest_schema_of_each_table(tmp_path: Path) -> None:
    with _gc_storage(tmp_path) as st:
        for p in (pw(10, ddl_table=7), cm(10, 11), pw(12, ddl_table=7), cm(12, 13),
                  pw(14), cm(14, 15), fk(20)):
            st.write_blocking([p])
        stats = asyncio.run(st.gc(18))
        assert stats.deleted_segments == (1, 2, 5, 6)
        assert stats.kept_schema_segments == (3, 4)


# -- fuzz: garbled payloads give clean errors and leave the storage unchanged --------------

_VALID = [pw(10, b"value"), cm(10, 20), rb(10), fk(30), pw(11, part_no=1, part_count=3),
          cm(5, 6, producer="p", epoch=2, offset=3)]


@hst.composite
def _garbled(draw: hst.DrawFn) -> bytes:
    base = bytearray(draw(hst.sampled_from(_VALID)))
    for _ in range(draw(hst.integers(1, 4))):
        op = draw(hst.sampled_from(["flip", "cut", "insert"]))
        pos = draw(hst.integers(0, len(base)))
        if op == "flip" and pos < len(base):
            base[pos] = draw(hst.integers(0, 255))
        elif op == "cut":
            del base[pos:]
        else:
            base[pos:pos] = draw(hst.binary(min_size=1, max_size=8))
    return bytes(base)


def test_write_fuzz_clean_errors_storage_unchanged(tmp_path: Path) -> None:
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(1), cm(1, 2), pw(3)])
        seq = iter(range(10_000, 1 << 30, 10))

        @settings(max_examples=250, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(hst.one_of(hst.binary(max_size=80), _garbled()), hst.booleans())
        def check(payload: bytes, with_good: bool) -> None:
            before = state(st)
            batch = ([pw(next(seq))] if with_good else []) + [payload]
            try:
                st.write_blocking(batch)
            except SluiceError as e:
                assert type(e) is not SluiceError, f"unclassified error {e!r}"
                assert state(st) == before, "a refused batch left something behind"

        check()
