"""Read-only snapshots: chunks read in a consistent snapshot, held in order with the binlog.

Invariant: a chunk read inside `START TRANSACTION WITH CONSISTENT SNAPSHOT` equals the source
state at its binlog position p, and it is emitted after every source transaction that starts
before p and before every one that starts at or after p. Nothing is written to the source.
How `ConsistentReadHold` holds the reader: docs/snapshots.md ("Read-only mode"). `held` tells the
caller how many transactions wait, so it stops reading the binlog instead of growing memory.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from sluice.capture.snapshot.chunks import Chunk
from sluice.capture.snapshot.emit import ChunkEmission, Stamper
from sluice.capture.snapshot.keys import SnapshotTable
from sluice.capture.snapshot.reader import RowConverter, chunk_sql, select_rows
from sluice.core import failpoint
from sluice.core.errors import FailedPrecondition
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)

__all__ = ["ConsistentReadHold", "Ticket", "Released", "read_chunk_consistent", "binlog_coord"]

_FileOff = tuple[int, int]
CHUNK_FAILPOINT = "snapshot-before-chunk-select"
"""Hit right before every chunk SELECT (both modes): after the low watermark, or after p."""


def binlog_coord(file_name: str, offset: int) -> _FileOff:
    """(file_seq, offset) of a binlog coordinate such as ("mariadb-bin.000003", 1234)."""
    stem, _, seq = file_name.rpartition(".")
    if not stem or not seq.isdigit():
        raise FailedPrecondition(f"binlog file name {file_name!r} has no numeric suffix")
    return int(seq), int(offset)


@dataclasses.dataclass(eq=False)
class Ticket:
    """One chunk read: registered, then its snapshot position, then its rows."""

    id: int
    p: _FileOff | None = None
    shape: SnapshotTable | None = None
    chunk: Chunk | None = None
    rows: tuple[pb.Row, ...] | None = None
    after_seq: int = 0                  # offers numbered <= this came before registration


@dataclasses.dataclass(frozen=True, slots=True)
class Released:
    """In emission order: a held source transaction (`txn`) or a chunk (`chunk`)."""

    txn: Any = None
    chunk: ChunkEmission | None = None


class ConsistentReadHold:
    def __init__(self, start_position: pb.Position | None = None) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._tickets: dict[int, Ticket] = {}
        self._held: deque[tuple[int, _FileOff, pb.Position, Any]] = deque()
        self._seq = 0                      # offers so far
        self._reader_at: _FileOff = (0, 0)
        self._stamper = Stamper(start_position)
        if start_position is not None and (start_position.file_seq or start_position.offset):
            self._reader_at = (start_position.file_seq, start_position.offset)

    # -- worker side --------------------------------------------------------------------------

    def register(self) -> Ticket:
        """Before START TRANSACTION WITH CONSISTENT SNAPSHOT."""
        with self._lock:
            t = Ticket(id=next(self._ids), after_seq=self._seq)
            self._tickets[t.id] = t
            return t

    def set_position(self, ticket: Ticket, file_name: str, offset: int) -> None:
        with self._lock:
            ticket.p = binlog_coord(file_name, offset)

    def complete(self, ticket: Ticket, shape: SnapshotTable, chunk: Chunk,
                 rows: Sequence[pb.Row]) -> None:
        with self._lock:
            if ticket.p is None:
                raise FailedPrecondition(f"chunk {chunk.index} of {chunk.table} completed before "
                                         "its snapshot position was set")
            ticket.shape, ticket.chunk, ticket.rows = shape, chunk, tuple(rows)

    def abandon(self, ticket: Ticket) -> None:
        with self._lock:
            self._tickets.pop(ticket.id, None)

    # -- reader side --------------------------------------------------------------------------

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._tickets)

    def offer(self, txn: Any, position: pb.Position) -> list[Released]:
        """The next source transaction (commit order); returns what may be emitted now."""
        with self._lock:
            self._seq += 1
            coord = (position.file_seq, position.offset)
            self._held.append((self._seq, coord, position, txn))
            if coord > self._reader_at:
                self._reader_at = coord
            return self._drain()

    def pass_through(self, position: pb.Position, end_offset: int = 0) -> bool:
        """`offer` + `reader_at(position.file_seq, end_offset)` for a transaction that nothing
        holds back (no chunk pending, nothing held): True when it was taken so, and the caller
        emits it; False (nothing changed) otherwise."""
        with self._lock:
            if self._held or self._tickets:
                return False
            self._seq += 1
            coord = (position.file_seq, position.offset)
            if coord > self._reader_at:
                self._reader_at = coord
            if end_offset and (position.file_seq, end_offset) > self._reader_at:
                self._reader_at = (position.file_seq, end_offset)
            self._stamper.passed(position)
            return True

    def reader_at(self, file_seq: int, offset: int) -> list[Released]:
        """The reader has read every event before (file_seq, offset) (heartbeat, idle source)."""
        with self._lock:
            if (file_seq, offset) > self._reader_at:
                self._reader_at = (file_seq, offset)
            return self._drain()

    def poll(self) -> list[Released]:
        """Chunks (and transactions behind them) released by a completion while the reader idles."""
        with self._lock:
            return self._drain()

    def _blocked(self, seq: int, coord: _FileOff) -> bool:
        for t in self._tickets.values():
            if t.p is None:
                if seq > t.after_seq:
                    return True
            elif coord >= t.p:
                return True
        return False

    def _drain(self) -> list[Released]:
        out: list[Released] = []
        while True:
            progressed = False
            while self._held and not self._blocked(self._held[0][0], self._held[0][1]):
                _, _, pos, txn = self._held.popleft()
                self._stamper.passed(pos)
                out.append(Released(txn=txn))
                progressed = True
            # A complete chunk goes out once nothing before its p is still held and the reader
            # has passed p; the smallest p first.
            ready = sorted((t for t in self._tickets.values()
                            if t.rows is not None and t.p is not None), key=lambda t: (t.p, t.id))
            for t in ready:
                assert t.p is not None and t.shape is not None and t.chunk is not None
                if self._held and self._held[0][1] < t.p:
                    break
                if self._reader_at < t.p:
                    break
                del self._tickets[t.id]
                out.append(Released(chunk=ChunkEmission(
                    window_id=f"ro-{t.id}", shape=t.shape, chunk=t.chunk, rows=t.rows or (),
                    position=self._stamper.stamp(), dropped=0)))
                progressed = True
            if not progressed:
                return out


def read_chunk_consistent(conn: Any, hold: ConsistentReadHold, shape: SnapshotTable, chunk: Chunk,
                          condition: str = "", converter: RowConverter | None = None) -> Ticket:
    """Read one chunk the read-only way on `conn` (a `snapshot_connect` connection) and hand it
    to the hold. No locks are taken and nothing is written."""
    ticket = hold.register()
    try:
        with conn.cursor() as cur:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            try:
                cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
                status = {k.lower(): v for k, v in cur.fetchall()}
                hold.set_position(ticket, status["binlog_snapshot_file"],
                                  int(status["binlog_snapshot_position"]))
                # Tests widen the gap between p and the SELECT, where a writer races the read.
                failpoint.inject(CHUNK_FAILPOINT)
                sql, params = chunk_sql(shape, chunk, condition)
                rows = select_rows(conn, sql, params, converter or RowConverter(shape.columns))
            finally:
                cur.execute("COMMIT")
        hold.complete(ticket, shape, chunk, rows)
        log.debug("consistent chunk read", extra=kv(table=chunk.table, chunk=chunk.index, rows=len(rows), p=ticket.p))
        return ticket
    except BaseException:
        hold.abandon(ticket)
        raise
