"""Snapshot modes (Debezium's snapshot.mode) as one pure decision at capture start.

Invariant: a capture never streams from a position it cannot prove complete: with no saved
position it snapshots first (unless `no_data`), an unfinished snapshot is resumed (never silently
abandoned, whatever the mode: under `no_data` it was started by a signal), and a saved position the source has purged is an error — except in `when_needed`,
which takes a fresh snapshot instead.

| mode           | nothing saved            | saved, snapshot unfinished | saved position purged      |
|----------------|--------------------------|----------------------------|----------------------------|
| `initial`      | snapshot, then stream    | resume snapshot, stream    | error (say when_needed)    |
| `initial_only` | snapshot, then stop      | resume snapshot, stop      | error                      |
| `no_data`      | stream from now, no data | resume snapshot, stream    | error                      |
| `when_needed`  | snapshot, then stream    | resume snapshot, stream    | new snapshot, stream       |
A finished snapshot with a saved, present position just streams (`initial_only`: stops).
"""
from __future__ import annotations

import dataclasses
import enum

from sluice.core.errors import ConfigError, FailedPrecondition

__all__ = ["SnapshotMode", "StartState", "StartPlan", "decide", "parse_mode", "PositionPurged"]


class SnapshotMode(str, enum.Enum):
    INITIAL = "initial"
    INITIAL_ONLY = "initial_only"
    NO_DATA = "no_data"
    WHEN_NEEDED = "when_needed"


class PositionPurged(FailedPrecondition):
    """The saved binlog position is no longer on the source."""


_ALIASES = {"schema_only": SnapshotMode.NO_DATA, "never": SnapshotMode.NO_DATA}


def parse_mode(text: str, where: str = "snapshot-mode") -> SnapshotMode:
    t = text.strip().lower().replace("-", "_")
    if t in _ALIASES:
        return _ALIASES[t]
    try:
        return SnapshotMode(t)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a snapshot mode; want one of "
                          f"{', '.join(m.value for m in SnapshotMode)}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class StartState:
    has_position: bool               # the pumps hold a committed position for this producer
    position_on_source: bool = True  # that position's GTIDs/binlog are still on the source
    snapshot_started: bool = False   # a SnapshotProgress exists
    snapshot_finished: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class StartPlan:
    snapshot: str            # "none" | "new" | "resume"
    stream: bool             # continue with the binlog after the snapshot
    stream_from: str         # "saved" | "current" (the source's binlog position now)
    reason: str


def decide(mode: SnapshotMode, state: StartState) -> StartPlan:
    stream = mode is not SnapshotMode.INITIAL_ONLY
    if not state.has_position:
        if mode is SnapshotMode.NO_DATA:
            return StartPlan("none", True, "current", "no saved position; no_data: stream from now")
        return StartPlan("new", stream, "current", "no saved position: initial snapshot")
    if not state.position_on_source:
        if mode is SnapshotMode.WHEN_NEEDED:
            return StartPlan("new", True, "current",
                             "saved position purged from the source: new snapshot (when_needed)")
        raise PositionPurged("the saved binlog position is no longer on the source (purged); "
                             "events after it are lost — set snapshot-mode = \"when_needed\" to "
                             "re-snapshot, or reset the position with `sluice ctl position set`")
    if state.snapshot_started and not state.snapshot_finished:
        return StartPlan("resume", stream, "saved", "unfinished snapshot: resume at its next chunk")
    if mode is SnapshotMode.INITIAL_ONLY:
        return StartPlan("none", False, "saved", "initial_only: snapshot already done; stopping")
    return StartPlan("none", True, "saved", "saved position: stream")
