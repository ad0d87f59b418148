"""Application transactions through Sluice, in TiDB's order (DESIGN §2.2, §5).

    async with producer.transaction() as txn:          # start_ts from the TSO, DB BEGIN
        await txn.update("shop.stock", {"sku": 7}, {"qty": 41})   # before-image FOR UPDATE
    # commit: Prewrite binlog (acked by the pumps) -> commit_ts from the TSO -> commit_ts above
    # every acked watermark, else abort -> outbox (start_ts, commit_ts) in the same DB
    # transaction -> DB COMMIT -> Commit binlog

Invariants kept here:
- **commit_ts is fetched only after the prewrite is durably acknowledged, and a transaction
  reaches its point of no return (the outbox insert) only with commit_ts above every acked
  watermark** (§2.2).
- **A transaction is in the database exactly when the pumps commit it, with the commit_ts of its
  outbox row.** Any failure before the DB COMMIT rolls the DB transaction back and sends a
  Rollback binlog; after the DB COMMIT the Commit binlog carries the outbox's commit_ts (or, if
  we die first, a pump's resolver reads it from the outbox); an ambiguous COMMIT error is
  decided by writing to the outbox (client/outbox.py), never by sending a Rollback.
- **Conflicting transactions get commit_ts in their DB commit order**: the DML helpers lock every
  row they read or write until the DB commit, and commit_ts is fetched while the locks are held.

Blocking database work runs on the producer's own thread pool, one thread per open transaction
(`pool_size` of each), so transactions waiting on row locks never starve anyone else's threads.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import pymysql

from sluice.core import errors, failpoint
from sluice.core.etcd import Etcd
from sluice.core.registry import Registry
from sluice.core.table import TableShape, quote_ident
from sluice.core.tls import SecurityConfig
from sluice.core.tso_client import TSOClient
from sluice.proto import sluice_pb2 as pb

from . import ddl as ddlmod
from . import outbox
from .producer import OUTBOX_LABEL, ProducerServer

if TYPE_CHECKING:
    from .pumps import PrewriteAck, PumpsClient

log = logging.getLogger(__name__)

T = TypeVar("T")
Connect = Callable[[], pymysql.connections.Connection]

_SELECT = re.compile(r"^\s*(\(\s*)*(select|with)\b", re.IGNORECASE)
ER_BAD_FIELD = 1054


class TxnAborted(errors.FailedPrecondition):
    """The transaction was rolled back in the database and in the pumps; nothing committed."""


class TxnUnknown(errors.Unavailable):
    """The DB COMMIT failed ambiguously and the outbox could not decide in time.

    The outbox stays the truth: a pump's resolver decides start_ts from it later.
    """

    def __init__(self, message: str, start_ts: int, commit_ts: int) -> None:
        super().__init__(message)
        self.start_ts, self.commit_ts = start_ts, commit_ts


def encode_row(shape: TableShape, row: tuple) -> pb.Row:
    return pb.Row(columns=[ddlmod.to_datum(v, c) for v, c in zip(row, shape.columns)])


def check_columns(shape: TableShape, names: Mapping[str, Any], what: str) -> None:
    unknown = [n for n in names if n not in shape.names]
    if unknown:
        raise errors.InvalidArgument(
            f"{what} names unknown column(s) {unknown} of {shape.sql_name} (columns: "
            f"{list(shape.names)}); if the table changed, declare it with "
            "producer.execute_ddl or producer.refresh")


class _Pool:
    """Idle pymysql connections to the outbox database (autocommit off: the first statement
    after a COMMIT or ROLLBACK opens the next transaction)."""

    def __init__(self, connect: Connect, size: int) -> None:
        self.connect, self.size = connect, size
        self._idle: list[pymysql.connections.Connection] = []
        self._lock = threading.Lock()

    def take_idle(self) -> pymysql.connections.Connection | None:
        """An idle connection, without blocking; None when there is none."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.open:
                    return conn
        return None

    def put(self, conn: pymysql.connections.Connection) -> None:
        with self._lock:
            if conn.open and len(self._idle) < self.size:
                self._idle.append(conn)
                return
        _close(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            _close(conn)


def _close(conn: pymysql.connections.Connection | None) -> None:
    if conn is None:
        return
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - a broken socket: the server aborts the session anyway
        conn._force_close()  # type: ignore[attr-defined]


def _where(names: tuple[str, ...] | list[str]) -> str:
    # <=> so a NULL key column matches a NULL value.
    return " AND ".join(f"{quote_ident(n)} <=> %s" for n in names)


async def _fires(name: str) -> bool:
    """Whether failpoint `name` (configured as `raise`) fired here."""
    try:
        await failpoint.ainject(name)
    except errors.FailpointError:
        return True
    return False


class Transaction:
    """One application transaction; use `async with producer.transaction() as txn:`.

    Leaving the block normally commits, with an exception rolls back. `commit()` and
    `rollback()` may also be called explicitly inside the block.
    """

    def __init__(self, producer: AppProducer, connect: Connect | None = None) -> None:
        self._p = producer
        self._connect = connect
        self._conn: pymysql.connections.Connection | None = None
        self._slot = False
        self._changes: list[tuple[TableShape, pb.RowChange]] = []
        self._ack: PrewriteAck | None = None
        self._busy: concurrent.futures.Future | None = None
        self.start_ts = 0
        self.commit_ts = 0
        self.state = "new"        # new | open | committed | rolled_back | unknown

    # -- lifecycle ---------------------------------------------------------------------------
    async def __aenter__(self) -> Transaction:
        await self.begin()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.state != "open":
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()

    async def begin(self) -> None:
        if self.state != "new":
            raise errors.FailedPrecondition(f"transaction already {self.state}")
        p = self._p
        p._check_started()
        await p._slots.acquire()
        self._slot = True
        try:
            self.start_ts = await p.tso.get_ts()
            conn = p._pool.take_idle() if self._connect is None else None
            self._conn = conn if conn is not None else await self._run(self._open)
        except BaseException:
            self._release(None)
            raise
        self.state = "open"

    def _open(self) -> pymysql.connections.Connection:
        if self._connect is None:
            return self._p._pool.connect()
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION")
        except BaseException:
            _close(conn)
            raise
        return conn

    def _release(self, conn: pymysql.connections.Connection | None, healthy: bool = True) -> None:
        if conn is not None:
            if healthy and self._connect is None:
                self._p._pool.put(conn)
            else:
                _close(conn)
        self._conn = None
        if self._slot:
            self._slot = False
            self._p._slots.release()

    async def _run(self, fn: Callable[[], T]) -> T:
        assert self._p._executor is not None
        self._busy = self._p._executor.submit(fn)
        return await asyncio.wrap_future(self._busy)

    async def _idle(self) -> None:
        """Wait for a statement whose caller was cancelled: the connection is not shareable."""
        busy = self._busy
        if busy is not None and not busy.done():
            await asyncio.wait([asyncio.wrap_future(busy)])

    def _check_open(self) -> pymysql.connections.Connection:
        if self.state != "open" or self._conn is None:
            raise errors.FailedPrecondition(f"transaction start_ts={self.start_ts} is {self.state}")
        return self._conn

    # -- DML ---------------------------------------------------------------------------------
    async def _shape(self, table: str) -> TableShape:
        conn = self._check_open()
        return await self._p._shape(table, lambda load: self._run(lambda: load(conn)), self.start_ts)

    async def _dml(self, table: str, fn: Callable[[Any, TableShape], T]) -> T:
        shape = await self._shape(table)
        conn = self._check_open()

        def work() -> T:
            with conn.cursor() as cur:
                return fn(cur, shape)
        try:
            return await self._run(work)
        except pymysql.err.OperationalError as e:
            if outbox.errcode(e) == ER_BAD_FIELD:
                self._p._forget(shape.name)  # the table changed under us: reload next time
            raise

    def _key(self, shape: TableShape, key: Any) -> dict[str, Any]:
        if not isinstance(key, Mapping):
            if len(shape.primary_key) != 1:
                raise errors.InvalidArgument(
                    f"{shape.qualified}: a bare key value needs a one-column primary key; "
                    f"pass a dict of column -> value")
            return {shape.primary_key[0]: key}
        if not key:
            raise errors.InvalidArgument("empty key")
        check_columns(shape, key, "key")
        return dict(key)

    @staticmethod
    def _locked_one(cur: Any, shape: TableShape, key: dict[str, Any], lock: bool) -> tuple | None:
        cur.execute(f"SELECT {shape.select_list} FROM {shape.sql_name} WHERE {_where(list(key))}"
                    f" LIMIT 2{' FOR UPDATE' if lock else ''}", tuple(key.values()))
        rows = cur.fetchall()
        if len(rows) > 1:
            raise errors.InvalidArgument(f"key {key} matches more than one row of "
                                         f"{shape.qualified}")
        return rows[0] if rows else None

    def _record(self, shape: TableShape, tp: int, before: tuple | None, after: tuple | None) -> None:
        ch = pb.RowChange(tp=tp)
        if before is not None:
            ch.before.CopyFrom(encode_row(shape, before))
        if after is not None:
            ch.after.CopyFrom(encode_row(shape, after))
        self._changes.append((shape, ch))

    async def get(self, table: str, key: Any, *, for_update: bool = True) -> dict[str, Any] | None:
        """The row with this key (locked until commit unless for_update=False), or None."""
        def fn(cur: Any, shape: TableShape) -> dict[str, Any] | None:
            row = self._locked_one(cur, shape, self._key(shape, key), for_update)
            return None if row is None else shape.as_dict(row)
        return await self._dml(table, fn)

    async def insert(self, table: str, row: Mapping[str, Any]) -> dict[str, Any]:
        """Insert one row; returns it as stored (defaults and auto-increment filled in)."""
        def fn(cur: Any, shape: TableShape) -> dict[str, Any]:
            if not row:
                raise errors.InvalidArgument(f"insert into {shape.qualified}: empty row")
            check_columns(shape, row, "insert")
            names = list(row)
            cur.execute(f"INSERT INTO {shape.sql_name} ({', '.join(map(quote_ident, names))}) "
                        f"VALUES ({', '.join(['%s'] * len(names))})", tuple(row.values()))
            pk = shape.primary_key
            if pk and all(c in row for c in pk):
                key = {c: row[c] for c in pk}
            elif len(pk) == 1 and cur.lastrowid:
                key = {pk[0]: cur.lastrowid}
            elif not pk:
                key = dict(row)
            else:
                raise errors.InvalidArgument(f"insert into {shape.qualified}: give the "
                                             f"primary key {list(pk)} (or use auto-increment)")
            after = self._locked_one(cur, shape, key, lock=True)
            if after is None:
                raise errors.SluiceError(f"insert into {shape.qualified}: inserted row "
                                         f"{key} not found again")
            self._record(shape, pb.INSERT, None, after)
            return shape.as_dict(after)
        return await self._dml(table, fn)

    async def update(self, table: str, key: Any, changes: Mapping[str, Any]) -> dict[str, Any] | None:
        """Update the row with this key; returns the row after, or None when no row has the key."""
        def fn(cur: Any, shape: TableShape) -> dict[str, Any] | None:
            k = self._key(shape, key)
            check_columns(shape, changes, "update")
            before = self._locked_one(cur, shape, k, lock=True)
            if before is None:
                return None
            if not changes:
                return shape.as_dict(before)
            limit = "" if shape.primary_key else " LIMIT 1"
            cur.execute(f"UPDATE {shape.sql_name} SET "
                        f"{', '.join(f'{quote_ident(c)} = %s' for c in changes)} "
                        f"WHERE {_where(list(k))}{limit}", (*changes.values(), *k.values()))
            # Re-read: the database may have converted values or fired ON UPDATE defaults.
            pk = shape.primary_key or tuple(k)
            old = shape.as_dict(before)
            new_key = {c: changes.get(c, old[c]) for c in pk}
            after = self._locked_one(cur, shape, new_key, lock=True)
            if after is None:
                raise errors.SluiceError(f"update of {shape.qualified}: row {new_key} not "
                                         "found after the update")
            self._record(shape, pb.UPDATE, before, after)
            return shape.as_dict(after)
        return await self._dml(table, fn)

    async def delete(self, table: str, key: Any) -> dict[str, Any] | None:
        """Delete the row with this key; returns it as it was, or None when there was none."""
        def fn(cur: Any, shape: TableShape) -> dict[str, Any] | None:
            k = self._key(shape, key)
            before = self._locked_one(cur, shape, k, lock=True)
            if before is None:
                return None
            limit = "" if shape.primary_key else " LIMIT 1"
            cur.execute(f"DELETE FROM {shape.sql_name} WHERE {_where(list(k))}{limit}",
                        tuple(k.values()))
            self._record(shape, pb.DELETE, before, None)
            return shape.as_dict(before)
        return await self._dml(table, fn)

    async def query(self, sql: str, args: Any = None) -> list[tuple]:
        """Run a read-only SELECT in this transaction (writes must go through the helpers)."""
        if not _SELECT.match(sql):
            raise errors.InvalidArgument("txn.query runs SELECT statements only: writes go "
                                         "through txn.insert/update/delete so they are captured")
        conn = self._check_open()

        def work() -> list[tuple]:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        return await self._run(work)

    # -- commit ------------------------------------------------------------------------------
    async def commit(self) -> int:
        """Commit; returns commit_ts (0 when the transaction changed nothing)."""
        conn = self._check_open()
        if not self._changes:
            try:
                await self._run(conn.commit)
            except BaseException:
                self.state = "rolled_back"
                self._release(conn, healthy=False)
                raise
            self.state = "committed"
            self._release(conn)
            return 0
        self.state = "committing"
        # The protocol must run to its end even if our caller is cancelled: a half-run commit
        # would leave the connection busy in a pool thread and the binlogs undecided.
        task = asyncio.create_task(self._commit_protocol(conn), name=f"txn-commit-{self.start_ts}")
        self._p._inflight.add(task)
        task.add_done_callback(self._p._inflight.discard)
        return await asyncio.shield(task)

    def _prewrite_value(self) -> tuple[pb.PrewriteValue, list[pb.TableInfo]]:
        p = self._p
        value = pb.PrewriteValue(source=pb.SourceInfo(name=p.source, ts_ms=int(time.time() * 1000)))
        snapshots: dict[int, pb.TableInfo] = {}
        last: pb.TableMutation | None = None
        for shape, change in self._changes:
            info = shape.info
            if p._declared.get(shape.name) != info.version and info.table_id not in snapshots:
                snapshots[info.table_id] = info
            if last is None or last.table_id != info.table_id:
                last = value.mutations.add(table_id=info.table_id, schema_name=info.schema_name,
                                           table_name=info.table_name, table_version=info.version)
            last.changes.append(change)
        value.schema_snapshots.extend(snapshots.values())
        return value, list(snapshots.values())

    async def _commit_protocol(self, conn: pymysql.connections.Connection) -> int:
        p = self._p
        value, snapshots = self._prewrite_value()
        try:
            ack = await p._write_prewrite(self.start_ts, value)
        except BaseException:
            # No acknowledged prewrite: nothing to roll back in the pumps. If a write landed
            # anyway, its pump asks TxnStatus later and the outbox (no row) says rolled back.
            await self._abort(conn, rollback_binlog=False)
            raise
        self._ack = ack
        try:
            await failpoint.ainject("txn-after-prewrite")
            commit_ts = await p.tso.get_ts()
            watermark = ack.watermark
            if await _fires("txn-watermark-above-commit"):
                watermark = commit_ts   # test wiring: a pump acked a watermark >= our commit_ts
            if commit_ts <= watermark:
                raise TxnAborted(f"commit_ts {commit_ts} is not above the served watermark "
                                 f"{watermark} acked by pump(s) {list(ack.pumps)}: transaction "
                                 f"start_ts={self.start_ts} aborted")

            def point_of_no_return() -> None:
                with conn.cursor() as cur:
                    outbox.record_commit(cur, p.dsn, self.start_ts, commit_ts, p.max_txn_age_s)
            await self._run(point_of_no_return)
            await failpoint.ainject("txn-before-db-commit")
        except BaseException as e:
            await self._abort(conn, rollback_binlog=True)
            if isinstance(e, outbox.AlreadyDecided):
                raise TxnAborted(str(e)) from None
            raise

        def db_commit() -> None:
            conn.commit()
            failpoint.inject("txn-commit-ambiguous")   # as if the OK never arrived
        try:
            await self._run(db_commit)
        except Exception as e:  # noqa: BLE001 - every COMMIT failure is ambiguous
            log.warning("COMMIT of start_ts=%d failed (%s): deciding by writing to the outbox",
                        self.start_ts, outbox._errtext(e))
            _close(conn)
            self._release(None)
            commit_ts = await self._decide_ambiguous(commit_ts)
        else:
            self._release(conn)
        self.commit_ts = commit_ts
        self.state = "committed"
        p._mark_declared(snapshots)
        await failpoint.ainject("txn-after-db-commit")
        await p._send_commit(self.start_ts, commit_ts, ack)
        return commit_ts

    async def _decide_ambiguous(self, commit_ts: int) -> int:
        state, decided = await self._p._decide_until(self.start_ts)
        if state == pb.TXN_COMMITTED:
            if decided != commit_ts:
                log.error("outbox has commit_ts %d for start_ts=%d, we wrote %d; using the "
                          "outbox's", decided, self.start_ts, commit_ts)
            return decided
        if state == pb.TXN_ROLLED_BACK:
            self.state = "rolled_back"
            await self._send_rollback()
            raise TxnAborted(f"COMMIT of start_ts={self.start_ts} failed and the outbox says it "
                             "did not commit: transaction rolled back")
        self.state = "unknown"
        raise TxnUnknown(f"COMMIT of start_ts={self.start_ts} failed and the outbox could not "
                         f"decide within {self._p.resolve_timeout_s:g}s; the pumps will resolve "
                         "it from the outbox", self.start_ts, commit_ts)

    async def _send_rollback(self) -> None:
        if self._ack is not None:
            await self._p._send_rollback(self.start_ts, self._ack)

    async def _abort(self, conn: pymysql.connections.Connection, rollback_binlog: bool) -> None:
        healthy = True
        await self._idle()
        try:
            await self._run(conn.rollback)
        except Exception as e:  # noqa: BLE001 - a lost connection rolls back on the server
            log.info("DB rollback of start_ts=%d failed (%s); the server aborts the session",
                     self.start_ts, outbox._errtext(e))
            healthy = False
        self.state = "rolled_back"
        self._release(conn, healthy)
        if rollback_binlog:
            await self._send_rollback()

    async def rollback(self) -> None:
        """Roll back (nothing was written to the pumps before commit)."""
        if self.state != "open" or self._conn is None:
            return
        await self._abort(self._conn, rollback_binlog=False)


class AppProducer:
    """An application's producer: pumps, TSO, its TxnStatus endpoint, outbox and table shapes.

    One process, one producer id (its epoch fences older processes with the same id).
    """

    def __init__(self, etcd_endpoints: str, cluster_id: int, producer_id: str, outbox_dsn: str,
                 *, source: str = "", pool_size: int = 8, tso_addrs: list[str] | None = None,
                 host: str = "127.0.0.1", port: int = 0, alive_ttl_s: int = 5,
                 labels: dict[str, str] | None = None, security: SecurityConfig | None = None,
                 max_txn_age_s: float = outbox.DEFAULT_MAX_TXN_AGE_S,
                 prune_interval_s: float = 30.0, resolve_timeout_s: float = 30.0,
                 statement_timeout_s: float = 60.0, max_binlog_size: int = 64 << 20,
                 pumps: PumpsClient | None = None,
                 pumps_options: dict[str, Any] | None = None) -> None:
        if pool_size < 1:
            raise errors.ConfigError(f"pool_size must be >= 1, got {pool_size}")
        self.etcd_endpoints, self.cluster_id, self.producer_id = etcd_endpoints, cluster_id, producer_id
        self.dsn = outbox.OutboxDSN.parse(outbox_dsn)
        self.source = source or f"{self.dsn.host}:{self.dsn.port}"
        self.pool_size = pool_size
        self.tso_addrs = tso_addrs
        self.host, self.port, self.alive_ttl_s = host, port, alive_ttl_s
        self.labels = dict(labels or {})
        self.security = security
        self.max_txn_age_s = max_txn_age_s
        self.prune_interval_s = prune_interval_s
        self.resolve_timeout_s = resolve_timeout_s
        self.statement_timeout_s = statement_timeout_s
        self.max_binlog_size = max_binlog_size
        self._own_pumps = pumps is None
        self._pumps_options = dict(pumps_options or {})
        self.pumps: PumpsClient = pumps  # type: ignore[assignment]
        self.tso: TSOClient = None  # type: ignore[assignment]
        self.server: ProducerServer | None = None
        self.etcd: Etcd | None = None
        self.registry: Registry | None = None
        self.epoch = 0
        self._pool = _Pool(self._new_connection, pool_size)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._slots = asyncio.Semaphore(pool_size)
        self._shapes: dict[tuple[str, str], TableShape] = {}
        self._declared: dict[tuple[str, str], int] = {}
        self._inflight: set[asyncio.Task] = set()
        self._prune_task: asyncio.Task | None = None
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Outbox table, TSO, pumps, then the TxnStatus endpoint and a new epoch."""
        await asyncio.to_thread(outbox.ensure_table, self.dsn)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.pool_size, thread_name_prefix=f"txn-{self.producer_id}")
        self.etcd = Etcd(self.etcd_endpoints, self.security)
        self.registry = Registry(self.etcd, self.cluster_id)
        self.tso = TSOClient(self.tso_addrs, self.cluster_id, etcd=self.etcd, security=self.security)
        try:
            if self.pumps is None:
                from .pumps import PumpsClient
                self.pumps = PumpsClient(self.etcd_endpoints, self.cluster_id,
                                         security=self.security,
                                         max_binlog_size=self.max_binlog_size, **self._pumps_options)
                await self.pumps.start()
            self.server = ProducerServer(
                self.etcd_endpoints, self.cluster_id, self.producer_id, self.decide,
                labels={**self.labels, OUTBOX_LABEL: self.dsn.url()}, host=self.host,
                port=self.port, alive_ttl_s=self.alive_ttl_s, security=self.security)
            await self.server.start()
            self.epoch = await self.server.bump_epoch()
        except BaseException:
            await self.close()
            raise
        if self.prune_interval_s > 0:
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
            await asyncio.wait(list(self._inflight), timeout=self.resolve_timeout_s)
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.pumps is not None and self._own_pumps:
            await self.pumps.close()
            self.pumps = None  # type: ignore[assignment]
        if self.tso is not None:
            await self.tso.close()
            self.tso = None  # type: ignore[assignment]
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.to_thread(executor.shutdown, True)
        await asyncio.to_thread(self._pool.close)
        if self.etcd is not None:
            self.etcd.close()
            self.etcd = None

    async def __aenter__(self) -> AppProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _check_started(self) -> None:
        if not self._started:
            raise errors.FailedPrecondition(f"producer {self.producer_id} is not started")

    def _new_connection(self) -> pymysql.connections.Connection:
        # UTC sessions: TIMESTAMP values then read back as UTC, which is what a Datum holds.
        return self.dsn.connect(timeout_s=10.0, read_timeout_s=self.statement_timeout_s,
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
        self._check_started()
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
            self._forget(name)
        if old_table_name:
            self._forget((old_schema_name or d.schema_name, old_table_name))
        return commit_ts

    async def execute_ddl(self, sql: str, table: str, tp: int = pb.ALTER_TABLE, *,
                          old_table: str = "") -> int:
        """Run a DDL statement on the outbox database, then write its DDL binlog (the shape read
        back from information_schema). `old_table` names the table before a RENAME_TABLE.
        Returns commit_ts."""
        self._check_started()
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
                    return ddlmod.read_table_info(cur, schema, name, source=self.source,
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
            self._forget((schema, name))
            raise

    async def declare(self, *tables: str) -> int:
        """Write a schema snapshot of these tables as they are now; returns commit_ts."""
        self._check_started()
        start_ts = await self.tso.get_ts()

        def work() -> list[pb.TableInfo]:
            conn = self.dsn.connect()
            try:
                with conn.cursor() as cur:
                    return [ddlmod.read_table_info(cur, *ddlmod.split_name(t, self.dsn.database),
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
        self._forget(ddlmod.split_name(table, self.dsn.database))

    # -- internals ---------------------------------------------------------------------------
    def _source_info(self) -> pb.SourceInfo:
        return pb.SourceInfo(name=self.source, ts_ms=int(time.time() * 1000))

    def _binlog(self, tp: int, start_ts: int, commit_ts: int = 0) -> pb.Binlog:
        return pb.Binlog(tp=tp, start_ts=start_ts, commit_ts=commit_ts,
                         producer_id=self.producer_id, producer_epoch=self.epoch,
                         ts_ms=int(time.time() * 1000))

    async def _write_prewrite(self, start_ts: int, value: pb.PrewriteValue) -> PrewriteAck:
        # PumpsClient splits a value over max_binlog_size into parts under this start_ts.
        b = self._binlog(pb.PREWRITE, start_ts)
        b.prewrite_value = value.SerializeToString()
        return await self.pumps.write_prewrite(b)

    async def _write_standalone(self, start_ts: int, value: pb.PrewriteValue) -> int:
        """A binlog-only transaction (DDL, schema snapshot) with the same commit protocol:
        the outbox row (autocommit) is its point of no return."""
        ack = await self._write_prewrite(start_ts, value)
        try:
            commit_ts = await self.tso.get_ts()
            if commit_ts <= ack.watermark:
                raise TxnAborted(f"commit_ts {commit_ts} is not above the served watermark "
                                 f"{ack.watermark}: start_ts={start_ts} aborted")
        except BaseException:
            await self._send_rollback(start_ts, ack)
            raise

        try:
            conn = await asyncio.to_thread(self.dsn.connect)
        except BaseException:
            await self._send_rollback(start_ts, ack)
            raise

        def record() -> None:
            try:
                with conn.cursor() as cur:
                    outbox.record_commit(cur, self.dsn, start_ts, commit_ts, self.max_txn_age_s)
            finally:
                _close(conn)
        try:
            await asyncio.to_thread(record)
        except errors.FailedPrecondition as e:   # already decided, or too old
            await self._send_rollback(start_ts, ack)
            raise TxnAborted(str(e)) from None
        except Exception as e:  # noqa: BLE001 - the autocommit INSERT may have committed
            log.warning("outbox insert of start_ts=%d failed (%s): deciding by writing",
                        start_ts, outbox._errtext(e))
            state, decided = await self._decide_until(start_ts)
            if state == pb.TXN_ROLLED_BACK:
                await self._send_rollback(start_ts, ack)
                raise TxnAborted(f"start_ts={start_ts} did not commit: {e}") from None
            if state != pb.TXN_COMMITTED:
                raise TxnUnknown(f"outbox insert of start_ts={start_ts} failed and the outbox "
                                 "could not decide in time", start_ts, commit_ts) from None
            commit_ts = decided
        await self._send_commit(start_ts, commit_ts, ack)
        return commit_ts

    async def _decide_until(self, start_ts: int) -> tuple[int, int]:
        """Decide start_ts by writing to the outbox, retrying for up to resolve_timeout_s while
        the answer is unknown or the database unreachable; TXN_UNKNOWN after that."""
        deadline = time.monotonic() + self.resolve_timeout_s
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

    async def _send_commit(self, start_ts: int, commit_ts: int, ack: PrewriteAck) -> None:
        """The Commit binlog of a transaction committed in the database. Never raises: when it
        is not written, the pumps' resolver reads the outbox and commits it."""
        try:
            await self.pumps.write_commits([self._binlog(pb.COMMIT, start_ts, commit_ts)], ack)
        except errors.Unavailable as e:
            log.warning("commit binlog of start_ts=%d commit_ts=%d not written (%s); the pumps "
                        "will resolve it from the outbox", start_ts, commit_ts, e)
        except errors.SluiceError as e:
            # A pump holds another decision for a transaction the outbox says committed.
            log.error("pump refused the commit of start_ts=%d commit_ts=%d, committed in the "
                      "database: %s", start_ts, commit_ts, e)

    async def _send_rollback(self, start_ts: int, ack: PrewriteAck) -> None:
        try:
            await self.pumps.write_commits([self._binlog(pb.ROLLBACK, start_ts)], ack)
        except errors.SluiceError as e:
            log.warning("rollback binlog of start_ts=%d not written (%s); the pumps will resolve "
                        "it from the outbox", start_ts, e)

    async def _shape(self, table: str, run: Callable[[Callable[[Any], TableShape]], Any],
                     version: int) -> TableShape:
        name = ddlmod.split_name(table, self.dsn.database)
        shape = self._shapes.get(name)
        if shape is not None:
            return shape

        def load(conn: pymysql.connections.Connection) -> TableShape:
            with conn.cursor() as cur:
                return TableShape(ddlmod.read_table_info(cur, *name, source=self.source,
                                                            version=version))
        shape = await run(load)
        return self._shapes.setdefault(name, shape)

    def _forget(self, name: tuple[str, str]) -> None:
        self._shapes.pop(name, None)
        self._declared.pop(name, None)

    def _mark_declared(self, infos: list[pb.TableInfo]) -> None:
        for info in infos:
            self._declared[(info.schema_name, info.table_name)] = info.version

    async def _prune_loop(self) -> None:
        assert self.registry is not None
        while True:
            await asyncio.sleep(self.prune_interval_s)
            try:
                await asyncio.to_thread(outbox.prune_once, self.dsn, self.registry,
                                        self.max_txn_age_s)
            except errors.SluiceError as e:
                log.warning("outbox prune skipped: %s", e)
