"""DBLog watermark windows: chunk rows reconciled with the binlog between low and high watermark.

Invariant: a chunk row is emitted (op=r, at the high watermark's position) only if no binlog
change between the chunk's low and high watermark touched its key; every touched row is dropped,
because the binlog delivers that key's newer state itself. So after applying everything emitted,
in order, each key holds the source's value (why: docs/snapshots.md, "Signal-table mode").

Pure and thread-safe: the worker calls `open`, `set_rows`, `abandon`; the binlog reader thread
calls `feed` once per source transaction, in commit order. Several windows may be open at once;
watermarks of windows this process did not open are ignored.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

from sluice.capture.payload import Mutation
from sluice.capture.snapshot.chunks import Chunk
from sluice.capture.snapshot.emit import ChunkEmission, Stamper, changed_keys, rows_by_key
from sluice.capture.snapshot.keys import SnapshotTable
from sluice.capture.snapshot.signals import InvalidSignal, Signal, Watermark, parse_signal
from sluice.core import rowcodec
from sluice.core.errors import FailedPrecondition
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)

__all__ = ["WindowReconciler", "WindowProtocolError", "split_signals"]


class WindowProtocolError(FailedPrecondition):
    """The worker and the reader disagree on a window's life (a wiring bug, never data)."""


@dataclasses.dataclass
class _Window:
    id: str
    shape: SnapshotTable
    chunk: Chunk
    opened: bool = False                       # LW seen by the reader
    rows: dict[tuple[Any, ...], pb.Row] | None = None
    changed: set[tuple[Any, ...]] = dataclasses.field(default_factory=set)


def split_signals(mutations: Sequence[Mutation], signal_table: str
                  ) -> tuple[list[Mutation], list[Signal]]:
    """Data mutations, and the signals inserted into `signal_table` ("db.table") by this
    transaction (its rows' first three columns are id, type, data). An invalid signal row is
    logged and skipped: a user's typo must not stop the capture."""
    data: list[Mutation] = []
    signals: list[Signal] = []
    for m in mutations:
        if f"{m.schema_name}.{m.table_name}" != signal_table:
            data.append(m)
            continue
        for ch in m.changes:
            if ch.tp != pb.INSERT:
                continue   # deleting old signal rows is housekeeping
            v = [rowcodec.datum_to_python(d) for d in ch.after.columns[:3]]
            try:
                signals.append(parse_signal(*(v + [None] * (3 - len(v)))))
            except InvalidSignal as e:
                log.error("signal ignored: %s", e)
    return data, signals


class WindowReconciler:
    def __init__(self, start_position: pb.Position | None = None,
                 stamper: Stamper | None = None) -> None:
        self._lock = threading.Lock()
        self._closed = threading.Condition(self._lock)
        self._windows: dict[str, _Window] = {}
        self._by_table: dict[str, list[_Window]] = {}
        # Shared with the capture's other emitters (read-only chunks, progress records), so all
        # positions after one transaction are numbered by one counter.
        self._stamper = stamper if stamper is not None else Stamper(start_position)

    # -- worker side --------------------------------------------------------------------------

    def open(self, window_id: str, shape: SnapshotTable, chunk: Chunk) -> None:
        """Register a window before its low watermark is written."""
        with self._lock:
            if window_id in self._windows:
                raise WindowProtocolError(f"window {window_id} opened twice")
            self._windows[window_id] = _Window(window_id, shape, chunk)

    def set_rows(self, window_id: str, rows: Sequence[pb.Row]) -> None:
        """The chunk's SELECT result; call before writing the high watermark."""
        with self._lock:
            w = self._windows.get(window_id)
            if w is None:
                raise WindowProtocolError(f"rows for window {window_id}, which is not open")
            w.rows = rows_by_key(rows, w.shape)

    def abandon(self, window_id: str) -> None:
        """Forget a window whose watermark or SELECT failed (the chunk is read again)."""
        with self._lock:
            w = self._windows.pop(window_id, None)
            if w is not None and w.opened:
                self._by_table[w.shape.key.qualified].remove(w)
            self._closed.notify_all()

    def wait_closed(self, window_id: str, timeout: float | None = None) -> bool:
        """Block until the reader emitted (or the worker abandoned) the window: bounds the rows
        buffered to `snapshot-parallelism` chunks when the reader lags."""
        with self._closed:
            return self._closed.wait_for(lambda: window_id not in self._windows, timeout)

    # -- reader side --------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No window is open: a transaction without watermarks changes nothing here but the
        stamper's anchor. Only the reader thread (`feed`) opens windows, so idle as read by it
        stays so until its next `feed`."""
        return not self._by_table

    def passed(self, position: pb.Position) -> None:
        """`feed` of a transaction while `idle` (no watermark in it): only the anchor moves."""
        with self._lock:
            self._stamper.passed(position)

    def feed(self, position: pb.Position, mutations: Sequence[Mutation],
             signals: Sequence[Signal] = ()) -> list[ChunkEmission]:
        """One source transaction, in commit order; returns the chunks to emit right after it."""
        out: list[ChunkEmission] = []
        with self._lock:
            self._stamper.passed(position)
            marks = [s for s in signals if isinstance(s, Watermark)]
            # Opens first, closes last: a change in the low-watermark transaction itself is only
            # dropped needlessly; one in the high-watermark transaction must be dropped.
            for s in marks:
                if s.open:
                    w = self._windows.get(s.window_id)
                    if w is None:
                        log.debug("low watermark of an unknown window ignored",
                                  extra=kv(window=s.window_id))
                        continue
                    w.opened = True
                    self._by_table.setdefault(w.shape.key.qualified, []).append(w)
            if self._by_table:
                for m in mutations:
                    ws = self._by_table.get(f"{m.schema_name}.{m.table_name}")
                    if not ws:
                        continue
                    keys = changed_keys(m, ws[0].shape)
                    for w in ws:
                        w.changed.update(keys)
            for s in marks:
                if not s.open:
                    w = self._windows.get(s.window_id)
                    if w is None:
                        continue
                    out.append(self._close(w))
            if out:
                self._closed.notify_all()
        return out

    def _close(self, w: _Window) -> ChunkEmission:
        if not w.opened:
            raise WindowProtocolError(f"high watermark of window {w.id} before its low watermark")
        if w.rows is None:
            raise WindowProtocolError(f"high watermark of window {w.id} before its rows were set "
                                      "(set_rows must precede the high watermark write)")
        del self._windows[w.id]
        self._by_table[w.shape.key.qualified].remove(w)
        if not self._by_table[w.shape.key.qualified]:
            del self._by_table[w.shape.key.qualified]
        kept = tuple(r for k, r in w.rows.items() if k not in w.changed)
        return ChunkEmission(window_id=w.id, shape=w.shape, chunk=w.chunk, rows=kept,
                             position=self._stamper.stamp(), dropped=len(w.rows) - len(kept))
