"""One reader per pump: `PullBinlogs(after_commit_ts)` into the merge, reconnecting with backoff.

Invariant: a reader hands the merge only complete transactions (every prewrite part, then the
commit) in its pump's commit order, and a watermark only once everything at or below it was
handed over — so after a reconnect it resumes strictly after the highest of those, and partial
transactions from a broken stream are discarded, never merged.

Back-pressure, not memory growth: before reading the next response the reader waits until the
merge holds fewer than `max_pending` of its transactions, so a slow sink stops the pump stream
(gRPC flow control) instead of filling memory.

Nothing is decoded here when the pump describes its transactions: the reader asks for packed
metadata (PullBinlogsReq.packed_meta) and builds the merge tuples from a few array conversions —
commit_ts, start_ts and each transaction's byte range in the serialized response, which it
slices out still framed as field 1 (`binlogs`), the form the merge carries and the grpc sink
forwards (drainer.txn.frame / unframe). Only COMMITs the pump marks as possibly carrying a
producer position are looked at (natively: their producer and position, for the position
filter). A pump older than packed_meta sends
TxnMeta envelopes (PullBinlogsResp.txns) instead, read one message per transaction. Without
either (a response holding a piece of a split huge transaction) the binlog envelopes are decoded
(type, ts, producer, position). Either way transaction values
are decoded once, by the drainer after the merge and only for sinks that take decoded
transactions (a raw sink such as grpc never decodes them), so dropped copies cost nothing. An
undecodable envelope, a commit without its prewrite, or envelopes that do not add up to the
response's binlogs is CorruptTxn naming the pump and commit_ts: the drainer stops (or, with
`skip-corrupt`, drops that transaction and says so).
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import operator
import random
from itertools import islice, repeat
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
import sluice_native
from google.protobuf.message import DecodeError

from sluice.core import errors, failpoint, grpcutil, wire
from sluice.core.tls import SecurityConfig
from sluice.drainer.merger import Merger
from sluice.drainer.txn import CorruptTxn, Txn, frame
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["PumpReader", "ReaderTarget", "PrivateMerge", "FATAL_CODES"]

_PREWRITE, _COMMIT, _FAKE, _ROLLBACK = pb.PREWRITE, pb.COMMIT, pb.FAKE, pb.ROLLBACK
_from_string = pb.Binlog.FromString
_position = pb.Position.FromString
_resp_from = pb.PullBinlogsResp.FromString
# (producer_id, serialized position or None) of a framed transaction's COMMIT, from the wire
# bytes (native/src/txnjoin.rs): every COMMIT a producer positions goes through it.
_commit_position = sluice_native.commit_position
_PULL = "/sluice.v1.Pump/PullBinlogs"
_FRAMES = bytes((wire.FRAME_TAG,))

# Retrying these cannot help: the drainer must stop and say why.
FATAL_CODES = frozenset({grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT,
                         grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNIMPLEMENTED,
                         grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})


class ReaderTarget(Protocol):
    """What a reader feeds (the drainer)."""

    def deliver(self, pump_id: str, items: Any, watermark: int, binlogs: int) -> None:
        """Complete transactions in commit order (a list of merge tuples, or a Segment from a
        reader made `columnar`), then the pump's watermark; `binlogs`: how many binlogs the
        items hold (observability)."""

    async def wait_room(self, pump_id: str) -> None:
        """Return once the merge can take more of this pump's transactions."""

    def record_schema(self, txn: Txn) -> None:
        """A schema-only transaction (PullBinlogsReq.with_schema): record, never apply."""


class PumpReader:
    """Reads one pump. `run()` until cancelled; raises only errors that retrying cannot fix."""

    def __init__(self, pump_id: str, addr: str, after_ts: int, target: ReaderTarget, *,
                 cluster_id: int, consumer_id: str, security: SecurityConfig | None = None,
                 with_schema: bool = False, skip_corrupt: bool = False,
                 max_backoff: float = 2.0,
                 on_event: Callable[[str, str], None] | None = None,
                 columnar: bool = False) -> None:
        """columnar: hand plain packed responses over as drainer.columnar Segments (a target
        merging with ColumnarMerge, for a raw sink) instead of merge tuples."""
        self.pump_id, self.addr = pump_id, addr
        self.after = after_ts            # everything <= after was delivered
        self.target = target
        self.cluster_id, self.consumer_id = cluster_id, consumer_id
        self.security = security
        self.with_schema = with_schema
        self.skip_corrupt = skip_corrupt
        self.max_backoff = max_backoff
        self.on_event = on_event or (lambda _pump, _what: None)
        self.binlogs = 0                 # received (observability)
        self.reconnects = 0
        self.skipped = 0
        self.connected = False
        self._fp = f"drainer-reader-recv-{pump_id}"
        self._segment: Callable[..., Any] | None = None
        if columnar:
            from sluice.drainer.columnar import segment
            self._segment = segment

    async def run(self) -> None:
        backoff = 0.05
        while True:
            channel = grpcutil.aio_channel(self.addr, self.security)
            try:
                got_any = await self._stream(channel)
                if got_any:
                    backoff = 0.05
                log.info("pump %s stream ended; reconnecting after ts %d", self.pump_id, self.after)
            except grpc.aio.AioRpcError as e:
                if e.code() in FATAL_CODES:
                    raise _fatal(self.pump_id, self.addr, e) from None
                if self.reconnects == 0 or backoff >= self.max_backoff:
                    log.warning("pump %s (%s) stream failed (%s: %s); retrying after ts %d",
                                self.pump_id, self.addr, e.code().name, e.details(), self.after)
            finally:
                self.connected = False
                await channel.close()
            self.reconnects += 1
            self.on_event(self.pump_id, "reconnect")
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self.max_backoff)

    async def _stream(self, channel: grpc.aio.Channel) -> bool:
        req = pb.PullBinlogsReq(cluster_id=self.cluster_id, after_commit_ts=self.after,
                                consumer_id=self.consumer_id, with_schema=self.with_schema,
                                packed_meta=True)
        # Responses arrive as bytes (no deserializer): the packed path slices them directly.
        call = channel.unary_stream(_PULL, request_serializer=pb.PullBinlogsReq.SerializeToString,
                                    response_deserializer=None)(req)
        pending: dict[int, Any] = {}   # start_ts -> (first decoded part, [raw parts])
        got_any = False
        try:
            while True:
                await self.target.wait_room(self.pump_id)
                raw = await call.read()
                if raw is grpc.aio.EOF:
                    return got_any
                try:
                    resp = _resp_from(raw)
                except DecodeError as e:
                    self._corrupt(None, None, f"undecodable PullBinlogs response after commit_ts "
                                  f"{self.after}: {e}")
                    continue
                if not got_any:
                    got_any = self.connected = True
                    log.info("pump %s (%s): reading after ts %d%s", self.pump_id, self.addr,
                             self.after, " with schema preamble" if self.with_schema else "")
                await failpoint.ainject(self._fp)
                if resp.schema_only:
                    self._schema_only(resp.binlogs, pending)
                    continue
                # The preamble is over (or was never sent): later reconnects do not ask again.
                self.with_schema = False
                if pending:
                    self._response(resp.binlogs, resp.watermark, pending)
                elif resp.txn_end:
                    if self._segment is None or not self._response_segment(raw, resp):
                        self._response_packed(raw, resp)
                elif resp.txns:
                    self._response_meta(resp.binlogs, resp.txns, resp.watermark)
                else:
                    self._response(resp.binlogs, resp.watermark, pending)
        finally:
            call.cancel()

    def _response_segment(self, raw: bytes, resp: pb.PullBinlogsResp) -> bool:
        """A plain packed response as Segments (drainer.columnar); False when it does not
        qualify (producer positions, arrays that do not match): the tuple path reads it."""
        assert self._segment is not None
        got = self._segment(raw, resp, self.after)
        if got is None:
            return False
        pieces, top = got
        nb = len(resp.binlogs)
        self.binlogs += nb
        watermark = resp.watermark
        wm = watermark if watermark > top else top
        self.after = wm
        # Runs between FAKE entries: each with its own end as the watermark, the last with the
        # response's (a watermark is given only once everything at or below it was handed over).
        for piece in pieces[:-1]:
            self.target.deliver(self.pump_id, piece, piece.last_ct, 0)
        self.target.deliver(self.pump_id, pieces[-1] if pieces else [], wm, nb)
        return True

    def _response_packed(self, raw: bytes, resp: pb.PullBinlogsResp) -> None:
        """A response with packed metadata: merge tuples from array conversions and slices.

        The arrays only spare the decoding: if they do not describe the response's bytes
        (lengths, ascending offsets, every entry starting with a binlog frame and the binlogs
        ending where the arrays begin), the response is decoded instead."""
        cts = list(resp.txn_commit_ts)
        sts = list(resp.txn_start_ts)
        ends = list(resp.txn_end)
        n = len(ends)
        pump_id = self.pump_id
        starts = [0, *ends[:-1]]
        if (len(cts) != n or len(sts) != n or ends[-1] >= len(raw)
                or raw[ends[-1]] != wire.PACKED_TAG
                or not all(map(operator.lt, starts, ends))
                or not all(map(operator.le, cts, islice(cts, 1, None)))
                or bytes(map(raw.__getitem__, starts)) != _FRAMES * n):
            log.warning("pump %s: packed metadata does not match a response after commit_ts %d; "
                        "decoding it instead", pump_id, self.after)
            self._response(resp.binlogs, resp.watermark, {})
            return
        top = self.after
        k = bisect.bisect_right(cts, top)   # at or below `after`: an inclusive resume, delivered
        blobs = list(map(raw.__getitem__, map(slice, starts[k:], ends[k:])))
        fakes = resp.fake_index
        positioned = resp.positioned_index
        if not fakes and not positioned:
            items = list(zip(cts[k:], sts[k:], repeat(pump_id), repeat(""), repeat(None), blobs,
                             repeat(False)))
            if items:
                top = cts[-1]
        else:
            # Runs between the few special entries (FAKEs, possibly positioned COMMITs) are
            # zipped whole; only the special entries are looked at one by one.
            items = []
            fake_set = set(fakes)
            lo = k
            for i in sorted(fake_set.union(positioned)):
                if i < lo:
                    continue
                if i >= n:
                    break
                if i > lo:
                    items += zip(cts[lo:i], sts[lo:i], repeat(pump_id), repeat(""), repeat(None),
                                 blobs[lo - k:i - k], repeat(False))
                lo = i + 1
                ct = cts[i]
                if i in fake_set:
                    if ct > top:
                        top = ct
                    continue
                try:
                    producer, pos = _commit_position(blobs[i - k])
                    if pos is None:
                        producer = ""
                    else:
                        pos = _position(pos)
                except (DecodeError, ValueError) as e:
                    self._corrupt(sts[i], ct, f"undecodable commit binlog: {e}")
                    continue
                items.append((ct, sts[i], pump_id, producer, pos, blobs[i - k], False))
            if lo < n:
                items += zip(cts[lo:], sts[lo:], repeat(pump_id), repeat(""), repeat(None),
                             blobs[lo - k:], repeat(False))
            if items and items[-1][0] > top:
                top = items[-1][0]
        nb = len(resp.binlogs)
        self.binlogs += nb
        watermark = resp.watermark
        wm = watermark if watermark > top else top
        self.after = wm
        self.target.deliver(pump_id, items, wm, nb)

    def _response_meta(self, binlogs: Any, txns: Any, watermark: int) -> None:
        """A response with transaction envelopes: merge tuples without decoding a binlog.

        The envelopes only spare the decoding: if they do not describe the binlogs exactly
        (counts, types), the response is decoded instead, which judges the binlogs themselves.
        """
        raws = list(binlogs)
        items: list[tuple] = []
        append = items.append
        pump_id = self.pump_id
        top = self.after
        i = 0
        for m in txns:
            n = m.binlog_count
            if n < 1:
                break
            j = i + n
            tp = m.tp
            if tp == _COMMIT:
                ct = m.commit_ts
                if ct > top:   # else already delivered (an inclusive resume)
                    pos = m.position
                    append((ct, m.start_ts, pump_id, m.producer_id,
                            _position(pos) if pos else None, frame(raws[i:j]), False))
                    top = ct
            elif tp == _FAKE:
                if m.commit_ts > top:
                    top = m.commit_ts
            else:
                break
            i = j
        else:
            if i == len(raws):
                self.binlogs += i
                wm = watermark if watermark > top else top
                self.after = wm
                self.target.deliver(pump_id, items, wm, i)
                return
        log.warning("pump %s: transaction envelopes do not match the %d binlogs of a response "
                    "after commit_ts %d; decoding them instead", pump_id, len(raws), self.after)
        self._response(raws, watermark, {})

    def _response(self, binlogs: Any, watermark: int, pending: dict[int, Any]) -> None:
        items: list[tuple] = []
        pump_id = self.pump_id
        top = self.after
        for raw in binlogs:
            try:
                b = _from_string(raw)
            except DecodeError as e:
                self._corrupt(None, None, f"undecodable binlog after commit_ts {top}: {e}")
                continue
            tp = b.tp
            if tp == _PREWRITE:
                entry = pending.get(b.start_ts)
                if entry is None:
                    pending[b.start_ts] = (b, [raw])
                else:
                    entry[1].append(raw)
            elif tp == _COMMIT:
                st, ct = b.start_ts, b.commit_ts
                entry = pending.pop(st, None)
                if entry is None:
                    self._corrupt(st, ct, "commit without its prewrite in the pump's stream")
                    continue
                if ct <= top:
                    # Inclusive resume or a pump answering below `after`: already delivered.
                    continue
                first, raws = entry
                if b.HasField("position"):
                    pos = b.position
                elif first.HasField("position"):
                    pos = first.position
                else:
                    pos = None
                raws.append(raw)
                # payload: the stored binlogs, prewrite part(s) then the commit.
                items.append((ct, st, pump_id, b.producer_id or first.producer_id, pos, frame(raws),
                              False))
                top = ct
            elif tp == _FAKE:
                if b.commit_ts > top:
                    top = b.commit_ts
            elif tp == _ROLLBACK:
                pending.pop(b.start_ts, None)
            else:
                self._corrupt(b.start_ts, b.commit_ts or None,
                              f"binlog of unknown type {tp} after commit_ts {top}")
        self.binlogs += len(binlogs)
        wm = watermark if watermark > top else top
        self.after = wm
        self.target.deliver(pump_id, items, wm, len(binlogs))

    def _schema_only(self, binlogs: Any, pending: dict[int, Any]) -> None:
        for raw in binlogs:
            try:
                b = _from_string(raw)
            except DecodeError as e:
                self._corrupt(None, None, f"undecodable schema-preamble binlog: {e}")
                continue
            if b.tp == _PREWRITE:
                pending.setdefault(b.start_ts, (b, []))[1].append(raw)
            elif b.tp == _COMMIT:
                entry = pending.pop(b.start_ts, None)
                try:
                    txn = Txn.from_binlogs(entry[1] if entry else [], raw, self.pump_id)
                except CorruptTxn as e:
                    self._corrupt_error(e)
                    continue
                self.target.record_schema(txn)

    def _corrupt(self, start_ts: int | None, commit_ts: int | None, reason: str) -> None:
        self._corrupt_error(CorruptTxn(self.pump_id, start_ts, commit_ts, reason))

    def _corrupt_error(self, e: CorruptTxn) -> None:
        if not self.skip_corrupt:
            raise e
        self.skipped += 1
        self.on_event(self.pump_id, "skipped")
        log.error("skip-corrupt is set: dropping %s", e)


def _fatal(pump_id: str, addr: str, e: grpc.aio.AioRpcError) -> errors.SluiceError:
    err = grpcutil.to_sluice_error(e)
    return type(err)(f"pump {pump_id} ({addr}) refused PullBinlogs: {e.code().name}: "
                     f"{e.details()}")


async def run_guarded(reader: PumpReader, on_fatal: Callable[[str, BaseException], Awaitable[None] | None]
                      ) -> None:
    """Run a reader; a fatal error goes to on_fatal (the drainer stops) instead of vanishing."""
    try:
        await reader.run()
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # noqa: BLE001 - handed to the owner, which stops the drainer
        res = on_fatal(reader.pump_id, e)
        if asyncio.iscoroutine(res):
            await res


class PrivateMerge:
    """A merge of its own over some pumps from `after`: what the grpc sink replays to a
    consumer asking below its buffer. Same readers and Merger rules as the drainer's merge
    (watermarks, start_ts dedupe, producer positions from `after` on); its own bounded queues.
    A reader's fatal error (a pump that no longer holds `after`: OUT_OF_RANGE) is raised by
    `next_batch`."""

    def __init__(self, pumps: dict[str, str], after: int, *, cluster_id: int, consumer_id: str,
                 security: SecurityConfig | None = None, max_pending: int = 20000,
                 batch: int = 2048, dedupe_window: int = 4096) -> None:
        self.merger = Merger(after, None, dedupe_window)
        self.max_pending = max_pending
        self.batch = batch
        self._data = asyncio.Event()
        self._room = asyncio.Event()
        self._fatal: BaseException | None = None
        self._tasks: list[asyncio.Task[None]] = []
        for pump_id, addr in sorted(pumps.items()):
            self.merger.add_source(pump_id, after)
            reader = PumpReader(pump_id, addr, after, self, cluster_id=cluster_id,
                                consumer_id=consumer_id, security=security)
            self._tasks.append(asyncio.create_task(run_guarded(reader, self._failed),
                                                   name=f"replay-{pump_id}"))

    def deliver(self, pump_id: str, items: list[tuple], watermark: int, binlogs: int) -> None:
        if items:
            self.merger.push_many(pump_id, items)
        self.merger.advance(pump_id, watermark)
        self._data.set()

    async def wait_room(self, pump_id: str) -> None:
        while self.merger.pending(pump_id) >= self.max_pending:
            self._room.clear()
            await self._room.wait()

    def record_schema(self, txn: Txn) -> None:
        return None  # never asked for (with_schema is off)

    def _failed(self, pump_id: str, e: BaseException) -> None:
        if self._fatal is None:
            self._fatal = e
        self._data.set()

    async def next_batch(self, timeout: float) -> tuple[list[tuple], int]:
        """(merged items, merge watermark); waits up to timeout for something to merge."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self._fatal is not None:
                raise self._fatal
            self._data.clear()
            items = self.merger.pop_ready(limit=self.batch)
            if items:
                self._room.set()
                return items, self.merger.merge_watermark
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return [], self.merger.merge_watermark
            try:
                await asyncio.wait_for(self._data.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
