"""Says when a process's event loop stopped running callbacks, and what its thread was doing.

Every server here does its network work on one asyncio loop: a callback that blocks it (a
synchronous call that waits, long Python work holding the loop) stops every stream and timer
of the process at once, which from outside looks like a stalled stream. The loop stamps a
clock every `tick` seconds; a watcher thread that sees the stamp older than `threshold` logs a
warning with the loop thread's Python stack, sampled while it is stuck (once per stall), and
when the loop runs again, how long the stall lasted. Cost: one timer callback per tick.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopWatch:
    """Start with `start()` on the running loop; `stop()` ends the watcher thread."""

    def __init__(self, name: str, *, threshold: float = 2.0, tick: float = 0.25,
                 on_stall: Callable[[float], None] | None = None) -> None:
        self.name = name
        self.threshold = threshold
        self.tick = tick
        self.on_stall = on_stall
        self.stalls = 0
        self._stamp = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._timer: asyncio.TimerHandle | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LoopWatch:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stamp = time.monotonic()
        self._timer = self._loop.call_later(self.tick, self._beat)
        self._thread = threading.Thread(target=self._watch, name=f"{self.name}-loopwatch",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join(2 * self.tick + 1)

    def _beat(self) -> None:
        self._stamp = time.monotonic()
        assert self._loop is not None
        self._timer = self._loop.call_later(self.tick, self._beat)

    def _watch(self) -> None:
        stuck_since: float | None = None
        while not self._done.wait(self.tick):
            stamp = self._stamp
            late = time.monotonic() - stamp
            if stuck_since is None and late > self.threshold:
                stuck_since = stamp
                log.warning("%s: event loop blocked for %.1fs so far; its thread is in:\n%s",
                            self.name, late, self._stack())
            elif stuck_since is not None and stamp > stuck_since:
                # The stamp moved: the loop ran again.
                lasted = stamp - stuck_since
                stuck_since = None
                self.stalls += 1
                log.warning("%s: event loop ran again after %.1fs blocked", self.name, lasted)
                if self.on_stall is not None:
                    self.on_stall(lasted)

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "  (no frame)"
        return "".join(traceback.format_stack(frame, limit=12))


async def watched(name: str, main: Awaitable[T]) -> T:
    """Run a process's main coroutine with a LoopWatch on its loop."""
    watch = LoopWatch(name).start()
    try:
        return await main
    finally:
        watch.stop()
