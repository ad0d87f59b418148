"""TSO timestamps: ts = physical_ms << 18 | logical (TiDB's layout)."""
from __future__ import annotations

import datetime as _dt
import time

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1


def compose(physical_ms: int, logical: int = 0) -> int:
    if not 0 <= logical <= LOGICAL_MASK:
        raise ValueError(f"logical part {logical} out of range 0..{LOGICAL_MASK}")
    return (physical_ms << LOGICAL_BITS) | logical


def physical_ms(ts: int) -> int:
    return ts >> LOGICAL_BITS


def logical(ts: int) -> int:
    return ts & LOGICAL_MASK


def now_ts() -> int:
    """A local, non-authoritative ts for the current wall clock (lag metrics, initial-commit-ts)."""
    return compose(int(time.time() * 1000))


def to_datetime(ts: int) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(physical_ms(ts) / 1000, tz=_dt.timezone.utc)


def lag_seconds(ts: int) -> float:
    """Wall-clock seconds since the physical part of ts (0 for ts <= 0)."""
    if ts <= 0:
        return 0.0
    return max(0.0, time.time() - physical_ms(ts) / 1000)
