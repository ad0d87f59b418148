"""The drainer's gRPC services: Cistern.Notify (pumps coming online) and Drainer (merged stream).

Notify adds the pump to the merge before it replies (DESIGN §2.4), so a pump that comes online
joins the merge before it takes its first write. Drainer.PullBinlogs / Ack are served only by a
drainer whose sink is `grpc`; PullBinlogs responses are yielded already serialized (the sink
concatenates its transactions' framed binlogs), so `add_to_server` registers a pass-through
serializer for it.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from sluice.core import errors
from sluice.core.grpcutil import add_service_with_raw_stream, check_cluster, handle_errors
from sluice.drainer.sink import ServingSink
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

if TYPE_CHECKING:
    from .main import Drainer

log = logging.getLogger(__name__)


class CisternService(pbg.CisternServicer):
    def __init__(self, server: "Drainer") -> None:
        self.server = server

    @handle_errors
    async def Notify(self, request: pb.NotifyReq, context: grpc.aio.ServicerContext) -> pb.NotifyResp:
        check_cluster(request, self.server.config.cluster_id)
        if not request.pump_id or not request.pump_addr:
            raise errors.InvalidArgument("Notify needs pump_id and pump_addr")
        await self.server.on_notify(request.pump_id, request.pump_addr)
        return pb.NotifyResp()


class DrainerService(pbg.DrainerServicer):
    def __init__(self, server: "Drainer") -> None:
        self.server = server

    def _sink(self) -> ServingSink:
        sink = self.server.grpc_sink()
        if sink is None:
            raise errors.FailedPrecondition(
                f"drainer {self.server.name} has sink '{self.server.config.sink}': the merged "
                "stream is served only by a drainer with sink = \"grpc\"")
        return sink

    @handle_errors
    async def PullBinlogs(self, request: pb.DrainerPullReq, context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[bytes]:
        check_cluster(request, self.server.config.cluster_id)
        if request.after_commit_ts < 0:
            raise errors.InvalidArgument(f"after_commit_ts must be >= 0, got {request.after_commit_ts}")
        sink = self._sink()
        log.info("consumer %r pulls after ts %d", request.consumer_id, request.after_commit_ts)
        async for resp in sink.serve(request.after_commit_ts, request.consumer_id):
            yield resp

    @handle_errors
    async def Ack(self, request: pb.AckReq, context: grpc.aio.ServicerContext) -> pb.AckResp:
        check_cluster(request, self.server.config.cluster_id)
        self._sink().ack(request.consumer_id, request.commit_ts)
        self.server.wake()
        return pb.AckResp()


def add_to_server(service: DrainerService, server: grpc.aio.Server) -> None:
    """Register the Drainer service; PullBinlogs responses may be yielded already serialized."""
    add_service_with_raw_stream(service, server, "Drainer")
