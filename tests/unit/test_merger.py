"""The drainer merge (drainer/merger.py): order, watermarks, copies, producer positions."""
from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.core.position import parse_position
from sluice.drainer.merger import (ConflictingCopies, MergeItem, Merger, SourceOrderError,
                                   UnknownSource)
from sluice.proto import sluice_pb2 as pb

FAR = 1 << 62


def item(ct: int, source: str, start: int | None = None, producer: str = "app",
         position: pb.Position | None = None) -> MergeItem:
    return MergeItem(ct, ct - 1 if start is None else start, source, producer, position,
                     f"txn@{ct}")


def fake(ct: int, source: str) -> MergeItem:
    return MergeItem(ct, 0, source, "", None, None, True)


def at(file_seq: int, offset: int) -> pb.Position:
    return pb.Position(file_seq=file_seq, offset=offset)


def merger(*sources: str, after: int = 0, **kw: object) -> Merger:
    m = Merger(**kw)  # type: ignore[arg-type]
    for s in sources:
        m.add_source(s, after)
    return m


def cts(items: list[MergeItem]) -> list[int]:
    return [i.commit_ts for i in items]


def test_emits_only_up_to_the_smallest_source_watermark() -> None:
    """Invariant: emit the smallest commit_ts only when every source in the merge has a watermark
    >= it (a source with nothing buffered holds the merge at its watermark)."""
    m = merger("a", "b", "c")
    m.push_many("a", [item(10, "a"), item(40, "a")])
    m.push_many("b", [item(20, "b")])
    # c has pushed nothing and its watermark is 0: it holds the merge at 0
    assert m.pop_ready() == []
    assert m.holding_source() == "c"
    m.advance("c", 15)
    assert cts(m.pop_ready()) == [10]          # 20 waits: c might still push 16..20
    m.advance("c", 25)
    assert cts(m.pop_ready()) == [20]          # b's watermark is 20 (its last item) -> bound 20
    assert m.merge_watermark == 20
    m.advance("b", 100)
    assert m.pop_ready() == []                 # c at 25 holds 40
    assert m.holding_source() == "c"
    m.push(item(30, "c"))
    m.advance("c", 50)
    assert cts(m.pop_ready()) == [30, 40]
    assert m.merge_watermark == 40 and m.pending() == 0  # a's watermark is its last item, 40


@pytest.mark.parametrize("n_sources", [3, 4, 5])
@pytest.mark.parametrize("seed", range(4))
def test_random_interleavings_match_a_sorted_reference(n_sources: int, seed: int) -> None:
    rng = random.Random(seed * 10 + n_sources)
    names = [f"pump{i}" for i in range(n_sources)]
    streams: dict[str, list[MergeItem]] = {n: [] for n in names}
    for ct in rng.sample(range(1, 100_000), 3000):
        s = rng.choice(names)
        streams[s].append(item(ct, s))
    for s in names:
        streams[s].sort()
    reference = sorted(i for s in streams.values() for i in s)
    m = merger(*names)
    out: list[MergeItem] = []
    cursor = dict.fromkeys(names, 0)
    while any(cursor[s] < len(streams[s]) for s in names):
        s = rng.choice(names)
        k = rng.randint(1, 50)
        batch = streams[s][cursor[s]:cursor[s] + k]
        cursor[s] += len(batch)
        if rng.random() < 0.5:
            m.push_many(s, batch)
        else:
            for it in batch:
                m.push(it)
        got = m.pop_ready(limit=rng.choice([None, 1, 7, 100]))
        bound = min(m.sources().values())
        assert all(i.commit_ts <= bound for i in got)
        out.extend(got)
    for s in names:
        m.advance(s, FAR)
    while True:
        got = m.pop_ready(limit=rng.choice([None, 13]))
        if not got:
            break
        out.extend(got)
    assert out == reference


def test_a_lagging_source_holds_the_merge_then_order_is_exact() -> None:
    m = merger("fast1", "fast2", "slow")
    fast = [item(ct, "fast1") for ct in range(100, 200, 4)]
    fast2 = [item(ct, "fast2") for ct in range(102, 202, 4)]
    m.push_many("fast1", fast)
    m.push_many("fast2", fast2)
    m.advance("fast1", 1000)
    m.advance("fast2", 1000)
    m.push_many("slow", [item(50, "slow"), item(120, "slow")])
    # slow's watermark is 120 (its last item): nothing past it may go out
    first = m.pop_ready()
    assert cts(first) == [50] + list(range(100, 121, 2))
    assert m.holding_source() == "slow"
    assert m.pending("fast1") > 0 and m.merge_watermark == 120
    late = [item(ct, "slow") for ct in (121, 151, 199)]  # between the fast pumps' ts
    m.push_many("slow", late)
    m.advance("slow", 1000)
    rest = m.pop_ready()
    assert cts(first + rest) == sorted(cts(fast + fast2 + late) + [50])
    assert m.holding_source() is None


def test_copies_across_sources_are_emitted_once() -> None:
    m = merger("a", "b")
    # replicas: the same transaction on both pumps, same start_ts and commit_ts
    m.push_many("a", [item(10, "a", start=5), item(20, "a", start=15)])
    m.push_many("b", [item(10, "b", start=5), item(30, "b", start=25)])
    m.advance("a", 40)
    m.advance("b", 40)
    out = m.pop_ready()
    assert [(i.start_ts, i.commit_ts) for i in out] == [(5, 10), (15, 20), (25, 30)]
    assert m.stats().duplicates_dropped == 1 and m.stats().emitted == 3
    # both copies ready, but a pop limit separates them: the held-back copy is still dropped
    m.push_many("a", [item(50, "a", start=45)])
    m.push_many("b", [item(50, "b", start=45)])
    m.advance("a", 60)
    m.advance("b", 60)
    assert cts(m.pop_ready(limit=1)) == [50]
    assert m.pop_ready() == []
    assert m.stats().duplicates_dropped == 2 and m.stats().emitted == 4


def test_copy_at_the_merge_watermark_from_a_source_at_that_watermark_is_dropped() -> None:
    # The careful case of window pruning: b already stands at 10 (say its reader resumed
    # inclusively) when the copy of the transaction emitted at 10 still comes from it.
    m = merger("a", "b", dedupe_window=1)
    m.push(item(10, "a", start=5))
    m.advance("b", 10)
    assert cts(m.pop_ready()) == [10]
    assert m.merge_watermark == 10
    m.push(item(10, "b", start=5))
    m.advance("a", 20)
    m.advance("b", 20)
    assert m.pop_ready() == []
    assert m.stats().duplicates_dropped == 1 and m.stats().late_dropped == 0


def test_dedupe_memory_stays_bounded() -> None:
    m = merger("a", dedupe_window=100)
    for base in range(0, 10_000, 500):
        m.push_many("a", [item(ct, "a") for ct in range(base + 1, base + 501)])
        m.pop_ready(limit=64)
        m.pop_ready()
    assert m.stats().emitted == 10_000
    assert len(m._seen_new) + len(m._seen_old) <= 2 * 500  # a window, not the whole history


def test_copies_that_disagree_on_commit_ts_raise_naming_both_sources() -> None:
    m = merger("pump-a", "pump-b")
    m.push(item(10, "pump-a", start=5))
    m.push(item(12, "pump-b", start=5))
    m.advance("pump-a", 20)
    m.advance("pump-b", 20)
    with pytest.raises(ConflictingCopies, match=r"start_ts 5 .*10 from source 'pump-a'.*12 from "
                                                r"source 'pump-b'"):
        m.pop_ready()


def test_a_late_copy_with_another_commit_ts_raises() -> None:
    m = merger("a", "b")
    m.push(item(10, "a", start=5))
    m.advance("b", 10)
    m.pop_ready()
    with pytest.raises(ConflictingCopies, match="start_ts 5"):
        m.push_many("b", [item(11, "b", start=5)])
        m.advance("a", 20)
        m.pop_ready()
    m2 = merger("a", "b", after=0)
    m2.push(item(10, "a", start=5))
    m2.advance("b", 10)
    m2.pop_ready()
    m2.add_source("c", 0)  # a replica added below the merge watermark sends an older commit_ts
    with pytest.raises(ConflictingCopies, match="from source 'c'"):
        m2.push(item(9, "c", start=5))


def test_producer_positions_drop_what_was_already_applied() -> None:
    m = merger("a", "b", producer_positions={"capture": at(3, 100)})
    m.push_many("a", [item(10, "a", producer="capture", position=at(3, 50)),    # applied before
                      item(20, "a", producer="capture", position=at(3, 100)),   # at: applied
                      item(30, "a", producer="capture", position=at(3, 200))])  # new
    m.push_many("b", [item(25, "b", producer="app"),                           # no position
                      item(35, "b", producer="capture", position=at(3, 150))])  # went backwards
    m.advance("a", 40)
    m.advance("b", 40)
    assert cts(m.pop_ready()) == [25, 30]
    assert m.producer_positions() == {"capture": at(3, 200)}
    assert m.stats().position_dropped == 3


def test_a_rewound_producer_passes_the_filter_by_its_higher_generation() -> None:
    """Deliberate rewinds (`ctl position set`) reset the drainer's per-producer filter: the
    rewound stream's positions carry a higher generation, which is after every older one."""
    m = merger("a")
    m.push_many("a", [item(10, "a", producer="cap", position=at(1, 10)),
                      item(20, "a", producer="cap", position=at(1, 20))])
    assert cts(m.pop_ready()) == [10, 20]
    # The producer re-reads from 1:10 at generation 1; a repeat within it is still dropped.
    again = at(1, 10)
    again.generation = 1
    m.push_many("a", [item(30, "a", producer="cap", position=again),
                      item(40, "a", producer="cap", position=again),
                      item(50, "a", producer="cap", position=at(1, 30))])  # generation 0: stale
    assert cts(m.pop_ready()) == [30]
    assert m.producer_positions() == {"cap": again}


def test_gtid_only_positions_filter_by_domain() -> None:
    m = merger("a", producer_positions={"cap": parse_position("mysql-bin.000042:1234 gtid=0-1-99")})
    m.push_many("a", [item(10, "a", producer="cap", position=parse_position("0-2-99")),
                      item(20, "a", producer="cap", position=parse_position("0-2-100"))])
    assert cts(m.pop_ready()) == [20]


def test_sources_can_be_added_and_removed_mid_stream() -> None:
    m = merger("a", "b")
    m.push_many("a", [item(10, "a"), item(20, "a")])
    m.advance("b", 15)
    assert cts(m.pop_ready()) == [10]
    # a new pump comes online (Notify): the merge waits for it from now on
    assert m.add_source("c", 15)
    assert not m.add_source("c", 0)  # a second Notify changes nothing
    m.advance("b", 100)
    assert m.pop_ready() == [] and m.holding_source() == "c"
    m.push(item(18, "c"))
    m.advance("c", 30)
    assert cts(m.pop_ready()) == [18, 20]
    # b goes offline (its final ts is checkpointed): the merge stops waiting for it ...
    m.push(item(160, "b"))
    m.advance("a", 200)
    m.advance("c", 140)
    assert m.pop_ready() == []
    assert m.remove_source("b")
    assert not m.remove_source("b")
    assert m.pending() == 1 and m.pop_ready() == []  # c at 140 still holds b's 160
    # ... and what b already delivered is still merged in order
    m.push(item(150, "c"))
    m.advance("c", 200)
    assert cts(m.pop_ready()) == [150, 160]
    assert m.merge_watermark == 200
    with pytest.raises(UnknownSource, match="'b'"):
        m.push(item(170, "b"))
    with pytest.raises(UnknownSource):
        m.advance("zzz", 1)


def test_a_source_added_below_the_merge_watermark_drops_its_old_items() -> None:
    m = merger("a")
    m.push_many("a", [item(10, "a", start=9), item(20, "a", start=19)])
    m.advance("a", 30)
    assert cts(m.pop_ready()) == [10, 20] and m.merge_watermark == 30
    m.add_source("replica", 5)  # read from an older checkpoint
    assert m.merge_watermark == 30  # never goes back, though the merge now waits for replica
    m.push_many("replica", [item(10, "replica", start=9), item(25, "replica", start=24),
                            item(40, "replica", start=39)])
    assert m.merge_watermark == 30
    m.advance("a", 50)
    m.advance("replica", 50)
    assert cts(m.pop_ready()) == [40]
    assert m.stats().duplicates_dropped == 1 and m.stats().late_dropped == 1


def test_fake_items_advance_watermarks_and_are_never_emitted() -> None:
    m = merger("a", "b")
    m.push_many("a", [item(10, "a"), fake(12, "a")])
    m.push(fake(11, "b"))
    assert cts(m.pop_ready()) == [10]
    assert m.merge_watermark == 11 and m.pending() == 0
    # idle pumps: only fakes, the merge watermark still moves (checkpoint while idle)
    for ts in (20, 30, 40):
        m.push(fake(ts, "a"))
        m.push_many("b", [fake(ts - 1, "b"), fake(ts + 1, "b")])
        assert m.pop_ready() == []
        assert m.merge_watermark == ts
    m.push(fake(35, "a"))  # a stale fake never moves a watermark back
    assert m.sources()["a"] == 40


def test_a_source_pushing_below_its_watermark_is_refused() -> None:
    m = merger("a", "b")
    m.push_many("a", [item(10, "a"), item(20, "a")])
    with pytest.raises(SourceOrderError, match="source 'a' pushed commit_ts 15"):
        m.push(item(15, "a"))
    with pytest.raises(SourceOrderError):
        m.push_many("b", [item(30, "b"), item(25, "b")])


def test_pop_limit_keeps_order_and_the_watermark_below_what_is_held_back() -> None:
    m = merger("a", "b")
    m.push_many("a", [item(ct, "a") for ct in range(1, 100, 2)])
    m.push_many("b", [item(ct, "b") for ct in range(2, 101, 2)])
    out = m.pop_ready(limit=7)
    assert cts(out) == list(range(1, 8))
    assert m.merge_watermark == 7
    m.push(item(101, "a"))  # new input between limited pops goes after what is held back
    while got := m.pop_ready(limit=10):
        out.extend(got)
    assert cts(out) == list(range(1, 101))
    with pytest.raises(ValueError):
        m.pop_ready(limit=0)


def test_plain_tuples_are_accepted() -> None:
    m = merger("a", "b")
    m.push_many("a", [(3, 2, "a", "app", None, "x", False), (5, 4, "a", "app", None, "y", False)])
    m.push((4, 1, "b", "app", None, "z", False))  # type: ignore[arg-type]
    m.advance("b", 9)
    assert [t[5] for t in m.pop_ready()] == ["x", "z", "y"]


def test_late_drop_is_logged_once_per_source_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    m = merger("a")
    m.advance("a", 100)
    m.pop_ready()
    m.add_source("b", 0)
    with caplog.at_level(logging.DEBUG, logger="sluice.drainer.merger"):
        m.push_many("b", [item(50, "b"), item(60, "b")])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "source b pushed commit_ts 50" in warnings[0].getMessage()


# ---------------------------------------------------------------------------------------------
# Property: random streams + random watermark advances
# ---------------------------------------------------------------------------------------------

@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, frozenset[int]]], list[int]]:
    n = draw(st.integers(2, 5))
    cts_ = draw(st.lists(st.integers(1, 10_000), unique=True, min_size=1, max_size=60))
    txns = []
    for ct in cts_:
        # one copy normally; sometimes a replica on a second pump (same start_ts and commit_ts)
        holders = frozenset(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2)))
        txns.append((ct, ct + 100_000, holders))
    ops = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=150))
    return n, txns, ops


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_random_streams_and_watermarks_give_sorted_complete_unique_output(
        scenario: tuple[int, list[tuple[int, int, frozenset[int]]], list[int]]) -> None:
    n, txns, ops = scenario
    names = [f"p{i}" for i in range(n)]
    streams: dict[str, list[MergeItem]] = {s: [] for s in names}
    for ct, start, holders in txns:
        for h in holders:
            streams[names[h]].append(MergeItem(ct, start, names[h], "app", None, ct))
    for s in names:
        streams[s].sort()
    m = merger(*names)
    cursor = dict.fromkeys(names, 0)
    out: list[MergeItem] = []

    def next_ct(s: str) -> int:
        return streams[s][cursor[s]].commit_ts if cursor[s] < len(streams[s]) else FAR

    for op in ops:
        s = names[op % n]
        kind = (op // n) % 4
        if kind == 0 and cursor[s] < len(streams[s]):
            k = 1 + (op // (4 * n)) % 5
            m.push_many(s, streams[s][cursor[s]:cursor[s] + k])
            cursor[s] += k
        elif kind == 1:
            # a legal watermark: below the source's next unpushed item
            lo = m.sources()[s]
            hi = next_ct(s) - 1
            if hi > lo:
                m.advance(s, lo + (op // (4 * n)) % (hi - lo + 1))
        elif kind == 2:
            m.push(MergeItem(min(next_ct(s) - 1, m.sources()[s] + 7), 0, s, "", None, None, True))
        else:
            got = m.pop_ready(limit=None if op % 3 else 1 + op % 5)
            out.extend(got)
            if op % 3:
                # complete up to the smallest watermark: nothing at or below it is still held
                low = min(m.sources().values())
                assert m.merge_watermark >= low
                emitted = {i.start_ts for i in out}
                assert all(start in emitted for ct, start, _ in txns if ct <= low)
        assert all(i.commit_ts <= min(m.sources().values()) for i in out)
    for s in names:
        m.push_many(s, streams[s][cursor[s]:])
        m.advance(s, FAR)
    out.extend(m.pop_ready())
    assert [i.commit_ts for i in out] == sorted(ct for ct, _, _ in txns)      # sorted, complete
    assert len({i.start_ts for i in out}) == len(out)                        # no duplicates


@pytest.mark.parametrize("limit", [None, 3000])
def test_a_large_backlog_merges_in_order_with_copies(limit: int | None) -> None:
    # larger than the merger's internal slices, so the stepped merge and sliced checks run
    rng = random.Random(5)
    names = ["a", "b", "c"]
    streams: dict[str, list[MergeItem]] = {s: [] for s in names}
    cts_ = rng.sample(range(1, 10**7), 30_000)
    for ct in cts_:
        for s in rng.sample(names, rng.choice([1, 1, 1, 2])):
            streams[s].append(item(ct, s))
    m = merger(*names)
    for s in names:
        streams[s].sort()
        m.push_many(s, streams[s])
        m.advance(s, FAR)
    out: list[MergeItem] = m.pop_ready(limit)
    assert len(out) == (limit or len(cts_))  # everything ready, or exactly the limit
    while got := m.pop_ready(limit):
        out.extend(got)
    assert cts(out) == sorted(cts_)
    assert m.merge_watermark == FAR and m.pending() == 0
