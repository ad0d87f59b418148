"""One reader per pump: `PullBinlogs(after_commit_ts)` into the merge, reconnecting with backoff.

Invariant: a reader hands the merge only complete transactions (every prewrite part, then the
commit) in its pump's commit order, and a watermark only once everything at or below it was
handed over — so after a reconnect it resumes strictly after the highest of those, and partial
transactions from a broken stream are discarded, never merged.

Back-pressure, not memory growth: before reading the next response the reader waits until the
merge holds fewer than `max_pending` of its transactions, so a slow sink stops the pump stream
(gRPC flow control) instead of filling memory.

Nothing is decoded here when the pump sends transaction envelopes (PullBinlogsResp.txns): the
merge tuple is built from the TxnMeta and the stored binlogs are sliced, never parsed. Without
them (a response holding a piece of a split huge transaction, or a pump older than the field)
the binlog envelopes are decoded (type, ts, producer, position). Either way transaction values
are decoded once, by the drainer after the merge and only for sinks that take decoded
transactions (a raw sink such as grpc never decodes them), so dropped copies cost nothing. An
undecodable envelope, a commit without its prewrite, or envelopes that do not add up to the
response's binlogs is CorruptTxn naming the pump and commit_ts: the drainer stops (or, with
`skip-corrupt`, drops that transaction and says so).
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from sluice.core import errors, failpoint, grpcutil
from sluice.core.tls import SecurityConfig
from sluice.drainer.txn import CorruptTxn, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

log = logging.getLogger(__name__)

__all__ = ["PumpReader", "ReaderTarget", "FATAL_CODES"]

_PREWRITE, _COMMIT, _FAKE, _ROLLBACK = pb.PREWRITE, pb.COMMIT, pb.FAKE, pb.ROLLBACK
_from_string = pb.Binlog.FromString
_position = pb.Position.FromString

# Retrying these cannot help: the drainer must stop and say why.
FATAL_CODES = frozenset({grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT,
                         grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNIMPLEMENTED,
                         grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})


class ReaderTarget(Protocol):
    """What a reader feeds (the drainer)."""

    def deliver(self, pump_id: str, items: list[tuple], watermark: int) -> None:
        """Complete transactions (merge tuples) in commit order, then the pump's watermark."""

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
                 on_event: Callable[[str, str], None] | None = None) -> None:
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
                                consumer_id=self.consumer_id, with_schema=self.with_schema)
        call = pbg.PumpStub(channel).PullBinlogs(req)
        pending: dict[int, Any] = {}   # start_ts -> (first decoded part, [raw parts])
        got_any = False
        try:
            while True:
                await self.target.wait_room(self.pump_id)
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    return got_any
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
                txns = resp.txns
                if txns and not pending:
                    self._response_meta(resp.binlogs, txns, resp.watermark)
                else:
                    self._response(resp.binlogs, resp.watermark, pending)
        finally:
            call.cancel()

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
                            _position(pos) if pos else None, raws[i:j], False))
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
                self.target.deliver(pump_id, items, wm)
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
                items.append((ct, st, pump_id, b.producer_id or first.producer_id, pos, raws, False))
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
        self.target.deliver(pump_id, items, wm)

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
