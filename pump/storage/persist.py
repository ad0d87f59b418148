"""Make a validated group durable: ONE value-log append + fdatasync, then ONE synced index batch,
then (memory after disk) the in-memory state. Committer thread only."""
from __future__ import annotations

import time

from sluice.core import failpoint

from . import index as ix
from .gc import SegmentSummary
from .records import PartLoc, Stage, SchemaPin
from .sorter import Pending
from .state import StoreState

# Builds a named tuple without the Python-level `__new__` its class defines (one frame per call,
# once per prewrite here): every field is given, in order.
_tuple_new = tuple.__new__


def persist(state: StoreState, grp: Stage) -> int:
    """Write `grp` durably and apply it to `state`; returns the new served watermark."""
    vlog = state.vlog
    prev_end = vlog.end
    t0 = time.monotonic()
    try:
        locs = vlog.append(grp.records, grp.crcs) if grp.records else []
        vlog.sync()
    except BaseException:
        vlog.rollback_to(prev_end)
        raise
    dt = time.monotonic() - t0
    s = state.stats
    s["fsync_seconds_total"] += dt
    s["fsync_count"] += 1
    s["fsync_last_seconds"] = dt
    failpoint.inject("storage-after-vlog-sync")

    wb = state.db.write_batch(sync=state.options.sync)
    put = wb.put
    pack = ix.entry_val_pack
    summaries = state.summaries
    touched: dict[int, SegmentSummary] = {}
    part_segs: dict[int, set[int]] = {}
    part_locs: dict[int, PartLoc] = {}      # by start_ts: a prewrite record of this group
    # The per-record loop below runs for every binlog: the records are plain tuples
    # (records.py) unpacked in place, and the summary of the segment being written is cached.
    commit_of = {c[3]: c[2] for c in grp.commits}
    cpack = ix.commit_val_pack
    sm_seg, sm = -1, SegmentSummary()
    for j, ((seg, off), (key, h, aux, ts, part_of), payload) in enumerate(
            zip(locs, grp.meta, grp.records)):
        length = len(payload)
        p = commit_of.get(j) if aux else None
        if p is not None and p.part_count == 1:
            ploc = part_locs.get(aux) or p.loc
            if ploc is not None:
                put(key, cpack(seg, off, length, h, aux, *ploc))
            else:
                put(key, pack(seg, off, length, h, aux))
        else:
            put(key, pack(seg, off, length, h, aux))
        if seg != sm_seg:
            sm_seg = seg
            sm = touched.get(seg)
            if sm is None:
                sm = touched[seg] = summaries.get(seg) or SegmentSummary()
        if ts > sm.max_ts:
            sm.max_ts = ts
        if part_of:
            segs = part_segs.get(part_of)
            if segs is None:
                part_segs[part_of] = {seg}
            else:
                segs.add(seg)
            part_locs[part_of] = (seg, off, length)
    ts_key, t_pack, T, U = ix.ts_key, ix.txn_val_pack, ix.T, ix.U
    for start_ts, t in grp.txn.items():
        put(ts_key(T, start_ts), t_pack(*t))
    sorter_pending = state.sorter.pending
    now_wall_ms = int(time.time() * 1000)
    unresolved_val = ix.unresolved_val
    for start_ts, p in grp.pending.items():
        if p is None:
            if start_ts in sorter_pending:
                wb.delete(ts_key(U, start_ts))
        elif start_ts not in sorter_pending:
            put(ts_key(U, start_ts),
                unresolved_val(p.part_count, now_wall_ms, p.tables, p.producer_id))
    schema_updates: dict[int, tuple[SchemaPin, ...]] = {}
    new_pins: list[tuple[int, SchemaPin]] = []
    for start_ts, commit_ts, p, record in grp.commits:
        in_group = part_segs.get(start_ts)
        segs = p.segments.union(in_group) if in_group else p.segments
        for seg in segs:
            sm = touched.get(seg)
            if sm is None:
                sm = touched[seg] = summaries.get(seg) or SegmentSummary()
            if commit_ts > sm.max_need_ts:
                sm.max_need_ts = commit_ts
        if p.tables:
            segs = segs | {locs[record].segment}
            pin = SchemaPin(commit_ts, frozenset(segs))
            for table in p.tables:
                cur = schema_updates.get(table) or state.schema.get(table, ())
                schema_updates[table] = tuple(sorted((*cur, pin)))
                new_pins.append((table, pin))
    for seg, sm in touched.items():
        put(ix.seg_key(seg), ix.summary_val(sm.max_ts, sm.max_need_ts))
    for table, pin in new_pins:
        put(ix.pin_key(table, pin.commit_ts), ix.pin_val(pin.segments))
    for pid, rec in grp.producers.items():
        put(ix.producer_key(pid), ix.producer_val(*rec))
    end = vlog.end
    put(ix.META_VLOG_END, ix.loc_val(end.segment, end.offset))
    max_ts = max(grp.max_ts, state.sorter.max_ts)
    put(ix.META_MAX_TS, ix.int_val(max_ts))
    # The watermark before this group: recovery recomputes this group's from the stored
    # unresolved prewrites and max ts, never below this one.
    put(ix.META_WATERMARK, ix.int_val(state.served))
    wb.write()

    # Memory after disk: get_commit relies on the index knowing a resolution first.
    summaries.update(touched)
    state.schema.update(schema_updates)
    state.producers.update(grp.producers)
    sorter = state.sorter
    for start_ts, p in grp.pending.items():
        if p is None:
            sorter.drop(start_ts)
        else:
            segs = part_segs.get(start_ts)
            if segs:
                # Built directly, not by `_replace` (once per prewrite: see records.py).
                start_ts, part_count, parts, producer_id, since, old, tables, _ = p
                p = _tuple_new(Pending, (start_ts, part_count, parts, producer_id, since,
                                         old.union(segs), tables,
                                         part_locs[start_ts] if part_count == 1 else None))
            sorter.put(p)
    # Every `s` key of the group is under a start_ts in grp.pending, every `t` key in grp.txn.
    if grp.pending:
        state.max_start_ts = max(state.max_start_ts, max(grp.pending))
    if grp.txn:
        state.max_start_ts = max(state.max_start_ts, max(grp.txn))
    sorter.observe(max_ts)
    state.served = sorter.advance()
    return state.served
