"""`sluice drainer`: merge every pump's stream by commit_ts and apply it to one sink.

Start-up order (DESIGN §2.4, §2.6, §6): take the epoch (with `ha = true`: wait as a standby until
this instance wins the name's leader lease) → load the checkpoint (or start at `initial-commit-ts`; -1 is a
fresh TSO ts) → open the sink and save a checkpoint at once → serve Cistern.Notify (and the merged
stream for the grpc sink) → register status online (with the checkpoint) and the alive key → list
pumps at revision R, watch from R+1 → one reader per pump from the checkpoint.

Invariant: the saved checkpoint never runs ahead of the sink — a checkpoint is written only after
`sink.flush()`, with the sink's durable commit_ts (or the merge watermark read before that flush,
when everything emitted up to it had been applied), and the producer positions saved with it are
those of the transactions at or below it. So a restart from it (kill -9 anywhere) loses nothing
and, with a sink that truncates to its checkpoint state (file), doubles nothing.

Fencing (DESIGN §2.10, drainer/ha.py): the epoch goes to the sink in its context; every hand-over
to the sink and every etcd write happens only while this instance is certainly the active one
(checked right before), and the checkpoint write is conditioned on the epoch. Once that fails —
or the leader lease is not certainly alive, noticed by the keeper thread — the process exits at
once with EXIT_FENCED and without flushing anything: a stale drainer writes nothing more.

Filters (`[filter]`, drainer/filter.py) run between the merge and the sink, after the schema
effects are recorded; a dropped transaction still advances the checkpoint.

One task owns the merge and the sink (`_merge_loop`): it pops commit-ordered transactions,
records their schema effects, applies them, saves checkpoints every `checkpoint-interval`, and
performs state changes asked for through the registry (pausing → paused, closing → offline).
Readers and the Notify handler only push into the merge; removals follow discovery's rules.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import gc
import logging
import operator
import os
import signal
import threading
import time
from typing import Any

from sluice.core import config as cfg
from sluice.core import errors, failpoint, grpcutil
from sluice.core import log as logsetup
from sluice.core import ts as tsmod
from sluice.core.etcd import Etcd
from sluice.core.memory import retain_freed_memory
from sluice.core.position import is_empty
from sluice.core.registry import NodeInfo, NodeKind, NodeState, NodeStatus, Registry
from sluice.core.tso_client import TSOClient
from sluice.drainer.checkpoint import CheckpointStore, decode_positions, encode_positions
from sluice.drainer.config import DrainerConfig
from sluice.drainer.discovery import Discovery, is_lost, wants_merge
from sluice.drainer.filter import TxnFilter
from sluice.drainer.ha import Election, FencedCheckpointStore, list_standbys
from sluice.drainer.merger import Merger, UnknownSource
from sluice.drainer.metrics import DrainerMetrics
from sluice.drainer.reader import PrivateMerge, PumpReader, run_guarded
from sluice.drainer.service import CisternService, DrainerService
from sluice.drainer.service import add_to_server as add_drainer_service
from sluice.drainer.sink import Checkpoint, Sink, load_sink, sink_class
from sluice.drainer.txn import CorruptTxn, SchemaHistory, Txn, unframe
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from sluice.core.log import kv

log = logging.getLogger(__name__)

_raw_fields = operator.itemgetter(0, 1, 5)   # (commit_ts, start_ts, framed binlogs): a RawTxn
_position = operator.itemgetter(4)

# How far ahead of the batch being dispatched dispatched_upper is raised, in physical ms: one
# checkpoint write per this much ts instead of one per batch (DESIGN §6 safe mode).
DISPATCH_AHEAD_MS = 10_000

# Exit code of a drainer that stopped because it is no longer certainly the active instance.
EXIT_FENCED = 3


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
    overrides = list(args.overrides)
    for flag, key in (("addr", "addr"), ("name", "name"), ("etcd", "etcd")):
        value = getattr(args, flag, None)
        if value:
            overrides.append(f'{key}="{value}"')
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
    return asyncio.run(DrainerServer(config).run_forever())


def tune_gc() -> None:
    """The merge allocates a few tuples per transaction, hundreds of thousands per second: with
    the default thresholds (a young collection every 700 allocations) the cyclic GC measured
    ~40% of the read path's CPU. The drainer's data holds no reference cycles worth collecting
    often, so collect rarely, and move start-up objects out of the collector's sight."""
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def check_prerequisites(config: DrainerConfig) -> None:
    """What needs the network (the config itself was checked by load_config)."""
    etcd = Etcd(config.etcd, config.security, timeout=3)
    try:
        etcd.revision()
    except errors.EtcdUnavailable as e:
        raise errors.ConfigError(f"etcd {config.etcd}: unreachable ({e}); start etcd or fix "
                                 "the `etcd` key") from None
    finally:
        etcd.close()


class _Stopped(Exception):
    """The drainer went offline (closing -> offline): the process exits 0."""


HELD_BY_LABEL = "held-by"


class DrainerServer:
    def __init__(self, config: DrainerConfig) -> None:
        self.config = config
        self.name = config.resolved_name()
        self.addr = config.resolved_advertise()
        self.etcd = Etcd(config.etcd, config.security)
        self.registry = Registry(self.etcd, config.cluster_id)
        # Keepalives on their own client with a short timeout: a hung call must not outlast
        # the lease it is meant to keep.
        self._keepalive_etcd = (Etcd(config.etcd, config.security,
                                     timeout=max(0.5, config.alive_ttl / 3)) if config.ha else None)
        self.election = Election(self.registry, self.name, self.addr, ha=config.ha,
                                 ttl=config.alive_ttl, margin_s=config.ha_margin,
                                 keepalive_etcd=self._keepalive_etcd, on_lost=self._lease_lost)
        self.store: CheckpointStore | FencedCheckpointStore = FencedCheckpointStore(
            self.registry, self.name, self.election)
        self.filter = TxnFilter(config.filter)
        self.epoch = 0
        self.metrics = DrainerMetrics(self)
        self.schema = SchemaHistory()
        self.sink: Sink | None = None
        self.merger: Merger | None = None
        self.discovery: Discovery | None = None
        self.readers: dict[str, tuple[PumpReader, asyncio.Task[None]]] = {}
        self.pump_status: dict[str, NodeStatus] = {}
        self.cp = Checkpoint(0)             # last saved checkpoint
        self.durable_ts = 0
        self.state = "starting"
        self.binlogs_out = 0
        self.binlogs_in = 0                 # merged from the readers (raw sinks count these)
        self.txns_out = 0
        self._txns_at_save = 0
        self._heartbeat: Any = None
        self._raw = False                   # the sink takes RawTxn batches (grpc)
        self._columnar = False              # ... and merged columns (drainer/columnar.py)
        self._follows_merge = True
        self._background = False            # the sink commits in the background (spark)
        self._sink_committed = False        # a background commit finished: save a checkpoint
        self._want_schema = False
        self._applied_positions: dict[str, pb.Position] = {}
        self._position_log: collections.deque[tuple[int, str, pb.Position]] = collections.deque()
        self._data = asyncio.Event()
        self._room = asyncio.Event()
        self._stop = asyncio.Event()
        self._stop_waiting = threading.Event()   # ends a standby's wait (SIGTERM)
        self._request: str | None = None     # "pause" | "close" | "resume", done by the merge loop
        self._fatal: BaseException | None = None
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self._server: Any = None

    # -- start --------------------------------------------------------------------------------

    async def _initial_checkpoint(self) -> Checkpoint:
        cp = await asyncio.to_thread(self.store.load)
        if cp is not None:
            log.info("drainer %s resumes from its checkpoint %d (%s)", self.name, cp.commit_ts,
                     tsmod.to_datetime(cp.commit_ts).isoformat() if cp.commit_ts else "start")
            return cp
        start = self.config.initial_commit_ts
        if start == -1:
            tso = TSOClient(self.config.tso or None, self.config.cluster_id, etcd=self.etcd,
                            security=self.config.security)
            try:
                start = await tso.get_ts()
            finally:
                await tso.close()
        log.info("drainer %s has no checkpoint: starting after ts %d", self.name, start)
        return Checkpoint(start)

    async def _register(self) -> NodeState:
        """Register status online (or finish a pausing/closing left by a crash); start alive."""
        info = await self._check_not_offline()
        ckpt = self.durable_ts
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
                labels = {k: v for k, v in old.labels.items() if k != "standby"}
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
                 target.value, self.addr, ckpt, epoch)
        return target

    async def _check_not_offline(self) -> NodeInfo | None:
        info = await asyncio.to_thread(self.registry.get, NodeKind.DRAINER, self.name)
        if info is not None and info.state == NodeState.OFFLINE:
            raise errors.ConfigError(
                f"drainer {self.name} is offline in the registry: pumps no longer keep binlogs "
                "for it; start it under a new name")
        return info

    # -- epoch and fencing --------------------------------------------------------------------

    async def _take_epoch(self) -> bool:
        """Become the active instance (ha: wait as a standby). False: stopped while waiting."""
        if not self.config.ha:
            term = await asyncio.to_thread(self.election.take_without_ha)
        else:
            log.info("drainer %s at %s: ha on, campaigning (lease ttl %ds, margin %.1fs)",
                     self.name, self.addr, self.config.alive_ttl, self.config.ha_margin)
            # A hot standby: the sink's costly start-up (Spark: JVM + catalog) runs
            # while it waits, so a takeover costs the TTL wait and the sink's open only.
            warm = asyncio.create_task(asyncio.to_thread(self._prewarm_sink), name="sink-prewarm")
            term = await asyncio.to_thread(self.election.campaign, self._stop_waiting)
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

    def _guard(self) -> None:
        """Right before anything reaches the sink: are we certainly still the active instance?"""
        self.election.check()

    def _lease_lost(self, reason: str) -> None:
        # Keeper thread: the loop may be busy or stalled; stop the process from here.
        self._exit_fenced(reason)

    def _exit_fenced(self, reason: str) -> None:
        """Exit now: no flush, no checkpoint, no sink close — buffered output would be a stale
        write. What was applied but not checkpointed is applied again by the new active one."""
        log.critical("drainer %s at %s (epoch %d) is no longer certainly the active instance and "
                     "stops at once, writing nothing more: %s", self.name, self.addr, self.epoch,
                     reason)
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        os._exit(EXIT_FENCED)

    def _new_merger(self) -> None:
        positions = decode_positions(self.cp.positions)
        self._applied_positions = dict(positions)
        self._position_log.clear()
        if self._columnar:
            from sluice.drainer.columnar import ColumnarMerge
            self.merger = ColumnarMerge(self.durable_ts, positions, self.config.dedupe_window)  # type: ignore[assignment]
            log.info("drainer %s merges plain pump responses in columns (sink %s)", self.name,
                     self.config.sink)
        else:
            self.merger = Merger(self.durable_ts, positions, self.config.dedupe_window)

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
            if not await self._take_epoch():
                self._close_etcd()
                return 0
        except BaseException:
            self._close_etcd()
            raise
        try:
            return await self._run_active()
        except errors.StaleEpoch as e:
            # Before any cleanup below can flush a buffered write to the sink.
            self._exit_fenced(str(e))
            raise
        finally:
            await self._shutdown()

    async def _run_active(self) -> int:
        loop = asyncio.get_running_loop()
        await self._check_not_offline()
        cp = await self._initial_checkpoint()
        self.cp, self.durable_ts = cp, cp.commit_ts
        if cp.schema is not None:
            self.schema = SchemaHistory.from_bytes(cp.schema)
        self.sink = load_sink(self.config.sink, self.config.to, schema=self.schema,
                              source_name=self.config.source_name, drainer_name=self.name,
                              cluster_id=self.config.cluster_id, epoch=self.epoch,
                              fence=self._guard, metrics=self.metrics.m)
        self._raw = bool(getattr(self.sink, "accepts_raw", False))
        # A sink taking merged columns gets them from a ColumnarMerge (drainer/columnar.py).
        self._columnar = (self.config.columnar_merge and self._raw
                          and hasattr(self.sink, "apply_columns"))
        if self._columnar:
            from sluice.drainer.columnar import warm_up
            warm_up()   # once per process, not per merger (checkpoint set renews the merger)
        set_replay = getattr(self.sink, "set_replay", None)
        if set_replay is not None:
            set_replay(self._open_replay)
        self._follows_merge = bool(getattr(self.sink, "checkpoint_follows_merge", True))
        self._background = bool(getattr(self.sink, "commits_in_background", False))
        if self._background:
            self.sink.set_commit_listener(  # type: ignore[attr-defined]
                lambda: loop.call_soon_threadsafe(self._on_sink_commit))
        self._want_schema = cp.schema is None and not self._raw
        self._guard()
        await self.sink.open(cp)
        sc = self.sink.checkpoint()
        self.cp = dataclasses.replace(cp, sink_state=sc.sink_state)
        await asyncio.to_thread(self.store.save, self.cp)
        self._new_merger()

        server = grpcutil.aio_server(self.config.security)
        pbg.add_CisternServicer_to_server(CisternService(self), server)
        add_drainer_service(DrainerService(self), server)
        grpcutil.add_port(server, self.config.addr, self.config.security)
        await server.start()
        self._server = server
        tasks: list[asyncio.Task[Any]] = []
        code = 0
        try:
            target = await self._register()
            if target == NodeState.OFFLINE:
                log.info("drainer %s was closing when it stopped: now offline", self.name)
                return 0
            await failpoint.ainject("drainer-between-register-and-list")
            self.discovery = Discovery(self.registry, loop, self._on_pump_change)
            nodes = await asyncio.to_thread(self.discovery.start)
            if target == NodeState.PAUSED:
                self.state = NodeState.PAUSED.value
                self.merger = None
                log.info("drainer %s was pausing when it stopped: now paused", self.name)
            else:
                self.state = NodeState.ONLINE.value
                for n in nodes:
                    self.pump_status[n.node_id] = n.status
                    if wants_merge(n.status, self.durable_ts):
                        self._add_pump(n.node_id, n.status.addr, self.durable_ts)
            log.info("drainer %s online: merging %d pump(s) after ts %d", self.name,
                     len(self.readers), self.durable_ts)
            tasks = [asyncio.create_task(c, name=n) for n, c in (
                ("merge", self._merge_loop()),
                ("status", self._status_loop()),
                ("metrics", self.metrics.loop()),
            )]
            stopper = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if stopper in done:
                # The merge loop owns the sink: it flushes and saves the final checkpoint itself
                # (cancelling it mid-apply could leave a batch written but not accounted for).
                self._request = "stop"
                self._data.set()
                self._room.set()
                done = {tasks[0]}
                await asyncio.wait(done)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    exc = t.exception()
                    if isinstance(exc, _Stopped):
                        return 0
                    raise exc  # type: ignore[misc]
            return code
        finally:
            log.info("drainer %s stopping", self.name)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _shutdown(self) -> None:
        server = self._server
        await self._stop_readers()
        for t in list(self._side_tasks):
            t.cancel()
        if self.discovery is not None:
            await asyncio.to_thread(self.discovery.stop)
        if server is not None:
            await server.stop(grace=0.5)
        if self.sink is not None:
            # Closing flushes buffered output: only while we are still the active instance.
            try:
                self._guard()
            except errors.StaleEpoch as e:
                self._exit_fenced(str(e))
            try:
                await self.sink.close()
            except errors.StaleEpoch as e:
                self._exit_fenced(str(e))
            except Exception as e:  # noqa: BLE001 - closing after a failure: report, go on
                log.warning("sink close failed: %s", e)
        if self._heartbeat is not None:
            await asyncio.to_thread(self._heartbeat.stop)
        # Nothing of ours can land any more: let a standby take over without waiting.
        await asyncio.to_thread(self.election.release)
        self._close_etcd()

    def _close_etcd(self) -> None:
        self.etcd.close()
        if self._keepalive_etcd is not None:
            self._keepalive_etcd.close()

    # -- pumps in the merge -------------------------------------------------------------------

    def _add_pump(self, pump_id: str, addr: str, after: int) -> None:
        if self.merger is None or not self.merger.add_source(pump_id, after):
            return
        reader = PumpReader(
            pump_id, addr, after, self, cluster_id=self.config.cluster_id,
            consumer_id=self.name, security=self.config.security,
            with_schema=self._want_schema, skip_corrupt=self.config.skip_corrupt,
            max_backoff=self.config.reconnect_max_backoff,
            on_event=self.metrics.on_reader_event, columnar=self._columnar)
        task = asyncio.create_task(run_guarded(reader, self._reader_failed), name=f"reader-{pump_id}")
        self.readers[pump_id] = (reader, task)
        log.info("pump %s (%s) joined the merge after ts %d", pump_id, addr, after)

    async def _remove_pump(self, pump_id: str, why: str) -> None:
        entry = self.readers.pop(pump_id, None)
        if self.merger is not None:
            self.merger.remove_source(pump_id)
        if entry is not None:
            entry[1].cancel()
            await asyncio.gather(entry[1], return_exceptions=True)
            log.info("pump %s left the merge: %s", pump_id, why)
        self._data.set()

    async def _stop_readers(self) -> None:
        entries = list(self.readers.values())
        self.readers.clear()
        for _, task in entries:
            task.cancel()
        await asyncio.gather(*(t for _, t in entries), return_exceptions=True)

    def _reader_failed(self, pump_id: str, e: BaseException) -> None:
        log.error("pump %s reader stopped: %s", pump_id, e)
        if self._fatal is None:
            self._fatal = e
        self._data.set()

    def _on_pump_change(self, pump_id: str, info: NodeInfo | None) -> None:
        if info is not None:
            self.pump_status[pump_id] = info.status
            reader = self.readers.get(pump_id)
            if reader is not None and info.status.addr and reader[0].addr != info.status.addr:
                log.info("pump %s moved to %s", pump_id, info.status.addr)
                reader[0].addr = info.status.addr
        self._spawn(self._reconcile(pump_id, deleted=info is None))

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._side_tasks.add(t)
        t.add_done_callback(self._side_tasks.discard)

    async def _reconcile(self, pump_id: str, deleted: bool = False) -> None:
        """Add or remove one pump per discovery's rules (removals on a fresh read)."""
        if self.merger is None or self.state != NodeState.ONLINE.value:
            return
        status = self.pump_status.get(pump_id)
        in_merge = pump_id in self.readers
        if status is not None and not deleted and wants_merge(status, self.durable_ts):
            if not in_merge:
                self._add_pump(pump_id, status.addr, self.merger.merge_watermark)
            return
        if not in_merge:
            return
        try:
            fresh = await asyncio.to_thread(self.discovery.fresh, pump_id)  # type: ignore[union-attr]
        except errors.SluiceError as e:
            log.warning("cannot re-read pump %s before removing it: %s", pump_id, e)
            return
        if fresh is not None:
            self.pump_status[pump_id] = fresh.status
            if wants_merge(fresh.status, self.durable_ts):
                return
            st = fresh.status
            why = ("marked lost" if is_lost(st) else
                   f"{st.state.value} with final ts {st.max_commit_ts} <= durable checkpoint "
                   f"{self.durable_ts}")
        else:
            why = "its registry entry was deleted"
        if pump_id in self.readers:
            await self._remove_pump(pump_id, why)

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
        self.pump_status[pump_id] = st
        if self.merger is None:
            # Paused or not started: the list that follows going online will find the pump.
            log.info("pump %s notified while this drainer is %s", pump_id, self.state)
            return
        reader = self.readers.get(pump_id)
        if reader is not None:
            reader[0].addr = addr
            return
        self._add_pump(pump_id, addr, self.merger.merge_watermark)

    def _open_replay(self, after: int) -> PrivateMerge:
        """A private merge of every pump that may hold transactions after `after` (the grpc
        sink's replay below its buffer)."""
        pumps = {pid: st.addr for pid, st in self.pump_status.items() if wants_merge(st, after)}
        if not pumps:
            raise errors.OutOfRange(f"after_commit_ts {after}: no pump in the registry holds "
                                    "transactions after it any more")
        return PrivateMerge(pumps, after, cluster_id=self.config.cluster_id,
                            consumer_id=f"{self.name}/replay", security=self.config.security,
                            max_pending=self.config.reader_queue, batch=self.config.txn_batch,
                            dedupe_window=self.config.dedupe_window)

    # -- ReaderTarget -------------------------------------------------------------------------

    def deliver(self, pump_id: str, items: Any, watermark: int, binlogs: int = 0) -> None:
        m = self.merger
        if m is None:
            return
        if self._raw:
            # A raw sink never unframes a transaction: count binlogs as the readers merge them.
            self.binlogs_in += binlogs
        try:
            if items.__class__ is not list:
                m.push_segment(pump_id, items)  # type: ignore[union-attr]
            elif items:
                m.push_many(pump_id, items)
            m.advance(pump_id, watermark)
        except UnknownSource:
            return
        self._data.set()

    async def wait_room(self, pump_id: str) -> None:
        limit = self.config.reader_queue
        while True:
            m = self.merger
            if m is None:
                return
            try:
                if m.pending(pump_id) < limit:
                    return
            except UnknownSource:
                return
            self._room.clear()
            await self._room.wait()

    def record_schema(self, txn: Txn) -> None:
        self.schema.apply(txn)

    # -- services -----------------------------------------------------------------------------

    def grpc_sink(self) -> Any:
        return self.sink if self.sink is not None and hasattr(self.sink, "serve") else None

    def wake(self) -> None:
        self._data.set()

    # -- the merge loop -----------------------------------------------------------------------

    def _sink_has_room(self) -> bool:
        has_room = getattr(self.sink, "has_room", None)
        return has_room() if has_room is not None else True

    def _on_sink_commit(self) -> None:
        self._sink_committed = True
        self._data.set()

    async def _merge_loop(self) -> None:
        interval = self.config.checkpoint_interval
        next_save = time.monotonic() + interval
        batch = self.config.txn_batch
        advance = getattr(self.sink, "advance", None)
        while True:
            if self._fatal is not None:
                raise self._fatal
            if self._request is not None:
                await self._handle_request()
                next_save = time.monotonic() + interval
                continue
            m = self.merger
            applied = False
            room = True
            if m is not None:
                room = self._sink_has_room()
                if room:
                    items = m.pop_ready(limit=batch)
                    if items:
                        self._room.set()
                        await self._apply(items)
                        applied = True
                    if advance is not None:
                        advance(m.merge_watermark)
            now = time.monotonic()
            if now >= next_save:
                if m is not None:
                    await self._save_checkpoint(final=False)
                next_save = time.monotonic() + interval
                continue
            if self._sink_committed:
                # Record a background commit as soon as it is durable (it started at the last
                # periodic save or when the sink's batch filled).
                self._sink_committed = False
                if m is not None:
                    await self._save_checkpoint(final=False, commit=False)
                continue
            if applied:
                continue
            timeout = next_save - now
            if not room:
                await self.sink.wait_room(timeout)  # type: ignore[union-attr]
                continue
            self._data.clear()
            try:
                await asyncio.wait_for(self._data.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    async def _apply(self, items: Any) -> None:
        sink = self.sink
        assert sink is not None
        bad: CorruptTxn | None = None
        if items.__class__ is not list:
            # A ColumnBatch (raw sink, columnar merge): no producer positions by construction.
            await self._raise_dispatched(items.last_ct)
            self._guard()
            sink.apply_columns(items)  # type: ignore[attr-defined]
            await self._applied(len(items), self.binlogs_in - self.binlogs_out)
            return
        if self._raw:
            # (commit_ts, start_ts, framed binlogs): RawTxn's fields, built as plain tuples.
            batch = list(map(_raw_fields, items))
            await self._raise_dispatched(items[-1][0])
            self._guard()
            sink.apply_raw(batch)  # type: ignore[attr-defined]
            applied = items
            nbin = self.binlogs_in - self.binlogs_out
        else:
            txns: list[Txn] = []
            applied = []
            nbin = 0
            schema = self.schema
            filt = self.filter if self.filter.active else None
            nfiltered = 0
            for it in items:
                try:
                    payload = unframe(it[5], it[2], it[0])
                    txn = Txn.from_binlogs(payload[:-1], payload[-1], it[2])
                except CorruptTxn as e:
                    if self.config.skip_corrupt:
                        self.metrics.on_reader_event(it[2], "skipped")
                        log.error("skip-corrupt is set: dropping %s", e)
                        continue
                    bad = e
                    break
                pv = txn.prewrite
                if pv.schema_snapshots or pv.HasField("ddl"):
                    schema.apply(txn)
                applied.append(it)
                nbin += len(payload)
                if filt is not None:
                    # After the schema effects: a table filtered today still decodes tomorrow.
                    kept = filt.filter(txn)
                    if kept is None:
                        nfiltered += 1   # still applied: the checkpoint moves past it
                        continue
                    txn = kept
                txns.append(txn)
            if nfiltered:
                self.metrics.filtered.inc(nfiltered)
            if txns:
                await self._raise_dispatched(txns[-1].commit_ts)
                self._guard()
                await sink.apply(txns)
        if any(map(_position, applied)):
            for it in applied:
                pos = it[4]
                if pos is not None and not is_empty(pos):
                    self._position_log.append((it[0], it[3], pos))
        await self._applied(len(applied), nbin)
        if bad is not None:
            # Everything before the bad transaction is applied: make it durable and say where
            # the drainer stopped, so nothing is half-written and the restart point is exact.
            await self._save_checkpoint(follow_merge=False)
            raise errors.SluiceError(f"drainer {self.name} stopped: {bad} (everything before it "
                                     f"is applied, checkpoint {self.durable_ts}; set "
                                     "skip-corrupt = true to drop such transactions)")

    async def _applied(self, txns: int, binlogs: int) -> None:
        self.txns_out += txns
        self.binlogs_out += binlogs
        self.metrics.txns.inc(txns)
        self.metrics.binlogs.inc(binlogs)
        await failpoint.ainject("drainer-after-apply")

    async def _raise_dispatched(self, commit_ts: int) -> None:
        """Persist dispatched_upper >= commit_ts before the sink sees it (DESIGN §6 safe mode)."""
        if commit_ts <= self.cp.dispatched_upper:
            return
        upper = tsmod.compose(tsmod.physical_ms(commit_ts) + DISPATCH_AHEAD_MS)
        cp = dataclasses.replace(self.cp, dispatched_upper=upper)
        await asyncio.to_thread(self.store.save, cp)
        self.cp = cp

    def _positions_at(self, ts: int) -> dict[str, pb.Position]:
        plog, base = self._position_log, self._applied_positions
        while plog and plog[0][0] <= ts:
            _, producer, pos = plog.popleft()
            base[producer] = pos
        return base

    async def _save_checkpoint(self, follow_merge: bool = True, final: bool = True,
                               commit: bool = True) -> None:
        """Flush the sink and save its durable position (final: at stop, pause, close, a bad
        transaction). A periodic save of a sink that commits in the background does not wait:
        it starts a commit of what is buffered (commit=True) and saves what is durable now; the
        merge follows only when the sink holds nothing uncommitted."""
        sink = self.sink
        assert sink is not None
        # Read before the flush: everything emitted up to it has been applied, and the flush
        # makes it durable. Later emissions are not covered by this flush.
        w = self.merger.merge_watermark if self.merger is not None else self.durable_ts
        self._guard()
        background = self._background and not final
        if not background:
            await sink.flush()
        elif commit:
            await sink.commit_soon()  # type: ignore[attr-defined]
        if self.txns_out != self._txns_at_save:
            # Between the sink write and the checkpoint, when there is something to lose.
            await failpoint.ainject("drainer-before-checkpoint-save")
        self._txns_at_save = self.txns_out
        sc = sink.checkpoint()
        commit_ts = sc.commit_ts
        if follow_merge and self._follows_merge and (not background or sink.idle):  # type: ignore[attr-defined]
            commit_ts = max(commit_ts, w)
        if commit_ts < self.durable_ts:
            if not background:   # (a background sink's last batch may predate a merge-following save)
                log.warning("sink reported checkpoint %d below the saved %d; keeping the saved "
                            "one", commit_ts, self.durable_ts)
            commit_ts = self.durable_ts
        positions = self._positions_at(commit_ts)
        self.schema.prune(commit_ts)
        cp = Checkpoint(commit_ts=commit_ts, positions=encode_positions(positions),
                        sink_state=sc.sink_state, schema=None if self._raw else self.schema.to_bytes(),
                        dispatched_upper=max(self.cp.dispatched_upper, commit_ts))
        if cp != self.cp:
            await asyncio.to_thread(self.store.save, cp)
            self.metrics.on_checkpoint(commit_ts)
        self.cp, self.durable_ts = cp, commit_ts
        for pump_id, st in list(self.pump_status.items()):
            if pump_id in self.readers and not wants_merge(st, commit_ts):
                await self._reconcile(pump_id)

    # -- own state (pausing / closing / resume) ------------------------------------------------

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.status_poll_interval)
            try:
                info = await asyncio.to_thread(self.registry.get, NodeKind.DRAINER, self.name)
            except errors.EtcdUnavailable as e:
                log.warning("registry unavailable: %s", e)
                continue
            if info is None:
                continue
            if self.config.ha:
                await self._show_standbys(info)
            try:
                await self._show_held_by(info)
            except errors.SluiceError as e:
                log.warning("cannot update the held-by label: %s", e)
            want = info.state
            if want == NodeState.PAUSING and self.state == NodeState.ONLINE.value:
                self._ask("pause")
            elif want == NodeState.CLOSING and self.state != NodeState.OFFLINE.value:
                self._ask("close")
            elif want == NodeState.ONLINE and self.state == NodeState.PAUSED.value:
                self._ask("resume")

    def held_by(self) -> tuple[str, dict[str, Any]] | None:
        """(pump, alert) for the oldest stuck prewrite a pump in the merge published
        (pump/loops.py): the start_ts that stops this drainer, and who can end it. A pump with
        a stuck prewrite serves nothing above it, so the merge cannot pass it either."""
        merger = self.merger
        if merger is None:
            return None
        best: tuple[str, dict[str, Any]] | None = None
        for pump_id in merger.sources():
            st = self.pump_status.get(pump_id)
            for a in st.alerts if st is not None else ():
                if best is None or int(a.get("start_ts") or 0) < int(best[1].get("start_ts") or 0):
                    best = (pump_id, a)
        return best

    async def _show_held_by(self, info: NodeInfo) -> None:
        """Mirror `held_by` into the status label `held-by` (for `ctl drainers` and lag
        reports): "<pump> start_ts=<S> producer=<P>", absent while nothing is stuck."""
        held = self.held_by()
        text = (f"{held[0]} start_ts={held[1].get('start_ts')} producer={held[1].get('producer')!r}"
                if held is not None else "")
        if info.status.labels.get(HELD_BY_LABEL, "") == text:
            return
        if text:
            log.warning("merge held by pump %s: its prewrite start_ts=%s of producer %r is "
                        "unresolved (%s); decide it: %s", held[0], held[1].get("start_ts"),  # type: ignore[index]
                        held[1].get("producer"), held[1].get("reason"), held[1].get("command"),  # type: ignore[index]
                        extra=kv(pump=held[0], start_ts=held[1].get("start_ts")))  # type: ignore[index]
        await self._set_label(HELD_BY_LABEL, text)

    async def _show_standbys(self, info: NodeInfo) -> None:
        """Mirror the live standby keys into the status label `standby` (for `ctl drainers`)."""
        try:
            standbys = ",".join(await asyncio.to_thread(list_standbys, self.registry, self.name))
        except errors.EtcdUnavailable:
            return
        if info.status.labels.get("standby", "") == standbys:
            return
        await self._set_label("standby", standbys)

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
        self._guard()
        try:
            await asyncio.to_thread(self.registry.update, NodeKind.DRAINER, self.name, label)
        except errors.EtcdUnavailable as e:
            log.warning("registry unavailable: %s", e)

    def _ask(self, what: str) -> None:
        if self._request is None:
            self._request = what
            self._data.set()
            self._room.set()

    async def _handle_request(self) -> None:
        what, self._request = self._request, None
        if what == "stop":
            if self.merger is not None:
                await self._stop_readers()
                await self._save_checkpoint()
            summary = getattr(self.merger, "summary", None)
            if summary is not None:
                log.info("drainer %s: %s", self.name, summary())
            log.info("drainer %s stopped at checkpoint %d", self.name, self.durable_ts)
            raise _Stopped()
        if what in ("pause", "close"):
            if self.merger is not None:
                await self._stop_readers()
                await self._save_checkpoint()
                self.merger = None
            done = NodeState.PAUSED if what == "pause" else NodeState.OFFLINE
            ckpt = self.durable_ts

            epoch = self.epoch

            def finish(old: NodeStatus) -> NodeStatus:
                if old.epoch > epoch:
                    raise self.election.fenced_error(f"setting the state {done.value}")
                return dataclasses.replace(old, state=done, checkpoint=ckpt)
            self._guard()
            try:
                await asyncio.to_thread(self.registry.update, NodeKind.DRAINER, self.name, finish)
            except errors.IllegalTransition as e:
                # Changed again meanwhile (e.g. set online): the status loop sees the new state.
                log.warning("drainer %s: %s; state left as it is", self.name, e)
            self.state = done.value
            log.info("drainer %s %s at checkpoint %d", self.name, done.value, ckpt)
            if done == NodeState.OFFLINE:
                raise _Stopped()
            self._room.set()
        elif what == "resume" and self.state == NodeState.PAUSED.value:
            self._new_merger()
            self.state = NodeState.ONLINE.value
            nodes, _ = await asyncio.to_thread(self.registry.list, NodeKind.PUMP)
            for n in nodes:
                self.pump_status[n.node_id] = n.status
                if wants_merge(n.status, self.durable_ts):
                    self._add_pump(n.node_id, n.status.addr, self.durable_ts)
            log.info("drainer %s resumed after ts %d with %d pump(s)", self.name,
                     self.durable_ts, len(self.readers))
