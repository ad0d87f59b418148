"""Streaming of one capture incarnation: the binlog reader, snapshot and etcd-signal threads
feeding one queue, transactions grouped and written to the pumps, reconnects, and the lag and
snapshot-progress publishers. docs/capture.md ("Threads").
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.capture.handoff import Handoff
from sluice.capture.payload import change_count
from sluice.capture.reader import BinlogReader, SourceDisconnected, SourceTxn
from sluice.capture.writer import PrewrittenGroup
from sluice.capture.snapshot.progress import decode
from sluice.capture.snapshot.signals import InvalidSignal, parse_etcd_signal
from sluice.core import errors
from sluice.core.keywatch import KeyWatch
from sluice.core.registry import snapshot_progress_path
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)

_QUEUE = 1024
_END = object()
_STOP = object()
RECONNECT_BACKOFF_S = (0.2, 5.0)     # first and longest wait between reconnect attempts
TICK_S = 0.1            # snapshot emission ticker (read-only chunks while the source idles)
SIGNAL_POLL_S = 0.25    # etcd signal channel: ticks (committed signals deleted); read when changed
PUBLISH_S = 0.5         # snapshot progress to etcd
READER_JOIN_S = 10.0    # how long a stop waits for the binlog reader's thread


class _Disconnected:
    """Queue marker: the reader's connection ended; everything read before it is queued."""

    def __init__(self, error: SourceDisconnected, resume: str) -> None:
        self.error, self.resume = error, resume

def _progress_only(txn: SourceTxn) -> bool:
    """A row-less snapshot progress record: it ends its group, because the writer drops empty
    transactions that are not the last of a group and this one must reach the pumps."""
    return txn.snapshot is not None and txn.empty


def _weight(item: object) -> int | None:
    """A queued item's bytes toward the group budget; None for what ends a group (a marker, an
    error, a row-less snapshot progress record)."""
    if type(item) is SourceTxn and not _progress_only(item):
        return item.size
    return None


def progress_doc(p: pb.SnapshotProgress) -> dict[str, Any]:
    """Snapshot progress as the JSON `sluice ctl snapshot status` shows."""
    st = decode(p)
    return {"snapshot_id": st.snapshot_id, "mode": st.mode, "tables": list(st.tables),
            "current_table": st.current_table, "chunks_done": st.chunks_done,
            "rows_done": st.rows_done, "finished": st.finished, "paused": st.paused,
            "conditions": [list(c) for c in st.conditions],
            "published_ms": int(time.time() * 1000)}



async def _next(queue: Handoff, pending: list[asyncio.Task[None] | None], full_items: int,
                full_bytes: int) -> object:
    """The first item of the next group. While a group's commit is in flight, the next group
    starts only when a whole group (`full_items` or `full_bytes`) or a marker is waiting: the
    source is ahead, and overlapping the round trips is what keeps up with it. Otherwise the
    commit ends first and the group takes what arrived meanwhile, so at a rate the capture keeps
    up with groups stay as large (and as few) as without the overlap. A failed commit raises
    its error at once, even when the source is idle."""
    while True:
        p = pending[0]
        if p is None:
            return await queue.get()
        if p.done():
            pending[0] = None
            await p     # its error, if any
            continue
        # fill() takes nothing from the queue: cancelling it loses no item.
        wait = asyncio.ensure_future(queue.fill(full_items, full_bytes, 3600.0))
        await asyncio.wait({wait, p}, return_when=asyncio.FIRST_COMPLETED)
        if wait.done():
            await wait
            if queue.qsize():
                return queue.get_nowait()
        else:
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)


class Streaming:
    """The streaming half of `Capture` (capture/incarnation.py), which sets up what it uses."""

    # -- streaming ----------------------------------------------------------------------------

    def _start_reader(self, start: str, queue: Handoff) -> None:
        c = self.config
        loop = asyncio.get_running_loop()

        def connected() -> None:
            loop.call_soon_threadsafe(lambda: self.metrics.set_state(
                "streaming", after=start or "(first binlog)"))

        reader = self._reader = BinlogReader(
            c.source.connection(), replica_server_id=c.source.server_id, tracker=self.tracker,
            gtid_state=start, heartbeat_s=c.heartbeat_s, on_connected=connected)
        put = self._put
        skip_before_ms = c.start_timestamp_ms()
        snap = self.snapshotter
        assert snap is not None

        def reader_thread() -> None:
            try:
                for txn in reader.transactions():
                    if self._stop.is_set():
                        return
                    # Read while the generator is suspended: the end of this transaction.
                    end = reader.assembler.last_event_end
                    if skip_before_ms is not None and txn.ts_ms < skip_before_ms:
                        txn = self._skipped(txn)
                    snap.process(txn, end)
                put(_END)
            except SourceDisconnected as e:
                if not self._stop.is_set():
                    put(_Disconnected(e, reader.assembler.resume_state()))
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
                if not self._stop.is_set():
                    put(e)

        t = self._reader_thread = threading.Thread(target=reader_thread, name="binlog-reader",
                                                   daemon=True)
        t.start()

    async def _stop_reader(self) -> None:
        """Join the binlog reader's thread, then close its connection. The thread may wait in
        the native socket read, which runs without the GIL: left running, a read that returns
        while the interpreter finalizes crashes the process on its way back into Python (exit
        -6 or -11 after "capture stopped"). `wake` shuts the socket down until the thread is
        gone (it may still be connecting). On a stop `self._stop` is set first, so the woken
        thread hands nothing on; before a reconnect the thread has already handed on the loss."""
        reader, thread = self._reader, self._reader_thread
        if reader is None:
            return
        deadline = time.monotonic() + READER_JOIN_S
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            reader.wake()
            await asyncio.to_thread(thread.join, 0.2)
        if thread is not None and thread.is_alive():
            log.warning("binlog reader thread still running %.0f s after the stop; closing its "
                        "connection anyway", READER_JOIN_S)
        reader.close()

    def _start_snapshot(self, queue: Handoff) -> None:
        """The snapshot thread, the emission ticker and the etcd signal poller; a failure of
        the snapshot fails the capture (a restart resumes at the next chunk)."""
        snap = self.snapshotter
        assert snap is not None
        put = self._put

        def snapshot_thread() -> None:
            try:
                snap.run(self._stop)
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
                if not self._stop.is_set():
                    put(e)

        def ticker() -> None:
            try:
                while not self._stop.wait(TICK_S):
                    snap.tick(self._reader)
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
                if not self._stop.is_set():
                    put(e)

        for target, name in ((snapshot_thread, "snapshot"), (ticker, "snapshot-tick"),
                             (self._signal_poller, "etcd-signals")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def _signal_poller(self) -> None:
        """Signals from etcd (read-only sources): the prefix is watched and read when it changed
        (they are rare: no Range request every tick); each key is applied once per process and
        deleted once its effect is committed (`_acked`)."""
        snap = self.snapshotter
        assert snap is not None
        prefix = self.registry.signals_prefix(self.config.producer_id)
        watch = KeyWatch(self.etcd, prefix, prefix=True)
        seen: set[str] = set()
        try:
            while not self._stop.is_set():
                due = watch.wait(SIGNAL_POLL_S)
                if self._stop.is_set():
                    return
                for key in snap.committed(()):    # signals that changed nothing: no commit to wait for
                    self._delete_key(key)
                if not due:
                    continue
                try:
                    kvs, _ = self.etcd.get_prefix(prefix)
                except errors.SluiceError as e:
                    watch.again()
                    log.warning("etcd signals not read: %s", e)
                    continue
                self._apply_signals(snap, kvs, seen)
        finally:
            watch.cancel()

    def _apply_signals(self, snap: Any, kvs: list[tuple[bytes, Any]], seen: set[str]) -> None:
        for value, meta in sorted(kvs, key=lambda kv: kv[1].create_revision):
            key = meta.key.decode() if isinstance(meta.key, bytes) else str(meta.key)
            if key in seen:
                continue
            seen.add(key)
            try:
                sig = parse_etcd_signal(key, value)
            except InvalidSignal as e:
                log.error("etcd signal ignored: %s", e, extra=kv(key=key))
                self._delete_key(key)
                continue
            log.info("etcd signal received", extra=kv(key=key, signal=sig.id))
            snap.submit(sig, key)

    def _delete_key(self, key: str) -> None:
        try:
            self.etcd.delete(key)
        except errors.SluiceError as e:
            log.warning("etcd signal key %s not deleted: %s", key, e)

    def _skipped(self, txn: SourceTxn) -> SourceTxn:
        """A transaction committed before `start-position = timestamp:T`, made empty: it only
        carries the position forward (in the reader thread, which owns the tracker).

        Its DDL still shaped the tracker's models, but what it declared never goes downstream:
        the tracker forgets its declarations, so the next TableMap of each table declares again.
        """
        if txn.ddls or txn.schema_snapshots:
            self.tracker.reset_declared()
        return dataclasses.replace(txn, mutations=(), schema_snapshots=(), ddls=(), size=0)

    async def _stream(self, start: str) -> None:
        c = self.config
        loop = asyncio.get_running_loop()
        queue = Handoff(loop, _QUEUE, _weight)
        self._queue = queue
        put = self._put = queue.put
        snap = self.snapshotter
        assert snap is not None
        snap.attach(put)
        if self._stop_after_snapshot:
            snap.on_finished = lambda: put(_STOP)     # initial_only: after the last chunk
        self._start_reader(start, queue)
        self._start_snapshot(queue)
        publish = loop.create_task(self._publish_progress(), name="snapshot-progress")
        try:
            await self._groups(queue)
        finally:
            queue.close()
            publish.cancel()

    async def _groups(self, queue: Handoff) -> None:
        """Group the source transactions and write each group. Two groups are in flight at
        most: when a whole group is waiting (the source is ahead), group k+1's prewrites go out
        while group k's commit is in flight (its round trip through the pumps, not the CPU,
        bounds the rate on a busy machine); group k+1's commit starts only after group k's
        returned (capture/writer.py: the committed set stays a prefix of the source order),
        and a marker (a reconnect, the end) waits for both."""
        pending: list[asyncio.Task[None] | None] = [None]   # the group whose commit is in flight
        try:
            await self._group_loop(queue, pending)
        except BaseException:
            p = pending[0]
            if p is not None and not p.done():
                # Let the commit in flight end as it would (a crash mid-write is decided by the
                # next epoch anyway); its own error is logged, the first one raised.
                await asyncio.gather(p, return_exceptions=True)
            raise
        await self._settle(pending[0])

    async def _settle(self, pending: asyncio.Task[None] | None) -> None:
        if pending is not None:
            await pending

    async def _group_loop(self, queue: Handoff, pending: list[asyncio.Task[None] | None]) -> None:
        c = self.config
        loop = asyncio.get_running_loop()
        wait_s = c.group_max_wait_ms / 1000
        min_interval_s = c.group_min_interval_ms / 1000
        last_sent = float("-inf")
        backoff = RECONNECT_BACKOFF_S[0]
        held: object = None      # a marker that ended the previous group, handled first
        ts_taken: asyncio.Event | None = None   # the group in flight fetched its commit_ts
        while not self._stopping:
            item, held = (held, None) if held is not None else (
                await _next(queue, pending, c.group_max_txns, c.group_max_bytes), None)
            if item is _END or item is _STOP:
                return
            if isinstance(item, _Disconnected):
                await self._settle(pending[0])
                pending[0] = None
                backoff = await self._reconnect(item, queue, backoff)
                continue
            if isinstance(item, BaseException):
                raise item
            group: list[SourceTxn] = [item]  # type: ignore[list-item]
            size = group[0].size
            # A busy source: the group fills until min-interval after the previous group went
            # out (fewer, larger groups); a quiet one: group-max-wait after its first transaction.
            deadline = max(loop.time() + wait_s, last_sent + min_interval_s)
            while len(group) < c.group_max_txns and size < c.group_max_bytes \
                    and not _progress_only(group[-1]):
                if not queue.qsize():
                    # One wake-up for the rest of the group: when it would be full, a marker
                    # arrives, or at the deadline (the bound on the added latency, as before).
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    await queue.fill(c.group_max_txns - len(group), c.group_max_bytes - size, left)
                    if not queue.qsize():
                        break
                nxt = queue.get_nowait()
                if not isinstance(nxt, SourceTxn):
                    held = nxt    # a marker ends the group; handled first thing next round
                    break
                group.append(nxt)
                size += nxt.size
            last_sent = loop.time()
            t0 = time.monotonic()
            self._writing += 1
            try:
                written = await self.writer.prewrite_group(group, ts_taken)
            except BaseException:
                self._writing -= 1
                raise
            if pending[0] is not None and not pending[0].done():
                self.metrics.overlapped.inc()
            await self._settle(pending[0])    # group k's commit before group k+1's
            pending[0] = None
            ts_taken = asyncio.Event()
            pending[0] = loop.create_task(self._commit_group(written, t0, ts_taken.set),
                                          name="capture-group-commit")
            backoff = RECONNECT_BACKOFF_S[0]

    async def _commit_group(self, written: PrewrittenGroup, t0: float,
                            commit_ts_taken: Callable[[], None]) -> None:
        """A prewritten group's commit, then what follows it (in group order: one at a time)."""
        group = written.group
        try:
            await self.writer.commit_group(written, commit_ts_taken)
        finally:
            self._writing -= 1
            # Never leave the next group's prewrite waiting on a commit that failed before its
            # commit_ts: that group is written, then this error stops the loop (the next epoch
            # decides both groups).
            commit_ts_taken()
        m = self.metrics
        snap = self.snapshotter
        assert snap is not None
        self._committed_ts_ms = group[-1].ts_ms
        progress = [t.snapshot for t in group if t.snapshot is not None]
        if progress:
            self._committed_progress = progress[-1]
        for key in snap.committed(group):
            await asyncio.to_thread(self._delete_key, key)
        m.group_seconds.observe(time.monotonic() - t0)
        m.groups.inc()
        m.txns.inc(len(group))
        m.rows.inc(sum(change_count(mu) for t in group for mu in t.mutations))
        m.lag.set(self.lag_s())

    async def _publish_progress(self) -> None:
        """The last committed snapshot progress, as JSON in etcd for `sluice ctl snapshot
        status` (at most every PUBLISH_S; a failed write is retried with the next change)."""
        key = self.registry.cluster_key(snapshot_progress_path(self.config.producer_id))
        published: pb.SnapshotProgress | None = None
        while True:
            await asyncio.sleep(PUBLISH_S)
            p = self._committed_progress
            if p is None or p is published:
                continue
            doc = progress_doc(p)
            try:
                await asyncio.to_thread(self.etcd.put, key, json.dumps(doc, sort_keys=True))
                published = p
            except errors.SluiceError as e:
                log.warning("snapshot progress not published: %s", e)

    async def _reconnect(self, lost: _Disconnected, queue: Handoff, backoff: float) -> float:
        """Everything read before the loss is written already (it was ahead in the queue)."""
        self.metrics.set_state("reconnecting", error=str(lost.error)[:300],
                               after=lost.resume or "(first binlog)")
        self.metrics.reconnects.inc()
        await self._stop_reader()
        await asyncio.sleep(backoff)
        if not self._stopping:
            self._start_reader(lost.resume, queue)
        return min(backoff * 2, RECONNECT_BACKOFF_S[1])

    # -- lag ----------------------------------------------------------------------------------

    def lag_s(self) -> float:
        """now - source commit time of the last committed transaction; 0 when caught up.

        Caught up: the source's last event was a heartbeat (MariaDB sends one only after
        `heartbeat-s` without anything to send) and nothing read is waiting to be written.
        Source times have 1 s resolution (binlog event timestamps).
        """
        r, q = self._reader, self._queue
        idle = q is None or q.qsize() == 0
        if r is not None and r.caught_up and idle and not self._writing:
            return 0.0
        ts_ms = self._committed_ts_ms
        if not ts_ms and r is not None and r.assembler.last_event_ts:
            ts_ms = r.assembler.last_event_ts * 1000
        return max(0.0, time.time() - ts_ms / 1000) if ts_ms else 0.0

    async def _lag_loop(self) -> None:
        counted: dict[str, tuple[object, int]] = {}
        while True:
            await asyncio.sleep(1.0)
            self.metrics.lag.set(self.lag_s())
            self._snapshot_metrics()
            self._count_wakeups(counted)

    def _count_wakeups(self, counted: dict[str, tuple[object, int]]) -> None:
        """The reader's socket reads and the loop's cross-thread wake-ups, added to their
        counters once a second (plain ints on the hot path; a reconnect makes new objects)."""
        m = self.metrics
        for key, obj, counter in (("reads", self._reader, m.source_reads),
                                  ("wakeups", self._queue, m.loop_wakeups)):
            if obj is None:
                continue
            now = obj.reads if key == "reads" else obj.wakeups  # type: ignore[attr-defined]
            seen, before = counted.get(key, (None, 0))
            counter.inc(now - (before if seen is obj else 0))
            counted[key] = (obj, now)

    def _snapshot_metrics(self) -> None:
        st = self.snapshotter.state if self.snapshotter is not None else None
        if st is None:
            self.metrics.set_snapshot_state("none", 0)
            return
        left = 0 if st.finished else len(st.tables) - (
            st.tables.index(st.current_table) if st.current_table in st.tables else 0)
        self.metrics.set_snapshot_state(
            "finished" if st.finished else "paused" if st.paused else "running", left)
