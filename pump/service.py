"""The Pump gRPC service: writes, commit-ordered pulls, producer positions, admin resolution.

Writes are refused (UNAVAILABLE, naming the reason) while the pump is starting (it has not yet
notified every drainer, DESIGN §4) and, for prewrites, while it is pausing or closing; commits
and rollbacks keep flowing until nothing is unresolved. Reads are always served.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import grpc

from sluice.core import errors, failpoint, wire
from sluice.core.grpcutil import add_service_with_raw_stream, check_cluster, handle_errors
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

if TYPE_CHECKING:
    from .admission import ProducerAdmission
    from .lifecycle import Lifecycle
    from .metrics import PumpMetrics
    from .storage.storage import Storage

log = logging.getLogger(__name__)

PULL_MESSAGE_BYTES = 2 << 20   # payload bytes per PullBinlogs response (about)
# A stream's first response is small and each next one twice the last, up to the full size:
# a consumer merging several pumps (the drainer) starts when every pump's first response is in,
# and a 2 MiB first response (~10k transactions) took 60-190 ms to build on a loaded pump.
PULL_FIRST_MESSAGE_BYTES = 128 << 10
# A stream that has caught up reads what each durable group added on the event loop itself,
# up to about this many bytes: a hop to a worker thread and back costs more CPU than reading a
# group, and it happens for every group and every puller. A read that finds more (the stream
# fell behind, or a transaction larger than this or of several parts) stops there and is
# continued in a worker thread, so the loop never reads much at once. The bound holds a whole
# capture group (~140-250 transactions of ~1 KiB at 50-100% of native, issue 23): at 64 KiB
# such a group took two responses per stream and a thread hop, and, its first chunk not
# covering the group, no stream could take another's read (SharedChunks keeps whole ranges).
# A worker thread would not spare the loop that time anyway: its read holds the GIL as long.
PULL_INLINE_BYTES = 512 << 10


class LiveFeed:
    """Wakes PullBinlogs streams after every durable group that moved the served watermark
    (streams read up to it: a group that leaves it, such as one of prewrites only, has nothing
    for them) and counts them (the fake-binlog loop beats faster while a drainer pulls)."""

    def __init__(self, metrics: "PumpMetrics") -> None:
        self.metrics = metrics
        self.pullers = 0
        self._subscribers: set[asyncio.Event] = set()
        self._watermark = -1

    def subscribe(self, event: asyncio.Event) -> Callable[[], None]:
        self._subscribers.add(event)
        return lambda: self._subscribers.discard(event)

    def on_group(self, watermark: int) -> None:
        """A storage loop listener (`Storage.add_loop_listener`): runs on the event loop after
        every durable group, in the same callback as the group's acks."""
        if watermark > self._watermark:
            self._watermark = watermark
            for ev in list(self._subscribers):
                ev.set()

    def pullers_changed(self, delta: int) -> None:
        self.pullers += delta
        self.metrics.pullers.set(self.pullers)


class PumpService(pbg.PumpServicer):
    def __init__(self, storage: "Storage", node: "Lifecycle", admission: "ProducerAdmission",
                 metrics: "PumpMetrics", feed: LiveFeed, cluster_id: int) -> None:
        self.storage = storage
        self.node = node            # node id, node state, and who may write in it
        self.admission = admission
        self.metrics = metrics
        self.feed = feed
        self.cluster_id = cluster_id

    # -- writes ----------------------------------------------------------------------------
    async def _write(self, payloads: list[bytes]) -> int:
        self.node.check_writable(payloads)
        await failpoint.ainject("pump-before-write")
        refreshed: set[str] = set()
        while True:
            try:
                wm = await self.storage.write(payloads, from_client=True)
                break
            except errors.UnknownProducer as e:
                # The registry watch may not have delivered a producer that registered a
                # moment ago: read it once from etcd, then try again (nothing was stored).
                if e.producer_id in refreshed or not await asyncio.to_thread(
                        self.admission.refresh, e.producer_id):
                    raise
                refreshed.add(e.producer_id)
        self.metrics.on_write(payloads)
        return wm

    @handle_errors
    async def WriteBinlog(self, request: pb.WriteBinlogReq, context: grpc.aio.ServicerContext
                          ) -> pb.WriteBinlogResp:
        check_cluster(request, self.cluster_id)
        if not request.payload:
            # An empty write is the client's probe: it answers whether we take writes.
            self.node.check_writable([])
            return pb.WriteBinlogResp(served_watermark=self.storage.served_watermark)
        return pb.WriteBinlogResp(served_watermark=await self._write([request.payload]))

    @handle_errors
    async def WriteBinlogs(self, request: pb.WriteBinlogsReq, context: grpc.aio.ServicerContext
                           ) -> pb.WriteBinlogsResp:
        check_cluster(request, self.cluster_id)
        payloads = list(request.payloads)
        if not payloads:
            self.node.check_writable([])
            return pb.WriteBinlogsResp(served_watermark=self.storage.served_watermark)
        return pb.WriteBinlogsResp(served_watermark=await self._write(payloads))

    # -- reads -----------------------------------------------------------------------------
    @handle_errors
    async def PullBinlogs(self, request: pb.PullBinlogsReq, context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[bytes]:
        """Yields serialized PullBinlogsResp messages (see `add_to_server`): the storage reader
        returns payloads already framed as the `binlogs` field and their envelopes as `txns`."""
        check_cluster(request, self.cluster_id)
        after = request.after_commit_ts
        if after < 0:
            raise errors.InvalidArgument(f"after_commit_ts must be >= 0, got {after}")
        gc_ts = self.storage.gc_ts
        if after < gc_ts:
            raise errors.OutOfRange(
                f"after_commit_ts {after} is below this pump's GC ts {gc_ts}: the binlogs it "
                "needs were garbage-collected (raise gc-retention, or restart the consumer from "
                "a newer checkpoint)")
        changed = asyncio.Event()
        unsubscribe = self.feed.subscribe(changed)
        self.feed.pullers_changed(+1)
        reader = None
        try:
            if request.with_schema:
                # Schema history at or below `after` first (contract: PullBinlogsReq.with_schema).
                preamble = self.storage.open_schema_reader(after)
                try:
                    while True:
                        chunk = await asyncio.to_thread(preamble.next_chunk, PULL_MESSAGE_BYTES)
                        if chunk.count:
                            yield chunk.frames + chunk.txns + wire.tail(after, schema_only=True)
                        if chunk.exhausted:
                            break
                finally:
                    preamble.close()
            reader = self.storage.open_reader(after)
            reader.packed = request.packed_meta
            last_sent_wm = -1
            size = PULL_FIRST_MESSAGE_BYTES
            live = False     # the last read reached the watermark: see PULL_INLINE_BYTES
            while True:
                changed.clear()
                if live:
                    chunk = reader.next_chunk(PULL_INLINE_BYTES, inline=True)
                else:
                    chunk = await asyncio.to_thread(reader.next_chunk, size)
                if chunk.count or chunk.covered > last_sent_wm:
                    yield chunk.frames + chunk.txns + wire.tail(chunk.covered)
                    last_sent_wm = chunk.covered
                    size = min(size * 2, PULL_MESSAGE_BYTES)
                live = chunk.exhausted
                if live:
                    try:
                        # asyncio.timeout, not wait_for: no task per wait (one per group).
                        async with asyncio.timeout(1.0):
                            await changed.wait()
                    except TimeoutError:
                        pass
        finally:
            if reader is not None:
                reader.close()
            unsubscribe()
            self.feed.pullers_changed(-1)

    # -- producers and admin ---------------------------------------------------------------
    @handle_errors
    async def GetProducerPosition(self, request: pb.GetProducerPositionReq,
                                  context: grpc.aio.ServicerContext) -> pb.GetProducerPositionResp:
        check_cluster(request, self.cluster_id)
        if not request.producer_id:
            raise errors.InvalidArgument("producer_id is empty")
        if request.peek:
            position, snapshot, epoch = self.storage.producer_state(request.producer_id)
        elif request.epoch <= 0:
            raise errors.InvalidArgument(f"epoch must be > 0, got {request.epoch}")
        else:
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
            node_id=self.node.node_id, state=self.node.state,
            served_watermark=self.storage.served_watermark,
            max_commit_ts=self.storage.max_commit_ts,
            unresolved=int(st.get("unresolved", 0)), storage_bytes=int(st.get("storage_bytes", 0)),
            gc_ts=int(st.get("gc_ts", 0)))


def _check_start_ts(request: pb.GetCommitReq | pb.ResolveTxnReq, cluster_id: int) -> None:
    check_cluster(request, cluster_id)
    if request.start_ts <= 0:
        raise errors.InvalidArgument(f"start_ts must be > 0, got {request.start_ts}")


def add_to_server(service: PumpService, server: grpc.aio.Server) -> None:
    """Register the Pump service; PullBinlogs responses may be yielded already serialized."""
    add_service_with_raw_stream(service, server, "Pump")
