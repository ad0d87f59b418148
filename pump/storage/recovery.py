"""Opening a data directory and rebuilding memory from the index; applying a GC plan.

Recovery truncates the value log to the last end the index acknowledged (an unacknowledged tail
is dropped), removes segments a crashed GC left behind, and rebuilds the sorter, producers and
schema pins from the index (docs/storage.md).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import plyvel

from sluice.core.errors import FailedPrecondition
from sluice.core.log import kv
from sluice.proto import sluice_pb2 as pb

from . import gc as gcmod
from . import index as ix
from .gc import GCStats, SegmentSummary
from .records import ProducerRecord, SchemaPin
from .sorter import Pending, Sorter
from .state import StoreState
from .vlog import Location

log = logging.getLogger(__name__)


def open_index(data_dir: Path) -> plyvel.DB:
    """Open (creating if needed) the LevelDB index and check its format version."""
    db = plyvel.DB(str(data_dir / "index"), create_if_missing=True, bloom_filter_bits=10,
                   lru_cache_size=32 << 20, write_buffer_size=16 << 20)
    try:
        version = db.get(ix.META_VERSION)
        if version is None:
            if next(db.iterator(include_value=False), None) is not None:
                raise FailedPrecondition(f"{data_dir}/index has no format version: not a "
                                         "Sluice pump data directory")
            db.put(ix.META_VERSION, str(ix.FORMAT_VERSION).encode(), sync=True)
        elif version != str(ix.FORMAT_VERSION).encode():
            raise FailedPrecondition(
                f"{data_dir}: storage format version {version.decode(errors='replace')!r} is "
                f"not supported by this build (it reads version {ix.FORMAT_VERSION}); "
                "use the Sluice release that wrote it")
    except BaseException:
        db.close()
        raise
    return db


def recover(state: StoreState) -> None:
    """Bring the value log and `state` back to what the index acknowledged."""
    db, vlog = state.db, state.vlog
    raw_end = db.get(ix.META_VLOG_END)
    end = Location(*ix.parse_loc(raw_end)) if raw_end else Location(1, 0)
    dropped = vlog.truncate_to(end)
    for key, val in db.iterator(prefix=ix.G):
        state.summaries[ix.parse_seg_key(key)] = SegmentSummary(*ix.parse_summary(val))
    for seg in vlog.segments():
        if seg < end.segment and seg not in state.summaries:
            # GC committed its index deletes but crashed before unlinking the file.
            log.warning("recovery: removing garbage-collected segment %s", vlog.path(seg),
                        extra=kv(segment=seg))
            vlog.delete_segment(seg)
    state.gc_ts = ix.parse_int(db.get(ix.META_GC_TS))
    state.sorter = Sorter(ix.parse_int(db.get(ix.META_WATERMARK)),
                          ix.parse_int(db.get(ix.META_MAX_TS)))
    for key, val in db.iterator(prefix=ix.P):
        state.producers[key[1:].decode()] = ProducerRecord(*ix.parse_producer_val(val))
    state.schema = _recover_pins(state)
    now_mono, now_wall = time.monotonic(), time.time()
    for key, val in db.iterator(prefix=ix.U):
        start_ts = ix.parse_ts_key(key)
        part_count, wall_ms, tables, producer = ix.parse_unresolved(val)
        p = Pending(start_ts, part_count, 0, producer,
                    now_mono - max(0.0, now_wall - wall_ms / 1000), frozenset(), tables)
        prefix = ix.ts_key(ix.S, start_ts) + bytes([pb.PREWRITE])
        for pkey, pval in db.iterator(prefix=prefix):
            seg, off, length = ix.entry_val_unpack(pval)[:3]
            p = p.with_part(ix.parse_entry_key(pkey)[3], seg)
            if part_count == 1:
                p = p._replace(loc=(seg, off, length))
        state.sorter.put(p)
    state.served = state.sorter.advance()
    state.max_start_ts = max_stored_start_ts(db)
    log.info("storage %s open: vlog end %s:%d (%d bytes of unacknowledged tail dropped), "
             "served watermark %d, %d unresolved prewrites, gc ts %d", state.data_dir,
             end.segment, end.offset, dropped, state.served, len(state.sorter.pending),
             state.gc_ts)


def max_stored_start_ts(db: plyvel.DB) -> int:
    """The highest start_ts of any `s` (prewrite part, rollback) or `t` (resolution) entry; 0
    when there is none. Keys sort by start_ts big-endian: the last key of each keyspace."""
    out = 0
    for prefix in (ix.S, ix.T):
        key = next(db.iterator(prefix=prefix, reverse=True, include_value=False), None)
        if key is not None:
            out = max(out, ix.parse_ts_key(key))
    return out


def _recover_pins(state: StoreState) -> dict[int, tuple[SchemaPin, ...]]:
    """The schema pins per table; entries in the first key layout are rewritten."""
    db = state.db
    pins: dict[int, list[SchemaPin]] = {}
    legacy: list[tuple[bytes, int, SchemaPin]] = []
    for key, val in db.iterator(prefix=ix.K):
        table, commit_ts, segs = ix.parse_pin(key, val)
        pin = SchemaPin(commit_ts, segs)
        pins.setdefault(table, []).append(pin)
        if len(key) != len(ix.pin_key(0, 0)):
            legacy.append((key, table, pin))
    if legacy:
        with db.write_batch(sync=state.options.sync) as wb:
            for key, table, pin in legacy:
                wb.delete(key)
                wb.put(ix.pin_key(table, pin.commit_ts), ix.pin_val(pin.segments))
    return {t: tuple(sorted(p)) for t, p in pins.items()}


# -- GC on the committer thread (the index scan between the two runs in a worker) -------------

def gc_plan(state: StoreState, safe_ts: int) -> gcmod.GCPlan | None:
    safe = min(safe_ts, state.served)
    if safe <= state.gc_ts:
        return None
    pending_segs: set[int] = set()
    for p in state.sorter.pending.values():
        pending_segs.update(p.segments)
    return gcmod.plan(safe, state.summaries, state.vlog.end.segment, pending_segs, state.schema)


def gc_apply(state: StoreState, plan: gcmod.GCPlan, keys: list[bytes]) -> GCStats:
    if not plan.segments and not plan.dropped_pins:
        # Nothing deleted: readers from older ts still get everything, so the GC ts (the
        # bound below which reads are refused) must not move.
        return GCStats(state.gc_ts, (), tuple(sorted(plan.kept_schema)), 0, 0)
    wb = state.db.write_batch(sync=state.options.sync)
    for key in keys:
        wb.delete(key)
    for seg in plan.segments:
        wb.delete(ix.seg_key(seg))
    for table, commit_ts in plan.dropped_pins:
        wb.delete(ix.pin_key(table, commit_ts))
    if plan.segments:
        wb.put(ix.META_GC_TS, ix.int_val(plan.safe_ts))
    wb.write()
    if plan.dropped_pins:
        gone: dict[int, set[int]] = {}
        for table, commit_ts in plan.dropped_pins:
            gone.setdefault(table, set()).add(commit_ts)
        for table, commits in gone.items():
            state.schema[table] = tuple(pin for pin in state.schema.get(table, ())
                                        if pin.commit_ts not in commits)
    if not plan.segments:
        return GCStats(state.gc_ts, (), tuple(sorted(plan.kept_schema)), 0, 0)
    state.gc_ts = plan.safe_ts
    freed = 0
    for seg in sorted(plan.segments):
        state.summaries.pop(seg, None)
        freed += state.vlog.delete_segment(seg)
    state.vlog.sync_dir()
    stats = GCStats(plan.safe_ts, tuple(sorted(plan.segments)),
                    tuple(sorted(plan.kept_schema)), freed, len(keys))
    log.info("gc at ts %d: deleted segments %s (%d bytes, %d index entries), kept for "
             "schema %s", plan.safe_ts, list(stats.deleted_segments), freed, len(keys),
             list(stats.kept_schema_segments),
             extra=kv(gc_ts=plan.safe_ts, freed_bytes=freed))
    return stats
