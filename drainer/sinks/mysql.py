"""MySQL / MariaDB sink: causality-parallel, batched, typed, fenced and crash-safe (docs/mysql-sink.md).

Invariants kept here:
- The downstream checkpoint never runs ahead of the data: the sink reports (and writes to
  `<checkpoint-schema>.sluice_checkpoint`) a commit_ts only when every worker has committed every
  change of every transaction at or below it (Dispatcher.applied()).
- Before a change with commit_ts above the durable `dispatched_upper` is dispatched, the upper is
  raised durably in the downstream. After a restart every transaction at or below the stored
  upper is applied in safe mode (idempotent REPLACE / DELETE+REPLACE, DDL errors meaning
  "already done" ignored), so whatever a crash left half-applied converges.
- A stale writer writes nothing (DESIGN §2.10): every worker transaction, the checkpoint and
  upper writes begin with `SELECT epoch ... LOCK IN SHARE MODE` on the sink's epoch row and roll
  back with SinkFenced on a mismatch. open() with a higher epoch first kills the connections the
  previous sink recorded, then bumps the epoch under an exclusive row lock.

Checkpoint table rows, keyed (name, slot): slot -1 holds the epoch and the control connection,
slot -2 the flushed commit_ts and dispatched_upper, slots 0..n-1 one per worker: the commit_ts
lower bound known when its last batch committed, that batch's id (a retry after a lost
connection asks it whether the batch committed) and the worker's connection id. Every worker
transaction writes its row, which doubles as the loop-prevention mark the capture ignores.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pymysql
from pymysql.constants import CLIENT
from pymysql.converters import escape_string

from sluice.core import failpoint
from sluice.core.marks import APPLY_MARK
from sluice.core.errors import ConfigError, InvalidArgument, SluiceError, StaleEpoch
from sluice.core.metrics import Metrics
from sluice.drainer.causality import Dispatcher
from sluice.drainer.sink import Checkpoint, Sink, SinkCheckpoint, sink_options
from sluice.drainer.sql import (IDEMPOTENT_DDL_ERRORS, batch_sql, create_database_sql, create_table_sql, ddl_sql,
                                ddl_target, quote_id, row_sql)
from sluice.drainer.translator import RowChange, Translator
from sluice.drainer.txn import SchemaLookup, Txn
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINT_TABLE = "sluice_checkpoint"
EPOCH_SLOT, PROGRESS_SLOT = -1, -2

# "Subquery returns more than 1 row": the fence guard of a worker transaction found a newer epoch.
FENCE_GUARD_ERROR = 1242
# Transient: the transaction (or connection) is gone and the batch can run again.
RETRYABLE_ERRORS = frozenset({1205, 1213, 1040, 1053, 1927, 2003, 2006, 2013, 2055})
# The connection cannot be used any more: reconnect before retrying.
CONNECTION_ERRORS = frozenset({1053, 1927, 2003, 2006, 2013, 2055})


@dataclasses.dataclass(frozen=True)
class MySQLSinkConfig:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    # 4, not TiDB-Binlog's 16: on 2 cores 4 workers applied the benchmark's rows with ~40% less
    # CPU (Python and mariadbd) than 16 (docs/mysql-sink.md, Throughput).
    worker_count: int = 4
    txn_batch: int = 20
    txn_batch_backlog: int = 500
    safe_mode: bool = False
    checkpoint_schema: str = "sluice"
    name: str = ""
    disable_binlog: bool = False
    read_committed: bool = True
    sql_mode: str = "STRICT_TRANS_TABLES,NO_AUTO_VALUE_ON_ZERO,NO_ENGINE_SUBSTITUTION"
    max_retries: int = 8
    retry_backoff_ms: int = 50
    retry_backoff_max_ms: int = 2000
    dispatched_upper_lead_ms: int = 3000
    connect_timeout: float = 5.0
    lock_wait_timeout: int = 10
    takeover_timeout: float = 30.0
    queue_size: int = 1024
    # Create missing databases and tables (CREATE ... IF NOT EXISTS, shape from the schema
    # history) before their first row or DDL; never alters an existing table.
    create_tables: bool = True

    def __post_init__(self) -> None:
        for key, value, low in (("worker-count", self.worker_count, 1), ("txn-batch", self.txn_batch, 1),
                                ("txn-batch-backlog", self.txn_batch_backlog, 1),
                                ("max-retries", self.max_retries, 0), ("queue-size", self.queue_size, 1),
                                ("lock-wait-timeout", self.lock_wait_timeout, 1),
                                ("dispatched-upper-lead-ms", self.dispatched_upper_lead_ms, 0)):
            if value < low:
                raise ConfigError(f"mysql sink: {key} must be >= {low}, got {value}")
        if not self.checkpoint_schema:
            raise ConfigError("mysql sink: checkpoint-schema must not be empty")


class SinkFenced(StaleEpoch):
    """A newer drainer (higher epoch) owns the downstream: this sink must stop."""


class ApplyError(SluiceError):
    """A permanent downstream error: the sink stops, naming what failed."""

    def __init__(self, target: str, commit_ts: int, what: str, error: BaseException) -> None:
        code, msg = _error_code(error), _error_message(error)
        super().__init__(f"mysql sink: {what} on {target} (commit_ts {commit_ts}) failed: "
                         f"MySQL error {code}: {msg}")
        self.target, self.commit_ts, self.mysql_code = target, commit_ts, code


class CreateTableError(ApplyError):
    """create-tables could not create a missing database or table downstream."""

    def __init__(self, kind: str, target: str, commit_ts: int, sql: str, error: BaseException) -> None:
        SluiceError.__init__(self, f"mysql sink: cannot create missing {kind} {target} (commit_ts "
                             f"{commit_ts}): MySQL error {_error_code(error)}: {_error_message(error)}; "
                             f"statement: {sql[:300]}. Create it downstream yourself (create-tables "
                             f"never alters an existing table), or set create-tables = false")
        self.target, self.commit_ts, self.mysql_code = target, commit_ts, _error_code(error)


class RetriesExhausted(SluiceError):
    def __init__(self, what: str, attempts: int, error: BaseException) -> None:
        super().__init__(f"mysql sink: {what} still failing after {attempts} attempts: "
                         f"MySQL error {_error_code(error)}: {_error_message(error)}")


def _error_code(e: BaseException) -> int:
    if isinstance(e, pymysql.err.InterfaceError):
        return 2013  # pymysql's "connection closed" carries no server code
    args = getattr(e, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


def _error_message(e: BaseException) -> str:
    args = getattr(e, "args", ())
    return str(args[1]) if len(args) > 1 else repr(e)


def _is_mysql_error(e: BaseException) -> bool:
    return isinstance(e, (pymysql.err.MySQLError, ConnectionError, OSError))


def _retryable(e: BaseException) -> bool:
    return isinstance(e, (pymysql.err.InterfaceError, ConnectionError, OSError)) or \
        _error_code(e) in RETRYABLE_ERRORS


@dataclasses.dataclass(frozen=True, slots=True)
class _DDLWork:
    commit_ts: int
    ddl: pb.DDL
    statements: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _RowsWork:
    commit_ts: int
    changes: tuple[RowChange, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _CreateWork:
    """Databases and tables to create if missing (create-tables), before what follows them."""
    commit_ts: int
    databases: tuple[str, ...]
    tables: tuple[pb.TableInfo, ...]     # the shape in force at commit_ts
    declared: bool = False               # from schema snapshots (not rows, not a DDL's target)


_IF_NOT_EXISTS = re.compile(r"\bIF\s+NOT\s+EXISTS\b", re.IGNORECASE)
# System schemas are never created nor listed as known.
_SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")


class _SinkMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.rows = metrics.counter("mysql_sink_rows_total", "Row changes committed downstream", ("kind",))
        self.txns = metrics.counter("mysql_sink_txns_total", "Source transactions dispatched")
        self.conflicts = metrics.counter("mysql_sink_conflicts_total",
                                         "Causality conflicts (each waits for the conflicting workers)")
        self.flushes = metrics.counter("mysql_sink_flushes_total", "Flushes of all workers")
        self.batch = metrics.histogram("mysql_sink_batch_seconds", "Worker batch transaction latency",
                                       buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.retries = metrics.counter("mysql_sink_retries_total", "Retried downstream transactions",
                                       ("code",))
        self.safe_mode = metrics.gauge("mysql_sink_safe_mode", "1 while applying in safe mode")
        self.applied = metrics.gauge("mysql_sink_applied_commit_ts", "Applied (durable) commit_ts")
        self.ddl = metrics.counter("mysql_sink_ddl_total", "DDL statements executed")
        self.created = metrics.counter("mysql_sink_created_total",
                                       "Missing databases and tables created (create-tables)", ("kind",))


class MySQLSink(Sink):
    name = "mysql"

    def __init__(self, options: MySQLSinkConfig, schema: SchemaLookup, epoch: int = 0,
                 name: str = "sluice", metrics: Metrics | None = None) -> None:
        self._cfg = options
        self._schema = schema
        self._epoch = int(epoch)
        self._name = options.name or name or "sluice"
        self._cp_table = f"{quote_id(options.checkpoint_schema)}.{quote_id(CHECKPOINT_TABLE)}"
        try:
            self._m = _SinkMetrics(metrics or Metrics())
        except ValueError:
            # A second sink in one process (a takeover in tests) cannot re-register the names.
            self._m = _SinkMetrics(Metrics())
        self._translator = Translator()
        self._run_id = uuid.uuid4().hex[:12]
        self._batch_ids = itertools.count(1)
        self._control: pymysql.connections.Connection | None = None
        self._workers: list[pymysql.connections.Connection | None] = [None] * options.worker_count
        self._dispatcher: Dispatcher[RowChange] | None = None
        self._boot = 0
        self._skip_upto = 0
        self._safe_until = 0
        self._upper = 0
        self._durable = 0
        self._written = 0
        self._failed: BaseException | None = None
        # create-tables: what exists downstream, as far as this sink knows. Loaded at open, added
        # to when the sink creates, and forgotten for what a DDL touches (re-checked with IF NOT
        # EXISTS at next use), so the hot path is one set lookup per table per transaction.
        self._known_tables: set[tuple[str, str]] = set()
        self._known_dbs: set[str] = set()
        # Tables this sink created from a schema snapshot and wrote no row to since. A capture
        # started from an old position declares the tables' current shapes before the binlog's
        # own CREATE TABLE / RENAME of them: that DDL then replaces the (empty) table.
        self._declared_only: set[tuple[str, str]] = set()
        self._lock = asyncio.Lock()
        self._closing = threading.Event()

    @classmethod
    def from_options(cls, options: Any, **context: Any) -> MySQLSink:
        cfg = sink_options(cls.name, options)
        schema = context.get("schema")
        if schema is None:
            raise InvalidArgument("mysql sink needs the drainer's schema lookup (context 'schema')")
        name = (context.get("drainer_name") or context.get("node_id") or context.get("source_name")
                or "sluice")
        return cls(cfg, schema, epoch=int(context.get("epoch") or 0), name=str(name),
                   metrics=context.get("metrics"))

    # -- public state -------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def safe_until(self) -> int:
        """Transactions at or below this commit_ts are applied in safe mode."""
        return self._safe_until

    @property
    def dispatched_upper(self) -> int:
        return self._upper

    @property
    def conflicts(self) -> int:
        return self._dispatcher.conflicts if self._dispatcher else 0

    @property
    def flushes(self) -> int:
        return self._dispatcher.flushes if self._dispatcher else 0

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
        under a newer epoch."""
        where = f"name={_q(self._name)} AND slot={EPOCH_SLOT}"
        return (f"START TRANSACTION;\nSELECT epoch FROM {self._cp_table} WHERE {where} LOCK IN SHARE MODE;\n"
                f"SELECT (SELECT 1 FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {self._cp_table} WHERE "
                f"{where} AND epoch={int(self._epoch)}) UNION ALL SELECT 2) AS sluice_epoch_guard")

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

    # -- open / takeover ----------------------------------------------------------------------

    async def open(self, checkpoint: Checkpoint) -> None:
        async with self._lock:
            await asyncio.to_thread(self._open_sync, checkpoint)

    def _open_sync(self, cp: Checkpoint) -> None:
        self._control = self._connect()
        with self._control.cursor() as cur:
            cur.execute("SELECT CAST(UNIX_TIMESTAMP() - VARIABLE_VALUE AS SIGNED) FROM "
                        "information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME='UPTIME'")
            self._boot = int(cur.fetchone()[0])
            cur.execute(f"{APPLY_MARK} CREATE DATABASE IF NOT EXISTS "
                        f"{quote_id(self._cfg.checkpoint_schema)}")
            cur.execute(f"""{APPLY_MARK} CREATE TABLE IF NOT EXISTS {self._cp_table} (
                name VARCHAR(191) NOT NULL,
                slot INT NOT NULL,
                epoch BIGINT NOT NULL DEFAULT 0,
                commit_ts BIGINT NOT NULL DEFAULT 0,
                dispatched_upper BIGINT NOT NULL DEFAULT 0,
                batch_id VARCHAR(64) NOT NULL DEFAULT '',
                conn_id BIGINT NOT NULL DEFAULT 0,
                server_boot BIGINT NOT NULL DEFAULT 0,
                updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
                    ON UPDATE CURRENT_TIMESTAMP(6),
                PRIMARY KEY (name, slot)) ENGINE=InnoDB""")
            cur.execute(f"INSERT IGNORE INTO {self._cp_table} (name, slot, epoch) VALUES (%s, %s, %s), "
                        f"(%s, %s, 0)", (self._name, EPOCH_SLOT, self._epoch, self._name, PROGRESS_SLOT))
        self._take_over()
        if self._cfg.create_tables:
            self._load_known()
        with self._control.cursor() as cur:
            cur.execute(f"SELECT slot, commit_ts, dispatched_upper FROM {self._cp_table} WHERE name=%s",
                        (self._name,))
            rows = cur.fetchall()
        downstream = max((int(r[1]) for r in rows if r[0] != EPOCH_SLOT), default=0)
        upper = max((int(r[2]) for r in rows if r[0] == PROGRESS_SLOT), default=0)
        start = max(cp.commit_ts, downstream)
        self._skip_upto = start
        self._durable = self._written = start
        self._upper = upper
        self._safe_until = max(upper, cp.dispatched_upper)
        safe = self._cfg.safe_mode or self._safe_until > start
        self._m.safe_mode.set(1 if safe else 0)
        self._m.applied.set(start)
        log.info("mysql sink open", extra=kv(name=self._name, epoch=self._epoch, checkpoint=cp.commit_ts, downstream_checkpoint=downstream, dispatched_upper=upper, safe_mode_until=self._safe_until if safe else 0))
        # Workers connect now, not at their first batch: open() fails fast on a downstream that
        # refuses connections, and each connection (pymysql builds a TLS context per connect,
        # tens of ms of CPU) is paid before the stream rather than in the apply path.
        for w in range(self._cfg.worker_count):
            self._worker_conn(w)
        self._dispatcher = Dispatcher(self._cfg.worker_count, self._cfg.txn_batch, self._execute,
                                      queue_size=self._cfg.queue_size, on_conflict=self._m.conflicts.inc,
                                      name=f"mysql-sink-{self._name}",
                                      max_batch=self._cfg.txn_batch_backlog)
        self._dispatcher.start(frontier=start)

    def _load_known(self) -> None:
        """The downstream's databases and tables: only the missing ones cost a CREATE later."""
        assert self._control is not None
        skip = ",".join(_q(s) for s in _SYSTEM_SCHEMAS)
        with self._control.cursor() as cur:
            cur.execute(f"SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME NOT IN ({skip})")
            self._known_dbs = {r[0] for r in cur.fetchall()}
            cur.execute(f"SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                        f"WHERE TABLE_SCHEMA NOT IN ({skip})")
            self._known_tables = {(r[0], r[1]) for r in cur.fetchall()}

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

    # -- applying -----------------------------------------------------------------------------

    async def apply(self, batch: list[Txn]) -> None:
        async with self._lock:
            self._check_usable()
            work: list[_DDLWork | _RowsWork | _CreateWork] = []
            create = self._cfg.create_tables
            # After a DDL in this call the known sets may shrink before the thread gets there:
            # from then on every table is a candidate, checked again where it is created.
            after_ddl = False
            try:
                # Translation reads the schema history, which the drainer mutates: on the loop.
                for txn in batch:
                    if txn.commit_ts <= self._skip_upto:
                        continue
                    if create and txn.prewrite.schema_snapshots:
                        declared = self._missing(txn.commit_ts, txn.prewrite.schema_snapshots, after_ddl)
                        if declared is not None:
                            work.append(declared)
                    ddl = txn.ddl
                    if ddl is not None:
                        if create:
                            target = self._ddl_target_work(txn, ddl)
                            if target is not None:
                                work.append(target)
                        work.append(self._ddl_work(txn, ddl))
                        after_ddl = True
                    changes = self._translator.translate(txn, self._schema)
                    if create and changes:
                        tables = self._row_tables(txn.commit_ts, changes, after_ddl)
                        if tables is not None:
                            work.append(tables)
                    work.append(_RowsWork(txn.commit_ts, tuple(changes)))
            except BaseException as e:
                self._failed = e
                raise
            if not work:
                return
            try:
                await asyncio.to_thread(self._apply_sync, work)
            except BaseException as e:
                self._failed = e
                raise

    # -- create-tables --------------------------------------------------------------------------

    def _missing(self, commit_ts: int, infos: Sequence[pb.TableInfo], recheck: bool) -> _CreateWork | None:
        """The tables of infos not known to exist downstream (all of them with recheck)."""
        known = self._known_tables
        todo = tuple(i for i in infos if recheck or (i.schema_name, i.table_name) not in known)
        return _CreateWork(commit_ts, (), todo, declared=True) if todo else None

    def _row_tables(self, commit_ts: int, changes: list[RowChange], recheck: bool) -> _CreateWork | None:
        """Tables the rows go to that are not known to exist downstream, with their shape at
        commit_ts (the one the rows were decoded with)."""
        known = self._known_tables
        last = None
        todo: dict[tuple[str, str], pb.TableInfo] = {}
        for ch in changes:
            shape = ch.shape
            if shape is last:
                continue
            last = shape
            key = (shape.schema, shape.table)
            if (not recheck and key in known) or key in todo:
                continue
            info = self._schema.table_at(shape.table_id, commit_ts)
            if info is None:
                continue  # cannot happen: the rows were just decoded with it
            if (info.schema_name, info.table_name) != key:
                named = pb.TableInfo()
                named.CopyFrom(info)
                named.schema_name, named.table_name = key
                info = named
            todo[key] = info
        return _CreateWork(commit_ts, (), tuple(todo.values())) if todo else None

    def _ddl_target_work(self, txn: Txn, ddl: pb.DDL) -> _CreateWork | None:
        """What a DDL needs downstream before it runs: its database (`USE db`, CREATE TABLE in a
        database that existed before the capture started), and — outside safe mode — the table
        it alters, truncates, renames or drops, if that table predates the capture and was never
        created downstream. In safe mode (a replay) the table may be missing because a later DDL
        renamed or dropped it: creating it there would leave a stray table; the DDL's "does not
        exist" error is ignored instead."""
        if ddl.tp in (pb.CREATE_DATABASE, pb.DROP_DATABASE):
            return None
        dbs = {d for d in (ddl.schema_name, ddl.old_schema_name) if d}
        tables: list[pb.TableInfo] = []
        if ddl.tp in (pb.ALTER_TABLE, pb.TRUNCATE_TABLE, pb.RENAME_TABLE, pb.DROP_TABLE) \
                and not self._is_safe(txn.commit_ts):
            before = txn.commit_ts - 1
            info = self._schema.table_at(ddl.table_id, before) if ddl.table_id else None
            if info is None and ddl.tp == pb.RENAME_TABLE:
                info = self._schema.find(ddl.old_schema_name or ddl.schema_name, ddl.old_table_name, before)
            elif info is None and ddl.table_name:
                info = self._schema.find(ddl.schema_name, ddl.table_name, before)
            if info is not None:
                tables.append(info)
        todo_dbs = tuple(sorted(d for d in dbs if d not in self._known_dbs))
        todo = tuple(i for i in tables if (i.schema_name, i.table_name) not in self._known_tables)
        return _CreateWork(txn.commit_ts, todo_dbs, todo) if todo_dbs or todo else None

    def _forget(self, ddl: pb.DDL) -> None:
        """After a DDL: what it touched is checked again at next use."""
        if ddl.tp == pb.OTHER:
            self._known_tables.clear()    # could be anything (DROP VIEW, an unparsed statement)
            self._known_dbs.clear()
        elif ddl.tp == pb.DROP_DATABASE:
            self._known_dbs.discard(ddl.schema_name)
            self._known_tables = {k for k in self._known_tables if k[0] != ddl.schema_name}
        elif ddl.tp != pb.CREATE_DATABASE:
            self._known_tables.discard((ddl.schema_name, ddl.table_name))
            self._known_tables.discard((ddl.old_schema_name or ddl.schema_name, ddl.old_table_name))

    def _run_create(self, item: _CreateWork) -> None:
        """CREATE DATABASE / TABLE IF NOT EXISTS for what is still not known to exist; never
        alters a table that exists (whatever its shape)."""
        dbs = [d for d in item.databases if d not in self._known_dbs]
        tables = [i for i in item.tables if (i.schema_name, i.table_name) not in self._known_tables]
        for info in tables:
            if info.schema_name not in self._known_dbs and info.schema_name not in dbs:
                dbs.append(info.schema_name)
        if not dbs and not tables:
            return
        for d in dbs:
            self._create_one(item.commit_ts, "database", d, create_database_sql(d))
            self._known_dbs.add(d)
        for info in tables:
            key = (info.schema_name, info.table_name)
            created = self._create_one(item.commit_ts, "table", f"{info.schema_name}.{info.table_name}",
                                       create_table_sql(info))
            self._known_tables.add(key)
            if created and item.declared:
                self._declared_only.add(key)

    def _rows_written(self, changes: tuple[RowChange, ...]) -> None:
        last = None
        for ch in changes:
            if ch.shape is not last:
                last = ch.shape
                self._declared_only.discard((last.schema, last.table))

    def _yield_declared(self, item: _DDLWork) -> None:
        """Before a CREATE TABLE or RENAME (outside safe mode) whose new name is a table this
        sink created from a schema snapshot and never wrote to: drop that table, so the DDL
        creates it as the source did (a capture started from an old position declares current
        shapes before the binlog's own CREATE TABLE)."""
        ddl = item.ddl
        if ddl.tp not in (pb.CREATE_TABLE, pb.RENAME_TABLE) or self._is_safe(item.commit_ts):
            return
        if ddl.tp == pb.CREATE_TABLE and _IF_NOT_EXISTS.search(ddl.query):
            return   # the source kept its existing table too
        key = (ddl.schema_name, ddl.table_name)
        if key not in self._declared_only:
            return
        self._declared_only.discard(key)
        target = f"{key[0]}.{key[1]}"
        self._create_one(item.commit_ts, "replaced table", target,
                         f"DROP TABLE IF EXISTS {quote_id(key[0])}.{quote_id(key[1])}")
        self._known_tables.discard(key)

    def _create_one(self, commit_ts: int, kind: str, target: str, sql: str) -> bool:
        """Run one create-tables statement; whether it did something (not "already exists")."""
        done = [False]

        def attempt(_: int) -> None:
            if self._control is None:
                self._control = self._connect()
            with self._control.cursor() as cur:
                self._begin_fenced(cur)
                cur.execute("COMMIT")
                cur.execute(f"{APPLY_MARK} {sql}")
                # IF NOT EXISTS on something that exists is a note (1007 / 1050), not an error.
                cur.execute("SHOW WARNINGS")
                existed = any(int(w[1]) in (1007, 1050) for w in cur.fetchall())
            if not existed:
                log.info("mysql sink created a missing %s" if kind != "replaced table" else
                         "mysql sink dropped a table it created from a schema snapshot: a DDL creates it",
                         kind, extra=kv(target=target, commit_ts=commit_ts, sql=sql[:500]))
                if kind != "replaced table":
                    self._m.created.labels(kind).inc()
            done[0] = not existed

        try:
            self._retry(f"create-tables on {target} (commit_ts {commit_ts})", attempt, self._control_failed)
        except (SinkFenced, RetriesExhausted):
            raise
        except BaseException as e:
            if _is_mysql_error(e):
                raise CreateTableError(kind, target, commit_ts, sql, e) from e
            raise
        return done[0]

    def _ddl_work(self, txn: Txn, ddl: pb.DDL) -> _DDLWork:
        previous = None
        if ddl.tp == pb.ALTER_TABLE and not ddl.query.strip():
            table_id = ddl.table_id or ddl.table_info.table_id
            previous = self._schema.table_at(table_id, txn.commit_ts - 1)
        try:
            statements = ddl_sql(ddl, previous)
        except ValueError as e:
            raise InvalidArgument(f"mysql sink: DDL at commit_ts {txn.commit_ts}: {e}") from None
        return _DDLWork(txn.commit_ts, ddl, tuple(statements))

    def _apply_sync(self, work: list[_DDLWork | _RowsWork | _CreateWork]) -> None:
        d = self._dispatcher
        assert d is not None
        last = work[-1].commit_ts
        lead = self._cfg.dispatched_upper_lead_ms << 18
        # A call carrying more than one batch per worker is a backlog (the drainer catching up):
        # each worker's share goes out in transactions of up to txn-batch-backlog rows.
        rows = sum(len(item.changes) for item in work if isinstance(item, _RowsWork))
        d.backlogged(rows > self._cfg.worker_count * self._cfg.txn_batch)
        txns = 0
        for item in work:
            cts = item.commit_ts
            if cts > self._upper:
                # Durable before anything beyond the old upper reaches a worker (or the DDL runs).
                self._raise_upper(max(last, cts + lead))
            if isinstance(item, _CreateWork):
                # No flush: nothing was dispatched to a table not known to exist.
                self._run_create(item)
                continue
            if isinstance(item, _DDLWork):
                d.flush()
                self._m.flushes.inc()
                if self._declared_only:
                    self._yield_declared(item)
                self._run_ddl(item)
                if self._cfg.create_tables:
                    self._forget(item.ddl)
                d.mark_done(cts)
                self._write_progress(cts)
                continue
            if self._declared_only:
                self._rows_written(item.changes)
            for change in item.changes:
                d.dispatch(change.keys, change, cts)
            d.mark_done(cts)
            txns += 1
        self._m.txns.inc(txns)
        # Partial batches are committed now rather than at the next input or flush: latency.
        d.nudge()
        if not self._cfg.safe_mode and self._safe_until and last > self._safe_until:
            self._m.safe_mode.set(0)

    def _is_safe(self, commit_ts: int) -> bool:
        return self._cfg.safe_mode or commit_ts <= self._safe_until

    def _run_ddl(self, item: _DDLWork) -> None:
        safe = self._is_safe(item.commit_ts)
        target = ddl_target(item.ddl)
        # A retry after a lost connection cannot know whether the DDL ran: replay it idempotently.
        replay = [safe]

        def attempt(n: int) -> None:
            if self._control is None:
                self._control = self._connect()
            with self._control.cursor() as cur:
                self._begin_fenced(cur)
                cur.execute("COMMIT")
                for stmt in item.statements:
                    sql = stmt if stmt.startswith("USE ") else f"{APPLY_MARK} {stmt}"
                    try:
                        cur.execute(sql)
                    except pymysql.err.MySQLError as e:
                        if (replay[0] or n > 0) and _error_code(e) in IDEMPOTENT_DDL_ERRORS:
                            log.warning("mysql sink: DDL already applied, skipped in safe mode",
                                        extra=kv(commit_ts=item.commit_ts, target=target, error=_error_code(e), sql=stmt[:200]))
                            continue
                        raise

        try:
            self._retry(f"DDL on {target} (commit_ts {item.commit_ts})", attempt, self._control_failed)
        except (SinkFenced, RetriesExhausted):
            raise
        except BaseException as e:
            if _is_mysql_error(e):
                raise ApplyError(target, item.commit_ts,
                                 f"DDL {pb.DDLType.Name(item.ddl.tp)} {item.statements[-1][:200]!r}",
                                 e) from e
            raise
        self._m.ddl.inc()
        failpoint.inject("mysql-sink-after-ddl")

    # -- workers ------------------------------------------------------------------------------

    def _execute(self, w: int, changes: list[RowChange]) -> None:
        """One worker batch = one downstream transaction (runs in worker thread w)."""
        d = self._dispatcher
        assert d is not None
        safe = [self._is_safe(c.commit_ts) for c in changes]
        statements = batch_sql(changes, safe)
        batch_id = f"{self._run_id}:{w}:{next(self._batch_ids)}"
        started = time.monotonic()

        def attempt(n: int) -> None:
            conn = self._worker_conn(w)
            with conn.cursor() as cur:
                if n:
                    cur.execute(f"SELECT batch_id FROM {self._cp_table} WHERE name=%s AND slot=%s",
                                (self._name, w))
                    row = cur.fetchone()
                    if row is not None and row[0] == batch_id:
                        return  # the lost connection had committed it
                # The applied bound is read now, so it never includes this batch: a true statement.
                body = [self._fence_sql]
                body += [s for s, _ in statements]
                body.append(f"UPDATE {self._cp_table} SET commit_ts=GREATEST(commit_ts, "
                            f"{int(d.applied())}), batch_id='{batch_id}', conn_id=CONNECTION_ID() "
                            f"WHERE name={_q(self._name)} AND slot={w}")
                failpoint.inject("mysql-sink-before-commit")
                # One round trip; the server stops at the first failing statement, so COMMIT
                # runs only when everything before it succeeded — the fence guard included.
                body.append("COMMIT")
                try:
                    cur.execute(";\n".join(body))
                    while cur.nextset():
                        pass
                except pymysql.err.MySQLError as e:
                    if _error_code(e) != FENCE_GUARD_ERROR:
                        raise
                    cur.execute("ROLLBACK")
                    cur.execute(f"SELECT epoch FROM {self._cp_table} WHERE name=%s AND slot=%s",
                                (self._name, EPOCH_SLOT))
                    raise self._fenced(cur.fetchone()) from None

        def on_error(e: BaseException) -> None:
            self._worker_failed(w, e)

        try:
            self._retry(f"worker {w} batch", attempt, on_error)
        except (SinkFenced, RetriesExhausted):
            raise
        except BaseException as e:
            if not _is_mysql_error(e):
                raise
            self._worker_failed(w, e)
            raise self._diagnose(w, changes, safe, statements, e) from e
        failpoint.inject("mysql-sink-after-commit")
        self._m.batch.observe(time.monotonic() - started)
        kinds: dict[str, int] = {}
        for c in changes:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
        for kind, n in kinds.items():
            self._m.rows.labels(kind).inc(n)

    def _worker_failed(self, w: int, e: BaseException) -> None:
        conn = self._workers[w]
        if conn is None:
            return
        if _error_code(e) in CONNECTION_ERRORS or isinstance(e, (pymysql.err.InterfaceError, OSError)):
            self._workers[w] = None
            self._close(conn)
            return
        try:
            conn.cursor().execute("ROLLBACK")
        except Exception:  # noqa: BLE001
            self._workers[w] = None
            self._close(conn)

    def _diagnose(self, w: int, changes: list[RowChange], safe: list[bool],
                  statements: list[tuple[str, list[RowChange]]], error: BaseException) -> ApplyError:
        """Replay the failed batch row by row (rolled back) to name the change that fails."""
        try:
            conn = self._worker_conn(w)
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION")
                try:
                    for change, s in zip(changes, safe):
                        for stmt in row_sql(change, s):
                            try:
                                cur.execute(stmt)
                            except pymysql.err.MySQLError as e:
                                return ApplyError(change.shape.qualified, change.commit_ts,
                                                  f"{change.kind} of a row", e)
                finally:
                    cur.execute("ROLLBACK")
        except Exception as e:  # noqa: BLE001 - the original error is what matters
            log.warning("mysql sink: could not diagnose a failed batch: %r", e)
        first = statements[0][1][0] if statements else changes[0]
        return ApplyError(first.shape.qualified, first.commit_ts, "a batch", error)

    # -- flush / checkpoint / close -----------------------------------------------------------

    async def flush(self) -> None:
        async with self._lock:
            self._check_usable()
            try:
                await asyncio.to_thread(self._flush_sync)
            except BaseException as e:
                self._failed = e
                raise

    def _flush_sync(self) -> None:
        d = self._dispatcher
        assert d is not None
        d.flush()
        self._m.flushes.inc()
        applied = d.applied()
        if applied > self._written:
            self._write_progress(applied)

    def checkpoint(self) -> SinkCheckpoint:
        applied = self._durable
        if self._dispatcher is not None and self._failed is None:
            # Everything at or below applied() is committed downstream, hence durable.
            applied = max(applied, self._dispatcher.applied())
        return SinkCheckpoint(applied, {"epoch": self._epoch, "dispatched_upper": self._upper})

    async def close(self) -> None:
        async with self._lock:
            self._closing.set()
            await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.close()
        for w, conn in enumerate(self._workers):
            self._workers[w] = None
            self._close(conn)
        conn, self._control = self._control, None
        self._close(conn)

    def _check_usable(self) -> None:
        if self._failed is not None:
            # The original error (SinkFenced, ApplyError, MissingSchema, ...) so callers can branch;
            # only a reopen from the drainer checkpoint recovers.
            raise self._failed
        if self._dispatcher is None:
            raise SluiceError("mysql sink is not open")
        err = self._dispatcher.error
        if err is not None:
            self._failed = err
            raise err


def _q(text: str) -> str:
    return "'" + escape_string(text) + "'"
