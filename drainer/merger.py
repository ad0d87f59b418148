"""The drainer's merge of all pumps' streams into one global commit order (DESIGN §2.4, §2.5, §2.9).

Invariant: emit the smallest commit_ts only when every source in the merge has a watermark >= it
(a source with nothing buffered holds the merge at its watermark).

Pure in-process logic: no I/O, no asyncio. One source per pump; its reader pushes complete
transactions in the pump's commit order (`push`, `push_many`) and watermarks (`advance`: every
item of the source with commit_ts <= watermark has been pushed). A source's watermark is the
highest of what it advanced to, its last pushed commit_ts and its FAKE items' ts; it never goes
back. `pop_ready` returns, in commit order, everything at or below the smallest watermark of the
sources in the merge.

Also kept here:
- One transaction, one commit_ts (§2.5): a later copy of an emitted start_ts (replicas, failover
  copies) is dropped; copies that disagree on commit_ts raise ConflictingCopies naming both
  sources.
- Per-producer positions (§2.9): an item whose position is at or below its producer's last
  emitted position is dropped (`core.position.is_after`). A deliberate rewind needs no call
  here: its positions carry a higher generation, which is after every older position.
- `merge_watermark` — the largest T such that everything <= T from every source was emitted — is
  monotonic, so a checkpoint taken from it while idle is never contradicted by a later emission.

The dedupe window (`dedupe_window` .. 2x emitted start_ts) is provably enough to drop every copy
of an emitted transaction; the proof and the speed notes are in docs/drainer.md ("The merge:
why a bounded dedupe window suffices").
"""
from __future__ import annotations

import bisect
import dataclasses
import logging
import operator
from collections.abc import Mapping, Sequence
from itertools import chain, islice
from typing import Any, NamedTuple

from sluice.core.errors import FailedPrecondition, NotFound, SluiceError
from sluice.core.position import format_position, is_after, is_empty
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["MergeItem", "Merger", "MergeStats", "ConflictingCopies", "SourceOrderError",
           "UnknownSource"]


class MergeItem(NamedTuple):
    """A complete transaction (or a FAKE watermark) from one source, as the merge sees it."""

    commit_ts: int
    start_ts: int
    source_id: str
    producer_id: str
    position: pb.Position | None
    payload: Any
    is_fake: bool = False


_ct = operator.itemgetter(0)
_st = operator.itemgetter(1)
_pos = operator.itemgetter(4)
_fake = operator.itemgetter(6)
_NO_BOUND = 1 << 64  # above every int64 ts: no source in the merge holds it back
# Large pushes and pops are checked in slices of this many items: the several C-level passes
# over a slice then hit the CPU cache instead of reloading every item from memory each pass.
_CHUNK = 4096


class ConflictingCopies(SluiceError):
    """Two copies of one transaction (same start_ts) with different commit_ts: breaks §2.5.

    The drainer must stop: the merger's state after raising it is not meant to be continued.
    """

    def __init__(self, first: Sequence[Any], second: Sequence[Any]) -> None:
        super().__init__(
            f"start_ts {first[1]} has commit_ts {first[0]} from source {first[2]!r} and commit_ts "
            f"{second[0]} from source {second[2]!r}: copies of one transaction must carry one "
            "commit_ts (DESIGN §2.5)")
        self.first, self.second = first, second


class SourceOrderError(FailedPrecondition):
    """A source pushed an item below its own watermark: its reader broke commit order."""


class UnknownSource(NotFound):
    def __init__(self, source_id: str) -> None:
        super().__init__(f"source {source_id!r} is not in the merge")
        self.source_id = source_id


@dataclasses.dataclass(frozen=True)
class MergeStats:
    emitted: int
    duplicates_dropped: int  # copies of an emitted start_ts (same commit_ts)
    position_dropped: int    # at or below the producer's last position
    late_dropped: int        # at or below merge_watermark, start_ts no longer in the window


class _Source:
    __slots__ = ("id", "buf", "watermark", "warned_late")

    def __init__(self, source_id: str, watermark: int) -> None:
        self.id = source_id
        self.buf: list[Any] = []
        self.watermark = watermark
        self.warned_late = False


def _cut(buf: list[Any], bound: int) -> list[Any] | None:
    """Remove and return buf's prefix with commit_ts <= bound (None if empty); buf stays sorted."""
    if not buf or buf[0][0] > bound:
        return None
    if buf[-1][0] <= bound:
        head = buf[:]
        buf.clear()
        return head
    n = bisect.bisect_right(buf, bound, key=_ct)
    head = buf[:n]
    del buf[:n]
    return head


class Merger:
    """Merges named sources by commit_ts; see the module docstring for the rules it keeps."""

    def __init__(self, initial_ts: int = 0,
                 producer_positions: Mapping[str, pb.Position] | None = None,
                 dedupe_window: int = 4096) -> None:
        """initial_ts: the checkpoint; everything <= it counts as emitted (merge_watermark starts
        there). producer_positions: each producer's last applied position (from the checkpoint).
        dedupe_window: emitted start_ts kept (between 1x and 2x this) to recognise copies.
        """
        if dedupe_window < 1:
            raise ValueError("dedupe_window must be >= 1")
        self._sources: dict[str, _Source] = {}
        self._retired: list[_Source] = []  # removed while holding items: merged, not waited on
        self._staged: list[Any] = []       # ready and sorted, held back by a pop limit
        self._mw = initial_ts
        self._positions: dict[str, pb.Position] = {}
        # (file_seq, offset, sub_seq) of each producer's last position when it has file
        # coordinates: most checks are then one tuple comparison instead of message reads.
        self._last_keys: dict[str, tuple[int, int, int, int]] = {}
        for producer_id, position in (producer_positions or {}).items():
            self._set_position(producer_id, position)
        self._window = dedupe_window
        self._seen_new: dict[int, Any] = {}
        self._seen_old: dict[int, Any] = {}
        self._emitted = 0
        self._dup = 0
        self._pos_dropped = 0
        self._late = 0

    # -- sources -----------------------------------------------------------------------------

    def add_source(self, source_id: str, after_ts: int) -> bool:
        """Start waiting for source_id, which will push items with commit_ts > after_ts.

        Returns False (and changes nothing) if it is already in the merge. With after_ts below
        merge_watermark the merge holds until the source passes it; its items up to it are late.
        """
        if source_id in self._sources:
            log.debug("source %s already in the merge", source_id)
            return False
        self._sources[source_id] = _Source(source_id, after_ts)
        # debug: the drainer logs the join at info, with the pump's address.
        log.debug("source %s joined the merge after ts %d (merge watermark %d)",
                 source_id, after_ts, self._mw)
        return True

    def remove_source(self, source_id: str) -> bool:
        """Stop waiting for source_id (the caller decides by node state, never by heartbeat).

        Items it already pushed stay in the merge and are emitted in order. Returns False if it
        was not in the merge.
        """
        src = self._sources.pop(source_id, None)
        if src is None:
            return False
        if src.buf:
            self._retired.append(src)
        log.info("source %s left the merge at watermark %d with %d items still to merge",
                 source_id, src.watermark, len(src.buf))
        return True

    def sources(self) -> dict[str, int]:
        """Each source in the merge and its watermark."""
        return {s.id: s.watermark for s in self._sources.values()}

    def _get(self, source_id: str) -> _Source:
        try:
            return self._sources[source_id]
        except KeyError:
            raise UnknownSource(source_id) from None

    # -- input -------------------------------------------------------------------------------

    def advance(self, source_id: str, watermark: int) -> None:
        """Everything from source_id with commit_ts <= watermark has been pushed."""
        src = self._get(source_id)
        if watermark > src.watermark:
            src.watermark = watermark

    def push(self, item: MergeItem) -> None:
        """One item, in its source's commit order (FAKE items only advance the watermark)."""
        self._push_one(self._get(item[2]), item)

    def push_many(self, source_id: str, items: Sequence[MergeItem]) -> None:
        """Items of one source (each with source_id == source_id), in its commit order."""
        src = self._get(source_id)
        if len(items) <= _CHUNK:
            self._push_chunk(src, items)
        else:
            for i in range(0, len(items), _CHUNK):
                self._push_chunk(src, items[i:i + _CHUNK])

    def _push_chunk(self, src: _Source, items: Sequence[Any]) -> None:
        if not items:
            return
        cts = list(map(_ct, items))
        first = cts[0]
        if (first > self._mw and first >= src.watermark and not any(map(_fake, items))
                and all(map(operator.le, cts, islice(cts, 1, None)))):
            src.buf.extend(items)
            src.watermark = cts[-1]
            return
        for it in items:
            self._push_one(src, it)

    def _push_one(self, src: _Source, it: Any) -> None:
        ct = it[0]
        if ct < src.watermark:
            if it[6]:
                return  # a stale fake: watermarks never go back
            raise SourceOrderError(
                f"source {src.id!r} pushed commit_ts {ct} (start_ts {it[1]}) below its "
                f"watermark {src.watermark}: a source must push in commit order")
        src.watermark = ct
        if it[6]:
            return
        if ct <= self._mw:
            self._drop_late(src, it)
            return
        src.buf.append(it)

    def _drop_late(self, src: _Source, it: Any) -> None:
        prev = self._seen_new.get(it[1])
        if prev is None:
            prev = self._seen_old.get(it[1])
        if prev is not None:
            if prev[0] != it[0]:
                raise ConflictingCopies(prev, it)
            self._dup += 1
            return
        self._late += 1
        level = logging.DEBUG if src.warned_late else logging.WARNING
        src.warned_late = True
        log.log(level, "source %s pushed commit_ts %d (start_ts %d) at or below merge watermark "
                "%d; dropped as a copy of an already emitted transaction", src.id, it[0], it[1],
                self._mw)

    # -- output ------------------------------------------------------------------------------

    def _bound(self) -> int:
        if not self._sources:
            return _NO_BOUND
        return min([s.watermark for s in self._sources.values()])

    def pop_ready(self, limit: int | None = None) -> list[MergeItem]:
        """Up to limit items (all if None) that can be emitted now, in commit order."""
        if limit is not None and limit < 1:
            raise ValueError("limit must be >= 1")
        bound = self._bound()
        out: list[Any] = []
        while limit is None or len(out) < limit:
            bufs = [self._staged, *(s.buf for s in self._sources.values()),
                    *(s.buf for s in self._retired)]
            # Merge in steps of at most _CHUNK items per buffer, so a large backlog is sorted
            # while its items are still in the CPU cache rather than in one giant sort.
            # ... and of at most the items still wanted from each: a small limit must not move
            # a large backlog out of the sources' buffers (their size is the readers'
            # back-pressure; what is staged here is not counted there).
            cap = _CHUNK if limit is None else min(_CHUNK, limit - len(out))
            step = bound
            for buf in bufs:
                if len(buf) > cap and buf[cap][0] < step:
                    step = buf[cap][0]
            chunks = [head for buf in bufs if (head := _cut(buf, step))]
            if not chunks:
                break
            ready = chunks[0] if len(chunks) == 1 else sorted(chain.from_iterable(chunks), key=_ct)
            n = len(ready)
            if limit is None or limit - len(out) >= n:
                out += self._admit_chunk(ready) if n <= _CHUNK else self._admit(ready)
            else:
                i = 0
                while i < n and len(out) < limit:
                    part = ready[i:i + limit - len(out)]
                    i += len(part)
                    out += self._admit(part)
                if i < n:
                    self._staged = ready[i:] + self._staged
                    break
            if step >= bound:
                break
        if self._retired:
            self._retired = [s for s in self._retired if s.buf]
        self._emitted += len(out)
        self._refresh_watermark(bound)
        return out

    def _admit(self, part: list[Any]) -> list[Any]:
        """Drop copies and positions already passed; record what is emitted."""
        if len(part) <= _CHUNK:
            return self._admit_chunk(part)
        out: list[Any] = []
        for i in range(0, len(part), _CHUNK):
            out += self._admit_chunk(part[i:i + _CHUNK])
        return out

    def _admit_chunk(self, part: list[Any]) -> list[Any]:
        new, old = self._seen_new, self._seen_old
        by_start = dict(zip(map(_st, part), part))
        if (len(by_start) == len(part) and new.keys().isdisjoint(by_start)
                and old.keys().isdisjoint(by_start)):
            new.update(by_start)
            if not any(map(_pos, part)):  # protobuf messages are always truthy
                out = part
            else:
                passes = self._position_passes
                out = [it for it in part if it[4] is None or passes(it[3], it[4])]
                self._pos_dropped += len(part) - len(out)
        else:
            out = []
            for it in part:
                st = it[1]
                prev = new.get(st)
                if prev is None:
                    prev = old.get(st)
                if prev is not None:
                    if prev[0] != it[0]:
                        raise ConflictingCopies(prev, it)
                    self._dup += 1
                    continue
                pos = it[4]
                if pos is not None and not self._position_passes(it[3], pos):
                    self._pos_dropped += 1
                    continue
                new[st] = it
                out.append(it)
        if len(new) >= self._window:
            self._seen_old = new
            self._seen_new = {}
        return out

    def _position_passes(self, producer_id: str, pos: pb.Position) -> bool:
        fs, off = pos.file_seq, pos.offset
        if fs or off:
            key = (pos.generation, fs, off, pos.sub_seq)
            last_key = self._last_keys.get(producer_id)
            if last_key is not None:
                if key > last_key:
                    self._positions[producer_id] = pos
                    self._last_keys[producer_id] = key
                    return True
                log.debug("producer %s: position %s is at or below applied %s; dropped",
                          producer_id, format_position(pos),
                          format_position(self._positions[producer_id]))
                return False
        elif is_empty(pos):
            return True
        last = self._positions.get(producer_id)
        if last is not None and not is_after(pos, last):
            log.debug("producer %s: position %s is at or below applied %s; dropped", producer_id,
                      format_position(pos), format_position(last))
            return False
        self._set_position(producer_id, pos)
        return True

    def _set_position(self, producer_id: str, pos: pb.Position | None) -> None:
        if pos is None or is_empty(pos):
            self._positions.pop(producer_id, None)
            self._last_keys.pop(producer_id, None)
            return
        self._positions[producer_id] = pos
        if pos.file_seq or pos.offset:
            self._last_keys[producer_id] = (pos.generation, pos.file_seq, pos.offset, pos.sub_seq)
        else:
            self._last_keys.pop(producer_id, None)

    def _refresh_watermark(self, bound: int) -> None:
        lowest = bound
        if self._staged:
            lowest = min(lowest, self._staged[0][0] - 1)
        for src in chain(self._sources.values(), self._retired):
            if src.buf:
                lowest = min(lowest, src.buf[0][0] - 1)
        if lowest != _NO_BOUND and lowest > self._mw:
            self._mw = lowest

    @property
    def merge_watermark(self) -> int:
        """Largest T such that everything <= T from every source was emitted; never decreases.

        Reading it also raises the floor below which pushes count as late, so a checkpoint taken
        from it is never contradicted by a later emission.
        """
        self._refresh_watermark(self._bound())
        return self._mw

    def pending(self, source_id: str | None = None) -> int:
        """Items buffered for source_id (for its bounded queue); all buffered items if None."""
        if source_id is not None:
            return len(self._get(source_id).buf)
        return (len(self._staged) + sum(len(s.buf) for s in self._sources.values())
                + sum(len(s.buf) for s in self._retired))

    def holding_source(self) -> str | None:
        """The source whose watermark bounds the merge (lowest, ties by id) while something
        waits on it — a buffered item above it, or another source past it; else None.
        """
        if not self._sources:
            return None
        low = min(self._sources.values(), key=lambda s: (s.watermark, s.id))
        if any(s.watermark > low.watermark for s in self._sources.values()):
            return low.id
        if any(s.buf and s.buf[-1][0] > low.watermark
               for s in chain(self._sources.values(), self._retired)):
            return low.id
        return None

    # -- producer positions --------------------------------------------------------------------

    def producer_positions(self) -> dict[str, pb.Position]:
        """Each producer's last emitted position (what the checkpoint stores with its ts)."""
        return dict(self._positions)

    def stats(self) -> MergeStats:
        return MergeStats(self._emitted, self._dup, self._pos_dropped, self._late)

    def push_segment(self, source_id: str, seg: Any) -> None:
        """A drainer.columnar.Segment, merged as its tuples (MergeStrategy)."""
        self.push_many(source_id, seg.tuples(source_id))

    def summary(self) -> str:
        """Nothing beyond stats() to say at stop (MergeStrategy)."""
        return ""
