"""The application outbox: the durable record that decides whether a transaction committed.

An application transaction inserts `(start_ts, commit_ts)` into the outbox table inside its own
DB transaction, so the row exists exactly when the transaction's data does (DESIGN §5). Anyone
who must know the outcome of start_ts S — the application after an ambiguous COMMIT error, its
TxnStatus endpoint, a pump whose producer is gone — decides it by writing:

    INSERT INTO outbox (start_ts, commit_ts) VALUES (S, NULL)

- it succeeds → S is rolled back for good: the application's own insert of S can never succeed
  afterwards, so its DB transaction aborts;
- duplicate key → the row decides: commit_ts set → committed at commit_ts; NULL → rolled back;
- the insert waits on the row lock while the application's COMMIT is in flight; a lock wait
  timeout answers "unknown", never a guess.

Invariant kept here: **decide-by-writing never gives a wrong answer** — committed(C) only when
the application's row (S, C) is committed, rolled back only when no (S, C) row can ever commit.

Pruning keeps that true. A row is deleted only when (a) every non-offline drainer's durable
checkpoint has passed it (no pump can still hold S unresolved: a pump's watermark stays below an
unresolved start_ts, so the merge cannot pass it), and (b) S is older than `max_txn_age` by the
database clock, which is also the clock of the age guard on the application's own insert
(`record_commit`): once a rolled-back marker is pruned, a late insert of S is refused by that
guard instead of committing a transaction the pumps already dropped.
"""
from __future__ import annotations

import logging
import math
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import pymysql
from pymysql.constants import ER

from sluice.core import errors
from sluice.core.secrets import mask_dsn
from sluice.core.registry import NodeKind, NodeState, Registry
from sluice.core.ts import LOGICAL_BITS
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

DEFAULT_TABLE = "sluice_outbox"
DEFAULT_MAX_TXN_AGE_S = 600.0
PRUNE_BATCH = 1000
_IDENT = re.compile(r"^[A-Za-z0-9_$]{1,64}$")
# Client-side codes of a connection that broke: the server may or may not have acted.
CONNECTION_LOST = frozenset({2006, 2013, 2014, 2045, 2055})
ER_LOCK_WAIT_TIMEOUT = ER.LOCK_WAIT_TIMEOUT          # 1205
ER_DUP_ENTRY = ER.DUP_ENTRY                          # 1062
ER_NO_SUCH_TABLE = ER.NO_SUCH_TABLE                  # 1146


class AlreadyDecided(errors.FailedPrecondition):
    """The outbox already holds start_ts: a resolver decided the transaction (rolled back)."""


@dataclass(frozen=True)
class OutboxDSN:
    """`mysql://user:pass@host:port/db?table=sluice_outbox`, parsed. repr never shows the password."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    table: str = DEFAULT_TABLE

    @classmethod
    def parse(cls, dsn: str) -> OutboxDSN:
        try:
            u = urllib.parse.urlsplit(dsn)
            port = u.port or 3306
        except ValueError as e:
            raise errors.ConfigError(f"outbox dsn {mask_dsn(dsn)}: {e}") from None
        if u.scheme not in ("mysql", "mariadb"):
            raise errors.ConfigError(f"outbox dsn {mask_dsn(dsn)}: scheme must be mysql://")
        database = urllib.parse.unquote(u.path.lstrip("/"))
        query = urllib.parse.parse_qs(u.query)
        table = query.get("table", [DEFAULT_TABLE])[0]
        if not database or not _IDENT.match(database):
            raise errors.ConfigError(f"outbox dsn {mask_dsn(dsn)}: needs a database name "
                                     "(mysql://user:pass@host:port/db?table=...)")
        if not _IDENT.match(table):
            raise errors.ConfigError(f"outbox dsn {mask_dsn(dsn)}: invalid table name {table!r}")
        return cls(host=u.hostname or "127.0.0.1", port=port,
                   user=urllib.parse.unquote(u.username or "root"),
                   password=urllib.parse.unquote(u.password or ""), database=database, table=table)

    def __str__(self) -> str:
        return self.redacted()

    def redacted(self) -> str:
        return f"mysql://{self.user}:***@{self.host}:{self.port}/{self.database}?table={self.table}"

    def url(self) -> str:
        """The full DSN (with the password): for the registry label only, never for logs."""
        user = urllib.parse.quote(self.user, safe="")
        pw = urllib.parse.quote(self.password, safe="")
        return f"mysql://{user}:{pw}@{self.host}:{self.port}/{self.database}?table={self.table}"

    @property
    def qualified_table(self) -> str:
        return f"`{self.database}`.`{self.table}`"

    def connect(self, *, timeout_s: float = 10.0, read_timeout_s: float | None = None,
                autocommit: bool = True, **kwargs: Any) -> pymysql.connections.Connection:
        """A pymysql connection to the outbox database; Unavailable when it cannot connect."""
        try:
            return pymysql.connect(
                host=self.host, port=self.port, user=self.user, password=self.password,
                database=self.database, charset="utf8mb4", autocommit=autocommit,
                connect_timeout=max(1, int(math.ceil(timeout_s))),
                read_timeout=read_timeout_s, write_timeout=read_timeout_s, **kwargs)
        except pymysql.err.OperationalError as e:
            raise errors.Unavailable(f"outbox {self.redacted()}: cannot connect: "
                                     f"{_errtext(e)}") from None


def _errtext(e: BaseException) -> str:
    args = getattr(e, "args", ())
    if len(args) >= 2:
        return f"({args[0]}) {args[1]}"
    return str(e)


def errcode(e: BaseException) -> int:
    args = getattr(e, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


def create_table_sql(cfg: OutboxDSN) -> str:
    return (f"CREATE TABLE IF NOT EXISTS {cfg.qualified_table} ("
            "start_ts BIGINT NOT NULL PRIMARY KEY, commit_ts BIGINT NULL) ENGINE=InnoDB")


def ensure_table(cfg: OutboxDSN, conn: pymysql.connections.Connection | None = None) -> None:
    """Create the outbox table if absent (blocking)."""
    own = conn is None
    c = conn or cfg.connect()
    try:
        with c.cursor() as cur:
            cur.execute(create_table_sql(cfg))
    except pymysql.err.MySQLError as e:
        raise errors.Unavailable(f"outbox {cfg}: cannot create table: {_errtext(e)}") from None
    finally:
        if own:
            c.close()


def _age_floor_sql(max_age_ms: int) -> str:
    """SQL for the smallest start_ts (by the database clock) still young enough to commit."""
    return f"((CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) - {int(max_age_ms)}) << {LOGICAL_BITS})"


def record_commit(cur: Any, cfg: OutboxDSN, start_ts: int, commit_ts: int,
                  max_txn_age_s: float = DEFAULT_MAX_TXN_AGE_S) -> None:
    """Insert (start_ts, commit_ts) inside the caller's DB transaction: its point of no return.

    Raises AlreadyDecided when a resolver already wrote start_ts (the transaction must abort),
    and errors.FailedPrecondition when start_ts is older than max_txn_age by the database clock
    (its rolled-back marker may already be pruned, so it must not commit).
    """
    try:
        n = cur.execute(
            f"INSERT INTO {cfg.qualified_table} (start_ts, commit_ts) SELECT %s, %s FROM DUAL "
            f"WHERE %s >= {_age_floor_sql(int(max_txn_age_s * 1000))}",
            (start_ts, commit_ts, start_ts))
    except pymysql.err.IntegrityError as e:
        if errcode(e) == ER_DUP_ENTRY:
            raise AlreadyDecided(f"start_ts {start_ts} was already decided in outbox {cfg} "
                                 "(rolled back by a resolver while this transaction was "
                                 "open)") from None
        raise
    if n != 1:
        raise errors.FailedPrecondition(
            f"start_ts {start_ts} is older than max-txn-age {max_txn_age_s:g}s by the database "
            f"clock: too late to commit it")


def decide_by_writing(dsn: str | OutboxDSN, start_ts: int, timeout_s: float = 5.0) -> tuple[int, int]:
    """(pb.TxnState value, commit_ts) of start_ts, decided by writing to the outbox (blocking).

    TXN_COMMITTED with its commit_ts, TXN_ROLLED_BACK (commit_ts 0), or TXN_UNKNOWN when the
    application's COMMIT held the row lock longer than the lock wait (ask again later). Raises
    errors.Unavailable when the database cannot be reached. Takes at most about timeout_s.
    """
    cfg = OutboxDSN.parse(dsn) if isinstance(dsn, str) else dsn
    if start_ts <= 0:
        raise errors.InvalidArgument(f"start_ts must be > 0, got {start_ts}")
    # innodb_lock_wait_timeout is whole seconds; leave room for connecting and the reads.
    lock_wait = max(1, int(timeout_s * 0.6))
    conn = cfg.connect(timeout_s=max(1.0, timeout_s - lock_wait), read_timeout_s=lock_wait + 2.0,
                       init_command=f"SET SESSION innodb_lock_wait_timeout = {lock_wait}")
    try:
        for _ in range(3):
            try:
                with conn.cursor() as cur:
                    cur.execute(f"INSERT INTO {cfg.qualified_table} (start_ts, commit_ts) "
                                "VALUES (%s, NULL)", (start_ts,))
                log.info("outbox %s: start_ts=%d had no row: decided rolled back", cfg.table,
                         start_ts)
                return pb.TXN_ROLLED_BACK, 0
            except pymysql.err.IntegrityError as e:
                if errcode(e) != ER_DUP_ENTRY:
                    raise
            with conn.cursor() as cur:
                cur.execute(f"SELECT commit_ts FROM {cfg.qualified_table} WHERE start_ts = %s",
                            (start_ts,))
                row = cur.fetchone()
            if row is None:
                continue    # pruned between the insert and the read: decide again
            if row[0] is None:
                return pb.TXN_ROLLED_BACK, 0
            return pb.TXN_COMMITTED, int(row[0])
        return pb.TXN_UNKNOWN, 0
    except pymysql.err.MySQLError as e:
        code = errcode(e)
        if code == ER_LOCK_WAIT_TIMEOUT:
            log.info("outbox %s: start_ts=%d is locked by an in-flight commit: unknown",
                     cfg.table, start_ts)
            return pb.TXN_UNKNOWN, 0
        if code == ER_NO_SUCH_TABLE:
            # No outbox table: nothing ever committed through it. Create it and decide.
            ensure_table(cfg, conn)
            return decide_by_writing(cfg, start_ts, timeout_s)
        raise errors.Unavailable(f"outbox {cfg}: deciding start_ts={start_ts} failed: "
                                 f"{_errtext(e)}") from None
    finally:
        try:
            conn.close()
        except pymysql.err.Error:
            pass


def min_drainer_checkpoint(registry: Registry) -> int | None:
    """The smallest durable checkpoint of the non-offline drainers; None when there is none."""
    drainers, _ = registry.list(NodeKind.DRAINER)
    points = [d.status.checkpoint for d in drainers if d.status.state != NodeState.OFFLINE]
    return min(points) if points else None


def prune(cfg: OutboxDSN, upto_commit_ts: int, max_txn_age_s: float = DEFAULT_MAX_TXN_AGE_S,
          batch: int = PRUNE_BATCH, max_batches: int = 100) -> int:
    """Delete rows the drainers have passed and no transaction can still need (blocking).

    Committed rows with commit_ts <= upto_commit_ts and rolled-back markers with start_ts <=
    upto_commit_ts, both only when older than max_txn_age by the database clock. Deletes in
    batches of `batch` rows (short row locks), at most max_batches per call; returns the count.
    """
    floor = _age_floor_sql(int(max_txn_age_s * 1000))
    total = 0
    conn = cfg.connect()
    try:
        with conn.cursor() as cur:
            for sql in (f"DELETE FROM {cfg.qualified_table} WHERE commit_ts IS NOT NULL AND "
                        f"commit_ts <= %s AND start_ts < {floor} LIMIT {int(batch)}",
                        f"DELETE FROM {cfg.qualified_table} WHERE commit_ts IS NULL AND "
                        f"start_ts <= %s AND start_ts < {floor} LIMIT {int(batch)}"):
                for _ in range(max_batches):
                    n = cur.execute(sql, (upto_commit_ts,))
                    total += n
                    if n < batch:
                        break
    except pymysql.err.MySQLError as e:
        if errcode(e) == ER_NO_SUCH_TABLE:
            return total
        raise errors.Unavailable(f"outbox {cfg}: prune failed: {_errtext(e)}") from None
    finally:
        conn.close()
    return total


def prune_once(cfg: OutboxDSN, registry: Registry,
               max_txn_age_s: float = DEFAULT_MAX_TXN_AGE_S) -> int:
    """One pruning round against the registry's drainer checkpoints (blocking)."""
    upto = min_drainer_checkpoint(registry)
    if not upto:
        return 0  # no drainer has durably consumed anything: every row may still be needed
    started = time.monotonic()
    n = prune(cfg, upto, max_txn_age_s)
    if n:
        log.info("outbox %s: pruned %d rows up to checkpoint %d in %.3fs", cfg.table, n, upto,
                 time.monotonic() - started)
    return n
