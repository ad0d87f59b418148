"""AppProducer: an application's producer — pumps, TSO, its TxnStatus endpoint, outbox, table shapes.

Transactions (client/transaction.py) and the binlog-only transactions written here (DDL, schema
snapshots, whose point of no return is an autocommit outbox row) commit through the one protocol
in client/commit.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pymysql

from sluice.core import errors
from sluice.core.etcd import Etcd
from sluice.core.registry import Registry
from sluice.core.table import TableShape, read_table_info
from sluice.core.tso_client import TSOClient
from sluice.proto import sluice_pb2 as pb

from . import ddl as ddlmod
from . import outbox
from .commit import Ambiguous, ClientConfig, CommitCore, TxnAborted
from .pool import Connect, TxnPool, close_quietly
from .producer import OUTBOX_LABEL, ProducerServer
from .transaction import Transaction

if TYPE_CHECKING:
    from .pumps import PumpsClient

__all__ = ["AppProducer", "ClientConfig"]

log = logging.getLogger(__name__)


class AppProducer:
    """An application's producer: pumps, TSO, its TxnStatus endpoint, outbox and table shapes.

    One process, one producer id (its epoch fences older processes with the same id). Options
    come as a `ClientConfig` or, equivalently, as its fields by keyword.
    """

    def __init__(self, etcd_endpoints: str, cluster_id: int, producer_id: str, outbox_dsn: str,
                 config: ClientConfig | None = None, *, pumps: PumpsClient | None = None,
                 **options: Any) -> None:
        if config is not None and options:
            raise errors.ConfigError(f"give AppProducer a ClientConfig or keyword options, not "
                                     f"both (got {sorted(options)})")
        known = {f.name for f in dataclasses.fields(ClientConfig)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise errors.ConfigError(f"AppProducer: unknown option(s) {unknown}; the options are "
                                     f"ClientConfig's fields: {sorted(known)}")
        cfg = config if config is not None else ClientConfig(**options)
        self.config = cfg
        self.etcd_endpoints, self.cluster_id, self.producer_id = etcd_endpoints, cluster_id, producer_id
        self.dsn = outbox.OutboxDSN.parse(outbox_dsn)
        self.source = cfg.source or f"{self.dsn.host}:{self.dsn.port}"
        self._own_pumps = pumps is None
        self.pumps: PumpsClient = pumps  # type: ignore[assignment]
        self.tso: TSOClient = None  # type: ignore[assignment]
        self.commits: CommitCore = None  # type: ignore[assignment]
        self.server: ProducerServer | None = None
        self.etcd: Etcd | None = None
        self.registry: Registry | None = None
        self.epoch = 0
        self.pool = TxnPool(self._new_connection, cfg.pool_size, f"txn-{producer_id}")
        self._shapes: dict[tuple[str, str], TableShape] = {}
        self._declared: dict[tuple[str, str], int] = {}
        self._inflight: set[asyncio.Task] = set()
        self._prune_task: asyncio.Task | None = None
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Outbox table, TSO, pumps, then the TxnStatus endpoint and a new epoch."""
        cfg = self.config
        await asyncio.to_thread(outbox.ensure_table, self.dsn)
        self.pool.start()
        self.etcd = Etcd(self.etcd_endpoints, cfg.security)
        self.registry = Registry(self.etcd, self.cluster_id)
        self.tso = TSOClient(cfg.tso_addrs, self.cluster_id, etcd=self.etcd, security=cfg.security)
        try:
            if self.pumps is None:
                from .pumps import PumpsClient
                self.pumps = PumpsClient(self.etcd_endpoints, self.cluster_id,
                                         security=cfg.security,
                                         max_binlog_size=cfg.max_binlog_size, **cfg.pumps_options)
                await self.pumps.start()
            self.commits = CommitCore(self.pumps, self.tso, self.producer_id, lambda: self.epoch)
            self.server = ProducerServer(
                self.etcd_endpoints, self.cluster_id, self.producer_id, self.decide,
                labels={**cfg.labels, OUTBOX_LABEL: self.dsn.url()}, host=cfg.host,
                port=cfg.port, alive_ttl_s=cfg.alive_ttl_s, security=cfg.security)
            await self.server.start()
            self.epoch = await self.server.bump_epoch()
        except BaseException:
            await self.close()
            raise
        if cfg.prune_interval_s > 0:
            self._prune_task = asyncio.create_task(self._prune_loop(), name="outbox-prune")
        self._started = True
        log.info("app producer %s started (outbox %s, epoch %d)", self.producer_id, self.dsn,
                 self.epoch)

    async def close(self) -> None:
        self._started = False
        if self._prune_task is not None:
            self._prune_task.cancel()
            await asyncio.gather(self._prune_task, return_exceptions=True)
            self._prune_task = None
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=self.config.resolve_timeout_s)
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.pumps is not None and self._own_pumps:
            await self.pumps.close()
            self.pumps = None  # type: ignore[assignment]
        if self.tso is not None:
            await self.tso.close()
            self.tso = None  # type: ignore[assignment]
        await self.pool.close()
        if self.etcd is not None:
            self.etcd.close()
            self.etcd = None

    async def __aenter__(self) -> AppProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _new_connection(self) -> pymysql.connections.Connection:
        # UTC sessions: TIMESTAMP values then read back as UTC, which is what a Datum holds.
        return self.dsn.connect(timeout_s=10.0, read_timeout_s=self.config.statement_timeout_s,
                                autocommit=False, init_command="SET time_zone = '+00:00'")

    # -- public API --------------------------------------------------------------------------
    def transaction(self, connect: Connect | None = None) -> Transaction:
        """A new transaction on a pooled connection to the outbox database, or on a fresh
        connection from `connect` (same server as the outbox; session time_zone '+00:00')."""
        return Transaction(self, connect)

    async def decide(self, start_ts: int) -> tuple[int, int]:
        """TxnStatus for this producer: decided by writing to our outbox."""
        return await asyncio.to_thread(outbox.decide_by_writing, self.dsn, start_ts, 3.0)

    async def ddl(self, table_info: pb.TableInfo | None, *, tp: int = pb.CREATE_TABLE,
                  query: str = "", schema_name: str = "", table_name: str = "",
                  old_schema_name: str = "", old_table_name: str = "") -> int:
        """Write a DDL binlog carrying the table's shape after the change; returns commit_ts.

        `table_info` is None for DROP TABLE / DATABASE (give schema_name/table_name then).
        """
        self.check_started()
        if tp == pb.RENAME_TABLE and table_info is not None and old_table_name:
            # Keep the table's id across the rename so its schema history continues.
            renamed = pb.TableInfo()
            renamed.CopyFrom(table_info)
            renamed.table_id = ddlmod.stable_table_id(
                self.source, old_schema_name or table_info.schema_name, old_table_name)
            table_info = renamed
        d = ddlmod.make_ddl(tp, table_info, query=query, schema_name=schema_name,
                            table_name=table_name, old_schema_name=old_schema_name,
                            old_table_name=old_table_name,
                            table_id=0 if table_info is not None else ddlmod.stable_table_id(
                                self.source, schema_name, table_name) if table_name else 0)
        start_ts = await self.tso.get_ts()
        commit_ts = await self._write_standalone(start_ts, ddlmod.ddl_value(d, self._source_info()))
        name = (d.schema_name, d.table_name)
        if table_info is not None:
            self._shapes[name] = TableShape(table_info)
            self._declared[name] = table_info.version
        else:
            self.forget(name)
        if old_table_name:
            self.forget((old_schema_name or d.schema_name, old_table_name))
        return commit_ts

    async def execute_ddl(self, sql: str, table: str, tp: int = pb.ALTER_TABLE, *,
                          old_table: str = "") -> int:
        """Run a DDL statement on the outbox database, then write its DDL binlog (the shape read
        back from information_schema). `old_table` names the table before a RENAME_TABLE.
        Returns commit_ts."""
        self.check_started()
        schema, name = ddlmod.split_name(table, self.dsn.database)
        old_schema, old_name = (ddlmod.split_name(old_table, self.dsn.database) if old_table
                                else ("", ""))
        start_ts = await self.tso.get_ts()

        def work() -> pb.TableInfo | None:
            conn = self.dsn.connect(init_command="SET time_zone = '+00:00'")
            try:
                with conn.cursor() as cur:
                    cur.execute(sql)
                    if tp in (pb.DROP_TABLE, pb.DROP_DATABASE):
                        return None
                    return read_table_info(cur, schema, name, source=self.source,
                                           version=start_ts)
            finally:
                conn.close()
        info = await asyncio.to_thread(work)
        try:
            return await self.ddl(info, tp=tp, query=sql, schema_name=schema, table_name=name,
                                  old_schema_name=old_schema, old_table_name=old_name)
        except BaseException:
            # The database changed but no DDL binlog says so: the next transaction touching the
            # table reads its shape again and declares it with a schema snapshot.
            self.forget((schema, name))
            raise

    async def declare(self, *tables: str) -> int:
        """Write a schema snapshot of these tables as they are now; returns commit_ts."""
        self.check_started()
        start_ts = await self.tso.get_ts()

        def work() -> list[pb.TableInfo]:
            conn = self.dsn.connect()
            try:
                with conn.cursor() as cur:
                    return [read_table_info(cur, *ddlmod.split_name(t, self.dsn.database),
                                            source=self.source, version=start_ts)
                            for t in tables]
            finally:
                conn.close()
        infos = await asyncio.to_thread(work)
        commit_ts = await self._write_standalone(
            start_ts, ddlmod.snapshot_value(infos, self._source_info()))
        for info in infos:
            name = (info.schema_name, info.table_name)
            self._shapes[name] = TableShape(info)
            self._declared[name] = info.version
        return commit_ts

    def refresh(self, table: str) -> None:
        """Forget a table's cached shape: the next transaction reads and declares it again."""
        self.forget(ddlmod.split_name(table, self.dsn.database))

    # -- internals ---------------------------------------------------------------------------

    # -- what a Transaction uses (TxnHost) ---------------------------------------------------
    def check_started(self) -> None:
        if not self._started:
            raise errors.FailedPrecondition(f"producer {self.producer_id} is not started")

    async def shape(self, table: str, load: Callable[[Callable[[Any], TableShape]],
                                                      Awaitable[TableShape]],
                    version: int) -> TableShape:
        """The cached shape of `table`, else read from information_schema by `load` (which
        runs the given blocking reader on a connection of the caller's choosing)."""
        name = ddlmod.split_name(table, self.dsn.database)
        shape = self._shapes.get(name)
        if shape is not None:
            return shape

        def read(conn: pymysql.connections.Connection) -> TableShape:
            with conn.cursor() as cur:
                return TableShape(read_table_info(cur, *name, source=self.source, version=version))
        shape = await load(read)
        return self._shapes.setdefault(name, shape)

    def forget(self, name: tuple[str, str]) -> None:
        self._shapes.pop(name, None)
        self._declared.pop(name, None)

    def is_declared(self, info: pb.TableInfo) -> bool:
        return self._declared.get((info.schema_name, info.table_name)) == info.version

    def mark_declared(self, infos: list[pb.TableInfo]) -> None:
        for info in infos:
            self._declared[(info.schema_name, info.table_name)] = info.version

    def record_commit(self, cur: Any, start_ts: int, commit_ts: int) -> None:
        outbox.record_commit(cur, self.dsn, start_ts, commit_ts, self.config.max_txn_age_s)

    async def decide_until(self, start_ts: int) -> tuple[int, int]:
        """Decide start_ts by writing to the outbox, retrying for up to resolve_timeout_s while
        the answer is unknown or the database unreachable; TXN_UNKNOWN after that."""
        deadline = time.monotonic() + self.config.resolve_timeout_s
        while True:
            try:
                state, commit_ts = await asyncio.to_thread(outbox.decide_by_writing, self.dsn,
                                                           start_ts, 5.0)
            except errors.Unavailable as e:
                log.warning("outbox unreachable while deciding start_ts=%d: %s", start_ts, e)
                state, commit_ts = pb.TXN_UNKNOWN, 0
            if state != pb.TXN_UNKNOWN or time.monotonic() >= deadline:
                return state, commit_ts
            await asyncio.sleep(0.2)

    def track(self, task: asyncio.Task) -> None:
        """A commit in flight: close() waits for it (up to resolve_timeout_s)."""
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    # -- internals ---------------------------------------------------------------------------
    def _source_info(self) -> pb.SourceInfo:
        return pb.SourceInfo(name=self.source, ts_ms=int(time.time() * 1000))

    async def _write_standalone(self, start_ts: int, value: pb.PrewriteValue) -> int:
        """A binlog-only transaction (DDL, schema snapshot) through the commit protocol."""
        return await self.commits.commit([self.commits.prewrite(start_ts, value)],
                                         _StandaloneSteps(self, start_ts))

    async def _prune_loop(self) -> None:
        assert self.registry is not None
        while True:
            await asyncio.sleep(self.config.prune_interval_s)
            try:
                await asyncio.to_thread(outbox.prune_once, self.dsn, self.registry,
                                        self.config.max_txn_age_s)
            except errors.SluiceError as e:
                log.warning("outbox prune skipped: %s", e)


class _StandaloneSteps:
    """A binlog-only transaction: its outbox row, inserted with autocommit, is its point of no
    return."""

    after_prewrite_failpoint = ""
    rollback_on = (BaseException,)
    pumps_decide = False

    def __init__(self, producer: AppProducer, start_ts: int) -> None:
        self.p, self.start_ts = producer, start_ts

    async def prewrite_failed(self, e: BaseException) -> None:
        pass

    async def point_of_no_return(self, commit_ts: int) -> None:
        p = self.p
        conn = await asyncio.to_thread(p.dsn.connect)

        def record() -> None:
            try:
                with conn.cursor() as cur:
                    p.record_commit(cur, self.start_ts, commit_ts)
            finally:
                close_quietly(conn)
        try:
            await asyncio.to_thread(record)
        except errors.FailedPrecondition as e:   # already decided, or too old
            raise TxnAborted(str(e)) from None
        except Exception as e:  # noqa: BLE001 - the autocommit INSERT may have committed
            raise Ambiguous("outbox insert", e) from None

    async def abort(self) -> None:
        pass

    async def decide(self, start_ts: int) -> tuple[int, int]:
        return await self.p.decide_until(start_ts)

    async def committed(self, commit_ts: int) -> None:
        pass

    async def commit_failed(self, e: BaseException) -> None:
        pass
