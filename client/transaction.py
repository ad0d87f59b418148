"""Application transactions through Sluice, in TiDB's order (DESIGN §2.2, §5).

    async with producer.transaction() as txn:          # start_ts from the TSO, DB BEGIN
        await txn.update("shop.stock", {"sku": 7}, {"qty": 41})   # before-image FOR UPDATE
    # commit (client/commit.py): Prewrite binlog (acked by the pumps) -> commit_ts from the TSO
    # -> commit_ts above every acked watermark, else abort -> outbox (start_ts, commit_ts) in the
    # same DB transaction -> DB COMMIT -> Commit binlog

Invariants kept here (the commit order itself is kept in client/commit.py):
- **A transaction is in the database exactly when the pumps commit it, with the commit_ts of its
  outbox row.** Any failure before the DB COMMIT rolls the DB transaction back and sends a
  Rollback binlog; after the DB COMMIT the Commit binlog carries the outbox's commit_ts (or, if
  we die first, a pump's resolver reads it from the outbox); an ambiguous COMMIT error is
  decided by writing to the outbox (client/outbox.py), never by sending a Rollback.
- **Conflicting transactions get commit_ts in their DB commit order**: the DML helpers lock every
  row they read or write until the DB commit, and commit_ts is fetched while the locks are held.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import pymysql

from sluice.core import errors, failpoint
from sluice.core.table import TableShape, quote_ident
from sluice.core.tso_client import TSOClient
from sluice.proto import sluice_pb2 as pb

from . import ddl as ddlmod
from . import outbox
from .commit import Ambiguous, CommitCore, TxnAborted, TxnUnknown
from .pool import Connect, TxnPool, close_quietly

__all__ = ["Transaction", "TxnHost", "TxnAborted", "TxnUnknown"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_SELECT = re.compile(r"^\s*(\(\s*)*(select|with)\b", re.IGNORECASE)
ER_BAD_FIELD = 1054


class TxnHost(Protocol):
    """What a Transaction needs of its producer (AppProducer implements it)."""

    source: str
    tso: TSOClient
    pool: TxnPool
    commits: CommitCore

    def check_started(self) -> None: ...

    async def shape(self, table: str, load: Callable[[Callable[[Any], TableShape]],
                                                      Awaitable[TableShape]],
                    version: int) -> TableShape: ...

    def forget(self, name: tuple[str, str]) -> None: ...

    def is_declared(self, info: pb.TableInfo) -> bool: ...

    def mark_declared(self, infos: list[pb.TableInfo]) -> None: ...

    def record_commit(self, cur: Any, start_ts: int, commit_ts: int) -> None: ...

    async def decide_until(self, start_ts: int) -> tuple[int, int]: ...

    def track(self, task: asyncio.Task) -> None: ...


def encode_row(shape: TableShape, row: tuple) -> pb.Row:
    return pb.Row(columns=[ddlmod.to_datum(v, c) for v, c in zip(row, shape.columns)])


def check_columns(shape: TableShape, names: Mapping[str, Any], what: str) -> None:
    unknown = [n for n in names if n not in shape.names]
    if unknown:
        raise errors.InvalidArgument(
            f"{what} names unknown column(s) {unknown} of {shape.qualified} (columns: "
            f"{list(shape.names)}); if the table changed, declare it with "
            "producer.execute_ddl or producer.refresh")


def _where(names: tuple[str, ...] | list[str]) -> str:
    # <=> so a NULL key column matches a NULL value.
    return " AND ".join(f"{quote_ident(n)} <=> %s" for n in names)


class Transaction:
    """One application transaction; use `async with producer.transaction() as txn:`.

    Leaving the block normally commits, with an exception rolls back. `commit()` and
    `rollback()` may also be called explicitly inside the block.
    """

    def __init__(self, producer: TxnHost, connect: Connect | None = None) -> None:
        self._p = producer
        self._connect = connect
        self._conn: pymysql.connections.Connection | None = None
        self._slot = False
        self._changes: list[tuple[TableShape, pb.RowChange]] = []
        self._busy: concurrent.futures.Future | None = None
        self.start_ts = 0
        self.commit_ts = 0
        self.state = "new"        # new | open | committing | committed | rolled_back | unknown

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
        p.check_started()
        await p.pool.acquire_slot()
        self._slot = True
        try:
            self.start_ts = await p.tso.get_ts()
            conn = p.pool.take_idle() if self._connect is None else None
            self._conn = conn if conn is not None else await self._run(self._open)
        except BaseException:
            self._release(None)
            raise
        self.state = "open"

    def _open(self) -> pymysql.connections.Connection:
        if self._connect is None:
            return self._p.pool.connect()
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION")
        except BaseException:
            close_quietly(conn)
            raise
        return conn

    def _release(self, conn: pymysql.connections.Connection | None, healthy: bool = True) -> None:
        if conn is not None:
            if healthy and self._connect is None:
                self._p.pool.put(conn)
            else:
                close_quietly(conn)
        self._conn = None
        if self._slot:
            self._slot = False
            self._p.pool.release_slot()

    async def _run(self, fn: Callable[[], T]) -> T:
        self._busy = self._p.pool.submit(fn)
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
        return await self._p.shape(table, lambda load: self._run(lambda: load(conn)), self.start_ts)

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
                self._p.forget(shape.name)  # the table changed under us: reload next time
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
        task = asyncio.create_task(self._commit(conn), name=f"txn-commit-{self.start_ts}")
        self._p.track(task)
        return await asyncio.shield(task)

    def _prewrite_value(self) -> tuple[pb.PrewriteValue, list[pb.TableInfo]]:
        p = self._p
        value = pb.PrewriteValue(source=pb.SourceInfo(name=p.source, ts_ms=int(time.time() * 1000)))
        snapshots: dict[int, pb.TableInfo] = {}
        last: pb.TableMutation | None = None
        for shape, change in self._changes:
            info = shape.info
            if not p.is_declared(info) and info.table_id not in snapshots:
                snapshots[info.table_id] = info
            if last is None or last.table_id != info.table_id:
                last = value.mutations.add(table_id=info.table_id, schema_name=info.schema_name,
                                           table_name=info.table_name, table_version=info.version)
            last.changes.append(change)
        value.schema_snapshots.extend(snapshots.values())
        return value, list(snapshots.values())

    async def _commit(self, conn: pymysql.connections.Connection) -> int:
        value, snapshots = self._prewrite_value()
        steps = _TxnSteps(self, conn, snapshots)
        try:
            self.commit_ts = await self._p.commits.commit(
                [self._p.commits.prewrite(self.start_ts, value)], steps)
        except TxnUnknown:
            self.state = "unknown"
            raise
        except BaseException:
            if self.state != "committed":
                self.state = "rolled_back"
            raise
        return self.commit_ts

    async def _abort(self, conn: pymysql.connections.Connection) -> None:
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

    async def rollback(self) -> None:
        """Roll back (nothing was written to the pumps before commit)."""
        if self.state != "open" or self._conn is None:
            return
        await self._abort(self._conn)


class _TxnSteps:
    """The commit steps of an application transaction: the outbox row inside the DB
    transaction, then the DB COMMIT, is its point of no return."""

    after_prewrite_failpoint = "txn-after-prewrite"
    rollback_on = (BaseException,)
    pumps_decide = False

    def __init__(self, txn: Transaction, conn: pymysql.connections.Connection,
                 snapshots: list[pb.TableInfo]) -> None:
        self.txn, self.conn, self.snapshots = txn, conn, snapshots

    async def prewrite_failed(self, e: BaseException) -> None:
        # No acknowledged prewrite: nothing to roll back in the pumps. If a write landed
        # anyway, its pump asks TxnStatus later and the outbox (no row) says rolled back.
        await self.txn._abort(self.conn)

    async def point_of_no_return(self, commit_ts: int) -> None:
        txn, conn = self.txn, self.conn

        def record() -> None:
            with conn.cursor() as cur:
                txn._p.record_commit(cur, txn.start_ts, commit_ts)
        try:
            await txn._run(record)
        except outbox.AlreadyDecided as e:
            raise TxnAborted(str(e)) from None
        await failpoint.ainject("txn-before-db-commit")

        def db_commit() -> None:
            conn.commit()
            failpoint.inject("txn-commit-ambiguous")   # as if the OK never arrived
        try:
            await txn._run(db_commit)
        except Exception as e:  # noqa: BLE001 - every COMMIT failure is ambiguous
            close_quietly(conn)
            txn._release(None)
            raise Ambiguous("COMMIT", e) from None
        txn._release(conn)

    async def abort(self) -> None:
        if self.txn._conn is not None:
            await self.txn._abort(self.conn)

    async def decide(self, start_ts: int) -> tuple[int, int]:
        return await self.txn._p.decide_until(start_ts)

    async def committed(self, commit_ts: int) -> None:
        self.txn.commit_ts = commit_ts
        self.txn.state = "committed"
        self.txn._p.mark_declared(self.snapshots)
        await failpoint.ainject("txn-after-db-commit")

    async def commit_failed(self, e: BaseException) -> None:
        pass
