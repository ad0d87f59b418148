"""The pump sorter (DESIGN §2.3): decides how far the commit-ordered stream is final.

Invariant: a commit with commit_ts C is served only when no prewrite with start_ts < C is
unresolved. Served watermark = min(unresolved prewrite start_ts) - 1, capped by the highest commit
or fake ts received; it never goes backwards.

A multi-part prewrite counts as one unresolved transaction from its first part on; it can be
committed only once all its parts are stored. Pure in-memory logic: the storage facade feeds it
only what is durable, and recovery rebuilds it from the index.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import NamedTuple

from sluice.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument


@dataclass(frozen=True)
class UnresolvedTxn:
    """An unresolved prewrite as reported to the pump server (for TxnStatus and `ctl`)."""

    start_ts: int
    producer_id: str
    since_monotonic: float
    parts_received: int = 1
    part_count: int = 1


class Pending(NamedTuple):
    """Sorter state of one unresolved prewrite (immutable: replaced on every change; a named
    tuple rather than a frozen dataclass because the committer builds one per prewrite)."""

    start_ts: int
    part_count: int
    parts: int = 0                          # bitmap of the part numbers stored
    producer_id: str = ""
    since: float = 0.0                      # time.monotonic() of the first part
    segments: frozenset[int] = frozenset()  # value-log segments holding its parts
    tables: tuple[int, ...] = ()            # table ids whose schema this transaction carries
    # (segment, offset, length) of a single-part prewrite's record once durable: the commit's
    # index entry carries it, so commit-ordered reads join without an index lookup.
    loc: tuple[int, int, int] | None = None

    @property
    def complete(self) -> bool:
        return self.parts == (1 << self.part_count) - 1

    @property
    def parts_received(self) -> int:
        return self.parts.bit_count()

    def with_part(self, part_no: int, segment: int | None = None) -> "Pending":
        segs = self.segments
        if segment is not None and segment not in segs:
            segs = segs | {segment}
        return Pending(self.start_ts, self.part_count, self.parts | (1 << part_no),
                       self.producer_id, self.since, segs, self.tables, self.loc)


def check_part(existing: Pending | None, start_ts: int, part_no: int, part_count: int) -> None:
    """Raise unless (part_no, part_count) fits the transaction's parts received so far."""
    if part_no >= part_count:
        raise InvalidArgument(f"prewrite start_ts={start_ts}: part_no {part_no} >= part_count "
                              f"{part_count}")
    if existing is not None and existing.part_count != part_count:
        raise AlreadyExists(f"prewrite start_ts={start_ts}: part_count {part_count} differs from "
                            f"the {existing.part_count} of the parts already stored")


def check_commit(p: Pending | None, start_ts: int, commit_ts: int, watermark: int) -> None:
    """Raise unless a commit (start_ts -> commit_ts) may be accepted now."""
    if commit_ts <= start_ts:
        raise InvalidArgument(f"commit_ts {commit_ts} <= start_ts {start_ts}")
    if p is None:
        raise FailedPrecondition(f"commit for start_ts={start_ts} without its prewrite")
    if not p.complete:
        raise FailedPrecondition(f"commit for start_ts={start_ts} before all parts of its prewrite "
                                 f"arrived ({p.parts_received}/{p.part_count})")
    if commit_ts <= watermark:
        raise FailedPrecondition(f"commit_ts {commit_ts} <= served watermark {watermark} "
                                 f"(start_ts={start_ts}): fetch commit_ts after the prewrite ack")


class Sorter:
    """Unresolved prewrites and the served watermark."""

    def __init__(self, watermark: int = 0, max_ts: int = 0) -> None:
        self.pending: dict[int, Pending] = {}
        self._heap: list[int] = []  # start_ts of pending, lazily pruned
        self._watermark = watermark
        self._max_ts = max_ts

    @property
    def watermark(self) -> int:
        return self._watermark

    @property
    def max_ts(self) -> int:
        """The highest commit or fake ts received."""
        return self._max_ts

    def min_unresolved(self) -> int | None:
        heap, pending = self._heap, self.pending
        while heap and heap[0] not in pending:
            heapq.heappop(heap)
        return heap[0] if heap else None

    # -- unchecked updates (the storage applies what it already validated and made durable) ----

    def put(self, p: Pending) -> None:
        if p.start_ts not in self.pending:
            heapq.heappush(self._heap, p.start_ts)
        self.pending[p.start_ts] = p

    def drop(self, start_ts: int) -> None:
        self.pending.pop(start_ts, None)

    def observe(self, ts: int) -> None:
        if ts > self._max_ts:
            self._max_ts = ts

    def advance(self) -> int:
        """Recompute the served watermark (never backwards) and return it."""
        low = self.min_unresolved()
        w = self._max_ts if low is None else min(low - 1, self._max_ts)
        if w > self._watermark:
            self._watermark = w
        return self._watermark

    # -- checked operations --------------------------------------------------------------------

    def prewrite(self, start_ts: int, part_no: int = 0, part_count: int = 1,
                 producer_id: str = "") -> int:
        p = self.pending.get(start_ts)
        check_part(p, start_ts, part_no, part_count)
        if p is None:
            p = Pending(start_ts, part_count, producer_id=producer_id, since=time.monotonic())
        self.put(p.with_part(part_no))
        return self.advance()

    def commit(self, start_ts: int, commit_ts: int) -> int:
        check_commit(self.pending.get(start_ts), start_ts, commit_ts, self._watermark)
        self.drop(start_ts)
        self.observe(commit_ts)
        return self.advance()

    def rollback(self, start_ts: int) -> int:
        if start_ts not in self.pending:
            raise FailedPrecondition(f"rollback for start_ts={start_ts} without its prewrite")
        self.drop(start_ts)
        return self.advance()

    def fake(self, ts: int) -> int:
        if ts <= self._watermark:
            raise FailedPrecondition(f"fake binlog ts {ts} <= served watermark {self._watermark}")
        self.observe(ts)
        return self.advance()

    def unresolved(self, older_than_s: float = 0.0, now: float | None = None
                   ) -> list[UnresolvedTxn]:
        now = time.monotonic() if now is None else now
        return sorted((UnresolvedTxn(p.start_ts, p.producer_id, p.since, p.parts_received,
                                     p.part_count)
                       for p in list(self.pending.values()) if now - p.since >= older_than_s),
                      key=lambda u: u.start_ts)
