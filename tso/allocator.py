"""Timestamp allocation inside one leader term: never above the persisted window.

A term starts at a physical ms strictly above the window every earlier leader persisted, and it
hands out a timestamp only when that timestamp's physical part is <= the window persisted for the
term. Within a term timestamps are strictly increasing: the next range starts above the last one
even when the wall clock goes backwards.

Pure logic (no etcd, no gRPC), guarded by one lock because the leader thread opens terms and
extends windows while the event loop allocates.
"""
from __future__ import annotations

import threading

from sluice.core import ts as tsmod
from sluice.core.errors import Unavailable


class NoTerm(Unavailable):
    """This process holds no leader term right now."""


class WindowExhausted(Exception):
    """The range would reach above the persisted window: extend it first."""

    def __init__(self, needed_physical: int) -> None:
        super().__init__(f"window exhausted: need physical {needed_physical}")
        self.needed_physical = needed_physical


class Allocator:
    """Hands out [first, first + count) ranges for the current term."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._term = 0            # 0: no term
        self._next_ts = 0
        self._window = 0          # max physical ms this term may hand out (persisted)

    def begin_term(self, term: int, start_physical: int, window: int) -> None:
        """Open a term; `window` must already be persisted and `start_physical` > every older window."""
        if window < start_physical:
            raise ValueError(f"window {window} below start {start_physical}")
        with self._lock:
            self._term = term
            self._next_ts = tsmod.compose(start_physical, 0)
            self._window = window

    def end_term(self) -> None:
        with self._lock:
            self._term = 0

    def set_window(self, term: int, window: int) -> None:
        """Record a window persisted for `term` (ignored if the term is over)."""
        with self._lock:
            if self._term == term and window > self._window:
                self._window = window

    @property
    def window(self) -> int:
        return self._window

    def high_physical(self, now_ms: int) -> int:
        """The physical ms the next allocation would start at (for window extension)."""
        with self._lock:
            return max(tsmod.physical_ms(self._next_ts), now_ms)

    def allocate(self, count: int, now_ms: int) -> tuple[int, int]:
        """(term, first_ts) for `count` timestamps; raises NoTerm or WindowExhausted."""
        with self._lock:
            if self._term == 0:
                raise NoTerm("not leader")
            # A range may cross into the next physical ms: ts are plain integers, and
            # (p, MAX_LOGICAL) + 1 == (p + 1, 0).
            first = max(self._next_ts, tsmod.compose(now_ms, 0))
            last = first + count - 1
            if tsmod.physical_ms(last) > self._window:
                raise WindowExhausted(tsmod.physical_ms(last))
            self._next_ts = last + 1
            return self._term, first
