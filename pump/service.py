"""The Pump gRPC service: writes, commit-ordered pulls, producer positions, admin resolution.

Writes are refused (UNAVAILABLE, naming the reason) while the pump is starting (it has not yet
notified every drainer, DESIGN §4) and, for prewrites, while it is pausing or closing; commits
and rollbacks keep flowing until nothing is unresolved. Reads are always served.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from sluice.core import errors, failpoint
from sluice.core.grpcutil import check_cluster, handle_errors
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

if TYPE_CHECKING:
    from .server import PumpServer

log = logging.getLogger(__name__)

PULL_MESSAGE_BYTES = 4 << 20   # payload bytes per PullBinlogs response


class PumpService(pbg.PumpServicer):
    def __init__(self, server: "PumpServer") -> None:
        self.server = server
        self.storage = server.storage
        self.cluster_id = server.config.cluster_id

    # -- writes ----------------------------------------------------------------------------
    async def _write(self, payloads: list[bytes]) -> int:
        self.server.check_writable(payloads)
        await failpoint.ainject("pump-before-write")
        wm = await self.storage.write(payloads)
        self.server.metrics.on_write(payloads)
        return wm

    @handle_errors
    async def WriteBinlog(self, request: pb.WriteBinlogReq, context: grpc.aio.ServicerContext
                          ) -> pb.WriteBinlogResp:
        check_cluster(request, self.cluster_id)
        if not request.payload:
            # An empty write is the client's probe: it answers whether we take writes.
            self.server.check_writable([])
            return pb.WriteBinlogResp(served_watermark=self.storage.served_watermark)
        return pb.WriteBinlogResp(served_watermark=await self._write([request.payload]))

    @handle_errors
    async def WriteBinlogs(self, request: pb.WriteBinlogsReq, context: grpc.aio.ServicerContext
                           ) -> pb.WriteBinlogsResp:
        check_cluster(request, self.cluster_id)
        payloads = list(request.payloads)
        if not payloads:
            self.server.check_writable([])
            return pb.WriteBinlogsResp(served_watermark=self.storage.served_watermark)
        return pb.WriteBinlogsResp(served_watermark=await self._write(payloads))

    # -- reads -----------------------------------------------------------------------------
    @handle_errors
    async def PullBinlogs(self, request: pb.PullBinlogsReq, context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[pb.PullBinlogsResp]:
        check_cluster(request, self.cluster_id)
        after = request.after_commit_ts
        if after < 0:
            raise errors.InvalidArgument(f"after_commit_ts must be >= 0, got {after}")
        gc_ts = self.storage.stats().get("gc_ts", 0)
        if after < gc_ts:
            raise errors.OutOfRange(
                f"after_commit_ts {after} is below this pump's GC ts {gc_ts}: the binlogs it "
                "needs were garbage-collected (raise gc-retention, or restart the consumer from "
                "a newer checkpoint)")
        changed = asyncio.Event()
        unsubscribe = self.server.subscribe(changed)
        self.server.pullers_changed(+1)
        reader = _ChunkReader(self.storage, after)
        try:
            last_sent_wm = -1
            while True:
                changed.clear()
                items, wm, exhausted = await asyncio.to_thread(reader.next_chunk, PULL_MESSAGE_BYTES)
                if items or wm > last_sent_wm:
                    yield pb.PullBinlogsResp(binlogs=items, watermark=wm)
                    last_sent_wm = wm
                if exhausted:
                    try:
                        await asyncio.wait_for(changed.wait(), timeout=1.0)
                    except asyncio.TimeoutError:
                        pass
                    reader.restart_if_exhausted()
        finally:
            reader.close()
            unsubscribe()
            self.server.pullers_changed(-1)

    # -- producers and admin ---------------------------------------------------------------
    @handle_errors
    async def GetProducerPosition(self, request: pb.GetProducerPositionReq,
                                  context: grpc.aio.ServicerContext) -> pb.GetProducerPositionResp:
        check_cluster(request, self.cluster_id)
        if not request.producer_id:
            raise errors.InvalidArgument("producer_id is empty")
        if request.epoch <= 0:
            raise errors.InvalidArgument(f"epoch must be > 0, got {request.epoch}")
        position, snapshot, epoch = await self.storage.record_producer_epoch(
            request.producer_id, request.epoch)
        resp = pb.GetProducerPositionResp(epoch=epoch, has_position=position is not None)
        if position is not None:
            resp.position.CopyFrom(position)
        if snapshot is not None:
            resp.snapshot.CopyFrom(snapshot)
        return resp

    @handle_errors
    async def GetCommit(self, request: pb.GetCommitReq, context: grpc.aio.ServicerContext
                        ) -> pb.GetCommitResp:
        _check_start_ts(request, self.cluster_id)
        state, commit_ts = await asyncio.to_thread(self.storage.get_commit, request.start_ts)
        return pb.GetCommitResp(state=state, commit_ts=commit_ts)

    @handle_errors
    async def ResolveTxn(self, request: pb.ResolveTxnReq, context: grpc.aio.ServicerContext
                         ) -> pb.ResolveTxnResp:
        _check_start_ts(request, self.cluster_id)
        which = request.WhichOneof("decision")
        if which is None:
            raise errors.InvalidArgument("ResolveTxn needs commit_ts or rollback")
        if which == "rollback" and not request.rollback:
            raise errors.InvalidArgument("rollback must be true when given")
        commit_ts = request.commit_ts if which == "commit_ts" else None
        log.warning("admin resolves txn start_ts=%d as %s", request.start_ts,
                    f"committed at {commit_ts}" if commit_ts else "rolled back")
        await self.storage.resolve(request.start_ts, commit_ts)
        state, _ = await asyncio.to_thread(self.storage.get_commit, request.start_ts)
        return pb.ResolveTxnResp(state=state)

    @handle_errors
    async def Status(self, request: pb.PumpStatusReq, context: grpc.aio.ServicerContext
                     ) -> pb.PumpStatusResp:
        check_cluster(request, self.cluster_id)
        st = self.storage.stats()
        return pb.PumpStatusResp(
            node_id=self.server.node_id, state=self.server.state,
            served_watermark=self.storage.served_watermark,
            max_commit_ts=self.storage.max_commit_ts,
            unresolved=int(st.get("unresolved", 0)), storage_bytes=int(st.get("storage_bytes", 0)),
            gc_ts=int(st.get("gc_ts", 0)))


def _check_start_ts(request: pb.GetCommitReq | pb.ResolveTxnReq, cluster_id: int) -> None:
    check_cluster(request, cluster_id)
    if request.start_ts <= 0:
        raise errors.InvalidArgument(f"start_ts must be > 0, got {request.start_ts}")


class _ChunkReader:
    """Reads commit-ordered payloads in chunks of about max_bytes, in a worker thread.

    A huge transaction spans several chunks; `watermark` only ever names a commit_ts whose
    transaction was sent whole, so a consumer that checkpoints on it never skips a part.
    """

    def __init__(self, storage, after: int) -> None:  # type: ignore[no-untyped-def]
        self.storage = storage
        self.after = after              # last commit_ts sent whole
        self._it = None
        self._wm = after
        self._pending: tuple[int, bytes] | None = None
        self._exhausted = True

    def _open(self) -> None:
        # The iterator covers commit_ts <= the served watermark at its creation, which is at
        # least the value read here, so reporting this value never over-claims.
        self._wm = max(self.after, self.storage.served_watermark)
        self._it = iter(self.storage.iter_committed(self.after))
        self._exhausted = False

    def restart_if_exhausted(self) -> None:
        if self._exhausted:
            self.close()

    def next_chunk(self, max_bytes: int) -> tuple[list[bytes], int, bool]:
        if self._it is None:
            self._open()
        items: list[bytes] = []
        size = 0
        current = self.after
        while True:
            if self._pending is not None:
                ts, payload = self._pending
                self._pending = None
            else:
                try:
                    ts, payload = next(self._it)  # type: ignore[arg-type]
                except StopIteration:
                    self._exhausted = True
                    if items:
                        self.after = max(self.after, current)
                    return items, max(self.after, self._wm), True
            if ts != current and current != self.after:
                # `current` completed: a transaction boundary.
                self.after = current
                if size >= max_bytes:
                    self._pending = (ts, payload)
                    return items, self.after, False
            current = ts
            items.append(payload)
            size += len(payload)
            if size >= 4 * max_bytes:
                # Mid-transaction split of a huge transaction: watermark stays at the last whole one.
                return items, self.after, False

    def close(self) -> None:
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()
