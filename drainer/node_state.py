"""This drainer's node in the registry: the epoch (HA fencing), its status and labels, alive key.

Fencing (DESIGN §2.10, drainer/ha.py): every hand-over to the sink and every etcd write happens
only while this instance is certainly the active one (`guard`, checked right before), and every
status write is conditioned on the epoch. Once that fails — or the keeper thread finds the
leader lease not certainly alive — the process exits at once with EXIT_FENCED, flushing
nothing: a stale drainer writes nothing more.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.core import errors
from sluice.core.etcd import Etcd
from sluice.core.keywatch import KeyWatch
from sluice.core.log import kv
from sluice.core.registry import NodeInfo, NodeKind, NodeState, NodeStatus, Registry
from sluice.drainer.config import DrainerConfig
from sluice.drainer.ha import Election, list_standbys
from sluice.drainer.metrics import DrainerMetrics
from sluice.drainer.sink import sink_class

log = logging.getLogger(__name__)

# Exit code of a drainer that stopped because it is no longer certainly the active instance.
EXIT_FENCED = 3

HELD_BY_LABEL = "held-by"
STANDBY_LABEL = "standby"

# (pump, alert) of the oldest stuck prewrite holding the merge (Pumps.held_by)
HeldBy = tuple[str, dict[str, Any]]


class Node:
    """The drainer's registry presence: election and epoch, status state, labels, heartbeat.

    `state` is this drainer's state as it acts on it ("starting", then a NodeState value);
    the syncer moves it (pausing -> paused, closing -> offline, resume)."""

    def __init__(self, config: DrainerConfig, name: str, addr: str, registry: Registry,
                 metrics: DrainerMetrics) -> None:
        self.config, self.name, self.addr = config, name, addr
        self.registry = registry
        self.metrics = metrics
        # Keepalives on their own client with a short timeout: a hung call must not outlast
        # the lease it is meant to keep.
        self.keepalive_etcd = (Etcd(config.etcd, config.security,
                                    timeout=max(0.5, config.alive_ttl / 3)) if config.ha else None)
        self.election = Election(registry, name, addr, ha=config.ha, ttl=config.alive_ttl,
                                 margin_s=config.ha_margin, keepalive_etcd=self.keepalive_etcd,
                                 on_lost=self._lease_lost)
        self.epoch = 0
        self.state = "starting"
        self._heartbeat: Any = None

    # -- epoch and fencing --------------------------------------------------------------------

    async def take_epoch(self, stop_waiting: threading.Event) -> bool:
        """Become the active instance (ha: wait as a standby). False: stopped while waiting."""
        if not self.config.ha:
            term = await asyncio.to_thread(self.election.take_without_ha)
        else:
            log.info("drainer %s at %s: ha on, campaigning (lease ttl %ds, margin %.1fs)",
                     self.name, self.addr, self.config.alive_ttl, self.config.ha_margin)
            # A hot standby: the sink's costly start-up (Spark: JVM + catalog) runs
            # while it waits, so a takeover costs the TTL wait and the sink's open only.
            warm = asyncio.create_task(asyncio.to_thread(self._prewarm_sink), name="sink-prewarm")
            term = await asyncio.to_thread(self.election.campaign, stop_waiting)
            if term is None:
                log.info("drainer %s: standby at %s stopped while waiting", self.name, self.addr)
                return False
            await warm
        self.epoch = term.epoch
        self.metrics.epoch.set(term.epoch)
        self.metrics.ha_active.set(1)
        return True

    def _prewarm_sink(self) -> None:
        t0 = time.monotonic()
        try:
            sink_class(self.config.sink).prewarm(self.config.to)
        except Exception as e:  # noqa: BLE001 - open() meets the same problem and reports it
            log.warning("drainer %s: sink %s prewarm failed: %s", self.name, self.config.sink, e)
            return
        log.info("drainer %s: sink %s prewarmed in %.1fs", self.name, self.config.sink,
                 time.monotonic() - t0)

    def guard(self) -> None:
        """Right before anything reaches the sink: are we certainly still the active instance?"""
        self.election.check()

    def _lease_lost(self, reason: str) -> None:
        # Keeper thread: the loop may be busy or stalled; stop the process from here.
        self.exit_fenced(reason)

    def exit_fenced(self, reason: str) -> None:
        """Exit now: no flush, no checkpoint, no sink close — buffered output would be a stale
        write. What was applied but not checkpointed is applied again by the new active one."""
        log.critical("drainer %s at %s (epoch %d) is no longer certainly the active instance and "
                     "stops at once, writing nothing more: %s", self.name, self.addr, self.epoch,
                     reason, extra=kv(epoch=self.epoch))
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        os._exit(EXIT_FENCED)

    # -- status -------------------------------------------------------------------------------

    async def check_not_offline(self) -> NodeInfo | None:
        info = await asyncio.to_thread(self.registry.get, NodeKind.DRAINER, self.name)
        if info is not None and info.state == NodeState.OFFLINE:
            raise errors.ConfigError(
                f"drainer {self.name} is offline in the registry: pumps no longer keep binlogs "
                "for it; start it under a new name")
        return info

    async def register(self, ckpt: int) -> NodeState:
        """Register status online (or finish a pausing/closing left by a crash); start alive."""
        info = await self.check_not_offline()
        epoch = self.epoch
        target = NodeState.ONLINE
        if info is not None and info.state == NodeState.PAUSING:
            target = NodeState.PAUSED
        elif info is not None and info.state == NodeState.CLOSING:
            target = NodeState.OFFLINE
        if info is None:
            self.election.check()
            await asyncio.to_thread(self.registry.register, NodeStatus(
                node_id=self.name, kind=NodeKind.DRAINER, addr=self.addr, state=target,
                checkpoint=ckpt, epoch=epoch))
        else:
            def to_target(old: NodeStatus) -> NodeStatus:
                if old.epoch > epoch:
                    raise self.election.fenced_error("registering the status")
                labels = {k: v for k, v in old.labels.items() if k != STANDBY_LABEL}
                return dataclasses.replace(old, addr=self.addr, state=target, checkpoint=ckpt,
                                           epoch=epoch, labels=labels)
            self.election.check()
            await asyncio.to_thread(self.registry.update, NodeKind.DRAINER, self.name, to_target)
        if target != NodeState.OFFLINE:
            if self.config.ha:
                # Bound to the leader lease: the alive key vanishes exactly with our leadership,
                # and a stalled old instance can never put it back over the new one's.
                hb = self.registry.heartbeat(NodeKind.DRAINER, self.name, self.config.alive_ttl)
                await asyncio.to_thread(self.election.put_alive, hb.key, hb.value)
            else:
                self._heartbeat = self.registry.heartbeat(NodeKind.DRAINER, self.name,
                                                          self.config.alive_ttl)
                await asyncio.to_thread(self._heartbeat.start)
        log.info("drainer %s registered %s at %s (checkpoint %d, epoch %d)", self.name,
                 target.value, self.addr, ckpt, epoch, extra=kv(checkpoint=ckpt, epoch=epoch))
        return target

    async def finish(self, done: NodeState, ckpt: int) -> None:
        """Set the status to `done` (paused / offline) with checkpoint ckpt, fenced by the epoch."""
        epoch = self.epoch

        def finish(old: NodeStatus) -> NodeStatus:
            if old.epoch > epoch:
                raise self.election.fenced_error(f"setting the state {done.value}")
            return dataclasses.replace(old, state=done, checkpoint=ckpt)
        self.guard()
        try:
            await asyncio.to_thread(self.registry.update, NodeKind.DRAINER, self.name, finish)
        except errors.IllegalTransition as e:
            # Changed again meanwhile (e.g. set online): the status loop sees the new state.
            log.warning("drainer %s: %s; state left as it is", self.name, e)
        self.state = done.value

    async def status_loop(self, held_by: Callable[[], HeldBy | None],
                          ask: Callable[[str], None]) -> None:
        """Follow the registry: labels (standby, held-by) out, state changes asked for in."""
        # The status key is watched: read again when it changed (or every few seconds if the
        # watch died silently), not every tick; the tick mirrors local changes (held-by) into it.
        watch = KeyWatch(self.registry.etcd,
                         self.registry.node_prefix(NodeKind.DRAINER, self.name), prefix=True)
        try:
            await self._follow_status(watch, held_by, ask)
        finally:
            watch.cancel()

    async def _follow_status(self, watch: KeyWatch, held_by: Callable[[], HeldBy | None],
                             ask: Callable[[str], None]) -> None:
        info: NodeInfo | None = None
        while True:
            info = await watch.follow_async(
                lambda: self.registry.get(NodeKind.DRAINER, self.name), info,
                self.config.status_poll_interval)
            if info is None:
                continue
            if self.config.ha:
                await self._show_standbys(info)
            try:
                await self._show_held_by(info, held_by())
            except errors.SluiceError as e:
                log.warning("cannot update the held-by label: %s", e)
            want = info.state
            if want == NodeState.PAUSING and self.state == NodeState.ONLINE.value:
                ask("pause")
            elif want == NodeState.CLOSING and self.state != NodeState.OFFLINE.value:
                ask("close")
            elif want == NodeState.ONLINE and self.state == NodeState.PAUSED.value:
                ask("resume")

    async def _show_held_by(self, info: NodeInfo, held: HeldBy | None) -> None:
        """Mirror `held_by` into the status label `held-by` (for `ctl drainers` and lag
        reports): "<pump> start_ts=<S> producer=<P>", absent while nothing is stuck."""
        text = ""
        if held is not None:
            pump, alert = held
            text = f"{pump} start_ts={alert.get('start_ts')} producer={alert.get('producer')!r}"
        if info.status.labels.get(HELD_BY_LABEL, "") == text:
            return
        if held is not None:
            pump, alert = held
            log.warning("merge held by pump %s: its prewrite start_ts=%s of producer %r is "
                        "unresolved (%s); decide it: %s", pump, alert.get("start_ts"),
                        alert.get("producer"), alert.get("reason"), alert.get("command"),
                        extra=kv(pump=pump, start_ts=alert.get("start_ts")))
        await self._set_label(HELD_BY_LABEL, text)

    async def _show_standbys(self, info: NodeInfo) -> None:
        """Mirror the live standby keys into the status label `standby` (for `ctl drainers`)."""
        try:
            standbys = ",".join(await asyncio.to_thread(list_standbys, self.registry, self.name))
        except errors.EtcdUnavailable:
            return
        if info.status.labels.get(STANDBY_LABEL, "") == standbys:
            return
        await self._set_label(STANDBY_LABEL, standbys)

    async def _set_label(self, key: str, value: str) -> None:
        """Set (or, when empty, remove) one label of this drainer's registry status, fenced by
        the epoch it holds now."""
        epoch = self.epoch

        def label(old: NodeStatus) -> NodeStatus:
            if old.epoch > epoch:
                raise self.election.fenced_error(f"updating the {key} label")
            labels = {k: v for k, v in old.labels.items() if k != key}
            if value:
                labels[key] = value
            return dataclasses.replace(old, labels=labels)
        self.guard()
        try:
            await asyncio.to_thread(self.registry.update, NodeKind.DRAINER, self.name, label)
        except errors.EtcdUnavailable as e:
            log.warning("registry unavailable: %s", e)

    # -- stop ---------------------------------------------------------------------------------

    async def leave(self) -> None:
        """Stop the alive key and release the leadership: a standby takes over at once."""
        if self._heartbeat is not None:
            await asyncio.to_thread(self._heartbeat.stop)
        await asyncio.to_thread(self.election.release)

    def close(self) -> None:
        if self.keepalive_etcd is not None:
            self.keepalive_etcd.close()
