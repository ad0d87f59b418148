"""TSO timestamps: ts = physical_ms << 18 | logical (TiDB's layout)."""
from __future__ import annotations

import datetime as dt
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.core import ts

PHYS = st.integers(min_value=0, max_value=(1 << 45) - 1)
LOGICAL = st.integers(min_value=0, max_value=ts.LOGICAL_MASK)


def test_layout_matches_tidb() -> None:
    assert ts.LOGICAL_BITS == 18
    assert ts.compose(1, 0) == 1 << 18
    assert ts.compose(1, 5) == (1 << 18) + 5
    t = 1554606413658 * 262144 + 1  # 2019-04-07T03:06:53.658Z, logical 1
    assert ts.physical_ms(t) == 1554606413658 and ts.logical(t) == 1
    assert ts.to_datetime(t).isoformat() == "2019-04-07T03:06:53.658000+00:00"


@given(PHYS, LOGICAL)
def test_round_trip(p: int, lg: int) -> None:
    t = ts.compose(p, lg)
    assert ts.physical_ms(t) == p and ts.logical(t) == lg


@given(PHYS, LOGICAL, PHYS, LOGICAL)
def test_order_is_physical_then_logical(p1: int, l1: int, p2: int, l2: int) -> None:
    """Comparing two ts compares (physical, logical): integer order is time order."""
    assert (ts.compose(p1, l1) < ts.compose(p2, l2)) == ((p1, l1) < (p2, l2))


def test_logical_out_of_range() -> None:
    for bad in (-1, ts.LOGICAL_MASK + 1):
        with pytest.raises(ValueError, match="out of range"):
            ts.compose(1, bad)


def test_now_and_datetime() -> None:
    before = int(time.time() * 1000)
    t = ts.now_ts()
    after = int(time.time() * 1000)
    assert before <= ts.physical_ms(t) <= after and ts.logical(t) == 0
    d = ts.to_datetime(ts.compose(1_700_000_000_123, 7))
    assert d == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.timezone.utc)


def test_lag_seconds() -> None:
    assert ts.lag_seconds(0) == 0.0 and ts.lag_seconds(-5) == 0.0
    old = ts.compose(int((time.time() - 10) * 1000))
    assert 9.5 < ts.lag_seconds(old) < 15
    future = ts.compose(int((time.time() + 60) * 1000))
    assert ts.lag_seconds(future) == 0.0
