"""The capture's thread -> event loop queue (capture/handoff.py).

Rules: items arrive in the order the threads put them; the queue is bounded (a putting thread
blocks while it is full and resumes when the loop takes an item, however many threads wait);
the loop wakes for an item put while it waits, and times out when none comes; `close` releases
blocked threads.
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
