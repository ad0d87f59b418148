"""Snapshot modes as a pure start-up decision (Debezium's snapshot.mode)."""
from __future__ import annotations

import pytest

from sluice.capture.snapshot.modes import (PositionPurged, SnapshotMode as M, StartState, decide,
                                           parse_mode)
from sluice.core.errors import ConfigError

FRESH = StartState(has_position=False)
RUNNING = StartState(has_position=True, snapshot_started=True)
DONE = StartState(has_position=True, snapshot_started=True, snapshot_finished=True)
PURGED = StartState(has_position=True, position_on_source=False, snapshot_finished=True)


@pytest.mark.parametrize("mode,state,snapshot,stream,start", [
    (M.INITIAL, FRESH, "new", True, "current"),
    (M.INITIAL, RUNNING, "resume", True, "saved"),
    (M.INITIAL, DONE, "none", True, "saved"),
    (M.INITIAL_ONLY, FRESH, "new", False, "current"),
    (M.INITIAL_ONLY, RUNNING, "resume", False, "saved"),
    (M.INITIAL_ONLY, DONE, "none", False, "saved"),
    (M.NO_DATA, FRESH, "none", True, "current"),
    (M.NO_DATA, RUNNING, "resume", True, "saved"),
    (M.WHEN_NEEDED, FRESH, "new", True, "current"),
    (M.WHEN_NEEDED, RUNNING, "resume", True, "saved"),
    (M.WHEN_NEEDED, PURGED, "new", True, "current"),
    (M.WHEN_NEEDED, DONE, "none", True, "saved"),
])
def test_mode_decisions(mode: M, state: StartState, snapshot: str, stream: bool, start: str) -> None:
    """Invariant: a capture never streams from a position it cannot prove complete; an
    unfinished snapshot is resumed, never silently abandoned."""
    plan = decide(mode, state)
    assert (plan.snapshot, plan.stream, plan.stream_from) == (snapshot, stream, start), plan.reason


@pytest.mark.parametrize("mode", [M.INITIAL, M.INITIAL_ONLY, M.NO_DATA])
def test_purged_position_is_an_error_outside_when_needed(mode: M) -> None:
    with pytest.raises(PositionPurged, match="when_needed"):
        decide(mode, PURGED)


def test_parse_mode() -> None:
    assert parse_mode("when-needed") is M.WHEN_NEEDED
    assert parse_mode("schema_only") is M.NO_DATA
    with pytest.raises(ConfigError, match="'always' is not a snapshot mode"):
        parse_mode("always")
