"""The raw path in columns: pump responses merged without a Python object per transaction.

A drainer whose sink forwards stored binlogs (grpc) spends its CPU on per-transaction Python
objects when every transaction is a merge tuple (bench/drainer_stages.py: ~1.1 us per
transaction, 4x the rest of the path). Here a pump response's packed metadata and framed
binlogs become Arrow arrays over the response's own bytes (`segment`), and `ColumnarMerge`
merges such segments with a few vectorised calls per batch (cut at the bound, sort by
commit_ts, check start_ts, take the binlogs in order), handing the sink one `ColumnBatch`.

Invariant: ColumnarMerge emits exactly what `Merger` emits for the same pushes — same
transactions, order, watermarks and counts — because it is a front for a Merger and takes the
columnar route only where that route provably agrees (the argument: docs/drainer.md, "The
columnar merge"; the two routes are checked against each other by tests/unit/test_columnar.py).
"""
from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.core import wire
from sluice.drainer.merger import _NO_BOUND, Merger, MergeStats
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["Segment", "ColumnBatch", "ColumnarMerge", "segment", "warm_up"]

_F_CTS, _F_STS, _F_END, _F_FAKE = (wire.F_TXN_COMMIT_TS, wire.F_TXN_START_TS, wire.F_TXN_END,
                                   wire.F_FAKE_INDEX)
_CHUNK = 4096
_MIN_POP = 8192
# Merged batches come from the C library's allocator, whose freed blocks the drainer keeps for
# reuse (core/memory.py); pyarrow's default pool returned them and each batch faulted in anew.
_POOL = pa.system_memory_pool()


def _mv(arr: pa.Array, fmt: str) -> memoryview:
    """The values of a fixed-width array as a memoryview (zero-copy; bisect and index work)."""
    width = 8 if fmt == "q" else 4
    buf = arr.buffers()[1]
    start = arr.offset * width
    return memoryview(buf)[start:start + len(arr) * width].cast(fmt)


class Segment:
    """Whole transactions of one source in commit order: commit_ts, start_ts, framed binlogs."""

    __slots__ = ("cts", "sts", "bins", "cts_mv")

    def __init__(self, cts: pa.Array, sts: pa.Array, bins: pa.Array,
                 cts_mv: memoryview | None = None) -> None:
        self.cts = cts          # int64, non-decreasing
        self.sts = sts          # int64
        self.bins = bins        # binary: each transaction's binlogs framed as field 1
        # commit_ts as a memoryview (bisect and index without Arrow calls)
        self.cts_mv = _mv(cts, "q") if cts_mv is None else cts_mv

    def __len__(self) -> int:
        return len(self.cts_mv)

    @property
    def first_ct(self) -> int:
        return self.cts_mv[0]

    @property
    def last_ct(self) -> int:
        return self.cts_mv[-1]

    def slice(self, start: int, length: int | None = None) -> Segment:
        end = len(self.cts_mv) if length is None else start + length
        return Segment(self.cts.slice(start, length), self.sts.slice(start, length),
                       self.bins.slice(start, length), self.cts_mv[start:end])

    def tuples(self, source_id: str) -> list[tuple]:
        """The Merger's items for these transactions (no producer positions: see `segment`)."""
        return list(zip(self.cts_mv.tolist(), _mv(self.sts, "q").tolist(), repeat(source_id),
                        repeat(""), repeat(None), self.bins.to_pylist(), repeat(False)))


@dataclasses.dataclass(eq=False)
class ColumnBatch:
    """Merged transactions in commit order, binlogs in one contiguous buffer."""

    cts: pa.Array
    sts: pa.Array
    bins: pa.Array         # binary, one chunk (offsets index into one data buffer)

    def __len__(self) -> int:
        return len(self.cts)

    @property
    def last_ct(self) -> int:
        return _mv(self.cts, "q")[-1]

    def views(self) -> tuple[memoryview, memoryview, memoryview]:
        """(commit_ts, len + 1 binlog offsets, binlog data) over the arrays' buffers: transaction
        k's framed binlogs are data[offsets[k]:offsets[k + 1]] (what the grpc sink keeps)."""
        bins = self.bins
        start = bins.offset * 4
        offsets = memoryview(bins.buffers()[1])[start:start + (len(bins) + 1) * 4].cast("i")
        return _mv(self.cts, "q"), offsets, memoryview(bins.buffers()[2])

    def tuples(self, source_id: str = "") -> list[tuple]:
        """As the Merger's items (tests compare the two routes with these)."""
        return Segment(self.cts, self.sts, self.bins).tuples(source_id)


def segment(raw: bytes, resp: pb.PullBinlogsResp, after: int) -> tuple[list[Segment], int] | None:
    """A packed response's transactions above `after` as Segments (one, or the runs between
    its FAKE entries, zero-copy), and the highest commit_ts it covers (FAKEs only advance
    that); None when the response does not qualify — it describes COMMITs carrying producer
    positions, or its arrays do not match its bytes — and the caller reads it as tuples (which
    also judges and reports a mismatch)."""
    n = len(resp.txn_end)
    if n == 0 or resp.positioned_index:
        return None
    end = resp.txn_end[-1]
    try:
        fields, i = wire.trailing_fields(raw, end)
    except ValueError:
        return None
    if (fields.get(_F_CTS, (0, -1))[1] != 8 * n or fields.get(_F_STS, (0, -1))[1] != 8 * n
            or fields.get(_F_END, (0, -1))[1] != 4 * n or i > len(raw)):
        return None
    buf = pa.py_buffer(raw)
    (a, la), (b, lb), (c, lc) = fields[_F_CTS], fields[_F_STS], fields[_F_END]
    cts = pa.Array.from_buffers(pa.int64(), n, [None, buf.slice(a, la)])
    sts = pa.Array.from_buffers(pa.int64(), n, [None, buf.slice(b, lb)])
    ends = pa.Array.from_buffers(pa.uint32(), n, [None, buf.slice(c, lc)]).cast(pa.int32())
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), ends])
    starts = offsets.slice(0, n)
    data = pa.Array.from_buffers(pa.uint8(), end, [None, buf.slice(0, end)])
    if n > 1 and not (pc.all(pc.greater(ends.slice(1), ends.slice(0, n - 1))).as_py()
                      and pc.all(pc.greater_equal(cts.slice(1), cts.slice(0, n - 1))).as_py()):
        return None
    if _mv(ends, "i")[0] <= 0 or not pc.all(pc.equal(data.take(starts), wire.FRAME_TAG)).as_py():
        return None
    bins = pa.Array.from_buffers(pa.binary(), n, [None, offsets.buffers()[1], buf.slice(0, end)])
    seg = Segment(cts, sts, bins)
    top = max(after, seg.last_ct)
    k = bisect.bisect_right(seg.cts_mv, after)   # at or below `after`: delivered already
    fakes: list[int] = []
    if _F_FAKE in fields:
        fa, fl = fields[_F_FAKE]
        if fl % 4:
            return None
        fakes = sorted(memoryview(raw)[fa:fa + fl].cast("I").tolist())
        if fakes and fakes[-1] >= n:
            return None
    pieces, lo = [], k
    for i in fakes:
        if i >= lo:
            if i > lo:
                pieces.append(seg.slice(lo, i - lo))
            lo = i + 1
    if lo < n:
        pieces.append(seg.slice(lo) if lo else seg)
    return pieces, top


def warm_up() -> bool:
    """Run every Arrow kernel of this module once on a tiny made-up response: the first call of
    each loads it (measured: ~7 ms for the first `segment`), which belongs to start-up, not to
    the first pump response. False (said in the log) if the made-up response left the columnar
    route: a bug, but responses would still be merged, as tuples where they must."""
    bodies = [b"\x08\x01", b"\x08\x02", b"\x08\x03"]
    resp = pb.PullBinlogsResp(binlogs=bodies)
    ends, end = [], 0
    for body in bodies:
        end += 2 + len(body)     # tag, one-byte length, body
        ends.append(end)
    resp.txn_commit_ts.extend([10, 20, 30])
    resp.txn_start_ts.extend([9, 19, 29])
    resp.txn_end.extend(ends)
    resp.fake_index.append(1)
    raw = resp.SerializeToString()
    got = segment(raw, pb.PullBinlogsResp.FromString(raw), 0)
    batch: Any = None
    if got is not None:
        merge = ColumnarMerge(0)
        merge.add_source("warm-up", 0)
        for piece in got[0]:
            merge.push_segment("warm-up", piece)
        merge.advance("warm-up", 40)
        batch = merge.pop_ready(8)
    if not isinstance(batch, ColumnBatch):
        log.warning("columnar merge warm-up: a made-up plain response did not take the columnar "
                    "route (segment %s); merging goes on", "refused it" if got is None else "ok")
        return False
    batch.views()
    return True


class ColumnarMerge:
    """A Merger that also takes Segments and emits ColumnBatches; see the module invariant.

    The Merger API the drainer uses, plus `push_segment`. `pop_ready` returns a ColumnBatch
    when the columnar route applies, else the Merger's list of tuples (possibly empty)."""

    def __init__(self, initial_ts: int = 0, producer_positions: Any = None,
                 dedupe_window: int = 4096) -> None:
        self.m = Merger(initial_ts, producer_positions, dedupe_window)
        self._window = dedupe_window
        self._segs: dict[str, list[Segment]] = {}
        self._queued = 0
        # Emitted (start_ts, commit_ts) arrays, oldest first, kept while they are within the
        # last 2 x dedupe_window emitted (what the Merger's two dict generations can hold);
        # `_win_in_merger` says whether the Merger's dicts are the current window instead.
        self._win: list[tuple[pa.Array, pa.Array]] = []
        self._win_len = 0
        self._win_in_merger = True
        self.columnar_emitted = 0
        self.columnar_batches = 0
        self.tuple_switches: dict[str, int] = {}   # reason -> times (observability)

    # -- sources -------------------------------------------------------------------------------

    def add_source(self, source_id: str, after_ts: int) -> bool:
        if not self.m.add_source(source_id, after_ts):
            return False
        self._segs[source_id] = []
        return True

    def remove_source(self, source_id: str) -> bool:
        if self._segs.get(source_id):
            self._tuple_route("a source left with transactions queued")
        self._segs.pop(source_id, None)
        return self.m.remove_source(source_id)

    def sources(self) -> dict[str, int]:
        return self.m.sources()

    # -- input ---------------------------------------------------------------------------------

    def advance(self, source_id: str, watermark: int) -> None:
        self.m.advance(source_id, watermark)

    def push(self, item: Any) -> None:
        self._tuple_route("tuples pushed")
        self.m.push(item)

    def push_many(self, source_id: str, items: Sequence[Any]) -> None:
        if items:
            self._tuple_route("tuples pushed")
        self.m.push_many(source_id, items)

    def push_segment(self, source_id: str, seg: Segment) -> None:
        src = self.m._get(source_id)
        why = ("the merge holds tuples" if self.m.pending() else
               "at or below the merge watermark" if seg.first_ct <= self.m._mw else
               "below the source's watermark" if seg.first_ct < src.watermark else None)
        if why is not None:
            # Order (the Merger holds items), a late copy or an order break: the Merger's rules.
            self._tuple_route(why)
            self.m.push_many(source_id, seg.tuples(source_id))
            return
        self._segs[source_id].append(seg)
        self._queued += len(seg)
        src.watermark = seg.last_ct

    def _tuple_route(self, why: str) -> None:
        """Everything pending goes the Merger's way (counted, and said once per reason)."""
        self.tuple_switches[why] = self.tuple_switches.get(why, 0) + 1
        if self.tuple_switches[why] == 1:
            log.info("columnar merge: tuple route taken (%s); it returns to columns once the "
                     "merge has emitted what it holds", why)
        self._to_merger()

    def _to_merger(self) -> None:
        """Make the Merger authoritative: its dedupe window (its pushes judge late copies by
        it), then every queued segment as tuples (each source's order kept)."""
        self._window_to_merger()
        if not self._queued:
            return
        for source_id, segs in self._segs.items():
            if not segs:
                continue
            src = self.m._get(source_id)
            wm = src.watermark
            items = [t for seg in segs for t in seg.tuples(source_id)]
            # Queuing moved the watermark to the segments' end; the Merger takes them from
            # their first commit_ts (which was >= its watermark and above the merge's).
            src.watermark = items[0][0]
            self.m.push_many(source_id, items)
            src.watermark = max(src.watermark, wm)
            segs.clear()
        self._queued = 0

    # -- window sync ---------------------------------------------------------------------------

    def _window_to_merger(self) -> None:
        """The Merger's dedupe dicts from the columnar window (before the Merger pops)."""
        if self._win_in_merger:
            return
        self.m._seen_old = {st: (ct, st, "(emitted earlier)", "", None, b"", False)
                            for sts, cts in self._win
                            for st, ct in zip(sts.to_pylist(), cts.to_pylist())}
        self.m._seen_new = {}
        self._win_in_merger = True

    def _window_from_merger(self) -> None:
        """The columnar window from the Merger's dedupe dicts (before a columnar pop)."""
        if not self._win_in_merger:
            return
        entries = [*self.m._seen_old.values(), *self.m._seen_new.values()]
        self._win = [(pa.array([e[1] for e in entries], pa.int64()),
                      pa.array([e[0] for e in entries], pa.int64()))]
        self._win_len = len(entries)
        self._win_in_merger = False

    # -- output --------------------------------------------------------------------------------

    def pop_ready(self, limit: int | None = None) -> list[Any] | ColumnBatch:
        if limit is not None and limit < 1:
            raise ValueError("limit must be >= 1")
        if not self._queued or self.m.pending():
            # Nothing queued here: the Merger pops alone. Its dedupe dicts need no sync: they
            # are handed over whenever items enter it (_to_merger), and an empty pop only moves
            # the watermark (syncing them on every idle pop: 6% of a raw drainer's busy samples).
            if self._queued:
                self._tuple_route("the merge holds tuples")
            return self.m.pop_ready(limit)
        self._window_from_merger()
        bound = self.m._bound()
        # A pop costs about fifteen Arrow calls whatever its size: take at least _MIN_POP when
        # that many are ready (measured: 0.16 -> 0.10 us per transaction from 2048 to 8192).
        # txn-batch bounds the tuple route's applies; the grpc sink takes any size.
        want = max(limit, _MIN_POP) if limit is not None else self._queued
        parts: list[tuple[str, Segment]] = []
        taken = 0
        while taken < want:
            # As the Merger: merge in steps, each source cut where the step's share of what is
            # wanted ends, so a large backlog is merged in pieces (and a pop takes `want` to
            # within one transaction per source).
            busy = sum(1 for segs in self._segs.values() if segs)
            cap = max(1, min(_CHUNK, (want - taken) // max(1, busy)))
            step = bound
            for segs in self._segs.values():
                ct = _nth_ct(segs, cap)
                if ct is not None and ct < step:
                    step = ct
            cut = [(sid, p) for sid, segs in self._segs.items() if (p := _cut(segs, step))]
            if not cut:
                break
            got = sum(len(p) for _, p in cut)
            self._queued -= got
            taken += got
            parts += cut
            if step >= bound:
                break
        if not parts:
            self._refresh(bound)   # as the Merger: an empty pop still moves the watermark
            return []
        # Contiguous copies first: a take from one array is cheaper than from chunks.
        one = len(parts) == 1
        cts = parts[0][1].cts if one else pa.concat_arrays([p.cts for _, p in parts], _POOL)
        order = pc.array_sort_indices(cts, memory_pool=_POOL)
        cts = pc.take(cts, order, memory_pool=_POOL)
        sts = pc.take(parts[0][1].sts if one else pa.concat_arrays([p.sts for _, p in parts], _POOL),
                      order, memory_pool=_POOL)
        n = len(cts)
        # A start_ts twice in the batch: a copy of a transaction (same commit_ts), or copies
        # that disagree on it (§2.5). Either way the Merger's rules decide.
        # (A copy of an already emitted transaction arrives at or below the merge watermark and
        # is judged at its push, against the window handed to the Merger.)
        if n > 1 and _repeats(sts):
            return self._through_merger(parts, order, limit)
        bins = parts[0][1].bins if one else pa.concat_arrays([p.bins for _, p in parts], _POOL)
        batch = ColumnBatch(cts, sts, pc.take(bins, order, memory_pool=_POOL))
        self._win.append((sts, cts))
        self._win_len += n
        while self._win_len - len(self._win[0][0]) >= 2 * self._window:
            self._win_len -= len(self._win.pop(0)[0])
        self.m._emitted += n
        self.columnar_emitted += n
        self.columnar_batches += 1
        self._refresh(bound)
        return batch

    def _through_merger(self, parts: list[tuple[str, Segment]], order: pa.Array,
                        limit: int | None) -> list[Any]:
        items = [t for sid, p in parts for t in p.tuples(sid)]
        self._tuple_route("a copy in a batch")
        # Ready and sorted: the Merger's staging, ahead of everything still buffered.
        self.m._staged = [items[i] for i in order.to_pylist()] + self.m._staged
        return self.m.pop_ready(limit)

    def _refresh(self, bound: int) -> None:
        lowest = bound
        for segs in self._segs.values():
            if segs:
                lowest = min(lowest, segs[0].first_ct - 1)
        if lowest != _NO_BOUND and lowest > self.m._mw:
            self.m._mw = lowest

    @property
    def merge_watermark(self) -> int:
        if self._queued:
            self._refresh(self.m._bound())
            return self.m._mw
        return self.m.merge_watermark

    def pending(self, source_id: str | None = None) -> int:
        if source_id is not None:
            return self.m.pending(source_id) + sum(map(len, self._segs.get(source_id, ())))
        return self.m.pending() + self._queued

    def holding_source(self) -> str | None:
        held = self.m.holding_source()
        if held is not None or not self._queued:
            return held
        srcs = self.m._sources
        if not srcs:
            return None
        low = min(srcs.values(), key=lambda s: (s.watermark, s.id))
        if any(segs and segs[-1].last_ct > low.watermark for segs in self._segs.values()):
            return low.id
        return None

    def summary(self) -> str:
        """How much went which way (logged when the drainer stops)."""
        emitted = self.m.stats().emitted
        return (f"{self.columnar_emitted} of {emitted} transactions merged in columns "
                f"({self.columnar_batches} batches)"
                + (f"; tuple route taken: {self.tuple_switches}" if self.tuple_switches else ""))

    def producer_positions(self) -> Any:
        return self.m.producer_positions()

    def stats(self) -> MergeStats:
        return self.m.stats()


def _repeats(values: pa.Array) -> bool:
    """Whether a value occurs twice (by sorting: half the CPU of count_distinct's hashing)."""
    s = pc.take(values, pc.array_sort_indices(values, memory_pool=_POOL), memory_pool=_POOL)
    n = len(s)
    return bool(pc.any(pc.equal(s.slice(1), s.slice(0, n - 1))).as_py())


def _nth_ct(segs: list[Segment], n: int) -> int | None:
    """commit_ts of the n-th (0-based) queued transaction of a source, None if fewer."""
    for s in segs:
        if n < len(s):
            return s.cts_mv[n]
        n -= len(s)
    return None


def _cut(segs: list[Segment], bound: int) -> Segment | None:
    """Remove and return the queued prefix with commit_ts <= bound, as one segment."""
    out: list[Segment] = []
    while segs:
        s = segs[0]
        if s.first_ct > bound:
            break
        if s.last_ct <= bound:
            out.append(segs.pop(0))
            continue
        k = bisect.bisect_right(s.cts_mv, bound)
        out.append(s.slice(0, k))
        segs[0] = s.slice(k)
        break
    if not out:
        return None
    if len(out) == 1:
        return out[0]
    return Segment(pa.concat_arrays([s.cts for s in out], _POOL),
                   pa.concat_arrays([s.sts for s in out], _POOL),
                   pa.concat_arrays([s.bins for s in out], _POOL))
