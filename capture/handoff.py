"""The capture's one queue from its threads (binlog reader, snapshot, signals) to the event loop.

Items keep the order in which the threads put them, and the queue is bounded: a thread blocks
while it is full (back-pressure on the binlog reader). A put wakes the loop only when the loop is
waiting for an item, so a busy loop takes whole runs of transactions without a cross-thread
wake-up (a coroutine and a future per transaction) for each. While the loop fills a group
(`fill`), a put wakes it only once the group would be full (items or bytes) or the item ends a
group (a marker): one wake-up per group instead of one per transaction when the capture keeps up.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["Handoff"]


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Handoff:
    """`weight(item)`: the item's bytes for `fill`, or None for an item that ends a group."""

    def __init__(self, loop: asyncio.AbstractEventLoop, maxsize: int,
                 weight: Callable[[object], int | None] = lambda item: None) -> None:
        self._loop, self._max, self._weight = loop, maxsize, weight
        self._items: deque[tuple[object, int | None]] = deque()
        self._bytes = 0        # sum of the queued items' weights
        self._enders = 0       # queued items of weight None
        # What the waiting `fill` needs before a put wakes it: (items, bytes); (0, 0) for `get`.
        self._need = (0, 0)
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._waiter: asyncio.Future[None] | None = None   # the loop waits for an item
        self._closed = False
        self._putters = 0     # threads blocked in `put` on a full queue
        self.wakeups = 0      # cross-thread wake-ups of the loop (sluice_capture_loop_wakeups_total)

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
            self._append(item)
            waiter = self._waiter
            if waiter is None or not self._enough(*self._need):
                return
            self._waiter, self._need = None, (0, 0)
        self.wakeups += 1
        self._loop.call_soon_threadsafe(_wake, waiter)

    def _append(self, item: object) -> None:
        """Queue item (under the lock), counting its bytes, or it as a group end."""
        w = self._weight(item)
        self._items.append((item, w))
        if w is None:
            self._enders += 1
        else:
            self._bytes += w

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
            self._append(item)
            waiter, self._waiter, self._need = self._waiter, None, (0, 0)
        if waiter is not None:
            _wake(waiter)
        return True

    def _enough(self, items: int, nbytes: int) -> bool:
        """(lock held) Whether what is queued ends the group being filled: `items` of them, or
        `nbytes` of weight, or an item that ends a group. (0, 0): any item."""
        return len(self._items) >= items or self._bytes >= nbytes or self._enders > 0

    def _pop(self) -> object:
        """(lock held, not empty)"""
        item, w = self._items.popleft()
        if w is None:
            self._enders -= 1
        else:
            self._bytes -= w
        if self._putters:
            self._space.notify()
        return item

    def get_nowait(self) -> object:
        with self._lock:
            if not self._items:
                raise asyncio.QueueEmpty
            return self._pop()

    async def fill(self, items: int, nbytes: int, timeout: float) -> None:
        """Wait until `items` items or `nbytes` of weight are queued, or an item that ends a
        group, or `timeout` seconds passed; the caller then takes what is queued. Threads wake
        the loop once for all of it, not once per item."""
        with self._lock:
            if self._enough(items, nbytes):
                return
            waiter = self._waiter = self._loop.create_future()
            self._need = (items, nbytes)
        timer = self._loop.call_later(timeout, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            with self._lock:
                if self._waiter is waiter:
                    self._waiter, self._need = None, (0, 0)

    async def get(self, timeout: float | None = None) -> object:
        """The next item; asyncio.TimeoutError after `timeout` seconds without one."""
        while True:
            with self._lock:
                if self._items:
                    return self._pop()
                waiter = self._waiter = self._loop.create_future()
                self._need = (0, 0)
            try:
                if timeout is None:
                    await waiter
                else:
                    await asyncio.wait_for(waiter, timeout)
            finally:
                with self._lock:
                    if self._waiter is waiter:
                        self._waiter, self._need = None, (0, 0)
