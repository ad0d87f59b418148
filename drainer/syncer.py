"""The merge-and-apply loop: one task owns the merge and the sink.

It pops commit-ordered transactions, records their schema effects, filters them (`[filter]`,
after the schema effects: a dropped transaction still advances the checkpoint), applies them,
saves checkpoints every `checkpoint-interval` (drainer/checkpointer.py), and performs the state
changes asked for through the registry (pausing -> paused, closing -> offline, resume, stop).
It is also the readers' target: readers push into the merge and wait for room here.
"""
from __future__ import annotations

import asyncio
import logging
import operator
import time
from typing import Any

from sluice.core import errors, failpoint
from sluice.core.position import is_empty
from sluice.core.registry import NodeState
from sluice.drainer.checkpointer import Checkpointer
from sluice.drainer.config import DrainerConfig
from sluice.drainer.filter import TxnFilter
from sluice.drainer.merge import MergeStrategy, new_merge
from sluice.drainer.merger import MergeItem, UnknownSource
from sluice.drainer.metrics import DrainerMetrics
from sluice.drainer.node_state import Node
from sluice.drainer.pumps import Pumps
from sluice.drainer.sink import BackgroundSink, RawSink, ServingSink, Sink, SinkCheckpoint
from sluice.drainer.txn import CorruptTxn, SchemaHistory, Txn

log = logging.getLogger(__name__)

# Merge items are plain tuples laid out as drainer.merger.MergeItem (no object per transaction).
_CT, _ST, _SOURCE, _PRODUCER, _POS, _PAYLOAD = range(6)
assert MergeItem._fields[:6] == ("commit_ts", "start_ts", "source_id", "producer_id",
                                 "position", "payload")
_raw_fields = operator.itemgetter(_CT, _ST, _PAYLOAD)   # a RawTxn's fields
_position = operator.itemgetter(_POS)


class Stopped(Exception):
    """The drainer went offline (closing -> offline) or was stopped: the process exits 0."""


class Syncer:
    """The merge, the sink and what moves transactions from one to the other."""

    def __init__(self, config: DrainerConfig, name: str, node: Node, checkpointer: Checkpointer,
                 metrics: DrainerMetrics, schema: SchemaHistory) -> None:
        self.config, self.name = config, name
        self.node = node
        self.ckpt = checkpointer
        self.metrics = metrics
        self.schema = schema
        self.filter = TxnFilter(config.filter)
        self.pumps: Pumps | None = None     # set by Pumps' owner once both exist
        self.sink: Sink | None = None
        self.raw_sink: RawSink | None = None          # the sink, when it takes raw batches
        self.background_sink: BackgroundSink | None = None
        self.merger: MergeStrategy | None = None
        self.columnar = False               # the merge and readers work in columns
        self.want_schema = False            # readers ask for the schema preamble
        self.binlogs_out = 0
        self.binlogs_in = 0                 # merged from the readers (raw sinks count these)
        self.txns_out = 0
        self._data = asyncio.Event()
        self._room = asyncio.Event()
        self._request: str | None = None     # "pause" | "close" | "resume" | "stop"
        self._fatal: BaseException | None = None

    # -- start --------------------------------------------------------------------------------

    def use_sink(self, sink: Sink, saved_schema: bool) -> None:
        """Take the (not yet opened) sink; what it can do decides the merge and the readers."""
        self.sink = sink
        caps = sink.capabilities
        self.raw_sink = sink if isinstance(sink, RawSink) else None
        self.background_sink = sink if isinstance(sink, BackgroundSink) else None
        # A sink taking merged columns gets them from a ColumnarMerge (drainer/columnar.py).
        self.columnar = self.config.columnar_merge and self.raw_sink is not None and caps.columns
        if self.columnar:
            from sluice.drainer.columnar import warm_up
            warm_up()   # once per process, not per merger (checkpoint set renews the merger)
        self.want_schema = not saved_schema and self.raw_sink is None

    def new_merger(self) -> None:
        positions = self.ckpt.reset_positions()
        self.merger = new_merge(self.columnar, self.ckpt.durable_ts, positions,
                                self.config.dedupe_window)
        if self.columnar:
            log.info("drainer %s merges plain pump responses in columns (sink %s)", self.name,
                     self.config.sink)

    def serving_sink(self) -> ServingSink | None:
        return self.sink if isinstance(self.sink, ServingSink) else None

    # -- ReaderTarget -------------------------------------------------------------------------

    def deliver(self, pump_id: str, items: Any, watermark: int, binlogs: int = 0) -> None:
        m = self.merger
        if m is None:
            return
        if self.raw_sink is not None:
            # A raw sink never unframes a transaction: count binlogs as the readers merge them.
            self.binlogs_in += binlogs
        try:
            if items.__class__ is not list:
                m.push_segment(pump_id, items)
            elif items:
                m.push_many(pump_id, items)
            m.advance(pump_id, watermark)
        except UnknownSource:
            return
        self._data.set()

    async def wait_room(self, pump_id: str) -> None:
        limit = self.config.reader_queue
        while True:
            m = self.merger
            if m is None:
                return
            try:
                if m.pending(pump_id) < limit:
                    return
            except UnknownSource:
                return
            self._room.clear()
            await self._room.wait()

    def record_schema(self, txn: Txn) -> None:
        self.schema.apply(txn)

    def reader_failed(self, pump_id: str, e: BaseException) -> None:
        log.error("pump %s reader stopped: %s", pump_id, e)
        if self._fatal is None:
            self._fatal = e
        self._data.set()

    def wake(self) -> None:
        self._data.set()

    def ask(self, what: str) -> None:
        """A state change for the loop to perform: pause, close, resume, stop."""
        if self._request is None:
            self._request = what
            self._data.set()
            self._room.set()

    def stop(self) -> None:
        """Stop (SIGTERM): replaces any request not yet taken; the loop flushes and saves."""
        self._request = "stop"
        self._data.set()
        self._room.set()

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        sink = self.sink
        assert sink is not None
        interval = self.config.checkpoint_interval
        next_save = time.monotonic() + interval
        batch = self.config.txn_batch
        raw = self.raw_sink
        successes = self.background_sink.successes() if self.background_sink else None
        while True:
            if self._fatal is not None:
                raise self._fatal
            if self._request is not None:
                await self._handle_request()
                next_save = time.monotonic() + interval
                continue
            m = self.merger
            applied = False
            room = True
            if m is not None:
                room = sink.has_room()
                if room:
                    items = m.pop_ready(limit=batch)
                    if items:
                        self._room.set()
                        await self._apply(items)
                        applied = True
                    if raw is not None:
                        raw.advance(m.merge_watermark)
            now = time.monotonic()
            if now >= next_save:
                if m is not None:
                    await self.save_checkpoint(final=False)
                next_save = time.monotonic() + interval
                continue
            if successes is not None and not successes.empty():
                # Record a background commit as soon as it is durable (it started at the last
                # periodic save or when the sink's batch filled).
                while not successes.empty():
                    successes.get_nowait()
                if m is not None:
                    await self.save_checkpoint(final=False, commit=False)
                continue
            if applied:
                continue
            timeout = next_save - now
            if not room:
                await sink.wait_room(timeout)
                continue
            await self._idle(timeout, successes)

    async def _idle(self, timeout: float, successes: asyncio.Queue[SinkCheckpoint] | None) -> None:
        """Wait for data, a request or (a background sink) a finished commit."""
        self._data.clear()
        if successes is None:
            try:
                await asyncio.wait_for(self._data.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            return
        data = asyncio.ensure_future(self._data.wait())
        done = asyncio.ensure_future(successes.get())
        _, pending = await asyncio.wait((data, done), timeout=timeout,
                                        return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        if done.done() and not done.cancelled():
            successes.put_nowait(done.result())   # read again by the loop, which saves

    async def _apply(self, items: Any) -> None:
        sink = self.sink
        assert sink is not None
        raw = self.raw_sink
        ckpt = self.ckpt
        bad: CorruptTxn | None = None
        if items.__class__ is not list:
            # A ColumnBatch (raw sink, columnar merge): no producer positions by construction.
            assert raw is not None
            await ckpt.raise_dispatched(items.last_ct)
            self.node.guard()
            raw.apply_columns(items)
            await self._applied(len(items), self.binlogs_in - self.binlogs_out)
            return
        if raw is not None:
            # (commit_ts, start_ts, framed binlogs): RawTxn's fields, built as plain tuples.
            batch = list(map(_raw_fields, items))
            await ckpt.raise_dispatched(items[-1][_CT])
            self.node.guard()
            raw.apply_raw(batch)
            applied = items
            nbin = self.binlogs_in - self.binlogs_out
        else:
            txns: list[Txn] = []
            applied = []
            nbin = 0
            schema = self.schema
            filt = self.filter if self.filter.active else None
            nfiltered = 0
            for it in items:
                try:
                    txn, nb = Txn.from_framed(it[_PAYLOAD], it[_SOURCE], it[_CT])
                except CorruptTxn as e:
                    if self.config.skip_corrupt:
                        self.metrics.on_reader_event(it[_SOURCE], "skipped")
                        log.error("skip-corrupt is set: dropping %s", e)
                        continue
                    bad = e
                    break
                if txn.changes_schema:
                    schema.apply(txn)
                applied.append(it)
                nbin += nb
                if filt is not None:
                    # After the schema effects: a table filtered today still decodes tomorrow.
                    kept = filt.filter(txn)
                    if kept is None:
                        nfiltered += 1   # still applied: the checkpoint moves past it
                        continue
                    txn = kept
                txns.append(txn)
            if nfiltered:
                self.metrics.filtered.inc(nfiltered)
            if txns:
                await ckpt.raise_dispatched(txns[-1].commit_ts)
                self.node.guard()
                await sink.apply(txns)
        if any(map(_position, applied)):
            for it in applied:
                pos = it[_POS]
                if pos is not None and not is_empty(pos):
                    ckpt.applied_position(it[_CT], it[_PRODUCER], pos)
        await self._applied(len(applied), nbin)
        if bad is not None:
            # Everything before the bad transaction is applied: make it durable and say where
            # the drainer stopped, so nothing is half-written and the restart point is exact.
            await self.save_checkpoint(follow_merge=False)
            raise errors.SluiceError(f"drainer {self.name} stopped: {bad} (everything before it "
                                     f"is applied, checkpoint {ckpt.durable_ts}; set "
                                     "skip-corrupt = true to drop such transactions)")

    async def _applied(self, txns: int, binlogs: int) -> None:
        self.txns_out += txns
        self.binlogs_out += binlogs
        self.metrics.txns.inc(txns)
        self.metrics.binlogs.inc(binlogs)
        await failpoint.ainject("drainer-after-apply")

    async def save_checkpoint(self, follow_merge: bool = True, final: bool = True,
                              commit: bool = True) -> None:
        """Checkpointer.save with the merge watermark read now, then let finished pumps go."""
        assert self.sink is not None
        # Read before the flush: everything emitted up to it has been applied, and the flush
        # makes it durable. Later emissions are not covered by this flush.
        w = self.merger.merge_watermark if self.merger is not None else self.ckpt.durable_ts
        await self.ckpt.save(self.sink, w, self.txns_out, self.schema, follow_merge=follow_merge,
                             final=final, commit=commit)
        if self.pumps is not None:
            await self.pumps.after_checkpoint()

    # -- own state (pausing / closing / resume / stop) -----------------------------------------

    async def _handle_request(self) -> None:
        what, self._request = self._request, None
        pumps = self.pumps
        assert pumps is not None
        node = self.node
        if what == "stop":
            if self.merger is not None:
                await pumps.stop_readers()
                await self.save_checkpoint()
                summary = self.merger.summary()
                if summary:
                    log.info("drainer %s: %s", self.name, summary)
            log.info("drainer %s stopped at checkpoint %d", self.name, self.ckpt.durable_ts)
            raise Stopped()
        if what in ("pause", "close"):
            if self.merger is not None:
                await pumps.stop_readers()
                await self.save_checkpoint()
                self.merger = None
            done = NodeState.PAUSED if what == "pause" else NodeState.OFFLINE
            ckpt = self.ckpt.durable_ts
            await node.finish(done, ckpt)
            log.info("drainer %s %s at checkpoint %d", self.name, done.value, ckpt)
            if done == NodeState.OFFLINE:
                raise Stopped()
            self._room.set()
        elif what == "resume" and node.state == NodeState.PAUSED.value:
            self.new_merger()
            node.state = NodeState.ONLINE.value
            await pumps.resume()
            log.info("drainer %s resumed after ts %d with %d pump(s)", self.name,
                     self.ckpt.durable_ts, len(pumps.readers))
