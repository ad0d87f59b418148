"""Value-log garbage collection: which whole segments may go (DESIGN §2.8, §3 GC).

Invariant: a segment is deleted only when every record in it has ts <= safe ts and every prewrite
in it was committed or rolled back at <= safe ts; the active segment and the segments holding a
pinned schema-bearing transaction are never deleted (schema pins: docs/storage.md, "GC").
`plan` is pure; `scan` lists the index keys pointing into the chosen segments.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import plyvel

from . import index as ix


@dataclass
class SegmentSummary:
    """What GC needs to know about one segment, maintained with every write group."""

    max_ts: int = 0       # highest ts of any record in it (start_ts for prewrite/rollback)
    max_need_ts: int = 0  # highest commit_ts of the committed prewrites stored in it


@dataclass(frozen=True)
class GCPlan:
    safe_ts: int
    segments: frozenset[int]           # to delete
    kept_schema: frozenset[int]        # deletable by age, kept for a pinned schema transaction
    dropped_pins: tuple[tuple[int, int], ...] = ()   # (table_id, commit_ts) no longer needed


# table_id -> its pins (commit_ts, segments), sorted by commit_ts
Pins = Mapping[int, tuple[tuple[int, frozenset[int]], ...]]


def retained_pins(pins: Pins, safe_ts: int
                  ) -> tuple[dict[int, tuple[tuple[int, frozenset[int]], ...]],
                             list[tuple[int, int]]]:
    """(pins kept per table, (table_id, commit_ts) of the pins dropped) at `safe_ts`."""
    kept: dict[int, tuple[tuple[int, frozenset[int]], ...]] = {}
    dropped: list[tuple[int, int]] = []
    for table, table_pins in pins.items():
        base = 0   # index of the latest pin at or below safe_ts
        for i, (commit_ts, _) in enumerate(table_pins):
            if commit_ts <= safe_ts:
                base = i
        kept[table] = table_pins[base:]
        dropped.extend((table, commit_ts) for commit_ts, _ in table_pins[:base])
    return kept, dropped


@dataclass(frozen=True)
class GCStats:
    gc_ts: int
    deleted_segments: tuple[int, ...] = ()
    kept_schema_segments: tuple[int, ...] = ()
    freed_bytes: int = 0
    index_entries_deleted: int = 0


def plan(safe_ts: int, summaries: Mapping[int, SegmentSummary], active_segment: int,
         pending_segments: Iterable[int], pins: Pins) -> GCPlan:
    """The segments that may be deleted at `safe_ts` (see the module invariant)."""
    busy = set(pending_segments)
    kept_pins, dropped = retained_pins(pins, safe_ts)
    schema: set[int] = set()
    for table_pins in kept_pins.values():
        for _, segs in table_pins:
            schema.update(segs)
    dead, kept = set(), set()
    for seg, s in summaries.items():
        if seg == active_segment or seg in busy:
            continue
        if s.max_ts <= safe_ts and s.max_need_ts <= safe_ts:
            (kept if seg in schema else dead).add(seg)
    return GCPlan(safe_ts, frozenset(dead), frozenset(kept), tuple(dropped))


def scan(db: plyvel.DB, p: GCPlan) -> list[bytes]:
    """Index keys (entries and their transactions' t-records) pointing into `p.segments`.

    Entries in a deletable segment all have ts <= safe ts, so only that range is read.
    """
    if not p.segments:
        return []
    dead = p.segments
    keys: list[bytes] = []
    for prefix in (ix.E, ix.S):
        for key, val in db.iterator(start=ix.ts_key(prefix, 0),
                                    stop=ix.ts_key(prefix, p.safe_ts + 1)):
            if ix.entry_val_unpack(val)[0] in dead:
                keys.append(key)
                if prefix == ix.S:
                    keys.append(ix.ts_key(ix.T, ix.parse_entry_key(key)[1]))
    return list(dict.fromkeys(keys))
