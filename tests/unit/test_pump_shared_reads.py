"""Work a pump does once per durable group rather than once per reader or per call: chunks shared
by readers at the same place (pump/storage/reader.py `SharedChunks`), one event-loop wakeup per
group for its acks and the live feed (`Storage.add_loop_listener`), and readers woken only when
the served watermark moved (pump/service.py `LiveFeed`)."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from sluice.proto import sluice_pb2 as pb
from sluice.pump.metrics import PumpMetrics
from sluice.pump.service import LiveFeed
from sluice.pump.storage.reader import Chunk, CommitReader
from sluice.pump.storage.storage import Storage, StorageOptions
from tests.unit.test_pump_reader import _mixed, decode_chunk
from tests.unit.test_storage import cm, fk, pw, rb


def private_reader(st: Storage, after: int) -> CommitReader:
    """A reader that shares nothing: the oracle for the shared ones."""
    state = st._state
    return CommitReader(state.db, state.vlog, after, st._served_now)


def same(a: Chunk, b: Chunk) -> bool:
    return (a.frames, a.count, a.covered, a.exhausted, a.txns) == \
        (b.frames, b.count, b.covered, b.exhausted, b.txns)


def drain(readers: list[CommitReader], max_bytes: int, inline: bool) -> int:
    """Read as the service does (inline first; after a stop, from a worker thread) until
    exhausted, checking every chunk against the last reader's; returns the whole-range chunks."""
    whole = 0
    first = True
    while True:
        a, b, ref = (r.next_chunk(max_bytes if inline else 1 << 20, inline) for r in readers)
        assert same(a, ref) and same(b, ref)
        assert len(decode_chunk(a.frames)) == a.count
        if a.exhausted:
            return whole + (first and a.count > 0)
        inline = first = False


def test_readers_at_the_same_place_get_one_shared_chunk_equal_to_a_private_read(
        tmp_path: Path) -> None:
    """Two live readers (one per drainer) woken for the same groups get the chunk the first one
    built (a hit, not a second read), and it is byte for byte what a reader sharing nothing
    builds, in both descriptions (txns entries, packed arrays), inline or not."""
    with Storage.open(tmp_path, StorageOptions(segment_size=1500)) as st:
        groups = [
            lambda: _mixed(st),
            lambda: st.write_blocking([pw(40, b"x" * 700), cm(40, 41), fk(42)]),
            lambda: st.write_blocking([pw(43), pw(44, b"y" * 90, producer="p", epoch=1)]),
            lambda: st.write_blocking([cm(44, 46, producer="p", epoch=1, offset=17), rb(43)]),
            lambda: st.write_blocking([pw(50, b"q" * 3000), cm(50, 51)]),
            lambda: st.write_blocking([pw(52, b"r" * 10), cm(52, 53)]),
        ]
        configs = [(packed, inline, max_bytes) for packed in (False, True)
                   for inline, max_bytes in ((False, 1 << 20), (True, 1 << 20), (True, 2000))]
        sets = []
        for packed, _, _ in configs:
            readers = [st.open_reader(0), st.open_reader(0), private_reader(st, 0)]
            for r in readers:
                r.packed = packed
            sets.append(readers)
        hits = st.stats()["shared_chunk_hits"]
        whole = 0
        for write in groups:
            write()
            for readers, (_, inline, max_bytes) in zip(sets, configs):
                whole += drain(readers, max_bytes, inline)
        for readers in sets:
            assert readers[0].after == readers[2].after == st.served_watermark == 53
        # The second reader took every whole-range chunk the first one built.
        assert st.stats()["shared_chunk_hits"] - hits == whole > 0


def test_live_readers_share_each_capture_sized_group_at_the_services_inline_bound(
        tmp_path: Path) -> None:
    """Live readers reading as the service does (inline, PULL_INLINE_BYTES) get a capture-sized
    durable group (140 transactions of ~1 KiB, more than 64 KiB) in one exhausted chunk each,
    and the second takes the first one's chunk: one read per group, not one per reader."""
    from sluice.pump.service import PULL_INLINE_BYTES
    with Storage.open(tmp_path) as st:
        readers = [st.open_reader(0), st.open_reader(0), private_reader(st, 0)]
        for r in readers:
            r.packed = True
        hits = st.stats()["shared_chunk_hits"]
        ts = 100
        for _ in range(3):
            starts = list(range(ts, ts + 140))
            st.write_blocking([pw(s, b"v" * 1000) for s in starts])
            st.write_blocking([cm(s, s + 1000) for s in starts])
            ts += 2000
            a, b, ref = (r.next_chunk(PULL_INLINE_BYTES, inline=True) for r in readers)
            assert a.exhausted and a.count == 280 and len(a.frames) > 64 << 10
            assert same(a, ref) and same(b, ref)
        assert st.stats()["shared_chunk_hits"] - hits == 3


def test_a_reader_elsewhere_or_asking_another_shape_builds_its_own(tmp_path: Path) -> None:
    """A kept chunk is taken only for the same (after, watermark, packed, max_bytes, inline): a
    reader behind, or one asking another shape, reads for itself and gets what it asked for."""
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5), cm(5, 6), pw(7), cm(7, 8)])
        first = st.open_reader(0).next_chunk(1 << 20)
        hits = st.stats()["shared_chunk_hits"]
        packed = st.open_reader(0)
        packed.packed = True
        p = packed.next_chunk(1 << 20)
        assert p.frames == first.frames and p.txns != first.txns and p.txns
        behind = st.open_reader(6).next_chunk(1 << 20)
        assert [b.start_ts for b in decode_chunk(behind.frames)] == [7, 7]
        assert st.stats()["shared_chunk_hits"] == hits
        again = st.open_reader(0).next_chunk(1 << 20)
        assert same(again, first) and st.stats()["shared_chunk_hits"] == hits + 1
        small = st.open_reader(0).next_chunk(1 << 19)
        assert same(small, first)   # built again (another max_bytes), with the same bytes
        on_loop = st.open_reader(0).next_chunk(1 << 20, inline=True)
        assert same(on_loop, first)   # built again (inline), with the same bytes
        assert st.stats()["shared_chunk_hits"] == hits + 1


def test_a_reader_with_nothing_new_gets_an_empty_exhausted_chunk(tmp_path: Path) -> None:
    """Woken with the watermark where it is, a live reader answers at once: empty, exhausted,
    covering what it covered; then it follows the next group."""
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5), cm(5, 6)])
        r = st.open_reader(0)
        assert r.next_chunk(1 << 20, inline=True).covered == 6
        st.write_blocking([pw(9)])   # moves nothing: 9 is unresolved
        empty = r.next_chunk(1 << 20, inline=True)
        assert (empty.count, empty.covered, empty.exhausted, empty.frames, empty.txns) == \
            (0, 6, True, b"", b"")
        st.write_blocking([cm(9, 10)])
        assert [b.tp for b in decode_chunk(r.next_chunk(1 << 20).frames)] == \
            [pb.PREWRITE, pb.COMMIT]


def test_a_full_chunk_that_ends_the_range_is_exhausted_at_once(tmp_path: Path) -> None:
    """A chunk is cut when it is full, before the next entry; a range that ends exactly there
    needs no extra empty call to say so."""
    with Storage.open(tmp_path) as st:
        st.write_blocking([pw(5, b"a" * 100), cm(5, 6), pw(7, b"b" * 100), cm(7, 8)])
        r = st.open_reader(0)
        one = r.next_chunk(100)
        assert (one.count, one.covered, one.exhausted) == (2, 6, False)
        two = r.next_chunk(100)
        assert (two.count, two.covered, two.exhausted) == (2, 8, True)


def test_loop_listeners_run_once_per_group_after_its_acks(tmp_path: Path) -> None:
    """A loop listener runs on its loop after every durable group, with the served watermark,
    after that group's acks to the loop were delivered (one wakeup for both); a group with no
    ack for the loop (a write from another thread) still reaches it."""
    with Storage.open(tmp_path) as st:
        async def main() -> tuple[list[tuple[int, bool]], list[tuple[int, bool]]]:
            loop = asyncio.get_running_loop()
            calls: list[tuple[int, bool]] = []

            def listener(wm: int) -> None:
                calls.append((wm, threading.current_thread() is threading.main_thread()))
            st.add_loop_listener(loop, listener)
            assert await st.write([pw(5), cm(5, 6)]) == 6
            # The ack and the listener came in one loop callback: the listener already ran
            # when the writer resumes.
            at_ack = list(calls)
            await asyncio.to_thread(st.write_blocking, [pw(7), cm(7, 8)])
            for _ in range(100):
                if len(calls) == 2:
                    break
                await asyncio.sleep(0.01)
            return at_ack, calls
        at_ack, calls = asyncio.run(main())
        assert at_ack == [(6, True)]
        assert calls == [(6, True), (8, True)]


def test_the_live_feed_wakes_streams_only_when_the_watermark_moves(tmp_path: Path) -> None:
    """A group that leaves the served watermark where it was (prewrites only) has nothing for a
    stream that reads up to it: the feed wakes streams for groups that moved it, never backwards."""
    with Storage.open(tmp_path) as st:
        feed = LiveFeed(PumpMetrics(st))
        ev = asyncio.Event()
        feed.subscribe(ev)
        feed.on_group(10)
        assert ev.is_set()
        ev.clear()
        feed.on_group(10)
        feed.on_group(9)
        assert not ev.is_set()
        feed.on_group(11)
        assert ev.is_set()
