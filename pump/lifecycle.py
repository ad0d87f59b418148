"""A pump's node lifecycle in the registry (DESIGN §4).

- Coming online (new, or resuming from paused) the pump notifies every online drainer before it
  accepts writes; a drainer that is online but not alive makes it wait, and it says why.
- Pausing: no new prewrites; commits and rollbacks continue until none is unresolved; then the
  final served watermark is published as max_commit_ts and the state becomes paused. Closing is
  the same and ends offline. Reads are served in every state.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from sluice.core import errors, grpcutil
from sluice.core.keywatch import KeyWatch
from sluice.core.registry import NodeInfo, NodeKind, NodeState, NodeStatus, Registry
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

if TYPE_CHECKING:
    from sluice.core.registry import Heartbeat

    from .config import PumpConfig
    from .storage.storage import Storage

log = logging.getLogger(__name__)

STATUS_POLL_S = 0.5
# The served watermark an online pump publishes is for `sluice ctl pumps` only (drainers read
# max_commit_ts of paused/offline pumps, published at once): each publish is a Range + a Txn and
# a watch event in every process that follows the pumps, so not every 2 s.
PUBLISH_EVERY_S = 10.0
NOTIFY_TIMEOUT_S = 5.0


class Lifecycle:
    """Owns the pump's node state (`state`) and who may write in it (`check_writable`)."""

    def __init__(self, registry: Registry, storage: "Storage", config: "PumpConfig",
                 node_id: str, addr: str) -> None:
        self.registry = registry
        self.storage = storage
        self.config = config
        self.node_id = node_id
        self.addr = addr
        self.state = "starting"
        self.heartbeat: Heartbeat | None = None

    def check_writable(self, payloads: list[bytes]) -> None:
        """Refuse (UNAVAILABLE) what this node state takes no writes of."""
        state = self.state
        if state == NodeState.ONLINE.value:
            return
        if state == "starting":
            raise errors.Unavailable(f"pump {self.node_id} is starting: it takes writes once every "
                                     "online drainer has been notified")
        if state in (NodeState.PAUSED.value, NodeState.OFFLINE.value):
            raise errors.Unavailable(f"pump {self.node_id} is {state}: it takes no writes")
        # pausing / closing: commits and rollbacks still resolve what was prewritten here.
        for raw in payloads:
            b = pb.Binlog.FromString(raw) if raw else pb.Binlog()
            if b.tp == pb.PREWRITE:
                raise errors.Unavailable(f"pump {self.node_id} is {state}: it takes no new "
                                         "prewrites; send them to another pump")

    async def start(self) -> None:
        info = await asyncio.to_thread(self.registry.get, NodeKind.PUMP, self.node_id)
        if info is not None and info.status.state == NodeState.OFFLINE.value:
            raise errors.ConfigError(
                f"pump {self.node_id} is offline in the registry: an offline pump never comes "
                "back; start it with a new node-id (or a new data-dir)")
        status = NodeStatus(node_id=self.node_id, kind=NodeKind.PUMP, addr=self.addr,
                            state=NodeState.ONLINE,
                            max_commit_ts=self.storage.served_watermark,
                            score=self.config.score,
                            update_ts=int(time.time()))
        if info is None:
            await asyncio.to_thread(self.registry.register, status)
        elif info.status.state in (NodeState.PAUSING, NodeState.CLOSING):
            # Restarted while draining: keep draining (commits and rollbacks only), never online.
            self.heartbeat = self.registry.heartbeat(NodeKind.PUMP, self.node_id,
                                                     self.config.alive_ttl)
            await asyncio.to_thread(self.heartbeat.start)
            self.state = info.status.state.value
            log.info("pump %s restarted while %s: resolving what is left", self.node_id,
                     self.state)
            return
        else:
            def to_online(old: NodeStatus) -> NodeStatus:
                return _replace(old, addr=self.addr, state=NodeState.ONLINE,
                                score=self.config.score, update_ts=int(time.time()))
            await asyncio.to_thread(self.registry.update, NodeKind.PUMP, self.node_id, to_online)
        self.heartbeat = self.registry.heartbeat(NodeKind.PUMP, self.node_id,
                                                 self.config.alive_ttl)
        await asyncio.to_thread(self.heartbeat.start)
        await self.notify_drainers()
        self.state = NodeState.ONLINE.value
        log.info("pump %s online: accepting writes", self.node_id)

    async def notify_drainers(self) -> None:
        """Notify every online drainer; wait (saying why) for any that is online but not alive."""
        notified: set[str] = set()
        last_warn = 0.0
        while True:
            drainers, _ = await asyncio.to_thread(self.registry.list, NodeKind.DRAINER)
            waiting = []
            for d in drainers:
                st = d.status
                if st.state != NodeState.ONLINE.value or st.node_id in notified:
                    continue
                if not d.alive:
                    waiting.append(f"{st.node_id} ({st.addr}) is online but not alive")
                    continue
                try:
                    await self._notify(st.addr)
                    notified.add(st.node_id)
                    log.info("notified drainer %s at %s", st.node_id, st.addr)
                except errors.SluiceError as e:
                    waiting.append(f"{st.node_id} ({st.addr}) did not answer Notify: {e}")
            if not waiting:
                return
            if time.monotonic() - last_warn > 5:
                last_warn = time.monotonic()
                log.warning("pump %s waits before accepting writes: %s — start that drainer, or "
                            "take it out with `sluice ctl offline-drainer <drainer-id>`",
                            self.node_id, "; ".join(waiting))
            await asyncio.sleep(0.5)

    async def _notify(self, addr: str) -> None:
        channel = grpcutil.aio_channel(addr, self.config.security)
        try:
            stub = pbg.CisternStub(channel)
            await stub.Notify(pb.NotifyReq(cluster_id=self.config.cluster_id,
                                           pump_id=self.node_id, pump_addr=self.addr),
                              timeout=NOTIFY_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - grpc errors become SluiceErrors
            import grpc
            if isinstance(e, grpc.RpcError):
                raise grpcutil.to_sluice_error(e) from None
            raise
        finally:
            await channel.close()

    async def watch(self) -> None:
        """Follow our own status key: act on pausing/closing/online set by `sluice ctl`."""
        last_publish = 0.0
        # The status key is watched and read again only when it changed (or every few seconds
        # if the watch died silently); the loop still ticks every STATUS_POLL_S for what changes
        # here (a pausing pump's last unresolved prewrite going away).
        watch = KeyWatch(self.registry.etcd, self.registry.node_prefix(NodeKind.PUMP, self.node_id),
                         prefix=True)
        info: NodeInfo | None = None
        try:
            while True:
                info = await watch.follow_async(
                    lambda: self.registry.get(NodeKind.PUMP, self.node_id), info, STATUS_POLL_S)
                if info is None:
                    continue
                last_publish, stored = await self._follow(info, last_publish)
                if stored is not None:
                    # What we just wrote is the status now (its watch event re-reads it too).
                    info = _replace_info(info, stored)
        finally:
            watch.cancel()

    async def _follow(self, info: NodeInfo, last_publish: float) -> tuple[float, NodeStatus | None]:
        """Act on the status last read; publish the watermark every PUBLISH_EVERY_S. Returns
        the new last-publish time and the status this call stored (None: none)."""
        stored: NodeStatus | None = None
        want = info.status.state
        if want in (NodeState.PAUSING.value, NodeState.CLOSING.value):
            self.state = want
            if not self.storage.unresolved():
                final = self.storage.served_watermark
                done = (NodeState.PAUSED if want == NodeState.PAUSING.value
                        else NodeState.OFFLINE)

                def finish(old: NodeStatus, final: int = final, done: NodeState = done) -> NodeStatus:
                    return _replace(old, state=done, max_commit_ts=final,
                                    update_ts=int(time.time()))
                stored = await asyncio.to_thread(self.registry.update, NodeKind.PUMP,
                                                 self.node_id, finish)
                self.state = done.value
                log.info("pump %s %s; final ts %d", self.node_id, done, final)
        elif want == NodeState.ONLINE.value and self.state in (NodeState.PAUSED.value,
                                                           NodeState.PAUSING.value):
            await self.notify_drainers()
            self.state = NodeState.ONLINE.value
            log.info("pump %s resumed: accepting writes", self.node_id)
        elif want in (NodeState.PAUSED.value, NodeState.OFFLINE.value):
            self.state = want
        if self.state == NodeState.ONLINE.value and time.monotonic() - last_publish > PUBLISH_EVERY_S:
            last_publish = time.monotonic()
            wm = self.storage.served_watermark

            def publish(old: NodeStatus, wm: int = wm) -> NodeStatus:
                if old.state != NodeState.ONLINE.value:
                    return old
                return _replace(old, max_commit_ts=wm, update_ts=int(time.time()))
            try:
                stored = await asyncio.to_thread(self.registry.update, NodeKind.PUMP,
                                                 self.node_id, publish)
            except errors.SluiceError as e:
                log.warning("cannot publish status: %s", e)
        return last_publish, stored

    async def stop(self) -> None:
        if self.heartbeat is not None:
            await asyncio.to_thread(self.heartbeat.stop)


def _replace_info(info: NodeInfo, status: NodeStatus) -> NodeInfo:
    import dataclasses
    return dataclasses.replace(info, status=status)


def _replace(status: NodeStatus, **changes: object) -> NodeStatus:
    import dataclasses
    return dataclasses.replace(status, **changes)  # type: ignore[arg-type]
