"""The capture's thread -> event loop queue (capture/handoff.py).

Rules: items arrive in the order the threads put them; the queue is bounded (a putting thread
blocks while it is full and resumes when the loop takes an item, however many threads wait);
the loop wakes for an item put while it waits, and times out when none comes; `close` releases
blocked threads; while the loop fills a group it is woken once, when the group would be full
(items or bytes), an item that ends a group arrives, or its deadline passes.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sluice.capture.handoff import Handoff


def test_items_arrive_in_order_and_a_full_queue_holds_the_threads_back() -> None:
    """Items put by two threads arrive in each thread's order, all of them; while the queue is
    full the threads block (never more than maxsize items queued) and resume as the loop takes."""

    async def main() -> None:
        q = Handoff(asyncio.get_running_loop(), 4)
        seen_max = 0

        def producer(tag: str) -> None:
            for i in range(500):
                q.put((tag, i))

        threads = [threading.Thread(target=producer, args=(t,)) for t in "ab"]
        for t in threads:
            t.start()
        got: list[tuple[str, int]] = []
        while len(got) < 1000:
            seen_max = max(seen_max, q.qsize())
            if q.qsize() and len(got) % 3:
                got.append(q.get_nowait())  # type: ignore[arg-type]
            else:
                got.append(await q.get(5))  # type: ignore[arg-type]
            if len(got) % 50 == 0:
                await asyncio.sleep(0.002)   # let the queue fill up
        for t in threads:
            t.join(5)
            assert not t.is_alive()
        for tag in "ab":
            assert [i for x, i in got if x == tag] == list(range(500))
        assert seen_max <= 4
        assert q.qsize() == 0

    asyncio.run(main())


def test_the_loop_wakes_for_a_late_item_and_times_out_without_one() -> None:
    """A get waiting on an empty queue returns the item a thread puts later; with a timeout and
    no item it raises TimeoutError; get_nowait on an empty queue raises QueueEmpty."""

    async def main() -> None:
        q = Handoff(asyncio.get_running_loop(), 8)
        with pytest.raises(asyncio.QueueEmpty):
            q.get_nowait()
        t0 = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await q.get(0.05)
        assert time.monotonic() - t0 >= 0.04
        threading.Timer(0.05, q.put, args=("late",)).start()
        assert await q.get(5) == "late"
        assert q.put_nowait("own")
        assert await q.get() == "own"

    asyncio.run(main())


def test_close_releases_a_thread_blocked_on_a_full_queue() -> None:
    """A thread blocked in put on a full queue returns once the loop closes the queue (its item
    is dropped), so a stopping capture never leaves the reader thread hanging."""

    async def main() -> None:
        q = Handoff(asyncio.get_running_loop(), 1)
        q.put("first")
        assert not q.put_nowait("no room")
        t = threading.Thread(target=q.put, args=("blocked",))
        t.start()
        await asyncio.sleep(0.05)
        assert t.is_alive()
        q.close()
        t.join(5)
        assert not t.is_alive()
        assert q.qsize() == 1 and q.get_nowait() == "first"

    asyncio.run(main())


def _size(item: object) -> int | None:
    return None if item == "marker" else len(item)  # type: ignore[arg-type]


def test_fill_wakes_the_loop_once_per_group_not_once_per_item() -> None:
    """While the loop fills a group of 50, a thread putting 50 items one by one wakes it once
    (when the 50th is queued), and every item is there, in order."""

    async def main() -> None:
        q = Handoff(asyncio.get_running_loop(), 1024, _size)

        def producer() -> None:
            for i in range(50):
                q.put(f"{i:03d}")
                time.sleep(0.0005)

        t = threading.Thread(target=producer)
        t0 = time.monotonic()
        t.start()
        await q.fill(50, 1 << 20, 10.0)
        assert time.monotonic() - t0 < 5
        t.join(5)
        assert q.qsize() == 50
        assert q.wakeups == 1
        assert [q.get_nowait() for _ in range(50)] == [f"{i:03d}" for i in range(50)]

    asyncio.run(main())


def test_fill_returns_on_bytes_on_a_marker_and_at_its_deadline() -> None:
    """fill returns as soon as the queued weight reaches its byte budget, or an item that ends a
    group (weight None) is queued, or after its timeout with what is there; it returns at once
    when the queue already holds enough."""

    async def main() -> None:
        q = Handoff(asyncio.get_running_loop(), 1024, _size)
        # bytes: two items of 6 reach a budget of 10
        threading.Timer(0.02, lambda: (q.put("aaaaaa"), q.put("bbbbbb"))).start()
        t0 = time.monotonic()
        await q.fill(100, 10, 5.0)
        assert time.monotonic() - t0 < 2 and q.qsize() == 2
        assert q.wakeups == 1
        # already enough: no wait
        await q.fill(2, 1 << 20, 5.0)
        q.get_nowait(), q.get_nowait()
        # a marker ends the fill at once
        threading.Timer(0.02, lambda: (q.put("x"), q.put("marker"))).start()
        t0 = time.monotonic()
        await q.fill(100, 1 << 20, 5.0)
        assert time.monotonic() - t0 < 2
        assert [q.get_nowait(), q.get_nowait()] == ["x", "marker"]
        assert q.wakeups == 2
        # deadline: one item, budget not reached
        threading.Timer(0.01, q.put, args=("y",)).start()
        t0 = time.monotonic()
        await q.fill(100, 1 << 20, 0.1)
        assert 0.08 <= time.monotonic() - t0 < 2
        assert q.qsize() == 1 and q.wakeups == 2
        # after a fill, a plain get wakes for any item again
        q.get_nowait()
        threading.Timer(0.02, q.put, args=("z",)).start()
        assert await q.get(5) == "z"

    asyncio.run(main())
