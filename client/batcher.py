"""Coalescing of concurrent writers into batched `WriteBinlogs` calls to one pump.

One binlog per unary RPC caps near 3k/s in Python; many binlogs per message is the lever. Each
caller awaits its own acknowledgement. A coalesced batch is applied atomically by the pump, so
when it fails its members are retried one by one: one bad binlog fails only its own caller.
A caller's request (`write_many`) is never split: what it asks to be atomic stays atomic.
A timeout is not split and retried member by member (each would wait out the same deadline
again): every member gets the DeadlineExceeded and its owner decides (retry or failover).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

import grpc

from sluice.core import errors
from sluice.core.grpcutil import to_sluice_error
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

log = logging.getLogger(__name__)


@dataclass
class _Request:
    payloads: list[bytes]
    future: asyncio.Future
    size: int = field(default=0)


class WriteBatcher:
    """Coalesces `write`/`write_many` calls into WriteBinlogs RPCs on one channel.

    Up to `max_inflight` RPCs run at once; each takes everything queued (up to `max_batch`
    binlogs / `max_bytes`), so batches grow with concurrency and latency stays one RPC when idle.
    """

    def __init__(self, channel: grpc.aio.Channel, cluster_id: int, *, max_batch: int = 256,
                 max_bytes: int = 8 << 20, max_inflight: int = 2, linger_s: float = 0.0,
                 timeout_s: float = 10.0) -> None:
        self.stub = pbg.PumpStub(channel)
        self.cluster_id = cluster_id
        self.max_batch, self.max_bytes = max_batch, max_bytes
        self.linger_s, self.timeout_s = linger_s, timeout_s
        self._queue: deque[_Request] = deque()
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(max_inflight)
        self._task: asyncio.Task | None = None
        self._sends: set[asyncio.Task] = set()
        self._closed = False
        self.rpcs = 0
        self.binlogs = 0

    async def write(self, payload: bytes) -> int:
        """Durably write one binlog; returns the pump's served watermark from its ack."""
        return await self.write_many([payload])

    async def write_many(self, payloads: list[bytes]) -> int:
        """Durably write these binlogs atomically (all or none); returns the served watermark."""
        if self._closed:
            raise errors.Unavailable("write batcher closed")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="write-batcher")
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(payloads, fut, sum(map(len, payloads))))
        self._wakeup.set()
        return await fut

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            if self.linger_s:
                await asyncio.sleep(self.linger_s)
            while self._queue:
                await self._slots.acquire()
                batch = self._take()
                if not batch:
                    self._slots.release()
                    break
                task = asyncio.create_task(self._send(batch), name="write-batch")
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)
            self._wakeup.clear()
            if self._queue:
                self._wakeup.set()

    def _take(self) -> list[_Request]:
        batch: list[_Request] = []
        n = size = 0
        while self._queue:
            req = self._queue[0]
            if batch and (n + len(req.payloads) > self.max_batch or size + req.size > self.max_bytes):
                break
            batch.append(self._queue.popleft())
            n += len(req.payloads)
            size += req.size
        return batch

    async def _send(self, batch: list[_Request]) -> None:
        try:
            try:
                wm = await self._rpc([p for r in batch for p in r.payloads])
                for r in batch:
                    if not r.future.done():
                        r.future.set_result(wm)
                return
            except errors.SluiceError as e:
                if len(batch) == 1 or isinstance(e, errors.DeadlineExceeded):
                    _fail(batch, e)
                    return
            # The pump applied none of the coalesced batch: retry each caller's request alone.
            for i, r in enumerate(batch):
                try:
                    wm = await self._rpc(r.payloads)
                    if not r.future.done():
                        r.future.set_result(wm)
                except errors.SluiceError as e:
                    if not r.future.done():
                        r.future.set_exception(e)
                    if isinstance(e, errors.DeadlineExceeded):
                        _fail(batch[i + 1:], e)
                        return
        except asyncio.CancelledError:
            _fail(batch, errors.Unavailable("write batcher closed"))
            raise
        finally:
            self._slots.release()

    async def _rpc(self, payloads: list[bytes]) -> int:
        try:
            resp = await self.stub.WriteBinlogs(
                pb.WriteBinlogsReq(cluster_id=self.cluster_id, payloads=payloads),
                timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise to_sluice_error(e) from None
        self.rpcs += 1
        self.binlogs += len(payloads)
        return resp.served_watermark

    async def probe(self, timeout_s: float) -> int:
        """An empty WriteBinlogs, sent alone: the pump answers whether it takes writes now."""
        try:
            resp = await self.stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=self.cluster_id),
                                                timeout=timeout_s)
        except grpc.RpcError as e:
            raise to_sluice_error(e) from None
        return resp.served_watermark

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._task, *self._sends) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for r in self._queue:
            if not r.future.done():
                r.future.set_exception(errors.Unavailable("write batcher closed"))
        self._queue.clear()


def _fail(requests: list[_Request], error: errors.SluiceError) -> None:
    for r in requests:
        if not r.future.done():
            r.future.set_exception(error)
