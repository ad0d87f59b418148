"""Running a table's chunks: signal-table windows or consistent reads, `parallelism` at a time.

Invariant: at most `parallelism` chunks of a table are in flight (read, not yet emitted), so the
rows held in memory are bounded by parallelism x chunk-size whatever the binlog reader's lag; the
splitter is advanced under a lock, so every chunk is read exactly once per run. No table lock is
ever taken: a chunk is one autocommit range SELECT (signal-table mode) or one SELECT inside a
consistent-snapshot read-only transaction.

Progress is logged per table about every `log_every_s`: rows, chunks, rows/s and an ETA from
InnoDB's row estimate.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sluice.capture.snapshot.chunks import ChunkSplitter
from sluice.capture.snapshot.keys import SnapshotTable
from sluice.core.table import quote_ident
from sluice.capture.snapshot.readonly import (CHUNK_FAILPOINT, ConsistentReadHold,
                                              read_chunk_consistent)
from sluice.capture.snapshot.reader import RowConverter, read_chunk
from sluice.capture.snapshot.signals import watermark_row
from sluice.capture.snapshot.window import WindowReconciler
from sluice.core import failpoint
from sluice.core.log import kv

log = logging.getLogger(__name__)

__all__ = ["TableRun", "OnChunk", "run_signal_table", "run_read_only"]

OnChunk = Callable[[str, int, float, "float | None"], None]
"""(table, rows, SELECT seconds, ETA seconds or None) after each chunk: the capture's metrics."""


class TableRun:
    """Shared bookkeeping of one table's snapshot: next chunk, counters, progress log."""

    def __init__(self, shape: SnapshotTable, splitter: ChunkSplitter, estimated_rows: int = 0,
                 log_every_s: float = 5.0, gate: Callable[[], bool] | None = None,
                 on_chunk: OnChunk | None = None) -> None:
        self.shape, self.splitter = shape, splitter
        self.lock = threading.Lock()
        self.rows = self.chunks = 0
        self.estimated = estimated_rows
        self.t0 = self._last_log = time.monotonic()
        self.log_every_s = log_every_s
        self.error: BaseException | None = None
        # Called before each chunk, outside the lock: blocks while the snapshot is paused,
        # False once it was stopped (the run ends after the chunks in flight).
        self.gate = gate
        self.on_chunk = on_chunk
        self.stopped = False

    def next_chunk(self):  # type: ignore[no-untyped-def]
        if self.gate is not None and not self.gate():
            self.stopped = True
            return None
        with self.lock:
            if self.error is not None:
                return None
            return self.splitter.next_chunk()

    def done(self, chunk: Any, rows: int, select_s: float) -> None:
        # One line per chunk: the count of chunk reads is how a restart proves it resumed.
        log.info("snapshot chunk read", extra=kv(table=chunk.table, chunk=chunk.index, rows=rows, select_ms=round(select_s * 1000, 1)))
        with self.lock:
            self.rows += rows
            self.chunks += 1
            now = time.monotonic()
            if now - self._last_log >= self.log_every_s:
                self._last_log = now
                self.log("snapshot progress")
            eta = self.eta()[1]
        if self.on_chunk is not None:
            self.on_chunk(chunk.table, rows, select_s, eta)

    def eta(self) -> tuple[float, float | None]:
        """(rows per second so far, estimated seconds left or None without an estimate)."""
        el = max(1e-6, time.monotonic() - self.t0)
        rate = self.rows / el
        left = max(0, self.estimated - self.rows)
        return rate, (round(left / rate, 1) if rate > 0 and self.estimated else None)

    def log(self, msg: str) -> None:
        el = max(1e-6, time.monotonic() - self.t0)
        rate, eta = self.eta()
        log.info(msg, extra=kv(table=self.shape.key.qualified, rows=self.rows, chunks=self.chunks, rows_per_s=round(rate), eta_s=eta, elapsed_s=round(el, 1)))


def _threads(run: TableRun, parallelism: int, body: Callable[[Any], None],
             connect: Callable[[], Any]) -> None:
    def loop() -> None:
        conn = connect()
        try:
            while (chunk := run.next_chunk()) is not None:
                body((conn, chunk))
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller below
            with run.lock:
                run.error = run.error or e
        finally:
            conn.close()
    ts = [threading.Thread(target=loop, name=f"snapshot-{i}", daemon=True)
          for i in range(max(1, parallelism))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if run.error is not None:
        raise run.error
    run.log("snapshot table stopped" if run.stopped else "snapshot table read")


def run_signal_table(run: TableRun, reconciler: WindowReconciler, connect: Callable[[], Any],
                     signal_table: str, parallelism: int = 1, condition: str = "",
                     window_timeout_s: float = 300.0) -> None:
    """DBLog: per chunk LW row -> SELECT -> rows to the reconciler -> HW row, then wait until
    the binlog reader emitted it. `connect` gives a `snapshot_connect` connection."""
    db, _, table = signal_table.partition(".")
    insert = f"INSERT INTO {quote_ident(db)}.{quote_ident(table)} (id, type, data) VALUES (%s, %s, %s)"
    conv = RowConverter(run.shape.columns)

    def one(arg: Any) -> None:
        conn, chunk = arg
        wid = uuid.uuid4().hex[:24]
        reconciler.open(wid, run.shape, chunk)
        try:
            with conn.cursor() as cur:
                cur.execute(insert, watermark_row(wid, True))
            failpoint.inject(CHUNK_FAILPOINT)
            t0 = time.monotonic()
            rows = read_chunk(conn, run.shape, chunk, condition, conv)
            select_s = time.monotonic() - t0
            reconciler.set_rows(wid, rows)
            with conn.cursor() as cur:
                cur.execute(insert, watermark_row(wid, False))
        except BaseException:
            reconciler.abandon(wid)
            raise
        if not reconciler.wait_closed(wid, window_timeout_s):
            reconciler.abandon(wid)
            raise TimeoutError(f"window {wid} of {chunk.table} chunk {chunk.index} not closed by "
                               f"the binlog reader within {window_timeout_s}s")
        run.done(chunk, len(rows), select_s)

    _threads(run, parallelism, one, connect)


def run_read_only(run: TableRun, hold: ConsistentReadHold, connect: Callable[[], Any],
                  parallelism: int = 1, condition: str = "", max_pending: int | None = None,
                  on_complete: Callable[[], None] | None = None) -> None:
    """Read-only: every chunk in its own consistent snapshot, handed to the hold. At most
    `max_pending` (default: parallelism) chunks wait for the reader before a worker reads more.
    `on_complete` runs after each chunk reached the hold (the capture emits what it released)."""
    conv = RowConverter(run.shape.columns)
    limit = max_pending or max(1, parallelism)

    def one(arg: Any) -> None:
        conn, chunk = arg
        while hold.pending >= limit + parallelism:
            time.sleep(0.005)   # the reader emits chunks; polled, the hold has no waiters
        t0 = time.monotonic()
        t = read_chunk_consistent(conn, hold, run.shape, chunk, condition, conv)
        run.done(chunk, len(t.rows or ()), time.monotonic() - t0)
        if on_complete is not None:
            on_complete()

    _threads(run, parallelism, one, connect)
