"""The pump's storage facade: durable binlogs, group commit, commit-ordered reads, GC.

Invariant: a write is acknowledged only after its value-log records and their index entries are on
disk (DESIGN §2.7); a request's binlogs are stored all or none, and recovery never drops an
acknowledged record.

One committer thread owns every mutation. `write()` enqueues a request and awaits its future; the
committer drains every queued request into one group, validates each request in order (against
the stored state plus the earlier requests of the group; a failing request fails alone and leaves
nothing behind), then does ONE value-log write, ONE fdatasync and ONE synced LevelDB batch for the
whole group, and only then resolves the futures with the served watermark. The event loop never
waits on disk.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import threading
import time
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import google_crc32c
import plyvel
from google.protobuf.message import DecodeError

from sluice.core import failpoint
from sluice.core.errors import (AlreadyExists, FailedPrecondition, InvalidArgument, OutOfRange,
                                ResourceExhausted, SluiceError, StaleEpoch, Unavailable,
                                UnknownProducer)
from sluice.proto import sluice_pb2 as pb

from . import gc as gcmod
from . import index as ix
from .gc import GCStats, SegmentSummary
from .reader import CommitReader
from .schema import multipart_schema_tables, schema_tables
from .sorter import Pending, Sorter, UnresolvedTxn, check_commit, check_part
from .valuecheck import check_multipart_value
from .vlog import HEADER_SIZE, Location, ValueLog

log = logging.getLogger(__name__)

__all__ = ["Storage", "StorageOptions", "GCStats", "UnresolvedTxn"]

_MAX_GROUP_BYTES = 64 << 20
# A multi-part prewrite of more parts than this (64 MiB parts: 4 TiB) is not a transaction but a
# part bitmap that would cost memory: refused.
MAX_PARTS = 1 << 16
_MAX_QUEUED_REQUESTS = 1 << 16
_DISK_CHECK_INTERVAL_S = 1.0

_PREWRITE, _COMMIT, _ROLLBACK, _FAKE = pb.PREWRITE, pb.COMMIT, pb.ROLLBACK, pb.FAKE
_COMMITTED, _ROLLED_BACK = pb.TXN_COMMITTED, pb.TXN_ROLLED_BACK
_WRITE, _EPOCH, _CALL, _STOP = range(4)
_HASH = struct.Struct(">II")
_crc32c = google_crc32c.value


def _any_prewrite(payloads: list[bytes]) -> bool:
    """Whether a write carries a PREWRITE (decoded only when the disk is already low); an
    undecodable payload counts as one, so the write is refused here rather than judged later."""
    for p in payloads:
        try:
            if pb.Binlog.FromString(p).tp == pb.PREWRITE:
                return True
        except DecodeError:
            return True
    return False

class Admission(Protocol):
    """The pump's admission rules for new prewrites (pump/admission.py), checked on the
    committer thread: in-memory only. A storage without one stores any well-formed binlog."""

    def check(self, producer_id: str) -> None:
        """Raise (InvalidArgument) unless prewrites of this producer can be resolved later."""

    def check_value(self, value: bytes) -> None:
        """Raise (InvalidArgument) unless a whole prewrite value decodes."""


@dataclass
class StorageOptions:
    segment_size: int = 512 << 20
    max_binlog_size: int = 64 << 20
    max_inflight_bytes: int = 256 << 20
    stop_write_at_available_space: int = 0   # bytes; 0 = no guard
    sync: bool = True                        # False only for tests that do not test durability


_FROM_CLIENT = "from-client"   # _Req.arg of a write that came through the Pump service


class _Req:
    __slots__ = ("kind", "payloads", "nbytes", "loop", "fut", "arg", "result", "error")

    def __init__(self, kind: int, payloads: list[bytes] | None = None, nbytes: int = 0,
                 loop: asyncio.AbstractEventLoop | None = None, fut: Any = None,
                 arg: Any = None) -> None:
        self.kind, self.payloads, self.nbytes = kind, payloads, nbytes
        self.loop, self.fut, self.arg = loop, fut, arg
        self.result: Any = None
        self.error: BaseException | None = None


class _Stage:
    """Changes staged by one request (or merged for a whole group), not yet durable."""

    __slots__ = ("keys", "txn", "pending", "producers", "records", "crcs", "meta", "commits",
                 "max_ts")

    def __init__(self) -> None:
        self.keys: dict[bytes, bytes] = {}                   # new entry key -> payload hash
        self.txn: dict[int, tuple[int, int, bytes]] = {}     # start_ts -> (state, commit_ts, hash)
        self.pending: dict[int, Pending | None] = {}         # None: resolved in this group
        self.producers: dict[str, tuple[int, bytes | None, bytes | None]] = {}
        self.records: list[bytes] = []
        self.crcs: list[int] = []
        # per record: (entry key, hash, aux start_ts, ts for the segment summary, start_ts of a
        # prewrite part or 0)
        self.meta: list[tuple[bytes, bytes, int, int, int]] = []
        # (start_ts, commit_ts, pending before the commit, index of the commit record)
        self.commits: list[tuple[int, int, Pending, int]] = []
        self.max_ts = 0

    def merge(self, req: "_Stage") -> None:
        base = len(self.records)
        self.keys.update(req.keys)
        self.txn.update(req.txn)
        self.pending.update(req.pending)
        self.producers.update(req.producers)
        self.records.extend(req.records)
        self.crcs.extend(req.crcs)
        self.meta.extend(req.meta)
        self.commits.extend((s, c, p, base + i) for s, c, p, i in req.commits)
        if req.max_ts > self.max_ts:
            self.max_ts = req.max_ts


def _hash(payload: bytes, crc: int) -> bytes:
    """Content identity for idempotent retries: CRC32C (also the record checksum) and zlib's
    CRC-32 side by side, 64 bits. It only ever compares two binlogs under the same key, where a
    collision needs a retry with different content that matches both; a cryptographic hash
    would cost more than the rest of the write path."""
    return _HASH.pack(crc, zlib.crc32(payload))


def _complete(items: list[tuple[Any, Any, BaseException | None]]) -> None:
    for fut, result, error in items:
        if fut.done():
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)


class Storage:
    """Open with `Storage.open(data_dir, options)`; see the module docstring."""

    def __init__(self, data_dir: Path, options: StorageOptions, db: plyvel.DB,
                 vlog: ValueLog) -> None:
        self.data_dir = data_dir
        self.options = options
        self._db = db
        self._vlog = vlog
        self._sorter = Sorter()
        self._served = 0
        self._gc_ts = 0
        self._producers: dict[str, tuple[int, bytes | None, bytes | None]] = {}
        self._summaries: dict[int, SegmentSummary] = {}
        # table_id -> schema pins (commit_ts, segments), sorted; replaced, never mutated, so
        # readers in other threads may take the dict as it is
        self._schema: dict[int, tuple[tuple[int, frozenset[int]], ...]] = {}
        self._listeners: list[Callable[[int], None]] = []
        self._queue: queue.SimpleQueue[_Req] = queue.SimpleQueue()
        self._carry: list[_Req] = []
        self._budget_lock = threading.Lock()
        self._inflight_bytes = 0
        self._inflight_reqs = 0
        self._disk_checked = 0.0
        self._disk_free = -1
        self._broken: BaseException | None = None
        self._closed = False
        self._stats = {"groups": 0, "group_binlogs": 0, "group_requests": 0,
                       "last_group_binlogs": 0, "max_group_binlogs": 0,
                       "fsync_seconds_total": 0.0, "fsync_count": 0, "fsync_last_seconds": 0.0,
                       "rejected_requests": 0}
        self._thread = threading.Thread(target=self._committer, name="storage-committer",
                                        daemon=True)
        # Set by the pump server before it takes writes (see Admission).
        self.admission: Admission | None = None

    # ------------------------------------------------------------------------------------------
    # open / recovery / close
    # ------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, data_dir: str | Path, options: StorageOptions | None = None) -> "Storage":
        """Open (creating if needed) and recover: blocking."""
        options = options or StorageOptions()
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
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
            vlog = ValueLog(data_dir / "vlog", options.segment_size, options.sync)
            try:
                self = cls(data_dir, options, db, vlog)
                self._recover()
            except BaseException:
                vlog.close()
                raise
        except BaseException:
            db.close()
            raise
        self._thread.start()
        return self

    def _recover(self) -> None:
        db, vlog = self._db, self._vlog
        raw_end = db.get(ix.META_VLOG_END)
        end = Location(*ix.parse_loc(raw_end)) if raw_end else Location(1, 0)
        dropped = vlog.truncate_to(end)
        for key, val in db.iterator(prefix=ix.G):
            self._summaries[ix.parse_seg_key(key)] = SegmentSummary(*ix.parse_summary(val))
        for seg in vlog.segments():
            if seg < end.segment and seg not in self._summaries:
                # GC committed its index deletes but crashed before unlinking the file.
                log.warning("recovery: removing garbage-collected segment %s", vlog.path(seg))
                vlog.delete_segment(seg)
        self._gc_ts = ix.parse_int(db.get(ix.META_GC_TS))
        self._sorter = Sorter(ix.parse_int(db.get(ix.META_WATERMARK)),
                              ix.parse_int(db.get(ix.META_MAX_TS)))
        for key, val in db.iterator(prefix=ix.P):
            self._producers[key[1:].decode()] = ix.parse_producer_val(val)
        pins: dict[int, list[tuple[int, frozenset[int]]]] = {}
        legacy: list[tuple[bytes, int, int, frozenset[int]]] = []
        for key, val in db.iterator(prefix=ix.K):
            table, commit_ts, segs = ix.parse_pin(key, val)
            pins.setdefault(table, []).append((commit_ts, segs))
            if len(key) != len(ix.pin_key(0, 0)):
                legacy.append((key, table, commit_ts, segs))
        if legacy:
            with db.write_batch(sync=self.options.sync) as wb:
                for key, table, commit_ts, segs in legacy:
                    wb.delete(key)
                    wb.put(ix.pin_key(table, commit_ts), ix.pin_val(segs))
        self._schema = {t: tuple(sorted(p)) for t, p in pins.items()}
        now_mono, now_wall = time.monotonic(), time.time()
        for key, val in db.iterator(prefix=ix.U):
            start_ts = ix.parse_ts_key(key)
            part_count, wall_ms, tables, producer = ix.parse_unresolved(val)
            p = Pending(start_ts, part_count, 0, producer,
                        now_mono - max(0.0, now_wall - wall_ms / 1000), frozenset(), tables)
            prefix = ix.ts_key(ix.S, start_ts) + bytes([_PREWRITE])
            for pkey, pval in db.iterator(prefix=prefix):
                seg, off, length = ix.entry_val_unpack(pval)[:3]
                p = p.with_part(ix.parse_entry_key(pkey)[3], seg)
                if part_count == 1:
                    p = p._replace(loc=(seg, off, length))
            self._sorter.put(p)
        self._served = self._sorter.advance()
        log.info("storage %s open: vlog end %s:%d (%d bytes of unacknowledged tail dropped), "
                 "served watermark %d, %d unresolved prewrites, gc ts %d", self.data_dir,
                 end.segment, end.offset, dropped, self._served, len(self._sorter.pending),
                 self._gc_ts)

    def close(self) -> None:
        """Finish queued requests, stop the committer, close files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_Req(_STOP))
        self._thread.join()
        while True:  # requests that raced with close()
            try:
                r = self._queue.get_nowait()
            except queue.Empty:
                break
            r.error = FailedPrecondition("storage is closed")
            self._finish([r])
        if self._broken is None:
            self._db.put(ix.META_WATERMARK, ix.int_val(self._served), sync=self.options.sync)
        self._vlog.close()
        self._db.close()

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------
    # public API
    # ------------------------------------------------------------------------------------------

    @property
    def served_watermark(self) -> int:
        """Every commit_ts <= this is final on this pump."""
        return self._served

    @property
    def max_commit_ts(self) -> int:
        """The highest commit or fake ts stored."""
        return self._sorter.max_ts

    @property
    def gc_ts(self) -> int:
        return self._gc_ts

    def add_listener(self, callback: Callable[[int], None]) -> None:
        """`callback(served_watermark)` runs in the committer thread after every group: keep it
        short (e.g. `loop.call_soon_threadsafe(event.set)`)."""
        self._listeners.append(callback)

    async def write(self, payloads: list[bytes], from_client: bool = False) -> int:
        """Store serialized Binlogs atomically; returns the served watermark once durable.

        `from_client`: the payloads came through the Pump service, so FAKE binlogs are refused:
        only the pump writes them (heartbeats at fresh TSO timestamps). A client's fake at a
        future ts would raise the served watermark past every timestamp the TSO hands out, and
        every commit after it would be refused."""
        if not payloads:
            self._check_writable()
            return self._served
        loop = asyncio.get_running_loop()
        req = _Req(_WRITE, payloads, self._size_check(payloads), loop, loop.create_future(),
                   _FROM_CLIENT if from_client else None)
        self._submit(req)
        return await req.fut

    def write_blocking(self, payloads: list[bytes]) -> int:
        """`write` for tools and tests (never call it from the event loop thread)."""
        if not payloads:
            self._check_writable()
            return self._served
        req = _Req(_WRITE, payloads, self._size_check(payloads), None,
                   concurrent.futures.Future())
        self._submit(req)
        return req.fut.result()

    async def record_producer_epoch(self, producer_id: str, epoch: int
                                    ) -> tuple[pb.Position | None, pb.SnapshotProgress | None,
                                               int]:
        """Durably record `epoch` for the producer (StaleEpoch if lower than recorded), then
        return its last committed position and snapshot progress on this pump."""
        if not producer_id:
            raise InvalidArgument("producer_id is empty")
        loop = asyncio.get_running_loop()
        req = _Req(_EPOCH, None, 0, loop, loop.create_future(), (producer_id, epoch))
        self._submit(req)
        rec_epoch, pos, snap = await req.fut
        return (pb.Position.FromString(pos) if pos is not None else None,
                pb.SnapshotProgress.FromString(snap) if snap is not None else None, rec_epoch)

    def producer_state(self, producer_id: str
                       ) -> tuple[pb.Position | None, pb.SnapshotProgress | None, int]:
        """The producer's last committed position, snapshot progress and recorded epoch, read
        without recording anything (an administrator's look: it fences nobody)."""
        epoch, pos, snap = self._producers.get(producer_id, (0, None, None))
        return (pb.Position.FromString(pos) if pos is not None else None,
                pb.SnapshotProgress.FromString(snap) if snap is not None else None, epoch)

    def unresolved(self, older_than_s: float = 0) -> list[UnresolvedTxn]:
        return self._sorter.unresolved(older_than_s)

    def is_unresolved(self, start_ts: int) -> bool:
        return start_ts in self._sorter.pending

    async def resolve(self, start_ts: int, commit_ts: int | None) -> int:
        """Write a COMMIT (or, with None, a ROLLBACK) built by the pump for `start_ts`."""
        p = self._sorter.pending.get(start_ts)
        producer = p.producer_id if p is not None else ""
        epoch = self._producers.get(producer, (0, None, None))[0] if producer else 0
        b = pb.Binlog(tp=_COMMIT if commit_ts is not None else _ROLLBACK, start_ts=start_ts,
                      commit_ts=commit_ts or 0, producer_id=producer, producer_epoch=epoch,
                      ts_ms=int(time.time() * 1000))
        return await self.write([b.SerializeToString()])

    def get_commit(self, start_ts: int) -> tuple[int, int]:
        """(TxnState, commit_ts) of a transaction on this pump."""
        # The index is written before the sorter forgets a resolved prewrite, so checking the
        # index, then the sorter, then the index again never misses a resolution in flight.
        for attempt in range(2):
            raw = self._db.get(ix.ts_key(ix.T, start_ts))
            if raw is not None:
                state, commit_ts, _ = ix.txn_val_unpack(raw)
                return state, commit_ts
            if attempt == 0 and start_ts in self._sorter.pending:
                return pb.TXN_UNKNOWN, 0
        return pb.TXN_NOT_FOUND, 0

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
        watermark = self._served
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
        return CommitReader(self._db, self._vlog, after_commit_ts, lambda: self._served)

    def schema_commits(self, after_commit_ts: int) -> list[int]:
        """commit_ts of the latest schema-bearing transaction of every table committed at or
        below `after_commit_ts` (GC keeps them: see gc.retained_pins)."""
        out: set[int] = set()
        for table_pins in list(self._schema.values()):
            best = None
            for commit_ts, _ in table_pins:
                if commit_ts > after_commit_ts:
                    break
                best = commit_ts
            if best is not None:
                out.add(best)
        return sorted(out)

    def open_schema_reader(self, after_commit_ts: int) -> CommitReader:
        """A reader of the schema preamble for a stream resuming after `after_commit_ts`: the
        transactions of `schema_commits`, in commit order, each whole."""
        self._check_readable(after_commit_ts)
        return CommitReader(self._db, self._vlog, after_commit_ts, lambda: self._served,
                            commits=self.schema_commits(after_commit_ts))

    async def gc(self, safe_ts: int) -> GCStats:
        """Delete whole segments no reader at or above `safe_ts` needs (see pump/storage/gc.py)."""
        plan = await self._call(lambda: self._gc_plan(safe_ts))
        if plan is None:
            return GCStats(self._gc_ts)
        keys = await asyncio.to_thread(gcmod.scan, self._db, plan)
        return await self._call(lambda: self._gc_apply(plan, keys))

    def stats(self) -> dict[str, Any]:
        s = dict(self._stats)
        s.update(storage_bytes=self._vlog.total_bytes(), segments=self._vlog.segment_count(),
                 unresolved=len(self._sorter.pending), served_watermark=self._served,
                 max_commit_ts=self._sorter.max_ts, gc_ts=self._gc_ts,
                 inflight_bytes=self._inflight_bytes, available_bytes=self._disk_free,
                 last_group_size=s["last_group_binlogs"],
                 last_fsync_ms=s["fsync_last_seconds"] * 1000.0)
        return s

    # ------------------------------------------------------------------------------------------
    # submission (caller's thread)
    # ------------------------------------------------------------------------------------------

    def _check_writable(self, payloads: list[bytes] | None = None, metadata: bool = False) -> None:
        """Refuse writes when the storage failed, or new prewrites when the disk is nearly full.

        Below `stop-write-at-available-space` only PREWRITEs (and the empty probe writes that ask
        "would you take one?") are refused: COMMITs, ROLLBACKs and FAKEs are tiny, and refusing
        them would leave this pump's transactions unresolved and its watermark still, which
        stalls every drainer's merge (DESIGN §2.4) instead of only moving producers elsewhere.
        A producer's epoch record (`metadata`) is a few index bytes too, and refusing it would
        keep a restarted capture from recovering at all (it must fence every non-offline pump)."""
        if self._closed:
            raise FailedPrecondition("storage is closed")
        if self._broken is not None:
            raise Unavailable(f"storage failed and refuses writes until restarted: "
                              f"{self._broken!r}")
        limit = self.options.stop_write_at_available_space
        if limit > 0:
            now = time.monotonic()
            if now - self._disk_checked >= _DISK_CHECK_INTERVAL_S:
                st = os.statvfs(self.data_dir)
                free = st.f_bavail * st.f_frsize
                try:
                    # Tests make a running pump see a full disk: `pump-disk-full=raise(BYTES)@K`
                    # reports BYTES available (0 when not a number) from the K-th check on.
                    failpoint.inject("pump-disk-full")
                except failpoint.FailpointError as e:
                    free = int(str(e)) if str(e).isdigit() else 0
                self._disk_free = free
                self._disk_checked = now
            if self._disk_free < limit and not metadata and (not payloads or _any_prewrite(payloads)):
                raise ResourceExhausted(
                    f"pump disk nearly full: {self._disk_free} bytes available < "
                    f"stop-write-at-available-space {limit}; writes refused, reads continue")

    def _size_check(self, payloads: list[bytes]) -> int:
        limit = self.options.max_binlog_size
        total = 0
        for i, p in enumerate(payloads):
            n = len(p)
            if n > limit:
                raise InvalidArgument(
                    f"binlog {i} is {n} bytes, over max-binlog-size {limit}: split the prewrite "
                    "into parts (part_no/part_count under one start_ts)")
            total += n
        return total

    def _submit(self, req: _Req) -> None:
        self._check_writable(req.payloads, metadata=req.kind == _EPOCH)
        with self._budget_lock:
            if self._inflight_bytes + req.nbytes > self.options.max_inflight_bytes:
                self._stats["rejected_requests"] += 1
                raise ResourceExhausted(
                    f"pump in-flight byte budget exhausted ({self._inflight_bytes} + "
                    f"{req.nbytes} > {self.options.max_inflight_bytes}): retry later")
            if self._inflight_reqs >= _MAX_QUEUED_REQUESTS:
                raise ResourceExhausted(f"pump write queue full ({self._inflight_reqs} requests)")
            self._inflight_bytes += req.nbytes
            self._inflight_reqs += 1
        self._queue.put(req)

    async def _call(self, fn: Callable[[], Any]) -> Any:
        if self._closed:
            raise FailedPrecondition("storage is closed")
        loop = asyncio.get_running_loop()
        req = _Req(_CALL, None, 0, loop, loop.create_future(), fn)
        with self._budget_lock:
            self._inflight_reqs += 1
        self._queue.put(req)
        return await req.fut

    # ------------------------------------------------------------------------------------------
    # committer thread
    # ------------------------------------------------------------------------------------------

    def _committer(self) -> None:
        while True:
            if self._carry:
                items, self._carry = self._carry, []
            else:
                items = [self._queue.get()]
            size = sum(r.nbytes for r in items)
            while size < _MAX_GROUP_BYTES:
                try:
                    r = self._queue.get_nowait()
                except queue.Empty:
                    break
                items.append(r)
                size += r.nbytes
            stop = False
            group: list[_Req] = []
            for i, r in enumerate(items):
                if r.kind == _STOP:
                    stop = True
                    self._carry = []
                    if group:
                        self._run_group(group)
                    group = []
                    for rest in items[i + 1:]:
                        rest.error = FailedPrecondition("storage is closed")
                        self._finish([rest])
                    break
                if r.kind == _CALL:
                    if group:
                        self._run_group(group)
                        group = []
                    try:
                        r.result = r.arg()
                    except BaseException as e:  # noqa: BLE001 - handed to the caller
                        r.error = e
                    self._finish([r])
                else:
                    group.append(r)
            if group:
                self._run_group(group)
            if stop:
                return

    def _finish(self, reqs: list[_Req]) -> None:
        by_loop: dict[Any, list[tuple[Any, Any, BaseException | None]]] = {}
        nbytes = 0
        for r in reqs:
            nbytes += r.nbytes
            if r.loop is None:
                if r.error is not None:
                    r.fut.set_exception(r.error)
                else:
                    r.fut.set_result(r.result)
            else:
                by_loop.setdefault(r.loop, []).append((r.fut, r.result, r.error))
        with self._budget_lock:
            self._inflight_bytes -= nbytes
            self._inflight_reqs -= len(reqs)
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_complete, items)
            except RuntimeError:
                log.debug("event loop closed before %d acks were delivered", len(items))

    def _run_group(self, reqs: list[_Req]) -> None:
        if self._broken is not None:
            for r in reqs:
                r.error = Unavailable(f"storage failed: {self._broken!r}")
            self._finish(reqs)
            return
        grp = _Stage()
        ok: list[_Req] = []
        for r in reqs:
            st = _Stage()
            try:
                if r.kind == _EPOCH:
                    r.result = self._stage_epoch(st, grp, *r.arg)
                else:
                    payloads = r.payloads
                    assert payloads is not None
                    client = r.arg is _FROM_CLIENT
                    for i, payload in enumerate(payloads):
                        self._stage(st, grp, i, payload, client)
            except SluiceError as e:
                r.error = e
                continue
            except Exception as e:  # noqa: BLE001 - a bug must fail the request, not the thread
                log.exception("unexpected error validating a write")
                r.error = InvalidArgument(f"cannot process binlog: {e!r}")
                continue
            grp.merge(st)
            ok.append(r)
        failed = [r for r in reqs if r.error is not None]
        if failed:
            self._finish(failed)
        if not ok:
            return
        try:
            # Retries of stored binlogs alone change nothing: nothing to make durable.
            watermark = self._persist(grp) if grp.records or grp.producers else self._served
        except BaseException as e:  # noqa: BLE001 - the storage stops accepting writes
            log.exception("storage write failed; refusing writes until restart")
            self._broken = e
            for r in ok:
                r.error = Unavailable(f"storage write failed: {e!r}")
            self._finish(ok)
            return
        n = len(grp.records)
        s = self._stats
        s["groups"] += 1
        s["group_binlogs"] += n
        s["group_requests"] += len(ok)
        s["last_group_binlogs"] = n
        if n > s["max_group_binlogs"]:
            s["max_group_binlogs"] = n
        failpoint.inject("storage-before-ack")
        for r in ok:
            if r.kind == _WRITE:
                r.result = watermark
        self._finish(ok)
        for cb in self._listeners:
            try:
                cb(watermark)
            except Exception:  # noqa: BLE001 - a listener must not stop the committer
                log.exception("storage listener failed")

    # -- validation ----------------------------------------------------------------------------

    def _producer(self, st: _Stage, grp: _Stage, pid: str
                  ) -> tuple[int, bytes | None, bytes | None]:
        rec = st.producers.get(pid) or grp.producers.get(pid) or self._producers.get(pid)
        return rec if rec is not None else (0, None, None)

    def _stage_epoch(self, st: _Stage, grp: _Stage, pid: str, epoch: int
                     ) -> tuple[int, bytes | None, bytes | None]:
        rec = self._producer(st, grp, pid)
        if epoch < rec[0]:
            raise StaleEpoch(f"producer {pid}: epoch {epoch} < recorded epoch {rec[0]}")
        if epoch > rec[0]:
            rec = (epoch, rec[1], rec[2])
            st.producers[pid] = rec
        return rec

    def _key_hash(self, st: _Stage, grp: _Stage, key: bytes) -> bytes | None:
        h = st.keys.get(key) or grp.keys.get(key)
        if h is not None:
            return h
        raw = self._db.get(key)
        return None if raw is None else ix.entry_val_unpack(raw)[3]

    def _pending(self, st: _Stage, grp: _Stage, start_ts: int) -> Pending | None:
        if start_ts in st.pending:
            return st.pending[start_ts]
        if start_ts in grp.pending:
            return grp.pending[start_ts]
        return self._sorter.pending.get(start_ts)

    def _txn(self, st: _Stage, grp: _Stage, start_ts: int) -> tuple[int, int, bytes] | None:
        t = st.txn.get(start_ts) or grp.txn.get(start_ts)
        if t is not None:
            return t
        raw = self._db.get(ix.ts_key(ix.T, start_ts))
        return None if raw is None else ix.txn_val_unpack(raw)

    def _stage(self, st: _Stage, grp: _Stage, i: int, payload: bytes,
               from_client: bool = False) -> None:
        try:
            b = pb.Binlog.FromString(payload)
        except DecodeError as e:
            raise InvalidArgument(f"binlog {i}: malformed Binlog payload: {e}") from None
        tp = b.tp
        crc = _crc32c(payload)
        h = _hash(payload, crc)
        pid = b.producer_id
        if pid:
            rec = self._producer(st, grp, pid)
            if b.producer_epoch < rec[0]:
                raise StaleEpoch(f"binlog {i}: producer {pid} epoch {b.producer_epoch} < "
                                 f"recorded epoch {rec[0]}")
            if b.producer_epoch > rec[0]:
                st.producers[pid] = (b.producer_epoch, rec[1], rec[2])
        start_ts = b.start_ts
        if start_ts <= 0:
            raise InvalidArgument(f"binlog {i}: start_ts {start_ts} must be > 0")
        if tp == _PREWRITE:
            part_count = b.part_count or 1
            part_no = b.part_no
            if part_no >= part_count:
                raise InvalidArgument(f"binlog {i}: prewrite start_ts={start_ts}: part_no "
                                      f"{part_no} >= part_count {part_count}")
            if part_count > MAX_PARTS:
                raise InvalidArgument(f"binlog {i}: prewrite start_ts={start_ts}: part_count "
                                      f"{part_count} > {MAX_PARTS}")
            key = ix.entry_key_pack(ix.S, start_ts, _PREWRITE, part_no)
            p = self._pending(st, grp, start_ts)
            if p is None or p.parts >> part_no & 1:
                old = self._key_hash(st, grp, key)
                if old is not None:
                    if old == h:
                        return
                    raise AlreadyExists(f"binlog {i}: a different prewrite (part {part_no}) is "
                                        f"already stored under start_ts={start_ts}")
            if p is None:
                t = self._txn(st, grp, start_ts)
                if t is not None:
                    raise AlreadyExists(
                        f"binlog {i}: start_ts={start_ts} is already "
                        f"{'committed' if t[0] == _COMMITTED else 'rolled back'}; a new prewrite "
                        "part cannot be added")
            adm = self.admission
            if p is None:
                if adm is not None:
                    self._admit(adm, i, start_ts, pid)
                    if part_count == 1:
                        self._admit_value(adm, i, start_ts, b.prewrite_value)
                # A multi-part prewrite's schema is found once all its parts are there (commit).
                tables = schema_tables(b.prewrite_value) if part_count == 1 else ()
                p = Pending(start_ts, part_count, 0, pid, time.monotonic(), frozenset(), tables)
            else:
                check_part(p, start_ts, part_no, part_count)
            p = p.with_part(part_no)
            st.pending[start_ts] = p
            st.keys[key] = h
            st.records.append(payload)
            st.crcs.append(crc)
            st.meta.append((key, h, 0, start_ts, start_ts))
            if adm is not None and part_count > 1 and p.complete:
                # The parts add up only now: the whole value must decode before the last part
                # is acknowledged (the commit could never be read otherwise). Streamed over the
                # stored parts: memory stays bounded whatever the transaction's size.
                try:
                    check_multipart_value(self._multipart_parts(st, grp, start_ts, part_count))
                except (ValueError, IndexError, DecodeError, OSError) as e:
                    raise InvalidArgument(
                        f"binlog {i}: prewrite start_ts={start_ts}: prewrite_value of its "
                        f"{part_count} parts joined is not a valid PrewriteValue: {e}") from None
        elif tp == _COMMIT:
            commit_ts = b.commit_ts
            if commit_ts <= start_ts:
                raise InvalidArgument(f"binlog {i}: commit_ts {commit_ts} <= start_ts {start_ts}")
            key = ix.entry_key_pack(ix.E, commit_ts, _COMMIT, 0)
            p = self._pending(st, grp, start_ts)
            if p is None:
                t = self._txn(st, grp, start_ts)
                if t is not None:
                    if t[0] == _COMMITTED and t[1] == commit_ts:
                        return  # the same decision again (a retry, or the pump's own resolve)
                    raise AlreadyExists(
                        f"binlog {i}: start_ts={start_ts} is already "
                        + (f"committed with commit_ts={t[1]}" if t[0] == _COMMITTED
                           else "rolled back"))
            # Only a ts at or below the highest one stored can collide: skip the lookup otherwise.
            if commit_ts <= max(self._sorter.max_ts, grp.max_ts, st.max_ts) and \
                    self._key_hash(st, grp, key) is not None:
                raise AlreadyExists(f"binlog {i}: commit_ts {commit_ts} is already used by "
                                    "another transaction")
            check_commit(p, start_ts, commit_ts, self._served)
            assert p is not None
            if p.part_count > 1:
                p = p._replace(tables=self._multipart_tables(st, grp, start_ts, p.part_count))
            st.pending[start_ts] = None
            st.txn[start_ts] = (_COMMITTED, commit_ts, h)
            st.keys[key] = h
            st.commits.append((start_ts, commit_ts, p, len(st.records)))
            if commit_ts > st.max_ts:
                st.max_ts = commit_ts
            if pid and (b.HasField("position") or b.HasField("snapshot")):
                rec = self._producer(st, grp, pid)
                st.producers[pid] = (
                    rec[0],
                    b.position.SerializeToString() if b.HasField("position") else rec[1],
                    b.snapshot.SerializeToString() if b.HasField("snapshot") else rec[2])
            st.records.append(payload)
            st.crcs.append(crc)
            st.meta.append((key, h, start_ts, commit_ts, 0))
        elif tp == _ROLLBACK:
            key = ix.entry_key_pack(ix.S, start_ts, _ROLLBACK, 0)
            p = self._pending(st, grp, start_ts)
            if p is None:
                t = self._txn(st, grp, start_ts)
                if t is None:
                    raise FailedPrecondition(f"binlog {i}: rollback for start_ts={start_ts} "
                                             "without its prewrite")
                if t[0] == _ROLLED_BACK:
                    return
                raise AlreadyExists(f"binlog {i}: start_ts={start_ts} is already committed "
                                    f"with commit_ts={t[1]}")
            st.pending[start_ts] = None
            st.txn[start_ts] = (_ROLLED_BACK, 0, h)
            st.keys[key] = h
            st.records.append(payload)
            st.crcs.append(crc)
            st.meta.append((key, h, 0, start_ts, 0))
        elif tp == _FAKE:
            if from_client:
                raise InvalidArgument(f"binlog {i}: fake binlogs are written by the pump itself "
                                      "(heartbeats at fresh TSO timestamps), not by clients")
            ts = b.commit_ts
            if ts != start_ts:
                raise InvalidArgument(f"binlog {i}: fake binlog needs start_ts == commit_ts "
                                      f"(got {start_ts} and {ts})")
            key = ix.entry_key_pack(ix.E, ts, _FAKE, 0)
            old = self._key_hash(st, grp, key)
            if old is not None:
                return  # a fake carries no data: any fake at this ts is the same heartbeat
            if ts <= self._served:
                raise FailedPrecondition(f"binlog {i}: fake binlog ts {ts} <= served watermark "
                                         f"{self._served}")
            if ts > st.max_ts:
                st.max_ts = ts
            st.keys[key] = h
            st.records.append(payload)
            st.crcs.append(crc)
            st.meta.append((key, h, 0, ts, 0))
        else:
            raise InvalidArgument(f"binlog {i}: unknown binlog type {tp}")

    # -- durability ----------------------------------------------------------------------------

    def _persist(self, grp: _Stage) -> int:
        """Make a validated group durable and apply it to memory; returns the new watermark."""
        vlog = self._vlog
        prev_end = vlog.end
        t0 = time.monotonic()
        try:
            locs = vlog.append(grp.records, grp.crcs) if grp.records else []
            vlog.sync()
        except BaseException:
            vlog.rollback_to(prev_end)
            raise
        dt = time.monotonic() - t0
        s = self._stats
        s["fsync_seconds_total"] += dt
        s["fsync_count"] += 1
        s["fsync_last_seconds"] = dt
        failpoint.inject("storage-after-vlog-sync")

        wb = self._db.write_batch(sync=self.options.sync)
        put = wb.put
        pack = ix.entry_val_pack
        summaries = self._summaries
        touched: dict[int, SegmentSummary] = {}
        part_segs: dict[int, set[int]] = {}
        # start_ts -> (segment, offset, length) of a prewrite record of this group
        part_locs: dict[int, tuple[int, int, int]] = {}
        commit_of = {rec_idx: p for _, _, p, rec_idx in grp.commits}
        meta, records = grp.meta, grp.records
        cpack = ix.commit_val_pack
        for j, loc in enumerate(locs):
            key, h, aux, ts, part_of = meta[j]
            seg = loc.segment
            length = len(records[j])
            p = commit_of.get(j) if aux else None
            if p is not None and p.part_count == 1:
                ploc = part_locs.get(aux) or p.loc
                if ploc is not None:
                    put(key, cpack(seg, loc.offset, length, h, aux, *ploc))
                else:
                    put(key, pack(seg, loc.offset, length, h, aux))
            else:
                put(key, pack(seg, loc.offset, length, h, aux))
            sm = touched.get(seg)
            if sm is None:
                sm = touched[seg] = summaries.get(seg) or SegmentSummary()
            if ts > sm.max_ts:
                sm.max_ts = ts
            if part_of:
                part_segs.setdefault(part_of, set()).add(seg)
                part_locs[part_of] = (seg, loc.offset, length)
        for start_ts, t in grp.txn.items():
            put(ix.ts_key(ix.T, start_ts), ix.txn_val_pack(*t))
        sorter_pending = self._sorter.pending
        now_wall_ms = int(time.time() * 1000)
        for start_ts, p in grp.pending.items():
            if p is None:
                if start_ts in sorter_pending:
                    wb.delete(ix.ts_key(ix.U, start_ts))
            elif start_ts not in sorter_pending:
                put(ix.ts_key(ix.U, start_ts),
                    ix.unresolved_val(p.part_count, now_wall_ms, p.tables, p.producer_id))
        schema_updates: dict[int, tuple[tuple[int, frozenset[int]], ...]] = {}
        new_pins: list[tuple[int, int, frozenset[int]]] = []
        for start_ts, commit_ts, p, rec_idx in grp.commits:
            segs = set(p.segments)
            segs.update(part_segs.get(start_ts, ()))
            for seg in segs:
                sm = touched.get(seg)
                if sm is None:
                    sm = touched[seg] = summaries.get(seg) or SegmentSummary()
                if commit_ts > sm.max_need_ts:
                    sm.max_need_ts = commit_ts
            if p.tables:
                segs.add(locs[rec_idx].segment)
                pin_segs = frozenset(segs)
                for table in p.tables:
                    cur = schema_updates.get(table) or self._schema.get(table, ())
                    schema_updates[table] = tuple(sorted((*cur, (commit_ts, pin_segs))))
                    new_pins.append((table, commit_ts, pin_segs))
        for seg, sm in touched.items():
            put(ix.seg_key(seg), ix.summary_val(sm.max_ts, sm.max_need_ts))
        for table, commit_ts, pin_segs in new_pins:
            put(ix.pin_key(table, commit_ts), ix.pin_val(pin_segs))
        for pid, rec in grp.producers.items():
            put(ix.producer_key(pid), ix.producer_val(*rec))
        end = vlog.end
        put(ix.META_VLOG_END, ix.loc_val(end.segment, end.offset))
        max_ts = max(grp.max_ts, self._sorter.max_ts)
        put(ix.META_MAX_TS, ix.int_val(max_ts))
        # The watermark before this group: recovery recomputes this group's from the stored
        # unresolved prewrites and max ts, never below this one.
        put(ix.META_WATERMARK, ix.int_val(self._served))
        wb.write()

        # Memory after disk: get_commit relies on the index knowing a resolution first.
        summaries.update(touched)
        self._schema.update(schema_updates)
        self._producers.update(grp.producers)
        sorter = self._sorter
        for start_ts, p in grp.pending.items():
            if p is None:
                sorter.drop(start_ts)
            else:
                segs = part_segs.get(start_ts)
                if segs:
                    p = p._replace(segments=p.segments | segs,
                                   loc=part_locs[start_ts] if p.part_count == 1 else None)
                sorter.put(p)
        sorter.observe(max_ts)
        self._served = sorter.advance()
        return self._served

    # -- GC (committer thread) -----------------------------------------------------------------

    def _gc_plan(self, safe_ts: int) -> gcmod.GCPlan | None:
        safe = min(safe_ts, self._served)
        if safe <= self._gc_ts:
            return None
        pending_segs: set[int] = set()
        for p in self._sorter.pending.values():
            pending_segs.update(p.segments)
        return gcmod.plan(safe, self._summaries, self._vlog.end.segment, pending_segs,
                          self._schema)

    def _gc_apply(self, plan: gcmod.GCPlan, keys: list[bytes]) -> GCStats:
        if not plan.segments and not plan.dropped_pins:
            # Nothing deleted: readers from older ts still get everything, so the GC ts (the
            # bound below which reads are refused) must not move.
            return GCStats(self._gc_ts, (), tuple(sorted(plan.kept_schema)), 0, 0)
        wb = self._db.write_batch(sync=self.options.sync)
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
                self._schema[table] = tuple(pin for pin in self._schema.get(table, ())
                                            if pin[0] not in commits)
        if not plan.segments:
            return GCStats(self._gc_ts, (), tuple(sorted(plan.kept_schema)), 0, 0)
        self._gc_ts = plan.safe_ts
        freed = 0
        for seg in sorted(plan.segments):
            self._summaries.pop(seg, None)
            freed += self._vlog.delete_segment(seg)
        if plan.segments:
            self._vlog.sync_dir()
        stats = GCStats(plan.safe_ts, tuple(sorted(plan.segments)),
                        tuple(sorted(plan.kept_schema)), freed, len(keys))
        log.info("gc at ts %d: deleted segments %s (%d bytes, %d index entries), kept for "
                 "schema %s", plan.safe_ts, list(stats.deleted_segments), freed, len(keys),
                 list(stats.kept_schema_segments))
        return stats

    # -- reads ---------------------------------------------------------------------------------

    def _check_readable(self, after_commit_ts: int) -> None:
        if self._closed:
            raise FailedPrecondition("storage is closed")
        if after_commit_ts < self._gc_ts:
            raise OutOfRange(f"commit_ts {after_commit_ts} is below the GC ts {self._gc_ts}: "
                             "those binlogs were garbage collected")

    def _iter(self, after_commit_ts: int, watermark: int | None = None
              ) -> Iterator[tuple[int, bytes, bool]]:
        self._check_readable(after_commit_ts)
        wm = self._served if watermark is None else watermark
        reader = CommitReader(self._db, self._vlog, after_commit_ts, lambda: wm)
        for payload, commit_ts, txn_end in reader.binlogs():
            yield commit_ts, payload, txn_end

    # -- admission of new prewrites (committer thread) -----------------------------------------

    @staticmethod
    def _admit(adm: Admission, i: int, start_ts: int, pid: str) -> None:
        if not pid:
            raise InvalidArgument(f"binlog {i}: prewrite start_ts={start_ts}: producer_id is "
                                  "empty: a prewrite must name its registered producer, which "
                                  "resolves it if its commit never comes")
        try:
            adm.check(pid)
        except UnknownProducer as e:
            raise UnknownProducer(f"binlog {i}: prewrite start_ts={start_ts}: {e}",
                                  e.producer_id) from None

    @staticmethod
    def _admit_value(adm: Admission, i: int, start_ts: int, value: bytes) -> None:
        try:
            adm.check_value(value)
        except SluiceError as e:
            raise InvalidArgument(f"binlog {i}: prewrite start_ts={start_ts}: {e}") from None

    # -- multi-part prewrites: schema detection and the joined-value check -------------------

    def _multipart_parts(self, st: _Stage, grp: _Stage, start_ts: int, part_count: int
                         ) -> list[tuple[Callable[[int, int], bytes], int]]:
        """(read(offset, n), length) of each part's serialized Binlog, in part order: in memory
        for parts of this group, `pread` on the value log otherwise."""
        parts: list[tuple[Callable[[int, int], bytes], int]] = []
        for part_no in range(part_count):
            key = ix.entry_key_pack(ix.S, start_ts, _PREWRITE, part_no)
            staged = _staged_record(st, key) or _staged_record(grp, key)
            if staged is not None:
                parts.append((lambda off, n, b=staged: b[off:off + n], len(staged)))
                continue
            raw = self._db.get(key)
            if raw is None:   # the sorter saw every part: only a bug gets here
                raise FailedPrecondition(f"prewrite part {part_no} of start_ts={start_ts} is "
                                         "not in the index")
            seg, off, length = ix.entry_val_unpack(raw)[:3]
            fd = self._vlog.read_fd(seg)
            base = off + HEADER_SIZE
            parts.append((lambda o, n, fd=fd, base=base: os.pread(fd, n, base + o), length))
        return parts

    def _multipart_tables(self, st: _Stage, grp: _Stage, start_ts: int, part_count: int
                          ) -> tuple[int, ...]:
        return multipart_schema_tables(self._multipart_parts(st, grp, start_ts, part_count))


def _staged_record(stage: _Stage, key: bytes) -> bytes | None:
    if key not in stage.keys:
        return None
    for j, m in enumerate(stage.meta):
        if m[0] == key:
            return stage.records[j]
    return None
