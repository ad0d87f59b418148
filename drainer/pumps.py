"""The pumps in the merge: one reader per pump, discovery, Cistern.Notify, replays.

Readers and the Notify handler only push into the merge (through the syncer, the readers'
target); pumps join and leave by discovery's rules (drainer/discovery.py): removals happen only
on a fresh registry read, and a pump leaves only once everything it holds is below the durable
checkpoint or it is marked lost.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from sluice.core import errors
from sluice.core.log import kv
from sluice.core.registry import NodeInfo, NodeKind, NodeState, NodeStatus, Registry
from sluice.drainer.checkpointer import Checkpointer
from sluice.drainer.config import DrainerConfig
from sluice.drainer.discovery import Discovery, is_lost, wants_merge
from sluice.drainer.merge import MergeStrategy
from sluice.drainer.metrics import DrainerMetrics
from sluice.drainer.node_state import HeldBy, Node
from sluice.drainer.reader import PrivateMerge, PumpReader, run_guarded

if TYPE_CHECKING:
    from sluice.drainer.syncer import Syncer

log = logging.getLogger(__name__)


class Pumps:
    """Owns the readers (one task each) and what the registry says about every pump."""

    def __init__(self, config: DrainerConfig, name: str, registry: Registry, node: Node,
                 checkpointer: Checkpointer, metrics: DrainerMetrics, syncer: Syncer) -> None:
        self.config, self.name = config, name
        self.registry = registry
        self.node = node
        self.ckpt = checkpointer
        self.metrics = metrics
        self.syncer = syncer
        self.discovery: Discovery | None = None
        self.readers: dict[str, tuple[PumpReader, asyncio.Task[None]]] = {}
        self.status: dict[str, NodeStatus] = {}
        self._side_tasks: set[asyncio.Task[Any]] = set()

    # -- start, resume, stop ------------------------------------------------------------------

    async def start(self) -> list[NodeInfo]:
        """List the pumps at revision R and watch from R+1 (changes come to `reconcile`)."""
        self.discovery = Discovery(self.registry, asyncio.get_running_loop(), self._on_change)
        return await asyncio.to_thread(self.discovery.start)

    async def resume(self) -> None:
        """After a pause: a fresh list, and the pumps that may hold transactions join."""
        nodes, _ = await asyncio.to_thread(self.registry.list, NodeKind.PUMP)
        self.join(nodes)

    def join(self, nodes: list[NodeInfo]) -> None:
        """Each listed pump that may hold transactions after the checkpoint joins the merge."""
        durable = self.ckpt.durable_ts
        for n in nodes:
            self.status[n.node_id] = n.status
            if wants_merge(n.status, durable):
                self._add(n.node_id, n.status.addr, durable)

    async def stop_readers(self) -> None:
        entries = list(self.readers.values())
        self.readers.clear()
        for _, task in entries:
            task.cancel()
        await asyncio.gather(*(t for _, t in entries), return_exceptions=True)

    async def close(self) -> None:
        await self.stop_readers()
        for t in list(self._side_tasks):
            t.cancel()
        if self.discovery is not None:
            await asyncio.to_thread(self.discovery.stop)

    # -- joining and leaving ------------------------------------------------------------------

    def _add(self, pump_id: str, addr: str, after: int) -> None:
        merge = self.syncer.merger
        if merge is None or not merge.add_source(pump_id, after):
            return
        reader = PumpReader(
            pump_id, addr, after, self.syncer, cluster_id=self.config.cluster_id,
            consumer_id=self.name, security=self.config.security,
            with_schema=self.syncer.want_schema, skip_corrupt=self.config.skip_corrupt,
            max_backoff=self.config.reconnect_max_backoff,
            on_event=self.metrics.on_reader_event, columnar=self.syncer.columnar)
        task = asyncio.create_task(run_guarded(reader, self.syncer.reader_failed),
                                   name=f"reader-{pump_id}")
        self.readers[pump_id] = (reader, task)
        log.info("pump %s (%s) joined the merge after ts %d", pump_id, addr, after,
                 extra=kv(pump=pump_id, after=after))

    async def _remove(self, pump_id: str, why: str) -> None:
        entry = self.readers.pop(pump_id, None)
        if self.syncer.merger is not None:
            self.syncer.merger.remove_source(pump_id)
        if entry is not None:
            entry[1].cancel()
            await asyncio.gather(entry[1], return_exceptions=True)
            log.info("pump %s left the merge: %s", pump_id, why, extra=kv(pump=pump_id))
        self.syncer.wake()

    def _on_change(self, pump_id: str, info: NodeInfo | None) -> None:
        if info is not None:
            self.status[pump_id] = info.status
            reader = self.readers.get(pump_id)
            if reader is not None and info.status.addr and reader[0].addr != info.status.addr:
                log.info("pump %s moved to %s", pump_id, info.status.addr, extra=kv(pump=pump_id))
                reader[0].addr = info.status.addr
        self._spawn(self.reconcile(pump_id, deleted=info is None))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.create_task(coro)
        self._side_tasks.add(t)
        t.add_done_callback(self._side_tasks.discard)

    async def after_checkpoint(self) -> None:
        """A checkpoint was saved: pumps whose transactions are all below it leave."""
        durable = self.ckpt.durable_ts
        for pump_id, st in list(self.status.items()):
            if pump_id in self.readers and not wants_merge(st, durable):
                await self.reconcile(pump_id)

    async def reconcile(self, pump_id: str, deleted: bool = False) -> None:
        """Add or remove one pump per discovery's rules (removals on a fresh read)."""
        merge = self.syncer.merger
        if merge is None or self.node.state != NodeState.ONLINE.value:
            return
        durable = self.ckpt.durable_ts
        status = self.status.get(pump_id)
        in_merge = pump_id in self.readers
        if status is not None and not deleted and wants_merge(status, durable):
            if not in_merge:
                self._add(pump_id, status.addr, merge.merge_watermark)
            return
        if not in_merge or self.discovery is None:
            return
        try:
            fresh = await asyncio.to_thread(self.discovery.fresh, pump_id)
        except errors.SluiceError as e:
            log.warning("cannot re-read pump %s before removing it: %s", pump_id, e)
            return
        durable = self.ckpt.durable_ts
        if fresh is not None:
            self.status[pump_id] = fresh.status
            if wants_merge(fresh.status, durable):
                return
            st = fresh.status
            why = ("marked lost" if is_lost(st) else
                   f"{st.state.value} with final ts {st.max_commit_ts} <= durable checkpoint "
                   f"{durable}")
        else:
            why = "its registry entry was deleted"
        if pump_id in self.readers:
            await self._remove(pump_id, why)

    async def on_notify(self, pump_id: str, addr: str) -> None:
        """Cistern.Notify: the pump joins the merge before we reply (it writes only after).

        Only a pump the registry holds, at that address, online and alive, is admitted (a pump
        registers and starts its heartbeat before it notifies, DESIGN §4); anything else is
        FAILED_PRECONDITION and changes nothing, so no request from an unregistered peer can
        put a source into the merge, where it would hold every transaction after it."""
        try:
            info = await asyncio.to_thread(self.registry.get, NodeKind.PUMP, pump_id)
        except errors.InvalidArgument as e:
            raise errors.FailedPrecondition(f"Notify refused: {e}") from None
        where = f"in the registry of cluster {self.config.cluster_id}"
        if info is None:
            raise errors.FailedPrecondition(
                f"Notify refused: pump {pump_id!r} is not registered {where}; a pump registers "
                "itself (online, alive) before it notifies drainers")
        st = info.status
        if st.addr != addr:
            raise errors.FailedPrecondition(
                f"Notify refused: pump {pump_id!r} notified from address {addr!r} but is "
                f"registered at {st.addr!r} {where}")
        if st.state != NodeState.ONLINE or not info.alive:
            raise errors.FailedPrecondition(
                f"Notify refused: pump {pump_id!r} is {st.state.value}"
                f"{'' if info.alive else ' and not alive'} {where}; only an online, alive pump "
                "joins the merge by Notify")
        self.status[pump_id] = st
        merge = self.syncer.merger
        if merge is None:
            # Paused or not started: the list that follows going online will find the pump.
            log.info("pump %s notified while this drainer is %s", pump_id, self.node.state)
            return
        reader = self.readers.get(pump_id)
        if reader is not None:
            reader[0].addr = addr
            return
        self._add(pump_id, addr, merge.merge_watermark)

    def open_replay(self, after: int) -> PrivateMerge:
        """A private merge of every pump that may hold transactions after `after` (the grpc
        sink's replay below its buffer; given to it when it is built)."""
        pumps = {pid: st.addr for pid, st in self.status.items() if wants_merge(st, after)}
        if not pumps:
            raise errors.OutOfRange(f"after_commit_ts {after}: no pump in the registry holds "
                                    "transactions after it any more")
        return PrivateMerge(pumps, after, cluster_id=self.config.cluster_id,
                            consumer_id=f"{self.name}/replay", security=self.config.security,
                            max_pending=self.config.reader_queue, batch=self.config.txn_batch,
                            dedupe_window=self.config.dedupe_window)

    def held_by(self, merge: MergeStrategy | None) -> HeldBy | None:
        """(pump, alert) for the oldest stuck prewrite a pump in the merge published
        (pump/loops.py): the start_ts that stops this drainer, and who can end it. A pump with
        a stuck prewrite serves nothing above it, so the merge cannot pass it either."""
        if merge is None:
            return None
        best: HeldBy | None = None
        for pump_id in merge.sources():
            st = self.status.get(pump_id)
            for a in st.alerts if st is not None else ():
                if best is None or int(a.get("start_ts") or 0) < int(best[1].get("start_ts") or 0):
                    best = (pump_id, a)
        return best
