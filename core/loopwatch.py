"""Says when a process's event loop stopped running callbacks, and what its thread was doing.

Every server here does its network work on one asyncio loop: a callback that blocks it (a
synchronous call that waits, long Python work holding the loop) stops every stream and timer
of the process at once, which from outside looks like a stalled stream. The loop stamps a
clock every `tick` seconds; a watcher thread that sees the stamp older than `threshold` logs a
warning with the loop thread's Python stack, sampled while it is stuck (once per stall), and
when the loop runs again, how long the stall lasted and which threads of the process used the
CPU meanwhile (from /proc: a loop thread parked at a function's first line is waiting for the
GIL, and the busiest thread is who held it). Cost: one timer callback per tick.
"""
from __future__ import annotations

import asyncio
import logging
import os
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

    def __init__(self, name: str, *, threshold: float = 2.0, tick: float = 0.5,
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
        cpu_before: dict[str, float] = {}
        while not self._done.wait(self.tick):
            stamp = self._stamp
            late = time.monotonic() - stamp
            if stuck_since is None and late > self.threshold:
                stuck_since = stamp
                cpu_before = thread_cpu()
                log.warning("%s: event loop blocked for %.1fs so far; its thread is in:\n%s"
                            "other threads are in:\n%s", self.name, late, self._stack(),
                            self._other_stacks())
            elif stuck_since is not None and stamp > stuck_since:
                # The stamp moved: the loop ran again.
                lasted = stamp - stuck_since
                stuck_since = None
                self.stalls += 1
                log.warning("%s: event loop ran again after %.1fs blocked; CPU seconds by thread "
                            "since the warning: %s", self.name, lasted,
                            busiest(cpu_before, thread_cpu()))
                if self.on_stall is not None:
                    self.on_stall(lasted)

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "  (no frame)"
        return "".join(traceback.format_stack(frame, limit=12))

    def _other_stacks(self) -> str:
        """The innermost frames of every other Python thread, one line each."""
        names = {t.ident: t.name for t in threading.enumerate()}
        lines = []
        for ident, frame in sys._current_frames().items():
            if ident in (self._loop_thread, threading.get_ident()):
                continue
            where = " <- ".join(f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})"
                                for f in reversed(traceback.extract_stack(frame, limit=3)))
            lines.append(f"  {names.get(ident, ident)}: {where}\n")
        return "".join(lines) or "  (none)\n"


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100   # per second


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by `name/tid`: Python
    threads by their name, others (gRPC's, the JVM's) by the kernel's. Empty without /proc."""
    py_names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue   # the thread ended
        comm_end = stat.rindex(b")")
        comm = stat[stat.index(b"(") + 1:comm_end].decode(errors="replace")
        fields = stat[comm_end + 2:].split()
        # fields[11], fields[12]: utime, stime (the 14th and 15th of stat, after pid and comm)
        cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        out[f"{py_names.get(int(tid), comm)}/{tid}"] = cpu
    return out


def busiest(before: dict[str, float], after: dict[str, float], top: int = 5) -> str:
    """The threads that used the most CPU between two `thread_cpu` readings."""
    used = sorted(((after[k] - before.get(k, 0.0), k) for k in after), reverse=True)
    shown = [f"{k} {d:.2f}" for d, k in used[:top] if d > 0]
    return ", ".join(shown) or "none"


async def watched(name: str, main: Awaitable[T]) -> T:
    """Run a process's main coroutine with a LoopWatch on its loop."""
    watch = LoopWatch(name).start()
    try:
        return await main
    finally:
        watch.stop()
