"""The pump's storage facade: durable binlogs, group commit, commit-ordered reads, GC.

A write is acknowledged only after its value-log records and index entries are on disk (DESIGN
§2.7); a request's binlogs are stored all or none. The stages: committer.py (queue and thread),
stage.py (validation per binlog type), persist.py (durability), recovery.py (open, recovery,
GC apply); docs/storage.md tells the whole story.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import plyvel

from sluice.core.errors import FailedPrecondition, InvalidArgument, OutOfRange
from sluice.core.ts import physical_ms
from sluice.proto import sluice_pb2 as pb

from . import gc as gcmod
from . import index as ix
from .committer import Committer, Kind, Req
from .gc import GCStats
from .options import StorageConfig, StorageOptions
from .reader import CommitReader, SharedChunks
from .records import NO_PRODUCER, ProducerState, TxnOutcome
from .recovery import gc_apply, gc_plan, open_index, recover
from .sorter import Sorter, UnresolvedTxn
from .stage import MAX_PARTS, Admission, IssuedTimestamps, Stager
from .state import StoreState
from .vlog import ValueLog

__all__ = ["Storage", "StorageOptions", "StorageConfig", "GCStats", "UnresolvedTxn",
           "ProducerState", "TxnOutcome", "Admission", "MAX_PARTS"]


class Storage:
    """Open with `Storage.open(data_dir, options)`; see the module docstring."""

    def __init__(self, state: StoreState) -> None:
        self._state = state
        self._stager = Stager(state)
        self._committer = Committer(state, self._stager)
        # Whole-range chunks one reader built, for the other readers at the same place.
        self._shared_chunks = SharedChunks()

    @property
    def data_dir(self) -> Path:
        return self._state.data_dir

    @property
    def options(self) -> StorageConfig:
        return self._state.options

    @property
    def admission(self) -> Admission | None:
        """The pump's admission rules for new prewrites; set before writes are taken."""
        return self._stager.admission

    @admission.setter
    def admission(self, value: Admission | None) -> None:
        self._stager.admission = value

    @property
    def tso(self) -> IssuedTimestamps | None:
        """The TSO that bounds clients' timestamps; set before writes are taken."""
        return self._stager.tso

    @tso.setter
    def tso(self, value: IssuedTimestamps | None) -> None:
        self._stager.tso = value

    def recent_tso_ts(self, max_age_s: float) -> int | None:
        """A timestamp the TSO issued to this pump (a write's TSO check fetched it) within the
        last `max_age_s` seconds, or None."""
        recent = self._recent_fetch(max_age_s)
        return None if recent is None else recent[0]

    def served_age_s(self, max_age_s: float) -> float | None:
        """How far the served watermark trails the TSO's clock now, in seconds, measured from a
        timestamp a write's TSO check fetched within the last `max_age_s` seconds; None without
        one (an idle pump) or when the watermark is past it (a heartbeat's own fake)."""
        recent = self._recent_fetch(max_age_s)
        served = self._state.served
        if recent is None or served > recent[0]:
            return None
        ts, elapsed = recent
        return (physical_ms(ts) - physical_ms(served)) / 1000.0 + elapsed

    def _recent_fetch(self, max_age_s: float) -> tuple[int, float] | None:
        """(ts, seconds since) of the write check's last TSO fetch, if within `max_age_s`."""
        ts, at = self._stager.fetched
        elapsed = time.monotonic() - at
        return (ts, elapsed) if ts and elapsed <= max_age_s else None

    # The handles tests and tools look at directly.
    @property
    def _db(self) -> plyvel.DB:
        return self._state.db

    @property
    def _vlog(self) -> ValueLog:
        return self._state.vlog

    @property
    def _sorter(self) -> Sorter:
        return self._state.sorter

    async def _call(self, fn: Callable[[], Any]) -> Any:
        return await self._committer.call(fn)

    # -- open / close --------------------------------------------------------------------

    @classmethod
    def open(cls, data_dir: str | Path, options: StorageConfig | None = None) -> "Storage":
        """Open (creating if needed) and recover: blocking."""
        options = options or StorageConfig()
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        db = open_index(data_dir)
        try:
            vlog = ValueLog(data_dir / "vlog", options.segment_size, options.sync)
            try:
                self = cls(StoreState(data_dir, options, db, vlog))
                recover(self._state)
            except BaseException:
                vlog.close()
                raise
        except BaseException:
            db.close()
            raise
        self._committer.start()
        return self

    def close(self) -> None:
        """Finish queued requests, stop the committer, close files. Idempotent."""
        c = self._committer
        if c.closed:
            return
        c.stop()
        state = self._state
        if c.broken is None:
            state.db.put(ix.META_WATERMARK, ix.int_val(state.served), sync=state.options.sync)
        state.vlog.close()
        state.db.close()

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ---------------------------------------------------------------------------

    @property
    def served_watermark(self) -> int:
        """Every commit_ts <= this is final on this pump."""
        return self._state.served

    @property
    def max_commit_ts(self) -> int:
        """The highest commit or fake ts stored."""
        return self._state.sorter.max_ts

    @property
    def gc_ts(self) -> int:
        return self._state.gc_ts

    def add_listener(self, callback: Callable[[int], None]) -> None:
        """`callback(served_watermark)` runs in the committer thread after every group: keep it
        short (e.g. `loop.call_soon_threadsafe(event.set)`)."""
        self._committer.listeners.append(callback)

    def add_loop_listener(self, loop: asyncio.AbstractEventLoop,
                          callback: Callable[[int], None]) -> None:
        """`callback(served_watermark)` runs on `loop` after every durable group, right after
        that group's acks to `loop` (one loop wakeup for both)."""
        c = self._committer
        # Copied, then swapped in whole: the committer thread reads the mapping unlocked.
        listeners = dict(c.loop_listeners)
        listeners[loop] = [*listeners.get(loop, ()), callback]
        c.loop_listeners = listeners

    def stats(self) -> dict[str, Any]:
        state, c = self._state, self._committer
        s = dict(state.stats)
        s.update(storage_bytes=state.vlog.total_bytes(), segments=state.vlog.segment_count(),
                 unresolved=len(state.sorter.pending), served_watermark=state.served,
                 max_commit_ts=state.sorter.max_ts, gc_ts=state.gc_ts,
                 inflight_bytes=c.inflight_bytes, available_bytes=c.disk_free,
                 last_group_size=s["last_group_binlogs"],
                 last_fsync_ms=s["fsync_last_seconds"] * 1000.0,
                 shared_chunk_hits=self._shared_chunks.hits)
        return s

    # -- writes --------------------------------------------------------------------------

    async def write(self, payloads: list[bytes], from_client: bool = False) -> int:
        """Store serialized Binlogs atomically; returns the served watermark once durable.

        `from_client`: the payloads came through the Pump service, so FAKE binlogs are refused:
        only the pump writes them (heartbeats at fresh TSO timestamps). A client's fake at a
        future ts would raise the served watermark past every timestamp the TSO hands out, and
        every commit after it would be refused."""
        c = self._committer
        if not payloads:
            c.check_writable()
            return self._state.served
        loop = asyncio.get_running_loop()
        req = Req(Kind.WRITE, payloads, c.size_check(payloads), loop, loop.create_future(),
                  from_client=from_client)
        c.submit(req)
        return await req.fut

    def write_blocking(self, payloads: list[bytes]) -> int:
        """`write` for tools and tests (never call it from the event loop thread)."""
        c = self._committer
        if not payloads:
            c.check_writable()
            return self._state.served
        req = Req(Kind.WRITE, payloads, c.size_check(payloads), None,
                  concurrent.futures.Future())
        c.submit(req)
        return req.fut.result()

    async def record_producer_epoch(self, producer_id: str, epoch: int) -> ProducerState:
        """Durably record `epoch` for the producer (StaleEpoch if lower than recorded), then
        return its last committed position and snapshot progress on this pump."""
        if not producer_id:
            raise InvalidArgument("producer_id is empty")
        loop = asyncio.get_running_loop()
        req = Req(Kind.EPOCH, None, 0, loop, loop.create_future(), (producer_id, epoch))
        self._committer.submit(req)
        return ProducerState.of(await req.fut)

    def producer_state(self, producer_id: str) -> ProducerState:
        """The producer's last committed position, snapshot progress and recorded epoch, read
        without recording anything (an administrator's look: it fences nobody)."""
        return ProducerState.of(self._state.producers.get(producer_id, NO_PRODUCER))

    async def resolve(self, start_ts: int, commit_ts: int | None) -> int:
        """Write a COMMIT (or, with None, a ROLLBACK) built by the pump for `start_ts`."""
        state = self._state
        p = state.sorter.pending.get(start_ts)
        producer = p.producer_id if p is not None else ""
        epoch = state.producers.get(producer, NO_PRODUCER).epoch if producer else 0
        b = pb.Binlog(tp=pb.COMMIT if commit_ts is not None else pb.ROLLBACK,
                      start_ts=start_ts, commit_ts=commit_ts or 0, producer_id=producer,
                      producer_epoch=epoch, ts_ms=int(time.time() * 1000))
        return await self.write([b.SerializeToString()])

    async def gc(self, safe_ts: int) -> GCStats:
        """Delete whole segments no reader at or above `safe_ts` needs (see pump/storage/gc.py)."""
        state = self._state
        plan = await self._committer.call(lambda: gc_plan(state, safe_ts))
        if plan is None:
            return GCStats(state.gc_ts)
        keys = await asyncio.to_thread(gcmod.scan, state.db, plan)
        return await self._committer.call(lambda: gc_apply(state, plan, keys))

    # -- transactions --------------------------------------------------------------------

    def unresolved(self, older_than_s: float = 0) -> list[UnresolvedTxn]:
        return self._state.sorter.unresolved(older_than_s)

    def is_unresolved(self, start_ts: int) -> bool:
        return start_ts in self._state.sorter.pending

    def get_commit(self, start_ts: int) -> TxnOutcome:
        """(TxnState, commit_ts) of a transaction on this pump."""
        # The index is written before the sorter forgets a resolved prewrite, so checking the
        # index, then the sorter, then the index again never misses a resolution in flight.
        state = self._state
        for attempt in range(2):
            raw = state.db.get(ix.ts_key(ix.T, start_ts))
            if raw is not None:
                txn_state, commit_ts, _ = ix.txn_val_unpack(raw)
                return TxnOutcome(txn_state, commit_ts)
            if attempt == 0 and start_ts in state.sorter.pending:
                return TxnOutcome(pb.TXN_UNKNOWN, 0)
        return TxnOutcome(pb.TXN_NOT_FOUND, 0)

    # -- reads ---------------------------------------------------------------------------

    def _check_readable(self, after_commit_ts: int) -> None:
        if self._committer.closed:
            raise FailedPrecondition("storage is closed")
        gc_ts = self._state.gc_ts
        if after_commit_ts < gc_ts:
            raise OutOfRange(f"commit_ts {after_commit_ts} is below the GC ts {gc_ts}: "
                             "those binlogs were garbage collected")

    def _served_now(self) -> int:
        return self._state.served

    def _iter(self, after_commit_ts: int, watermark: int | None = None
              ) -> Iterator[tuple[int, bytes, bool]]:
        self._check_readable(after_commit_ts)
        wm = self._state.served if watermark is None else watermark
        reader = CommitReader(self._state.db, self._state.vlog, after_commit_ts, lambda: wm)
        for payload, commit_ts, txn_end in reader.binlogs():
            yield commit_ts, payload, txn_end

    def iter_committed(self, after_commit_ts: int) -> Iterator[tuple[int, bytes]]:
        """(commit_ts, payload) in commit order for commit_ts in (after, watermark at call]:
        each transaction's PREWRITE parts in part order, then its COMMIT; FAKEs in order."""
        for commit_ts, payload, _ in self._iter(after_commit_ts):
            yield commit_ts, payload

    def read_committed(self, after_commit_ts: int, max_bytes: int) -> tuple[list[bytes], int]:
        """Whole transactions after `after_commit_ts`, stopping after ~max_bytes (at least one
        transaction). Returns (payloads, covered): every commit_ts <= covered has been returned,
        so covered is the served watermark at call time when the range was exhausted."""
        out: list[bytes] = []
        size = 0
        watermark = self._state.served
        for commit_ts, payload, txn_end in self._iter(after_commit_ts, watermark):
            out.append(payload)
            size += len(payload)
            if txn_end and size >= max_bytes:
                return out, commit_ts
        return out, max(watermark, after_commit_ts)

    def open_reader(self, after_commit_ts: int) -> CommitReader:
        """A PullBinlogs reader of everything after `after_commit_ts`, following live
        (OUT_OF_RANGE below the GC ts). See pump/storage/reader.py."""
        self._check_readable(after_commit_ts)
        return CommitReader(self._state.db, self._state.vlog, after_commit_ts, self._served_now,
                            shared=self._shared_chunks)

    def schema_commits(self, after_commit_ts: int) -> list[int]:
        """commit_ts of the latest schema-bearing transaction of every table committed at or
        below `after_commit_ts` (GC keeps them: see gc.retained_pins)."""
        out: set[int] = set()
        for table_pins in list(self._state.schema.values()):
            best = None
            for pin in table_pins:
                if pin.commit_ts > after_commit_ts:
                    break
                best = pin.commit_ts
            if best is not None:
                out.add(best)
        return sorted(out)

    def open_schema_reader(self, after_commit_ts: int) -> CommitReader:
        """A reader of the schema preamble for a stream resuming after `after_commit_ts`: the
        transactions of `schema_commits`, in commit order, each whole."""
        self._check_readable(after_commit_ts)
        return CommitReader(self._state.db, self._state.vlog, after_commit_ts, self._served_now,
                            commits=self.schema_commits(after_commit_ts))
