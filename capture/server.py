"""`sluice capture --config capture.toml`: MariaDB binlog -> pumps, exactly once.

Invariant: the capture streams only after the source passed every start-up check (exit 2 with
one line otherwise) and after recovery fenced older epochs and found where the pumps' committed
prefix ends; it then reads strictly after that position.

Threads: the binlog reader blocks (pymysql), so it runs in one thread and hands whole source
transactions to the event loop through a bounded queue; grouping and pump writes run on the loop.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time

from sluice.capture import checks
from sluice.capture.config import CaptureConfig
from sluice.capture.metrics import CaptureMetrics
from sluice.capture.reader import BinlogReader, SourceTxn, gtid_state_text
from sluice.capture.schema import SchemaTracker, TableFilter
from sluice.capture.writer import GroupWriter
from sluice.client.pumps import PumpsClient
from sluice.client.producer import ProducerServer
from sluice.core import config as cfg
from sluice.core import errors
from sluice.core import log as logsetup
from sluice.core.etcd import Etcd
from sluice.core.registry import Registry
from sluice.core.tso_client import TSOClient

log = logging.getLogger(__name__)

_QUEUE = 1024
_END = object()


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sluice.ctl.main import add_process_arguments
    add_process_arguments(p)
    p.add_argument("--check", action="store_true",
                   help="run the source start-up checks and exit (0: ok, 2: a check failed)")


def load_config(args: argparse.Namespace) -> CaptureConfig:
    config = cfg.load(CaptureConfig, args.config, list(args.overrides))
    config.validate(str(args.config or "<defaults>"))
    return config


def source_checks(config: CaptureConfig, saved_gtid: str | None) -> checks.SourceFacts:
    return checks.check_source(config.source.connection(), address=config.source.address(),
                               replica_server_id=config.source.server_id, saved_gtid=saved_gtid)


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    logsetup.setup(args.log_level, args.log_file)
    sp = config.start_position
    # Checked before touching the cluster, so a misconfigured source fails fast with exit 2.
    source_checks(config, sp[5:] if sp.startswith("gtid:") else None)
    if args.check:
        return 0
    etcd = Etcd(config.etcd, config.security, timeout=3)
    try:
        etcd.revision()
    except errors.EtcdUnavailable as e:
        raise errors.ConfigError(f"etcd {config.etcd}: unreachable ({e}); start etcd or fix the "
                                 "`etcd` key") from None
    finally:
        etcd.close()
    return asyncio.run(Capture(config).run())


class Capture:
    def __init__(self, config: CaptureConfig) -> None:
        self.config = config
        self.metrics = CaptureMetrics()
        self.etcd = Etcd(config.etcd, config.security)
        self.registry = Registry(self.etcd, config.cluster_id)
        self.tso = TSOClient(config.tso or None, config.cluster_id, etcd=self.etcd,
                             security=config.security)
        self.pumps = PumpsClient(config.etcd, config.cluster_id, security=config.security)
        self.writer = GroupWriter(self.pumps, self.tso, self.registry, config.producer_id,
                                  config.cluster_id, config.source.resolved_name(), config.security)
        host, _, port = config.addr.rpartition(":")
        self.producer = ProducerServer(config.etcd, config.cluster_id, config.producer_id,
                                       self.writer.decide, host=host or "127.0.0.1",
                                       port=int(port or 0), security=config.security)
        self._reader: BinlogReader | None = None
        self._stop = threading.Event()

    async def run(self) -> int:
        c = self.config
        self.metrics.set_state("starting")
        self.metrics.metrics.serve(c.metrics_addr)
        try:
            await self.producer.start()
            await self.pumps.start()
            epoch = await self.producer.bump_epoch()
            pos = await self.writer.recover(epoch)
            saved = gtid_state_text(pos.gtids) if pos.gtids else None
            facts = await asyncio.to_thread(source_checks, c, saved)
            if saved is not None:
                start = saved
            elif c.start_position == "earliest":
                start = ""
            elif c.start_position == "latest":
                start = facts.gtid_binlog_pos
            else:
                start = c.start_position[5:]
            await self._stream(start)
            return 0
        except errors.ConfigError:
            self.metrics.set_state("failed")
            raise
        except Exception as e:
            self.metrics.set_state("failed", error=str(e)[:300])
            raise
        finally:
            self._stop.set()
            if self._reader is not None:
                self._reader.close()
            await self.pumps.close()
            await self.tso.close()
            await self.producer.stop()
            self.etcd.close()

    def _tracker(self) -> SchemaTracker:
        c = self.config
        f = c.filter
        return SchemaTracker(c.source.resolved_name(), TableFilter(
            f.include_databases, f.exclude_databases, f.include_tables, f.exclude_tables,
            ignored=[c.signal_table, c.mark_table]))

    async def _stream(self, start: str) -> None:
        c = self.config
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue(_QUEUE)
        self._reader = BinlogReader(c.source.connection(), replica_server_id=c.source.server_id,
                                    tracker=self._tracker(), gtid_state=start,
                                    heartbeat_s=c.heartbeat_s)
        self.metrics.set_state("connected", source=c.source.address(), after=start or "earliest")
        reader = self._reader

        def pump_thread() -> None:
            try:
                for txn in reader.transactions():
                    if self._stop.is_set():
                        return
                    asyncio.run_coroutine_threadsafe(queue.put(txn), loop).result()
                asyncio.run_coroutine_threadsafe(queue.put(_END), loop).result()
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
                if not self._stop.is_set():
                    asyncio.run_coroutine_threadsafe(queue.put(e), loop).result()

        threading.Thread(target=pump_thread, name="binlog-reader", daemon=True).start()
        self.metrics.set_state("streaming")
        wait_s = c.group_max_wait_ms / 1000
        while True:
            item = await queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            group: list[SourceTxn] = [item]  # type: ignore[list-item]
            size = group[0].size
            deadline = loop.time() + wait_s
            while len(group) < c.group_max_txns and size < c.group_max_bytes:
                try:
                    nxt = queue.get_nowait() if queue.qsize() else await asyncio.wait_for(
                        queue.get(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    break
                if nxt is _END or isinstance(nxt, BaseException):
                    queue.put_nowait(nxt)
                    break
                group.append(nxt)  # type: ignore[arg-type]
                size += nxt.size  # type: ignore[union-attr]
            t0 = time.monotonic()
            await self.writer.write_group(group)
            m = self.metrics
            m.group_seconds.observe(time.monotonic() - t0)
            m.groups.inc()
            m.txns.inc(len(group))
            m.rows.inc(sum(len(mu.changes) for t in group for mu in t.mutations))
            m.lag.set(max(0.0, time.time() - group[-1].ts_ms / 1000) if queue.qsize() else 0.0)
