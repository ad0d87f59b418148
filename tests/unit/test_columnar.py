"""The columnar raw path against the tuple path it replaces for plain responses.

Invariant (drainer/columnar.py): ColumnarMerge emits exactly what Merger emits for the same
pushes — transactions, order, watermarks, drops — and `segment` reads a packed response as
the reader's tuple path does. The tuple Merger is the oracle: both are driven by the same random
streams (interleaved pumps, failover copies arriving early and late, pops with limits, sources
leaving) and compared.
"""
from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from sluice.drainer.columnar import ColumnarMerge, ColumnBatch, Segment, segment, warm_up
from sluice.drainer.merger import ConflictingCopies, Merger
from sluice.drainer.reader import PumpReader
from sluice.proto import sluice_pb2 as pb
from sluice.core.wire import frame_head, packed_meta


def seg_of(items: list[tuple]) -> Segment:
    return Segment(pa.array([i[0] for i in items], pa.int64()),
                   pa.array([i[1] for i in items], pa.int64()),
                   pa.array([i[5] for i in items], pa.binary()))


def emitted(out: Any) -> list[tuple[int, int, bytes]]:
    items = out.tuples() if isinstance(out, ColumnBatch) else out
    return [(i[0], i[1], i[5]) for i in items]


def streams(rng: random.Random, sources: int, txns: int, copies: float) -> dict[str, list[tuple]]:
    """Each source's transactions in commit order; `copies` of them also on another source."""
    per: dict[str, list[tuple]] = {f"p{i}": [] for i in range(sources)}
    ct = 1000
    for _ in range(txns):
        ct += rng.randint(1, 3)
        st = ct * 10
        body = b"\x0a\x03" + ct.to_bytes(3, "big")
        owners = rng.sample(sorted(per), 2 if sources > 1 and rng.random() < copies else 1)
        for sid in owners:
            per[sid].append((ct, st, sid, "", None, body, False))
    return per


def drive(merger: Any, per: dict[str, list[tuple]], rng: random.Random, segments: float,
          remove: bool, replica: bool = False) -> tuple[list[tuple], int]:
    """Deliver every source in random bursts, pop with random limits; the emitted stream.
    `replica`: a copy of the first source joins a third of the way in, read from the start
    (a replica pump read from an older checkpoint: its copies at or below the merge watermark
    are late, the rest merge as copies)."""
    per = dict(per)
    late_joiner: tuple[str, list[tuple]] | None = None
    if replica:
        first = sorted(per)[0]
        late_joiner = ("replica", [(*t[:2], "replica", *t[3:]) for t in per[first]])
    for sid in per:
        merger.add_source(sid, 0)
    pos = dict.fromkeys(per, 0)
    joined_at = sum(map(len, per.values())) // 3
    reported = [0]

    def popped(batch: Any) -> list[tuple]:
        """A pop's items, checked against the watermark reported before it: once reported
        (a checkpoint may be taken from it), nothing at or below it is emitted any more."""
        items = emitted(batch)
        assert all(t[0] > reported[0] for t in items), (reported[0], items[:3])
        wm = merger.merge_watermark
        assert wm >= reported[0]
        reported[0] = wm
        return items
    out: list[tuple] = []
    removed: set[str] = set()
    rounds = 0
    while any(pos[s] < len(per[s]) for s in per if s not in removed) or merger.pending():
        rounds += 1
        assert rounds < 100_000
        if late_joiner is not None and len(out) >= joined_at:
            sid, items = late_joiner
            late_joiner = None
            per[sid] = items
            pos[sid] = 0
            merger.add_source(sid, 0)
        live = [s for s in per if s not in removed]
        if live and rng.random() < 0.7:
            sid = rng.choice(live)
            items = per[sid][pos[sid]:pos[sid] + rng.randint(0, 40)]
            pos[sid] += len(items)
            if items:
                if rng.random() < segments:
                    merger.push_segment(sid, seg_of(items))
                else:
                    merger.push_many(sid, items)
            nxt = per[sid][pos[sid]][0] if pos[sid] < len(per[sid]) else 1 << 40
            top = items[-1][0] if items else 0
            merger.advance(sid, max(top, nxt - 1 - rng.randint(0, 1)))
        elif live and rng.random() < 0.03:
            # Every source catches up to one point and the merge drains: a tuple-route backlog
            # empties, so the next segments take the columnar route again.
            upto = min(per[s][min(pos[s] + rng.randint(0, 60), len(per[s]) - 1)][0]
                       if per[s] else 0 for s in live)
            for sid in live:
                n = 0
                while pos[sid] + n < len(per[sid]) and per[sid][pos[sid] + n][0] <= upto:
                    n += 1
                items = per[sid][pos[sid]:pos[sid] + n]
                pos[sid] += n
                if items:
                    if rng.random() < segments:
                        merger.push_segment(sid, seg_of(items))
                    else:
                        merger.push_many(sid, items)
                merger.advance(sid, max(upto, items[-1][0] if items else 0))
            out += popped(merger.pop_ready())
        elif remove and len(live) > 1 and rng.random() < 0.01:
            sid = rng.choice(live)
            merger.remove_source(sid)
            removed.add(sid)
        else:
            out += popped(merger.pop_ready(limit=rng.choice([None, 1, 7, 64, 2048])))
    # The same end for both (a pop may emit a few more on the columnar route, so the loop above
    # can end a round apart): every live source far ahead, then the last pop.
    for sid in per:
        if sid not in removed:
            merger.advance(sid, 1 << 41)
    out += popped(merger.pop_ready())
    return out, merger.merge_watermark


# (copies, segment share, sources leave, dedupe window): plain streams (the columnar route all
# the way), rare copies with a small window (many switches between the routes, the start_ts
# window carried both ways and across the Merger's window generations), frequent copies and
# mixed pushes (mostly the tuple route).
CASES = [(0.0, 1.0, False, 4096), (0.0, 0.85, True, 4096), (0.002, 1.0, False, 64),
         (0.01, 1.0, True, 64), (0.05, 0.85, False, 4096), (0.3, 1.0, True, 4096)]


@pytest.mark.parametrize("seed", range(4))
def test_a_replica_joining_late_is_dropped_below_the_watermark_on_both_routes(seed: int) -> None:
    per = streams(random.Random(seed), sources=2 + seed % 2, txns=3000, copies=0.0)
    oracle = Merger(0, dedupe_window=[64, 4096][seed % 2])
    expected, wm_oracle = drive(oracle, per, random.Random(seed), 0.0, False, replica=True)
    col = ColumnarMerge(0, dedupe_window=[64, 4096][seed % 2])
    got, wm_col = drive(col, per, random.Random(seed), 1.0, False, replica=True)
    assert got == expected and wm_col == wm_oracle
    assert len(got) == len({t[1] for t in got}) == 3000   # every transaction once
    assert_same_drops(col.stats(), oracle.stats())
    assert col.stats().duplicates_dropped + col.stats().late_dropped > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("copies,share,remove,window", CASES)
def test_columnar_merge_emits_what_the_merger_emits(seed: int, copies: float, share: float,
                                                    remove: bool, window: int) -> None:
    """Same stream, same merge watermark, same stats as the Merger fed the same as tuples."""
    per = streams(random.Random(seed), sources=2 + seed, txns=4000, copies=copies)
    oracle = Merger(0, dedupe_window=window)
    expected, wm_oracle = drive(oracle, per, random.Random(seed + 100), 0.0, remove)
    col = ColumnarMerge(0, dedupe_window=window)
    got, wm_col = drive(col, per, random.Random(seed + 100), share, remove)
    assert got == expected
    assert wm_col == wm_oracle
    assert_same_drops(col.stats(), oracle.stats())
    if share == 1.0 and copies == 0.0:
        assert col.columnar_emitted > len(got) // 2   # the columnar route did the work
    if copies == 0.002:
        assert 0 < col.columnar_emitted < len(got)    # both routes, switching


def assert_same_drops(got: Any, want: Any) -> None:
    """Same emitted and dropped counts. A late copy counts as a duplicate when its original is
    still in the dedupe window, else as late; the two routes keep windows of different depth
    (the columnar one the last 2x, the Merger's 1x-2x by its generations), so only the sum of
    the two is the same."""
    assert got.emitted == want.emitted
    assert got.position_dropped == want.position_dropped
    assert got.duplicates_dropped + got.late_dropped == want.duplicates_dropped + want.late_dropped


def test_stats_and_drops_match_the_merger() -> None:
    per = streams(random.Random(7), sources=3, txns=4000, copies=0.2)
    m = Merger(0)
    drive(m, per, random.Random(8), 0.0, False)
    col = ColumnarMerge(0)
    drive(col, per, random.Random(8), 1.0, False)
    assert_same_drops(col.stats(), m.stats())
    assert col.stats().duplicates_dropped > 0


def test_a_conflicting_copy_is_refused_on_the_columnar_route_too() -> None:
    col = ColumnarMerge(0)
    col.add_source("a", 0)
    col.add_source("b", 0)
    col.push_segment("a", seg_of([(10, 5, "a", "", None, b"\x0a\x00", False)]))
    col.push_segment("b", seg_of([(11, 5, "b", "", None, b"\x0a\x00", False)]))
    col.advance("a", 20)
    with pytest.raises(ConflictingCopies, match="start_ts 5 has commit_ts 10"):
        col.pop_ready()


def test_a_late_conflicting_copy_of_a_columnar_emission_is_refused() -> None:
    """The start_ts window of columnar emissions reaches the Merger's late-copy check."""
    col = ColumnarMerge(0)
    col.add_source("a", 0)
    col.add_source("b", 0)
    col.push_segment("a", seg_of([(10, 5, "a", "", None, b"\x0a\x00", False)]))
    col.advance("b", 10)
    assert isinstance(col.pop_ready(), ColumnBatch) and col.merge_watermark == 10
    col.add_source("c", 0)   # e.g. a replica read from an older checkpoint
    with pytest.raises(ConflictingCopies, match="start_ts 5 has commit_ts 10"):
        col.push_segment("c", seg_of([(9, 5, "c", "", None, b"\x0a\x00", False)]))


@pytest.mark.parametrize("kind", ["merger", "columnar"])
def test_an_empty_pop_moves_the_watermark_so_a_late_joiner_below_it_is_late(kind: str) -> None:
    """The merge watermark moves on every pop, an empty one too: a source joining below it
    (a replica read from an older checkpoint) has its items there dropped as late, not merged."""
    m: Any = Merger(0) if kind == "merger" else ColumnarMerge(0)
    push = m.push_many if kind == "merger" else (lambda sid, items: m.push_segment(sid, seg_of(items)))
    m.add_source("a", 0)
    m.add_source("b", 0)
    push("a", [(10, 1, "a", "", None, b"x", False)])
    m.advance("a", 30)
    m.advance("b", 30)
    assert emitted(m.pop_ready()) == [(10, 1, b"x")]
    push("a", [(60, 4, "a", "", None, b"w", False)])   # waits: b is at 40
    m.advance("b", 40)
    assert emitted(m.pop_ready()) == []          # nothing to emit; everything <= 40 was
    m.add_source("r", 0)
    push("r", [(35, 2, "r", "", None, b"y", False), (45, 3, "r", "", None, b"z", False)])
    m.advance("r", 70)
    m.advance("b", 70)
    assert emitted(m.pop_ready()) == [(45, 3, b"z"), (60, 4, b"w")]
    assert m.stats().late_dropped == 1


def test_watermark_and_pending_count_queued_segments() -> None:
    col = ColumnarMerge(0)
    col.add_source("a", 0)
    col.add_source("b", 0)
    col.push_segment("a", seg_of([(10, 1, "a", "", None, b"x", False),
                                  (30, 3, "a", "", None, b"y", False)]))
    assert col.pending("a") == 2 and col.pending() == 2
    assert col.merge_watermark == 0                 # b holds the merge at 0
    assert col.holding_source() == "b"
    col.advance("b", 20)
    out = col.pop_ready()
    assert isinstance(out, ColumnBatch) and emitted(out) == [(10, 1, b"x")]
    assert col.merge_watermark == 20 and col.pending("a") == 1


# -- reading a packed response -------------------------------------------------------------------

def response(txns: list[tuple[int, int, bytes]], fakes: set[int] = frozenset(),  # type: ignore[assignment]
             positioned: set[int] = frozenset(), watermark: int = 0) -> bytes:  # type: ignore[assignment]
    parts, cts, sts, ends, end = [], [], [], [], 0
    for i, (ct, st, payload) in enumerate(txns):
        framed = frame_head(len(payload)) + payload
        parts.append(framed)
        end += len(framed)
        cts.append(ct)
        sts.append(st)
        ends.append(end)
    return (b"".join(parts) + packed_meta(cts, sts, ends, sorted(fakes), sorted(positioned))
            + pb.PullBinlogsResp(watermark=watermark).SerializeToString())


class _Collect:
    def __init__(self) -> None:
        self.got: list[tuple] = []

    def deliver(self, pump_id: str, items: list[tuple], watermark: int, binlogs: int) -> None:
        self.got += items


def tuple_path(raw: bytes, after: int) -> list[tuple]:
    target = _Collect()
    reader = PumpReader("p", "-", after, target, cluster_id=1, consumer_id="c")  # type: ignore[arg-type]
    reader._response_packed(raw, pb.PullBinlogsResp.FromString(raw))
    return [(i[0], i[1], i[5]) for i in target.got]


def binlog(tp: int, st: int, ct: int = 0) -> bytes:
    return pb.Binlog(tp=tp, start_ts=st, commit_ts=ct).SerializeToString()


def test_segment_reads_a_response_as_the_tuple_path_does() -> None:
    """Same transactions as the reader's tuple path, for every resume point; FAKE entries (in
    the middle and at the end) split the run and only move the covered ts."""
    entries, fakes = [], set()
    for i in range(52):
        ct = 100 + i
        if i in (10, 30, 51):
            fakes.add(i)
            entries.append((ct, ct, binlog(pb.FAKE, ct, ct)))
        else:
            entries.append((ct, 50 + i, binlog(pb.COMMIT, 50 + i, ct)))
    raw = response(entries, fakes=fakes, watermark=170)
    for after in (0, 99, 100, 109, 110, 111, 129, 130, 149, 150, 151):
        got = segment(raw, pb.PullBinlogsResp.FromString(raw), after)
        assert got is not None
        pieces, top = got
        rows = [(i[0], i[1], i[5]) for seg in pieces for i in seg.tuples("p")]
        assert rows == tuple_path(raw, after)
        assert top == max(after, 151)
        assert all(len(p) for p in pieces)


def test_a_reader_in_columns_feeds_the_merge_the_same_as_in_tuples() -> None:
    """Through PumpReader: the pieces and their watermarks are accepted in order by a
    ColumnarMerge, and emit what the tuple path emits through a Merger."""
    entries, fakes = [], set()
    for i in range(40):
        ct = 100 + 2 * i
        if i % 9 == 4:
            fakes.add(i)
            entries.append((ct, ct, binlog(pb.FAKE, ct, ct)))
        else:
            entries.append((ct, ct - 1, binlog(pb.COMMIT, ct - 1, ct)))
    raws = [response(entries[:20], fakes={i for i in fakes if i < 20}, watermark=139),
            response(entries[20:], fakes={i - 20 for i in fakes if i >= 20}, watermark=190)]

    class Feed:
        def __init__(self, merge: Any) -> None:
            self.merge = merge

        def deliver(self, pump_id: str, items: Any, watermark: int, binlogs: int) -> None:
            if isinstance(items, Segment):
                self.merge.push_segment(pump_id, items)
            elif items:
                self.merge.push_many(pump_id, items)
            self.merge.advance(pump_id, watermark)
    outs = []
    for columnar, merge in ((False, Merger(0)), (True, ColumnarMerge(0))):
        merge.add_source("p", 0)
        reader = PumpReader("p", "-", 0, Feed(merge), cluster_id=1, consumer_id="c",  # type: ignore[arg-type]
                            columnar=columnar)
        for raw in raws:
            resp = pb.PullBinlogsResp.FromString(raw)
            if not (columnar and reader._response_segment(raw, resp)):
                reader._response_packed(raw, resp)
        outs.append((emitted(merge.pop_ready()), merge.merge_watermark, reader.after))
    assert outs[0] == outs[1]
    assert len(outs[0][0]) == 40 - len(fakes) and outs[0][1] == outs[0][2] == 190


def test_segment_declines_positions_and_mismatched_arrays() -> None:
    txns = [(100 + i, 50 + i, binlog(pb.COMMIT, 50 + i, 100 + i)) for i in range(5)]
    raw = response(txns, positioned={2})
    assert segment(raw, pb.PullBinlogsResp.FromString(raw), 0) is None
    good = response(txns)
    resp = pb.PullBinlogsResp.FromString(good)
    resp.txn_end[2] += 1                      # an end inside a frame
    bad = resp.SerializeToString()
    assert segment(bad, pb.PullBinlogsResp.FromString(bad), 0) is None
    resp = pb.PullBinlogsResp.FromString(good)
    resp.txn_commit_ts[1], resp.txn_commit_ts[2] = resp.txn_commit_ts[2], resp.txn_commit_ts[1]
    bad = resp.SerializeToString()
    assert segment(bad, pb.PullBinlogsResp.FromString(bad), 0) is None


def test_warm_up_takes_the_columnar_route() -> None:
    """The drainer's start-up warm-up runs its made-up response through the columnar route."""
    assert warm_up() is True


def test_an_idle_pop_leaves_the_start_ts_window_in_columns() -> None:
    """A pop with nothing queued does not rebuild the Merger's dedupe dicts (it did, on every
    idle wake of the merge loop: 6% of a raw drainer's busy samples in a profile), and a late
    copy pushed afterwards is still judged against the window."""
    col = ColumnarMerge(0)
    col.add_source("a", 0)
    col.add_source("b", 0)
    col.push_segment("a", seg_of([(10, 5, "a", "", None, b"\x0a\x00", False)]))
    col.advance("b", 10)
    assert isinstance(col.pop_ready(), ColumnBatch)
    assert col.pop_ready() == [] and col.pop_ready() == []
    assert not col._win_in_merger
    col.push_segment("b", seg_of([(10, 5, "b", "", None, b"\x0a\x00", False)]))   # a copy
    col.advance("a", 20)
    col.advance("b", 20)
    assert col.pop_ready() == [] and col.stats().duplicates_dropped == 1
