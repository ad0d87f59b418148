"""The pump sorter (DESIGN §2.3)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as hst

from sluice.core.errors import FailedPrecondition, InvalidArgument
from sluice.pump.storage.sorter import Sorter


def test_commit_served_only_when_no_older_prewrite_unresolved() -> None:
    """A commit with commit_ts C is served only when no prewrite with start_ts < C is
    unresolved. Served watermark = min(unresolved prewrite start_ts) - 1, capped by the highest
    commit or fake ts received; it never goes backwards."""
    s = Sorter()
    s.prewrite(5)
    s.prewrite(7)
    assert s.commit(7, 9) == 4, "9 waits for the unresolved prewrite 5"
    assert s.watermark < 9
    assert s.commit(5, 10) == 10, "5 resolved: 9 and 10 are served"


def test_rollback_drops_the_prewrite() -> None:
    s = Sorter()
    s.prewrite(5)
    s.prewrite(7)
    s.commit(7, 9)
    assert s.rollback(5) == 9
    assert s.unresolved() == []
    with pytest.raises(FailedPrecondition):
        s.rollback(5)


def test_commit_below_watermark_refused() -> None:
    s = Sorter()
    s.fake(100)
    s.prewrite(50)
    assert s.watermark == 100, "a late prewrite never moves the watermark backwards"
    with pytest.raises(FailedPrecondition, match="served watermark"):
        s.commit(50, 90)
    assert s.commit(50, 101) == 101
    with pytest.raises(FailedPrecondition):
        s.fake(100)


def test_commit_rules() -> None:
    s = Sorter()
    with pytest.raises(FailedPrecondition, match="without its prewrite"):
        s.commit(3, 4)
    s.prewrite(3)
    with pytest.raises(InvalidArgument):
        s.commit(3, 3)


def test_multi_part_prewrite_is_one_transaction() -> None:
    s = Sorter()
    s.prewrite(10, part_no=1, part_count=3)
    s.fake(20)
    assert s.watermark == 9
    s.prewrite(10, part_no=0, part_count=3)
    with pytest.raises(FailedPrecondition, match="before all parts"):
        s.commit(10, 21)
    with pytest.raises(InvalidArgument):
        s.prewrite(10, part_no=3, part_count=3)
    s.prewrite(10, part_no=2, part_count=3)
    assert len(s.unresolved()) == 1
    assert s.commit(10, 21) == 21


@given(hst.lists(hst.tuples(hst.sampled_from("pcrf"), hst.integers(1, 60)), max_size=80))
def test_watermark_never_goes_backwards_and_never_passes_an_unresolved_prewrite(
        ops: list[tuple[str, int]]) -> None:
    s = Sorter()
    last = 0
    early: set[int] = set()  # prewrites that arrived while the watermark was below them
    for op, ts in ops:
        try:
            if op == "p":
                before = s.watermark
                s.prewrite(ts)
                if ts > before:
                    early.add(ts)
            elif op == "c":
                s.commit(ts, ts + 3)
                early.discard(ts)
            elif op == "r":
                s.rollback(ts)
                early.discard(ts)
            else:
                s.fake(ts)
        except (FailedPrecondition, InvalidArgument):
            pass
        assert s.watermark >= last
        last = s.watermark
        assert s.watermark <= s.max_ts or s.watermark == 0
        for start_ts in early & set(s.pending):
            assert s.watermark < start_ts, "a commit above an unresolved prewrite was served"
