"""`sluice drainer`: merge every pump's stream by commit_ts and apply it to one sink.

Start-up order (DESIGN §2.4, §2.6, §6): take the epoch (ha: wait as a standby until this
instance wins the name's leader lease) -> load the checkpoint (or start at `initial-commit-ts`;
-1 is a fresh TSO ts) -> open the sink and save a checkpoint at once -> serve Cistern.Notify
(and the merged stream for the grpc sink) -> register status online (with the checkpoint) and
the alive key -> list pumps at revision R, watch from R+1 -> one reader per pump.

The parts: node_state.py (registry, HA fencing), checkpointer.py, pumps.py (readers, notify),
syncer.py (merge and apply, pause/close); docs/drainer.md says why the order keeps the
checkpoint invariant.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import threading
from typing import Any

from sluice.core.cli import check_etcd_reachable, flag_overrides
from sluice.core import config as cfg
from sluice.core import errors, failpoint, grpcutil
from sluice.core import log as logsetup
from sluice.core.etcd import Etcd
from sluice.core.log import kv
from sluice.core.memory import retain_freed_memory
from sluice.core.registry import NodeState, Registry
from sluice.core.loopwatch import watched
from sluice.drainer.checkpointer import Checkpointer
from sluice.drainer.config import DrainerConfig
from sluice.drainer.ha import FencedCheckpointStore
from sluice.drainer.merge import MergeStrategy
from sluice.drainer.metrics import DrainerMetrics
from sluice.drainer.node_state import EXIT_FENCED, HeldBy, Node
from sluice.drainer.pumps import Pumps
from sluice.drainer.service import CisternService, DrainerService
from sluice.drainer.service import add_to_server as add_drainer_service
from sluice.drainer.sink import ServingSink, load_sink
from sluice.drainer.syncer import Stopped, Syncer
from sluice.drainer.txn import SchemaHistory
from sluice.proto import sluice_pb2_grpc as pbg

log = logging.getLogger(__name__)

__all__ = ["add_arguments", "run", "Drainer", "EXIT_FENCED"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sluice.core.cli import add_process_arguments
    add_process_arguments(p)
    p.add_argument("--addr", help="listen address host:port (overrides addr)")
    p.add_argument("--name", help="drainer name / node id (overrides name)")
    p.add_argument("--etcd", help="etcd endpoints (overrides etcd)")
    p.add_argument("--initial-commit-ts", type=int,
                   help="start here when no checkpoint is saved (-1: now)")
    p.add_argument("--ha", action="store_true", default=None,
                   help="run as an active/standby member of the drainers with this name")


def load_config(args: argparse.Namespace) -> DrainerConfig:
    overrides = flag_overrides(args, (("addr", "addr"), ("name", "name"), ("etcd", "etcd")))
    if getattr(args, "initial_commit_ts", None) is not None:
        overrides.append(f"initial-commit-ts={args.initial_commit_ts}")
    if getattr(args, "ha", None):
        overrides.append("ha=true")
    config = cfg.load(DrainerConfig, args.config, overrides)
    config.validate(str(args.config or "<defaults>"))
    return config


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    logsetup.setup(args.log_level, args.log_file)
    check_prerequisites(config)
    tune_gc()
    retain_freed_memory()
    return asyncio.run(watched(f"drainer {config.name or config.addr}", Drainer(config).run_forever()))


def tune_gc() -> None:
    """The merge allocates a few tuples per transaction, hundreds of thousands per second: with
    the default thresholds the cyclic GC measured ~40% of the read path's CPU (docs/drainer.md).
    The drainer's data holds no reference cycles worth collecting often, so collect rarely, and
    move start-up objects out of the collector's sight."""
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def check_prerequisites(config: DrainerConfig) -> None:
    """What needs the network (the config itself was checked by load_config)."""
    check_etcd_reachable(config.etcd, config.security)


class Drainer:
    """One drainer process: its parts, their start-up order, and their shutdown."""

    def __init__(self, config: DrainerConfig) -> None:
        self.config = config
        self.name = config.resolved_name()
        self.addr = config.resolved_advertise()
        self.etcd = Etcd(config.etcd, config.security)
        self.registry = Registry(self.etcd, config.cluster_id)
        self.metrics = DrainerMetrics(self)
        self.node = Node(config, self.name, self.addr, self.registry, self.metrics)
        self.checkpointer = Checkpointer(
            FencedCheckpointStore(self.registry, self.name, self.node.election), self.node.guard,
            self.metrics)
        self.syncer = Syncer(config, self.name, self.node, self.checkpointer, self.metrics,
                             SchemaHistory())
        self.pumps = Pumps(config, self.name, self.registry, self.node, self.checkpointer,
                           self.metrics, self.syncer)
        self.syncer.pumps = self.pumps
        self._stop = asyncio.Event()
        self._stop_waiting = threading.Event()   # ends a standby's wait (SIGTERM)
        self._server: Any = None

    # -- what the services and metrics read ----------------------------------------------------

    @property
    def durable_ts(self) -> int:
        return self.checkpointer.durable_ts

    @property
    def merger(self) -> MergeStrategy | None:
        return self.syncer.merger

    @property
    def binlogs_out(self) -> int:
        return self.syncer.binlogs_out

    def held_by(self) -> HeldBy | None:
        return self.pumps.held_by(self.syncer.merger)

    async def on_notify(self, pump_id: str, addr: str) -> None:
        await self.pumps.on_notify(pump_id, addr)

    def grpc_sink(self) -> ServingSink | None:
        return self.syncer.serving_sink()

    def wake(self) -> None:
        self.syncer.wake()

    # -- run ----------------------------------------------------------------------------------

    def _on_signal(self) -> None:
        self._stop.set()
        self._stop_waiting.set()

    async def run_forever(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        self.metrics.serve(self.config.metrics_addr)
        self.metrics.ha_active.set(0)
        try:
            if not await self.node.take_epoch(self._stop_waiting):
                self._close_etcd()
                return 0
        except BaseException:
            self._close_etcd()
            raise
        try:
            return await self._run_active()
        except errors.StaleEpoch as e:
            # Before any cleanup below can flush a buffered write to the sink.
            self.node.exit_fenced(str(e))
            raise
        finally:
            await self._shutdown()

    async def _run_active(self) -> int:
        node, syncer = self.node, self.syncer
        await node.check_not_offline()
        cp = await self.checkpointer.initial(self.config, self.etcd, self.name)
        if cp.schema is not None:
            syncer.schema = SchemaHistory.from_bytes(cp.schema)
        sink = load_sink(self.config.sink, self.config.to, schema=syncer.schema,
                         source_name=self.config.source_name, drainer_name=self.name,
                         cluster_id=self.config.cluster_id, epoch=node.epoch,
                         fence=node.guard, metrics=self.metrics.m, replay=self.pumps.open_replay)
        syncer.use_sink(sink, saved_schema=cp.schema is not None)
        node.guard()
        await sink.open(cp)
        await self.checkpointer.save_opened(sink)
        syncer.new_merger()

        server = grpcutil.aio_server(self.config.security)
        pbg.add_CisternServicer_to_server(CisternService(self), server)
        add_drainer_service(DrainerService(self), server)
        grpcutil.add_port(server, self.config.addr, self.config.security)
        await server.start()
        self._server = server
        try:
            target = await node.register(self.checkpointer.durable_ts)
            if target == NodeState.OFFLINE:
                log.info("drainer %s was closing when it stopped: now offline", self.name)
                return 0
            await failpoint.ainject("drainer-between-register-and-list")
            nodes = await self.pumps.start()
            if target == NodeState.PAUSED:
                node.state = NodeState.PAUSED.value
                syncer.merger = None
                log.info("drainer %s was pausing when it stopped: now paused", self.name)
            else:
                node.state = NodeState.ONLINE.value
                self.pumps.join(nodes)
            log.info("drainer %s online: merging %d pump(s) after ts %d", self.name,
                     len(self.pumps.readers), self.checkpointer.durable_ts,
                     extra=kv(pumps=len(self.pumps.readers), after=self.checkpointer.durable_ts))
            # The three live and die together; a stop is asked of the syncer, which owns the
            # sink: it flushes and saves the final checkpoint itself (cancelling it mid-apply
            # could leave a batch written but not accounted for), then ends them all.
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(syncer.run(), name="merge")
                tasks.create_task(node.status_loop(self.held_by, syncer.ask), name="status")
                tasks.create_task(self.metrics.loop(), name="metrics")
                tasks.create_task(self._stop_on_signal(), name="stop")
            return 0
        except BaseExceptionGroup as group:
            first = group.exceptions[0]
            if isinstance(first, Stopped):
                return 0
            raise first from None
        finally:
            log.info("drainer %s stopping", self.name)

    async def _stop_on_signal(self) -> None:
        await self._stop.wait()
        self.syncer.stop()

    async def _shutdown(self) -> None:
        server = self._server
        await self.pumps.close()
        if server is not None:
            await server.stop(grace=0.5)
        sink = self.syncer.sink
        if sink is not None:
            # Closing flushes buffered output: only while we are still the active instance.
            try:
                self.node.guard()
            except errors.StaleEpoch as e:
                self.node.exit_fenced(str(e))
            try:
                await sink.close()
            except errors.StaleEpoch as e:
                self.node.exit_fenced(str(e))
            except Exception as e:  # noqa: BLE001 - closing after a failure: report, go on
                log.warning("sink close failed: %s", e)
        # Nothing of ours can land any more: let a standby take over without waiting.
        await self.node.leave()
        self._close_etcd()

    def _close_etcd(self) -> None:
        self.etcd.close()
        self.node.close()
