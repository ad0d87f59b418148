"""A producer's presence in the cluster: registry status, alive key, and the TxnStatus endpoint.

Pumps ask a producer `TxnStatus(start_ts)` about prewrites left unresolved past `txn-timeout`
(DESIGN §3). The producer registers NodeKind.PRODUCER status (addr, epoch, labels) and a
lease-backed alive key, and answers by calling `decide(start_ts)`.

Invariants kept here:
- **The status outlives the process.** Stopping (or dying) removes only the alive key: the
  status keeps the address, the epoch and the labels — `outbox-dsn` among them — so a pump can
  still decide this producer's transactions from its outbox while it is down.
- **Epochs only grow.** `bump_epoch` is a compare-and-swap on the stored status; binlogs carry
  the epoch and pumps refuse older ones from then on (DESIGN §2.10).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

import grpc

from sluice.core import errors, grpcutil
from sluice.core.etcd import Etcd
from sluice.core.registry import Heartbeat, NodeKind, NodeState, NodeStatus, Registry
from sluice.core.tls import SecurityConfig
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

log = logging.getLogger(__name__)

OUTBOX_LABEL = "outbox-dsn"

Decide = Callable[[int], Awaitable[tuple[int, int]]]


class _Servicer(pbg.ProducerServicer):
    def __init__(self, cluster_id: int, decide: Decide) -> None:
        self.cluster_id, self.decide = cluster_id, decide

    @grpcutil.handle_errors
    async def TxnStatus(self, request: pb.TxnStatusReq, context: grpc.aio.ServicerContext
                        ) -> pb.TxnStatusResp:
        grpcutil.check_cluster(request, self.cluster_id)
        if request.start_ts <= 0:
            raise errors.InvalidArgument(f"start_ts must be > 0, got {request.start_ts}")
        state, commit_ts = await self.decide(request.start_ts)
        log.info("TxnStatus start_ts=%d -> %s %d", request.start_ts, pb.TxnState.Name(state),
                 commit_ts)
        return pb.TxnStatusResp(state=state, commit_ts=commit_ts)


class ProducerServer:
    """Registers a producer and serves Producer.TxnStatus through `decide`."""

    def __init__(self, etcd_endpoints: str, cluster_id: int, producer_id: str, decide: Decide, *,
                 labels: dict[str, str] | None = None, host: str = "127.0.0.1", port: int = 0,
                 alive_ttl_s: int = 5, security: SecurityConfig | None = None,
                 advertise_host: str = "") -> None:
        self.etcd_endpoints, self.cluster_id, self.producer_id = etcd_endpoints, cluster_id, producer_id
        self.decide = decide
        self.labels = dict(labels or {})
        self.host, self.port = host, port
        self.advertise_host = advertise_host or host
        self.alive_ttl_s = alive_ttl_s
        self.security = security
        self.etcd: Etcd | None = None
        self.registry: Registry | None = None
        self._server: grpc.aio.Server | None = None
        self._heartbeat: Heartbeat | None = None
        self.addr = ""
        self.epoch = 0

    async def start(self) -> None:
        """Serve TxnStatus, then register status (state online) and the alive key."""
        self.etcd = Etcd(self.etcd_endpoints, self.security)
        self.registry = Registry(self.etcd, self.cluster_id)
        server = grpcutil.aio_server(self.security)
        pbg.add_ProducerServicer_to_server(_Servicer(self.cluster_id, self.decide), server)
        bound = grpcutil.add_port(server, f"{self.host}:{self.port}", self.security)
        await server.start()
        self._server = server
        self.addr = f"{self.advertise_host}:{bound}"
        try:
            status = await asyncio.to_thread(self._register)
            self.epoch = status.epoch
            self._heartbeat = self.registry.heartbeat(NodeKind.PRODUCER, self.producer_id,
                                                      self.alive_ttl_s)
            await asyncio.to_thread(self._heartbeat.start)
        except BaseException:
            await self.stop()
            raise
        log.info("producer %s serving TxnStatus on %s (epoch %d)", self.producer_id, self.addr,
                 self.epoch)

    def _register(self) -> NodeStatus:
        assert self.registry is not None
        info = self.registry.get(NodeKind.PRODUCER, self.producer_id)
        if info is None:
            return self.registry.register(NodeStatus(
                node_id=self.producer_id, kind=NodeKind.PRODUCER, addr=self.addr,
                state=NodeState.ONLINE, labels=self.labels))
        if info.status.state == NodeState.OFFLINE:
            raise errors.ConfigError(
                f"producer {self.producer_id} is offline in the registry; start it with a new "
                "producer id (or bring it back with `sluice ctl` first)")
        return self.registry.update(NodeKind.PRODUCER, self.producer_id, lambda old: dataclasses.replace(
            old, addr=self.addr, state=NodeState.ONLINE, labels=self.labels))

    async def bump_epoch(self) -> int:
        """Raise the stored epoch by one (compare-and-swap); returns the new epoch."""
        if self.registry is None:
            raise errors.FailedPrecondition(f"producer {self.producer_id} is not started")
        registry = self.registry
        status = await asyncio.to_thread(
            registry.update, NodeKind.PRODUCER, self.producer_id,
            lambda old: dataclasses.replace(old, epoch=old.epoch + 1))
        self.epoch = status.epoch
        log.info("producer %s epoch is now %d", self.producer_id, self.epoch)
        return self.epoch

    @property
    def alive(self) -> bool:
        hb = self._heartbeat
        return hb is not None and not hb.lost and hb.lease_id is not None

    async def stop(self) -> None:
        """Drop the alive key and stop serving; the status stays (see the module docstring)."""
        if self._heartbeat is not None:
            await asyncio.to_thread(self._heartbeat.stop)
            self._heartbeat = None
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None
        if self.etcd is not None:
            self.etcd.close()
            self.etcd = None
            self.registry = None
