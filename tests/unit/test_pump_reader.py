"""Commit-ordered PullBinlogs reads straight from the value log (pump/storage/reader.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from sluice.core.errors import CorruptRecord
from sluice.proto import sluice_pb2 as pb
from sluice.pump.storage import index as ix
from sluice.pump.storage.storage import Storage, StorageOptions
from tests.unit.test_storage import cm, fk, pw, rb


def decode_chunk(frames: bytes) -> list[pb.Binlog]:
    """The chunk is the `binlogs` field of a PullBinlogsResp: parse it as one."""
    return [pb.Binlog.FromString(b) for b in pb.PullBinlogsResp.FromString(frames).binlogs]


def reference(st: Storage, after: int) -> list[tuple[int, int, int]]:
    return [(b.tp, b.start_ts, b.part_no) for b in
            (pb.Binlog.FromString(p) for _, p in st.iter_committed(after))]


def pull_all(st: Storage, after: int, max_bytes: int) -> tuple[list[pb.Binlog], list[int]]:
    reader = st.open_reader(after)
    got: list[pb.Binlog] = []
    covered: list[int] = []
    while True:
        chunk = reader.next_chunk(max_bytes)
        binlogs = decode_chunk(chunk.frames)
        assert len(binlogs) == chunk.count
        got += binlogs
        covered.append(chunk.covered)
        if chunk.exhausted:
            return got, covered


def _mixed(st: Storage) -> None:
    st.write_blocking([pw(5, b"a" * 300), pw(7, b"b" * 200)])
    st.write_blocking([cm(7, 9)])                                   # prewrite in an earlier group
    st.write_blocking([pw(11, b"c" * 50), cm(11, 12), fk(13)])      # prewrite in the same group
    st.write_blocking([pw(20, b"p0" * 100, part_no=1, part_count=3),
                       pw(20, b"p1" * 100, part_no=0, part_count=3)])
    st.write_blocking([pw(20, b"p2" * 100, part_no=2, part_count=3), cm(20, 21)])
    st.write_blocking([pw(22), rb(22), cm(5, 25), fk(30)])


def test_chunks_are_the_commit_ordered_stream_framed_for_the_wire(tmp_path: Path) -> None:
    with Storage.open(tmp_path, StorageOptions(segment_size=1500)) as st:
        _mixed(st)
        want = reference(st, 0)
        assert [t for t in want if t[0] == pb.COMMIT] == [(pb.COMMIT, s, 0) for s in (7, 11, 20, 5)]
        for max_bytes in (1, 250, 1 << 20):
            got, covered = pull_all(st, 0, max_bytes)
            assert [(b.tp, b.start_ts, b.part_no) for b in got] == want
            assert covered == sorted(covered) and covered[-1] == st.served_watermark == 30
        got, _ = pull_all(st, 12, 1 << 20)
        assert [(b.tp, b.start_ts, b.part_no) for b in got] == reference(st, 12)


def test_a_chunk_covers_only_transactions_sent_whole(tmp_path: Path) -> None:
    """A chunk's `covered` ts names only transactions sent whole — every binlog with
    commit_ts <= covered has been returned by this chunk or an earlier one of the same reader,
    and a transaction split over several chunks (a huge one) counts as covered only once its
    COMMIT is out."""
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5, b"x" * 100), cm(5, 6)])
        st.write_blocking([pw(10, bytes([i]) * 1000, part_no=i, part_count=4) for i in range(4)])
        st.write_blocking([cm(10, 11), fk(12)])
        reader = st.open_reader(0)
        seen: list[pb.Binlog] = []
        while True:
            chunk = reader.next_chunk(900)   # smaller than one part: the 4-part txn splits
            seen += decode_chunk(chunk.frames)
            committed = {b.commit_ts for b in seen if b.tp in (pb.COMMIT, pb.FAKE)}
            assert all(ts in committed for ts in (6, 11, 12) if ts <= chunk.covered), \
                f"covered {chunk.covered} claims a transaction not yet sent whole"
            if chunk.exhausted:
                break
        assert [(b.tp, b.part_no) for b in seen] == [(pb.PREWRITE, 0), (pb.COMMIT, 0)] + \
            [(pb.PREWRITE, i) for i in range(4)] + [(pb.COMMIT, 0), (pb.FAKE, 0)]
        assert chunk.covered == 12


def test_reader_follows_live_after_exhaustion(tmp_path: Path) -> None:
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5), cm(5, 6)])
        reader = st.open_reader(0)
        first = reader.next_chunk(1 << 20)
        assert first.exhausted and first.count == 2 and first.covered == 6
        empty = reader.next_chunk(1 << 20)
        assert empty.exhausted and empty.count == 0 and empty.covered == 6
        st.write_blocking([pw(7), cm(7, 8), fk(9)])
        more = reader.next_chunk(1 << 20)
        assert [b.start_ts for b in decode_chunk(more.frames)] == [7, 7, 9]
        assert more.covered == 9


def test_commit_entries_of_the_first_layout_are_still_joined(tmp_path: Path) -> None:
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5, b"v" * 10), cm(5, 6)])
        key = ix.entry_key(ix.E, 6, pb.COMMIT, 0)
        val = st._db.get(key)
        assert len(val) == ix.COMMIT_VAL_SIZE, "a commit records where its prewrite is"
        st._db.put(key, val[:ix.ENTRY_VAL_SIZE])   # as written before that field existed
        got, _ = pull_all(st, 0, 1 << 20)
        assert [(b.tp, b.start_ts) for b in got] == [(pb.PREWRITE, 5), (pb.COMMIT, 5)]


def test_corruption_is_reported_with_file_and_offset(tmp_path: Path) -> None:
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5, b"a" * 100)])
        st.write_blocking([cm(5, 6)])
        loc = ix.entry_val_unpack(st._db.get(ix.entry_key(ix.S, 5, pb.PREWRITE, 0)))
        seg_path = tmp_path / "vlog" / "000001.log"
        data = bytearray(seg_path.read_bytes())
        data[loc[1] + 12 + 50] ^= 0xFF
        seg_path.write_bytes(bytes(data))
        with pytest.raises(CorruptRecord) as e:
            st.open_reader(0).next_chunk(1 << 20)
        assert e.value.path == str(seg_path) and e.value.offset == loc[1]
        assert "CRC32C" in str(e.value)


def test_packed_metadata_describes_every_binlog_of_a_chunk_or_none(tmp_path: Path) -> None:
    """With packed metadata a chunk's arrays are either empty or describe every binlog of the
    chunk, in order: per entry its commit_ts, start_ts and where its framed binlogs end, FAKE
    entries and every COMMIT carrying a position flagged."""
    with Storage.open(tmp_path, StorageOptions(segment_size=1500)) as st:
        _mixed(st)
        positioned = pb.Binlog.FromString(cm(31, 32))
        positioned.position.file_seq, positioned.position.offset = 1, 4
        st.write_blocking([pw(31, b"q" * 40), positioned.SerializeToString()])
        for max_bytes in (1, 250, 1 << 20):
            reader = st.open_reader(0)
            reader.packed = True
            described = undescribed = 0
            while True:
                chunk = reader.next_chunk(max_bytes)
                raw = chunk.frames + chunk.txns
                resp = pb.PullBinlogsResp.FromString(raw)
                binlogs = [pb.Binlog.FromString(b) for b in resp.binlogs]
                assert not resp.txns
                if not resp.txn_end:
                    undescribed += len(binlogs)
                else:
                    n = len(resp.txn_end)
                    assert len(resp.txn_commit_ts) == len(resp.txn_start_ts) == n
                    start = 0
                    got: list[pb.Binlog] = []
                    for i, end in enumerate(resp.txn_end):
                        txn = [pb.Binlog.FromString(b) for b in
                               pb.DrainerPullResp.FromString(raw[start:end]).binlogs]
                        start = end
                        last = txn[-1]
                        assert resp.txn_commit_ts[i] == last.commit_ts
                        assert resp.txn_start_ts[i] == last.start_ts
                        assert (i in resp.fake_index) == (last.tp == pb.FAKE)
                        if last.HasField("position"):
                            assert i in resp.positioned_index
                        assert all(b.start_ts == last.start_ts for b in txn)
                        got += txn
                    assert [b.SerializeToString() for b in got] == list(resp.binlogs)
                    described += len(binlogs)
                if chunk.exhausted:
                    break
            assert described + undescribed == len(reference(st, 0))
            if max_bytes == 1 << 20:
                assert undescribed == 0



def test_an_inline_read_stops_before_what_the_event_loop_must_not_read(tmp_path: Path) -> None:
    """An inline chunk (read on the service's event loop) holds only single-part transactions
    and FAKEs of at most max_bytes; it stops, not exhausted, before anything else (a bigger
    transaction, a multi-part one), and the next (worker-thread) read goes on from there: the
    stream is the one plain reads give, and every `covered` names only whole transactions."""
    with Storage.open(tmp_path, StorageOptions(segment_size=1500)) as st:
        _mixed(st)
        st.write_blocking([pw(40, b"z" * 2000), cm(40, 41), pw(42, b"s" * 10), cm(42, 43)])
        want = reference(st, 0)
        ends = [b.commit_ts for b in (pb.Binlog.FromString(p) for _, p in st.iter_committed(0))
                if b.tp in (pb.COMMIT, pb.FAKE)]
        for inline_max in (1, 500, 1 << 20):
            reader = st.open_reader(0)
            got: list[pb.Binlog] = []
            stops = 0
            inline = True
            while True:
                chunk = reader.next_chunk(inline_max if inline else 1 << 20, inline=inline)
                binlogs = decode_chunk(chunk.frames)
                assert len(binlogs) == chunk.count
                if inline:
                    assert all(b.part_count <= 1 and b.ByteSize() <= inline_max for b in binlogs)
                    stops += not chunk.exhausted
                got += binlogs
                sent = {b.commit_ts for b in got if b.tp in (pb.COMMIT, pb.FAKE)}
                assert all(ts in sent for ts in ends if ts <= chunk.covered)
                if chunk.exhausted:
                    break
                inline = not inline
            assert [(b.tp, b.start_ts, b.part_no) for b in got] == want
            # 1 byte: every inline read stops at once; 1 MiB: before the 3-part transaction.
            assert stops > 0
