"""MySQL / MariaDB sink: causality-parallel, batched, typed, fenced and crash-safe (docs/mysql-sink.md).

The sink's lifecycle (open, apply, flush, checkpoint, close); its parts: mysql_config.py,
mysql_errors.py, mysql_checkpoint.py (checkpoint table, fencing, durable progress, takeover),
mysql_create.py (create-tables), mysql_apply.py (DDL, dispatch, worker batches), mysql_work.py.

Invariants kept here:
- The downstream checkpoint never runs ahead of the data: the sink reports (and writes to
  `<checkpoint-schema>.sluice_checkpoint`) a commit_ts only when every worker has committed every
  change of every transaction at or below it (Dispatcher.applied()).
- Before a change with commit_ts above the durable `dispatched_upper` is dispatched, the upper is
  raised durably in the downstream. After a restart every transaction at or below the stored
  upper is applied in safe mode (idempotent REPLACE / DELETE+REPLACE, DDL errors meaning
  "already done" ignored), so whatever a crash left half-applied converges.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import uuid
from typing import Any

import pymysql

from sluice.core.errors import InvalidArgument, SluiceError
from sluice.core.log import kv
from sluice.core.marks import APPLY_MARK
from sluice.core.metrics import Metrics
from sluice.drainer.causality import Dispatcher
from sluice.drainer.sink import Checkpoint, Sink, SinkCheckpoint, sink_options
from sluice.drainer.sinks.mysql_apply import _Apply
from sluice.drainer.sinks.mysql_checkpoint import CHECKPOINT_TABLE, EPOCH_SLOT, PROGRESS_SLOT
from sluice.drainer.sinks.mysql_config import MySQLSinkConfig
from sluice.drainer.sinks.mysql_errors import (CONNECTION_ERRORS, FENCE_GUARD_ERROR, RETRYABLE_ERRORS, ApplyError,
                                               CreateTableError, RetriesExhausted, SinkFenced)
from sluice.drainer.sinks.mysql_work import _CreateWork, _DDLWork, _RowsWork
from sluice.drainer.sql import quote_id
from sluice.drainer.translator import DELETE, INSERT, UPDATE, UPSERT, RowChange, Translator
from sluice.drainer.txn import SchemaLookup, Txn

# Re-exported: `from sluice.drainer.sinks.mysql import X` keeps working for every public name.
__all__ = ["ApplyError", "CHECKPOINT_TABLE", "CONNECTION_ERRORS", "CreateTableError", "EPOCH_SLOT",
           "FENCE_GUARD_ERROR", "MySQLSink", "MySQLSinkConfig", "PROGRESS_SLOT", "RETRYABLE_ERRORS",
           "RetriesExhausted", "SinkFenced"]

log = logging.getLogger(__name__)


class _SinkMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.rows = metrics.counter("mysql_sink_rows_total", "Row changes committed downstream", ("kind",))
        # Each worker batch counts its rows per kind: the labelled children looked up once.
        self.rows_by_kind = {k: self.rows.labels(k) for k in (INSERT, UPDATE, DELETE, UPSERT)}
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


class MySQLSink(_Apply, Sink):
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
                    if create and txn.has_schema_snapshots:
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
