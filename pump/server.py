"""`sluice pump`: a pump process — storage, gRPC service, registry lifecycle, background loops.

Start-up order (DESIGN §4): open storage (recovery) → serve reads → register status online and
the alive heartbeat → notify every online drainer (waiting, with a reason in the log, for one that
is online but not alive) → accept writes. A pump leaves drainers' merges only by state, so a
crash or SIGTERM leaves the state online: the merge waits for us and nothing is lost.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from sluice.core.cli import flag_overrides
from sluice.core import config as cfg
from sluice.core import errors, grpcutil
from sluice.core import log as logsetup
from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, Registry
from sluice.core.tso_client import TSOClient
from sluice.core.registry import CONFIG_PATH
from sluice.core.loopwatch import watched
from sluice.pump.storage.storage import Storage

from .admission import ProducerAdmission
from .tso_view import TsoView
from .config import PumpConfig
from .lifecycle import Lifecycle
from .loops import fake_binlog_loop, gc_loop, resolve_loop
from .metrics import PumpMetrics
from .service import LiveFeed, PumpService, add_to_server

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sluice.core.cli import add_process_arguments
    add_process_arguments(p)
    p.add_argument("--addr", help="listen address host:port (overrides addr)")
    p.add_argument("--data-dir", help="data directory (overrides data-dir)")
    p.add_argument("--node-id", help="node id (overrides node-id)")
    p.add_argument("--etcd", help="etcd endpoints (overrides etcd)")


def load_config(args: argparse.Namespace) -> PumpConfig:
    overrides = flag_overrides(args, (("addr", "addr"), ("data_dir", "data-dir"),
                                      ("node_id", "node-id"), ("etcd", "etcd")))
    config = cfg.load(PumpConfig, args.config, overrides)
    config.validate(str(args.config or "<defaults>"))
    return config


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    logsetup.setup(args.log_level, args.log_file)
    check_prerequisites(config)
    asyncio.run(watched(f"pump {config.node_id or config.addr}", PumpServer(config).run_forever()))
    return 0


def check_prerequisites(config: PumpConfig) -> None:
    data = Path(config.data_dir)
    try:
        data.mkdir(parents=True, exist_ok=True)
        probe = data / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise errors.ConfigError(f"data-dir {data}: not writable ({e.strerror}); "
                                 "fix its permissions or choose another data-dir") from None
    etcd = Etcd(config.etcd, config.security, timeout=3)
    try:
        etcd.revision()
        registry = Registry(etcd, config.cluster_id)
        check_replicas(registry, config.replicas)
        check_not_lost(registry, config.resolved_node_id())
    except errors.EtcdUnavailable as e:
        raise errors.ConfigError(f"etcd {config.etcd}: unreachable ({e}); start etcd or fix "
                                 "the `etcd` key") from None
    finally:
        etcd.close()




def check_replicas(registry: Registry, replicas: int) -> None:
    """The cluster-wide replica count is set once: the first pump creates it (compare-and-swap
    create), every later pump must agree — a pump that disagreed would hold a different share
    of the cluster's copies than the clients write."""
    key = registry.cluster_key(CONFIG_PATH)
    for _ in range(100):
        stored, rev = registry.get_json_rev(CONFIG_PATH)
        if isinstance(stored, dict) and "replicas" in stored:
            if stored["replicas"] != replicas:
                raise errors.ConfigError(
                    f"replicas = {replicas} but the cluster's etcd key {key} says replicas = "
                    f"{stored['replicas']}: set replicas = {stored['replicas']} in the pump "
                    "config (the value is cluster-wide)")
            return
        new = {**(stored if isinstance(stored, dict) else {}), "replicas": replicas}
        if registry.cas_json(CONFIG_PATH, rev, new):
            log.info("cluster config %s created: replicas = %d", key, replicas)
            return
    raise errors.EtcdUnavailable(f"{key} kept changing while the pump read it")


def check_not_lost(registry: Registry, node_id: str) -> None:
    """A pump marked lost (`sluice ctl mark-lost`) had its data given up: drainers stopped
    waiting for it, so serving that data now could only reorder or duplicate it."""
    info = registry.get(NodeKind.PUMP, node_id)
    if info is not None and info.status.labels.get("lost") == "true":
        raise errors.ConfigError(
            f"pump {node_id} was marked lost (`sluice ctl mark-lost`): its data was given up "
            "and drainers no longer read it; start it with a new node-id and an empty data-dir")


class PumpServer:
    def __init__(self, config: PumpConfig) -> None:
        self.config = config
        self.node_id = config.resolved_node_id()
        self.addr = config.resolved_advertise()
        self.storage = Storage.open(config.data_dir, config.storage)
        self.etcd = Etcd(config.etcd, config.security)
        self.registry = Registry(self.etcd, config.cluster_id)
        self.tso = TSOClient(config.tso or None, config.cluster_id, etcd=self.etcd,
                             security=config.security)
        self.admission = ProducerAdmission(self.registry)
        self.metrics = PumpMetrics(self.storage)
        self.lifecycle = Lifecycle(self.registry, self.storage, config, self.node_id, self.addr)
        self.feed = LiveFeed(self.metrics)
        self._stop = asyncio.Event()

    @property
    def state(self) -> str:
        """The node state (`starting`, then the registry states): see lifecycle.py."""
        return self.lifecycle.state

    # -- lifecycle -------------------------------------------------------------------------
    async def run_forever(self) -> None:
        self.storage.add_loop_listener(asyncio.get_running_loop(), self.feed.on_group)
        server = grpcutil.aio_server(self.config.security)
        add_to_server(PumpService(self.storage, self.lifecycle, self.admission, self.metrics,
                                  self.feed, self.config.cluster_id), server)
        grpcutil.add_port(server, self.config.addr, self.config.security)
        await server.start()
        self.metrics.serve(self.config.metrics_addr)
        log.info("pump %s listening on %s (data %s, served watermark %d)", self.node_id,
                 self.config.addr, self.config.data_dir, self.storage.served_watermark)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        try:
            # Before the first write is taken: prewrites are admitted by this view.
            await asyncio.to_thread(self.admission.start)
            self.storage.admission = self.admission
            self.storage.tso = TsoView(self.tso, loop)
            await self.lifecycle.start()
            await self._run_tasks()
        finally:
            log.info("pump %s stopping", self.node_id)
            await server.stop(grace=1.0)
            await self.lifecycle.stop()
            await asyncio.to_thread(self.admission.stop)
            await self.tso.close()
            await asyncio.to_thread(self.storage.close)
            self.etcd.close()

    async def _run_tasks(self) -> None:
        """The background tasks live and die together: until SIGTERM/SIGINT, or until one fails
        (the others are cancelled, then its exception is raised as it is)."""
        cfg, storage, registry = self.config, self.storage, self.registry
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(c, name=n) for n, c in (
                    ("fake-binlogs", fake_binlog_loop(
                        cfg, self.tso, storage, starting=lambda: self.state == "starting",
                        pulled=lambda: self.feed.pullers != 0)),
                    ("resolver", resolve_loop(cfg, self.node_id, registry, storage,
                                              self.metrics)),
                    ("gc", gc_loop(cfg, registry, storage)),
                    ("lifecycle", self.lifecycle.watch()),
                    ("metrics", self.metrics.loop()),
                )]
                await self._stop.wait()
                for t in tasks:
                    t.cancel()
        except BaseExceptionGroup as eg:
            raise _first_leaf(eg) from None


def _first_leaf(eg: BaseExceptionGroup) -> BaseException:
    first = eg.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
