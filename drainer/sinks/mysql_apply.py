"""Applying work: DDL on the control connection, rows through the causality Dispatcher's
workers, one downstream transaction per worker batch (fenced, retried, diagnosed on failure)."""
from __future__ import annotations

import collections
import logging
import operator
import time

import pymysql

from sluice.core import failpoint
from sluice.core.log import kv
from sluice.core.marks import APPLY_MARK
from sluice.drainer.sinks.mysql_checkpoint import EPOCH_SLOT, _q
from sluice.drainer.sinks.mysql_create import _CreateTables
from sluice.drainer.sinks.mysql_errors import (CONNECTION_ERRORS, FENCE_GUARD_ERROR, ApplyError, RetriesExhausted,
                                               SinkFenced, _error_code, _is_mysql_error)
from sluice.drainer.sinks.mysql_work import _CreateWork, _DDLWork, _RowsWork
from sluice.drainer.sql import IDEMPOTENT_DDL_ERRORS, batch_sql, ddl_sql, ddl_target, row_sql
from sluice.drainer.translator import RowChange
from sluice.drainer.txn import Txn
from sluice.core.errors import InvalidArgument
from sluice.proto import sluice_pb2 as pb

_kind = operator.attrgetter("kind")

# One logger name for the whole sink, whichever part logs.
log = logging.getLogger("sluice.drainer.sinks.mysql")


class _Apply(_CreateTables):
    """DDL, dispatch and the worker batches (a part of MySQLSink)."""

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
        # A worker's batch is in commit order (drainer/causality.py), so outside safe mode and
        # past the safe-mode bound at its first change, no change of it is in safe mode.
        if not self._cfg.safe_mode and changes[0].commit_ts > self._safe_until:
            safe = [False] * len(changes)
        else:
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
        rows = self._m.rows_by_kind
        for kind, n in collections.Counter(map(_kind, changes)).items():
            rows[kind].inc(n)

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
