"""A watch on one etcd key (or one prefix) that says "changed since you last read it".

Processes that follow a key they rarely see change (a node's own registry status, the TSO leader
key a standby waits on) read it again only when it changed, instead of every fraction of a
second: an etcd watch costs nothing while nothing changes, a poll costs a Range request each
time (issue #23). The watch is created before the caller's first read, so no change after that
read is missed; a watch that fails (etcd restarted, the stream ended) is reported as a change —
the caller reads again — and re-created at the next wait. Callers still read at least every
`fallback` seconds (`due`), so a watch that died silently delays a change by at most that.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import EtcdUnavailable
from .etcd import Etcd

T = TypeVar("T")

log = logging.getLogger(__name__)


class KeyWatch:
    """`changed()` / `wait(timeout)` / `await wait_async(timeout)`: whether the key (or prefix)
    changed since the last call that returned True. Start it before the first read."""

    def __init__(self, etcd: Etcd, key: str, *, prefix: bool = False, fallback: float = 5.0,
                 clock: Any = time.monotonic) -> None:
        self.etcd = etcd
        self.key = key
        self.prefix = prefix
        self.fallback = fallback
        self.clock = clock
        self._flag = threading.Event()
        self._async_flag: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch_id: int | None = None
        self._broken = True          # no watch yet: create one at start()/the next wait
        self._last_read = float("-inf")
        self._lock = threading.Lock()

    # -- the watch ----------------------------------------------------------------------------
    def start(self) -> None:
        """Create the watch (blocking; failures leave it broken, retried at the next wait)."""
        with self._lock:
            if not self._broken:
                return
            self.cancel()
            try:
                watch = self.etcd.watch_prefix if self.prefix else self.etcd.watch_key
                self._watch_id = watch(self.key, self._callback)
                self._broken = False
            except Exception as e:  # noqa: BLE001 - etcd down or any client failure: the
                # caller reads (and fails or not) at once, and the next wait tries again.
                log.debug("watch on %s not created: %s", self.key, e)
            # Whatever happened before the watch existed is unknown to it: read again.
            self._set()

    def cancel(self) -> None:
        if self._watch_id is not None:
            self.etcd.cancel_watch(self._watch_id)
            self._watch_id = None

    def _callback(self, item: Any) -> None:
        # pyetcd's stream thread: only flags, never blocks.
        if isinstance(item, Exception) or item is None:
            self._broken = True
        self._set()

    def _set(self) -> None:
        self._flag.set()
        loop, flag = self._loop, self._async_flag
        if loop is not None and flag is not None:
            with contextlib.suppress(RuntimeError):   # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(flag.set)

    def wake(self) -> None:
        """Make the current or next wait return at once (shutdown)."""
        self._set()

    # -- the caller ---------------------------------------------------------------------------
    def due(self) -> bool:
        """Whether the key must be read now: it changed, or `fallback` passed since the last
        read. Clears the change flag: the caller reads right after."""
        changed = self._flag.is_set()
        if changed:
            self._flag.clear()
            if self._async_flag is not None:
                self._async_flag.clear()
        if changed or self.clock() - self._last_read >= self.fallback:
            self._last_read = self.clock()
            return True
        return False

    def again(self) -> None:
        """The read after `due()` failed: read at the next wait's end, whatever happens."""
        self._last_read = float("-inf")

    def wait(self, timeout: float) -> bool:
        """Blocking: wait up to `timeout` for a change; returns `due()`."""
        if self._broken:
            self.start()
        self._flag.wait(timeout)
        return self.due()

    async def wait_async(self, timeout: float) -> bool:
        """The event-loop form of `wait`."""
        if self._async_flag is None:
            self._loop = asyncio.get_running_loop()
            self._async_flag = asyncio.Event()
            if self._flag.is_set():
                self._async_flag.set()
        if self._broken:
            await asyncio.to_thread(self.start)
        if not self._flag.is_set():
            # A stale wakeup: `due` consumed its change before the wakeup ran on the loop. Left
            # set, `wait()` would return without suspending and a follower loop would spin on
            # the event loop until `fallback` passed.
            self._async_flag.clear()
        # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that arrives
        # as the flag is set (a node writing its own status as it stops), and the task would
        # then never end.
        try:
            async with asyncio.timeout(timeout):
                await self._async_flag.wait()
        except TimeoutError:
            pass
        return self.due()

    async def follow_async(self, read: Callable[[], T | None], last: T | None,
                           timeout: float) -> T | None:
        """One step of following the key: wait up to `timeout` for a change, then `read` it
        again (in a thread) when it changed, when `fallback` passed, or when `last` is None.
        Returns what was read, else `last`; None when the read failed because etcd is down
        (logged; the next step reads again)."""
        if await self.wait_async(timeout) or last is None:
            try:
                return await asyncio.to_thread(read)
            except EtcdUnavailable as e:
                self.again()
                log.warning("%s not read, etcd unavailable: %s", self.key, e)
                return None
        return last
