"""The capture's one queue from its threads (binlog reader, snapshot, signals) to the event loop.

Items keep the order in which the threads put them, and the queue is bounded: a thread blocks
while it is full (back-pressure on the binlog reader). A put wakes the loop only when the loop is
waiting for an item, so a busy loop takes whole runs of transactions without a cross-thread
wake-up (a coroutine and a future per transaction) for each.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque

__all__ = ["Handoff"]


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Handoff:
    def __init__(self, loop: asyncio.AbstractEventLoop, maxsize: int) -> None:
        self._loop, self._max = loop, maxsize
        self._items: deque[object] = deque()
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._waiter: asyncio.Future[None] | None = None   # the loop waits for an item
        self._closed = False
        self._putters = 0     # threads blocked in `put` on a full queue

    # -- threads ------------------------------------------------------------------------------

    def put(self, item: object) -> None:
        """From a thread other than the loop's: blocks while the queue is full; after `close`
        the item is dropped (nobody reads it any more)."""
        with self._lock:
            while len(self._items) >= self._max and not self._closed:
                self._putters += 1
                try:
                    self._space.wait()
                finally:
                    self._putters -= 1
            if self._closed:
                return
            self._items.append(item)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._loop.call_soon_threadsafe(_wake, waiter)

    def close(self) -> None:
        """Release threads blocked in `put`: the loop stopped reading."""
        with self._lock:
            self._closed = True
            self._space.notify_all()

    # -- the loop -----------------------------------------------------------------------------

    def qsize(self) -> int:
        return len(self._items)

    def put_nowait(self, item: object) -> bool:
        """From the loop itself (e.g. a stop marker): False when the queue is full."""
        with self._lock:
            if len(self._items) >= self._max or self._closed:
                return False
            self._items.append(item)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)
        return True

    def get_nowait(self) -> object:
        with self._lock:
            if not self._items:
                raise asyncio.QueueEmpty
            item = self._items.popleft()
            if self._putters:
                self._space.notify()
            return item

    async def get(self, timeout: float | None = None) -> object:
        """The next item; asyncio.TimeoutError after `timeout` seconds without one."""
        while True:
            with self._lock:
                if self._items:
                    item = self._items.popleft()
                    if self._putters:
                        self._space.notify()
                    return item
                waiter = self._waiter = self._loop.create_future()
            try:
                if timeout is None:
                    await waiter
                else:
                    await asyncio.wait_for(waiter, timeout)
            finally:
                with self._lock:
                    if self._waiter is waiter:
                        self._waiter = None
