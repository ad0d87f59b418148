"""The checkpoint table `<checkpoint-schema>.sluice_checkpoint`: fenced connections and
transactions, retries, durable progress (flushed commit_ts, dispatched_upper) and takeover.

A stale writer writes nothing (DESIGN §2.10): every write begins with `SELECT epoch ... LOCK IN
SHARE MODE` on the sink's epoch row and rolls back with SinkFenced on a mismatch; a takeover kills
the connections the previous sink recorded, then bumps the epoch under an exclusive row lock.

Rows, keyed (name, slot): slot -1 holds the epoch and the control connection, slot -2 the flushed
commit_ts and dispatched_upper, slots 0..n-1 one per worker: the commit_ts lower bound known when
its last batch committed, that batch's id (a retry after a lost connection asks it whether the
batch committed) and the worker's connection id. Every worker transaction writes its row, which
doubles as the loop-prevention mark the capture ignores.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pymysql
from pymysql.constants import CLIENT
from pymysql.converters import escape_string

from sluice.core import failpoint
from sluice.core.log import kv
from sluice.drainer.sinks.mysql_errors import (CONNECTION_ERRORS, RetriesExhausted, SinkFenced, _error_code,
                                               _error_message, _is_mysql_error, _retryable)

# One logger name for the whole sink, whichever part logs.
log = logging.getLogger("sluice.drainer.sinks.mysql")

T = TypeVar("T")

CHECKPOINT_TABLE = "sluice_checkpoint"
EPOCH_SLOT, PROGRESS_SLOT = -1, -2


class _CheckpointTable:
    """Connections, retries and fenced writes to the checkpoint table (a part of MySQLSink)."""

    # -- connections --------------------------------------------------------------------------

    def _connect(self) -> pymysql.connections.Connection:
        c = self._cfg
        conn = pymysql.connect(host=c.host, port=c.port, user=c.user, password=c.password,
                               charset="utf8mb4", autocommit=True, connect_timeout=c.connect_timeout,
                               client_flag=CLIENT.MULTI_STATEMENTS)
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION sql_mode=%s, time_zone='+00:00', foreign_key_checks=0, "
                            "innodb_lock_wait_timeout=%s", (c.sql_mode, c.lock_wait_timeout))
                if c.read_committed:
                    # Workers touch disjoint keys; REPEATABLE READ's gap locks would still make
                    # them deadlock on neighbouring keys.
                    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                if c.disable_binlog:
                    cur.execute("SET SESSION sql_log_bin=0")
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _close(conn: pymysql.connections.Connection | None) -> None:
        if conn is None:
            return
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - already broken
            pass

    def _worker_conn(self, w: int) -> pymysql.connections.Connection:
        conn = self._workers[w]
        if conn is None:
            conn = self._connect()
            try:
                with conn.cursor() as cur:
                    # Recorded first, so a takeover can kill this connection before its first batch;
                    # fenced like every write: a stale sink reconnecting after a takeover (its old
                    # connection killed) must not overwrite the new owner's recorded connection id.
                    self._begin_fenced(cur)
                    cur.execute(f"INSERT INTO {self._cp_table} (name, slot, conn_id, server_boot) "
                                f"VALUES (%s, %s, CONNECTION_ID(), %s) ON DUPLICATE KEY UPDATE "
                                f"conn_id=VALUES(conn_id), server_boot=VALUES(server_boot)",
                                (self._name, w, self._boot))
                    cur.execute("COMMIT")
            except BaseException:
                self._close(conn)
                raise
            self._workers[w] = conn
        return conn

    def _retry(self, what: str, fn: Callable[[int], T], on_error: Callable[[BaseException], None]) -> T:
        """Run fn(attempt) again on transient errors, with backoff; others propagate."""
        c = self._cfg
        delay = c.retry_backoff_ms / 1000.0
        for attempt in itertools.count():
            try:
                return fn(attempt)
            except SinkFenced:
                raise
            except BaseException as e:
                if not _is_mysql_error(e) or not _retryable(e):
                    raise
                on_error(e)
                if attempt >= c.max_retries or self._closing.is_set():
                    raise RetriesExhausted(what, attempt + 1, e) from e
                code = _error_code(e)
                self._m.retries.labels(str(code)).inc()
                log.warning("mysql sink: %s failed (MySQL error %s: %s); retrying in %.2fs",
                            what, code, _error_message(e), delay)
                time.sleep(delay)
                delay = min(delay * 2, c.retry_backoff_max_ms / 1000.0)
        raise AssertionError("unreachable")

    @property
    def _fence_sql(self) -> str:
        """`START TRANSACTION`, the shared lock on the epoch row, and a guard that fails (error
        1242) unless the epoch is ours — the first statements of a one-round-trip transaction:
        the server stops a multi-statement at its first error, so nothing after the guard runs
        under a newer epoch. Both SELECTs write INTO session variables: the lock and the guard's
        error are the same, but the server answers with an OK packet instead of a result set
        (column definitions and a row for pymysql to parse, twice per worker batch)."""
        where = f"name={_q(self._name)} AND slot={EPOCH_SLOT}"
        return (f"START TRANSACTION;\nSELECT epoch INTO @sluice_epoch FROM {self._cp_table} WHERE {where} "
                f"LOCK IN SHARE MODE;\n"
                f"SELECT (SELECT 1 FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {self._cp_table} WHERE "
                f"{where} AND epoch={int(self._epoch)}) UNION ALL SELECT 2) INTO @sluice_epoch_guard")

    def _fenced(self, row: Any) -> SinkFenced:
        return SinkFenced(f"mysql sink {self._name}: fenced: this sink has epoch {self._epoch} "
                          f"but {self._cfg.checkpoint_schema}.{CHECKPOINT_TABLE} has "
                          f"{'no epoch row' if row is None else f'epoch {row[0]}'}; a newer "
                          f"drainer took over, stopping")

    def _begin_fenced(self, cur: Any) -> None:
        """Begin a transaction that S-locks the epoch row, refusing to go on under a newer epoch.

        The shared lock is held to the end of the transaction, so a takeover's epoch bump (an
        exclusive lock) waits for it, and everything after the bump sees the new epoch."""
        cur.execute(f"START TRANSACTION; SELECT epoch FROM {self._cp_table} WHERE name={_q(self._name)} "
                    f"AND slot={EPOCH_SLOT} LOCK IN SHARE MODE")
        cur.nextset()
        row = cur.fetchone()
        if row is None or int(row[0]) != self._epoch:
            cur.execute("ROLLBACK")
            raise self._fenced(row)

    # -- control-connection transactions ------------------------------------------------------

    def _control_txn(self, what: str, statements: Sequence[tuple[str, tuple]]) -> None:
        """One fenced transaction on the control connection."""
        def attempt(_: int) -> None:
            if self._control is None:
                self._control = self._connect()
            with self._control.cursor() as cur:
                self._begin_fenced(cur)
                for sql, args in statements:
                    cur.execute(sql, args)
                cur.execute("COMMIT")

        self._retry(what, attempt, self._control_failed)

    def _control_failed(self, e: BaseException) -> None:
        conn = self._control
        if _error_code(e) in CONNECTION_ERRORS or isinstance(e, (pymysql.err.InterfaceError, OSError)):
            self._control = None
            self._close(conn)
        elif conn is not None:
            try:
                conn.cursor().execute("ROLLBACK")
            except Exception:  # noqa: BLE001
                self._control = None
                self._close(conn)

    def _write_progress(self, commit_ts: int) -> None:
        failpoint.inject("mysql-sink-before-checkpoint")
        self._control_txn("checkpoint write", [(
            f"UPDATE {self._cp_table} SET commit_ts=GREATEST(commit_ts, %s) WHERE name=%s AND slot=%s",
            (commit_ts, self._name, PROGRESS_SLOT))])
        self._written = max(self._written, commit_ts)
        self._durable = max(self._durable, commit_ts)
        self._m.applied.set(self._durable)

    def _raise_upper(self, upper: int) -> None:
        self._control_txn("dispatched_upper raise", [(
            f"UPDATE {self._cp_table} SET dispatched_upper=GREATEST(dispatched_upper, %s) "
            f"WHERE name=%s AND slot=%s", (upper, self._name, PROGRESS_SLOT))])
        self._upper = max(self._upper, upper)

    def _take_over(self) -> None:
        """Kill the connections recorded by the previous sink, then set our epoch (or be fenced)."""
        assert self._control is not None
        deadline = time.monotonic() + self._cfg.takeover_timeout
        with self._control.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID()")
            own = int(cur.fetchone()[0])
            cur.execute("SET SESSION innodb_lock_wait_timeout=2")
            try:
                while True:
                    cur.execute(f"SELECT slot, epoch, conn_id, server_boot FROM {self._cp_table} "
                                f"WHERE name=%s", (self._name,))
                    rows = cur.fetchall()
                    stored = next((int(r[1]) for r in rows if r[0] == EPOCH_SLOT), 0)
                    if stored > self._epoch:
                        raise self._fenced_at_open(stored)
                    # A connection id means something only on the server boot that issued it.
                    ids = sorted({int(r[2]) for r in rows
                                  if r[2] and r[2] != own and abs(int(r[3]) - self._boot) <= 2})
                    self._kill(cur, ids)
                    try:
                        cur.execute("START TRANSACTION")
                        cur.execute(f"SELECT epoch FROM {self._cp_table} WHERE name=%s AND slot=%s "
                                    f"FOR UPDATE", (self._name, EPOCH_SLOT))
                        stored = int(cur.fetchone()[0])
                        if stored > self._epoch:
                            cur.execute("ROLLBACK")
                            raise self._fenced_at_open(stored)
                        cur.execute(f"UPDATE {self._cp_table} SET epoch=%s, conn_id=%s, server_boot=%s "
                                    f"WHERE name=%s AND slot=%s",
                                    (self._epoch, own, self._boot, self._name, EPOCH_SLOT))
                        cur.execute("COMMIT")
                    except pymysql.err.OperationalError as e:
                        # An old worker reconnected and holds the row: kill again and retry.
                        if _error_code(e) not in (1205, 1213) or time.monotonic() > deadline:
                            raise
                        cur.execute("ROLLBACK")
                        continue
                    if stored != self._epoch:
                        log.info("mysql sink took over", extra=kv(name=self._name, old_epoch=stored, epoch=self._epoch, killed=ids))
                    return
            finally:
                cur.execute("SET SESSION innodb_lock_wait_timeout=%s", (self._cfg.lock_wait_timeout,))

    def _fenced_at_open(self, stored: int) -> SinkFenced:
        return SinkFenced(f"mysql sink {self._name}: cannot open with epoch {self._epoch}: "
                          f"{self._cfg.checkpoint_schema}.{CHECKPOINT_TABLE} already has epoch "
                          f"{stored} (a newer drainer owns this downstream)")

    def _kill(self, cur: Any, ids: list[int]) -> None:
        if not ids:
            return
        # Only sessions of our user: after a server restart the ids could name someone else's.
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE ID IN ("
                    + ",".join(str(i) for i in ids) + ") AND USER=%s", (self._cfg.user,))
        for (conn_id,) in cur.fetchall():
            try:
                cur.execute(f"KILL CONNECTION {int(conn_id)}")
            except pymysql.err.MySQLError as e:
                if _error_code(e) != 1094:  # unknown thread: already gone
                    raise

    def _is_safe(self, commit_ts: int) -> bool:
        return self._cfg.safe_mode or commit_ts <= self._safe_until


def _q(text: str) -> str:
    return "'" + escape_string(text) + "'"
