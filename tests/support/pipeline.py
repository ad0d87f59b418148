"""The whole pipeline for end-to-end tests: source MariaDB -> `sluice capture` -> pumps ->
`sluice drainer` (sink mysql) -> a second, downstream MariaDB; and typed comparisons of the two.

One `Pipeline` per test module (etcd, TSO, pumps, source, downstream, one capture reading the
source from `latest`); each test makes its own source database and runs its own drainer whose
`do-db` holds only that database, so tests never see each other's rows downstream.

Comparisons read both servers with pymysql's typed conversions (Decimal, datetime, timedelta,
bytes, int, float) plus an IS NULL flag per column, so a value that converts to None on one side
(a zero date) still differs from a real NULL on the other.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
from pymysql.constants import CLIENT

from tests.support.capture import start_capture, wait_streaming
from tests.support.cluster import Cluster, DrainerHandle, fresh_ts, running_cluster
from tests.support.mariadb import MariaDBServer
from tests.support.procs import Proc, wait_until

PUMPS = ["pump-1", "pump-2", "pump-3"]
_names = itertools.count(1)


@dataclasses.dataclass
class Pipeline:
    cluster: Cluster
    source: MariaDBServer
    downstream: MariaDBServer
    capture: Proc

    def fresh_db(self, prefix: str) -> str:
        """A database name not used before in this module (dropped on both sides, if present)."""
        db = f"{prefix}_{next(_names)}"
        for server in (self.source, self.downstream):
            server.execute(f"DROP DATABASE IF EXISTS `{db}`")
        return db

    def start_drainer(self, name: str, db: str | list[str], *, instance: str | None = None,
                      env: dict[str, str] | None = None, wait_online: bool = True,
                      initial_commit_ts: int | None = None, **settings: object) -> DrainerHandle:
        """A `sluice drainer` with sink mysql into the downstream, replicating `db` only
        (`do-db`), 16 workers, batches of 20; checkpoint schema `<name>_cp`. A restart (same
        name / instance, no initial ts) keeps the first start's settings."""
        key = instance or name
        if key not in self.cluster.drainers:
            dbs = [db] if isinstance(db, str) else list(db)
            base: dict[str, object] = {
                "to.port": self.downstream.port, "to.user": self.downstream.user,
                "to.password": self.downstream.password,
                "to.checkpoint-schema": f"{name.replace('-', '_')}_cp",
                "to.worker-count": 16, "to.txn-batch": 20, "to.retry-backoff-ms": 20,
                "filter.do-db": dbs, "txn-batch": 512,
                "initial-commit-ts": fresh_ts(self.cluster) if initial_commit_ts is None
                else initial_commit_ts,
            }
            settings = {**base, **settings}
        handle = self.cluster.start_drainer(name, sink="mysql", instance=instance, env=env,
                                            wait_online=False, **settings)
        if wait_online:
            # Generous: on a loaded 2-core machine a drainer's start takes tens of seconds.
            self.cluster.wait_drainer_online(handle, timeout=90)
        return handle


@contextlib.contextmanager
def pipeline(workdir: Path, etcd_endpoint: str, pumps: list[str] | None = None,
             producer_id: str = "cap-e2e", before_capture: Callable[[MariaDBServer], None] | None = None,
             **capture_settings: object) -> Iterator[Pipeline]:
    """Start everything a module needs; stop it all (by pid) at the end. `before_capture` runs
    on the source before the capture starts (tables that predate it, for a snapshot)."""
    pumps = pumps or PUMPS
    # A private tmpdir each: the servers' internal temporary tables (information_schema
    # queries, ALTERs) are files named by pid and thread id, and in the shared /tmp another
    # suite's cleanup removed one under a running server (SIGSEGV in ha_maria::drop_table).
    for name in ("source-tmp", "downstream-tmp"):
        (workdir / name).mkdir(parents=True, exist_ok=True)
    source = MariaDBServer(workdir / "source", server_id=1,
                           extra_args=[f"--tmpdir={workdir / 'source-tmp'}"])
    downstream = MariaDBServer(workdir / "downstream", server_id=2,
                               extra_args=["--gtid-domain-id=2",
                                           f"--tmpdir={workdir / 'downstream-tmp'}"])
    try:
        # One after the other: concurrent mariadb-install-db runs collide on temporary tables
        # in the shared /tmp.
        source.start()
        downstream.start()
        if before_capture is not None:
            before_capture(source)
        with running_cluster(workdir / "cluster", etcd_endpoint, pumps) as cluster:
            cap = start_capture(cluster, source, producer_id, **capture_settings)
            wait_streaming(cap)
            yield Pipeline(cluster, source, downstream, cap)
    finally:
        for s in (source, downstream):
            with contextlib.suppress(Exception):
                s.stop()


# ------------------------------------------------------------------------------------------------
# typed table comparisons
# ------------------------------------------------------------------------------------------------

def _query(conn: Any, sql: str, args: Any = None) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return [tuple(r) for r in cur.fetchall()]


def _conn(server: MariaDBServer | Any) -> tuple[Any, bool]:
    """(connection, whether we opened it): the comparisons take a server or an open connection
    (each pymysql connect costs tens of ms of CPU: a polling loop reuses one)."""
    if isinstance(server, MariaDBServer):
        return server.connect(), True
    return server, False


def tables_of(server: MariaDBServer | Any, db: str) -> list[str]:
    conn, own = _conn(server)
    try:
        return sorted(r[0] for r in _query(
            conn, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s", (db,)))
    finally:
        if own:
            conn.close()


def columns_of(server: MariaDBServer | Any, db: str, table: str) -> list[tuple[str, str, str]]:
    """(name, column type, nullable) in ordinal order."""
    conn, own = _conn(server)
    try:
        return _query(conn, "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM "
                            "information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s "
                            "ORDER BY ORDINAL_POSITION", (db, table))
    finally:
        if own:
            conn.close()


def _qid(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def typed_rows(server: MariaDBServer | Any, db: str, table: str) -> list[tuple]:
    """Every row as a tuple of pymysql-typed values followed by one IS NULL flag per column,
    sorted (by repr: rows of a keyless table may repeat and mix types)."""
    conn, own = _conn(server)
    try:
        cols = [c[0] for c in columns_of(conn, db, table)]
        flags = ",".join(f"{_qid(c)} IS NULL" for c in cols)
        return sorted(_query(conn, f"SELECT *, {flags} FROM {_qid(db)}.{_qid(table)}"), key=repr)
    finally:
        if own:
            conn.close()


def differences(source: MariaDBServer | Any, downstream: MariaDBServer | Any, db: str,
                tables: list[str] | None = None) -> list[str]:
    """What differs between the source's and the downstream's `db` (all its tables, or these):
    table set, column shapes, rows (as multisets: keyless tables may hold equal rows). Empty
    when equal."""
    src, own_src = _conn(source)
    dst, own_dst = _conn(downstream)
    try:
        out: list[str] = []
        names = tables if tables is not None else tables_of(src, db)
        if tables is None:
            got = tables_of(dst, db)
            if got != names:
                out.append(f"{db}: tables differ: source {names}, downstream {got}")
        for t in names:
            sc, dc = columns_of(src, db, t), columns_of(dst, db, t)
            if sc != dc:
                out.append(f"{db}.{t}: columns differ: source {sc}, downstream {dc}")
                continue
            want, have = typed_rows(src, db, t), typed_rows(dst, db, t)
            if want != have:
                missing = list((Counter(want) - Counter(have)).elements())
                extra = list((Counter(have) - Counter(want)).elements())
                out.append(f"{db}.{t}: {len(want)} source rows, {len(have)} downstream; "
                           f"{len(missing)} missing, e.g. {missing[:3]}; {len(extra)} extra "
                           f"(or doubled), e.g. {extra[:3]}")
        return out
    finally:
        if own_src:
            src.close()
        if own_dst:
            dst.close()


def wait_equal(p: Pipeline, db: str, timeout: float = 60, tables: list[str] | None = None,
               watch: tuple[Proc, ...] = ()) -> None:
    """Until the downstream's `db` equals the source's (typed, row for row); fails with the
    differences (and the drainer's log tail if a watched process died)."""
    last: list[list[str]] = [[]]
    src, dst = p.source.connect(), p.downstream.connect()

    def equal() -> bool:
        for proc in (p.capture, *watch):
            assert proc.alive(), f"{proc.name} exited:\n{proc.log_text()[-4000:]}"
        last[0] = differences(src, dst, db, tables)
        return not last[0]
    try:
        wait_until(equal, timeout, 0.5, what=f"the downstream {db} to equal the source")
    except TimeoutError as e:
        # No differences recorded: the comparison itself kept failing (its error is in e).
        raise AssertionError("\n".join(last[0]) or str(e)) from None
    finally:
        src.close()
        dst.close()


def checkpoint_rows(p: Pipeline, name: str, drainer: str | None = None) -> list[tuple]:
    """The MySQL sink's rows in the downstream checkpoint table of drainer `name`."""
    schema = f"{name.replace('-', '_')}_cp"
    return [tuple(r) for r in p.downstream.execute(
        f"SELECT slot, epoch, commit_ts, dispatched_upper, batch_id, conn_id FROM "
        f"`{schema}`.sluice_checkpoint WHERE name=%s ORDER BY slot", (drainer or name,))]


# ------------------------------------------------------------------------------------------------
# a random source workload
# ------------------------------------------------------------------------------------------------

class SourceWorkload:
    """Random source transactions over four tables of one database, each sent as one
    multi-statement round trip (BEGIN; ...; COMMIT):

    - `acct`   INT primary key, nullable UNIQUE email, DECIMAL, DATETIME(6), TEXT;
    - `ledger` composite primary key;
    - `tags`   no primary key, a NOT NULL unique key (its identity);
    - `events` no key at all (the sink keys it by the full row image).

    Transactions mix inserts, updates, deletes, primary-key changes (UPDATE ... SET id), two
    rows swapping their unique emails through NULL inside one transaction, and a delete followed
    by a re-insert of the same key in the next transaction. Only keys are tracked here: the
    expectation is the source itself."""

    TABLES = (
        "CREATE TABLE `{db}`.acct (id INT NOT NULL PRIMARY KEY, email VARCHAR(40) NULL UNIQUE, "
        "bal DECIMAL(14,2) NOT NULL, seen DATETIME(6) NULL, note TEXT NULL) ENGINE=InnoDB",
        "CREATE TABLE `{db}`.ledger (acct INT NOT NULL, seq INT NOT NULL, amount BIGINT NOT NULL, "
        "memo VARCHAR(32) NULL, PRIMARY KEY (acct, seq)) ENGINE=InnoDB",
        "CREATE TABLE `{db}`.tags (tag VARCHAR(24) NOT NULL, weight INT NULL, "
        "UNIQUE KEY uk_tag (tag)) ENGINE=InnoDB",
        "CREATE TABLE `{db}`.events (kind VARCHAR(8) NULL, n INT NULL) ENGINE=InnoDB",
    )

    def __init__(self, server: MariaDBServer, db: str, seed: int = 1, keys: int = 2000,
                 keyless: bool = True) -> None:
        self.server, self.db = server, db
        # Crash tests leave the keyless table out: safe mode cannot make a replayed insert into
        # a table without a key idempotent (docs/mysql-sink.md), so a restart may double a row.
        self.keyless = keyless
        self.rng = random.Random(seed)
        self.keys = keys
        self.conn = pymysql.connect(host="127.0.0.1", port=server.port, user=server.user,
                                    password=server.password, charset="utf8mb4", autocommit=True,
                                    database=None, client_flag=CLIENT.MULTI_STATEMENTS)
        self.acct: dict[int, str | None] = {}          # id -> email
        self.emails: dict[str, int] = {}
        self.ledger: set[tuple[int, int]] = set()
        self.tags: set[str] = set()
        self.events: list[tuple[str | None, int]] = []
        self.deleted: list[int] = []                   # acct ids to re-insert soon
        self.ledger_memo = True                        # False once a test drops ledger.memo
        self.committed = 0

    def create(self) -> None:
        self.execute(f"CREATE DATABASE IF NOT EXISTS `{self.db}`")
        for sql in self.TABLES:
            self.execute(sql.format(db=self.db))

    def execute(self, sql: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql)
            while cur.nextset():
                pass

    def commit_retrying(self, sql: str, attempts: int = 5) -> None:
        """One transaction, retried as an application would when InnoDB chose it as a deadlock
        victim (1213) or its lock wait timed out (1205): the server rolled it back whole, so the
        same statements run again (the workload's model of the rows stays right). A test's own
        concurrent UPDATE on the source can make either happen."""
        for attempt in range(1, attempts + 1):
            try:
                self.execute(sql)
                return
            except pymysql.err.OperationalError as e:
                if e.args[0] not in (1205, 1213) or attempt == attempts:
                    raise
                self.conn.rollback()
                time.sleep(0.05 * attempt)

    def close(self) -> None:
        self.conn.close()

    # statements -----------------------------------------------------------------------------

    @staticmethod
    def _lit(v: Any) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, str):
            return "'" + pymysql.converters.escape_string(v) + "'"
        return str(v)

    def _new_email(self) -> str | None:
        if self.rng.random() < 0.25:
            return None
        while True:
            e = f"u{self.rng.randrange(self.keys * 4)}@x"
            if e not in self.emails:
                return e

    def _insert_acct(self, i: int) -> str:
        r = self.rng
        email = self._new_email()
        self.acct[i] = email
        if email is not None:
            self.emails[email] = i
        seen = dt.datetime(2024, 1, 1) + dt.timedelta(microseconds=r.randrange(10**14))
        note = r.choice([None, "", "ünïcødé 🚀", "it's \\ quoted", "x" * r.randrange(200)])
        return (f"INSERT INTO `{self.db}`.acct (id, email, bal, seen, note) VALUES ({i}, {self._lit(email)}, "
                f"{r.randrange(-10**9, 10**9)}.{r.randrange(100):02d}, '{seen.isoformat(' ')}', "
                f"{self._lit(note)})")

    def _acct(self) -> list[str]:
        r = self.rng.random()
        d = self.db
        if self.deleted and r < 0.1:
            # Delete then re-insert the same key, in two transactions (TiDB-Binlog's case 1).
            i = self.deleted.pop()
            if i not in self.acct:
                return [self._insert_acct(i)]
        if len(self.acct) < 50 or r < 0.35:
            i = self.rng.randrange(self.keys)
            if i in self.acct:
                return [f"UPDATE `{d}`.acct SET bal = bal + 1 WHERE id = {i}"]
            return [self._insert_acct(i)]
        i = self.rng.choice(list(self.acct))
        if r < 0.5:
            email = self.acct.pop(i)
            if email is not None:
                del self.emails[email]
            self.deleted.append(i)
            return [f"DELETE FROM `{d}`.acct WHERE id = {i}"]
        if r < 0.6:
            # Primary-key change; sometimes the old key comes back at once (3 -> 4, insert 3).
            j = self.rng.randrange(self.keys)
            if j in self.acct:
                return []
            email = self.acct.pop(i)
            self.acct[j] = email
            if email is not None:
                self.emails[email] = j
            out = [f"UPDATE `{d}`.acct SET id = {j} WHERE id = {i}"]
            if self.rng.random() < 0.3:
                out.append(self._insert_acct(i))
            return out
        if r < 0.72 and len(self.emails) >= 2:
            # Two rows swap their unique emails inside one transaction.
            a, b = self.rng.sample(sorted(self.emails), 2)
            ia, ib = self.emails[a], self.emails[b]
            self.emails[a], self.emails[b] = ib, ia
            self.acct[ia], self.acct[ib] = b, a
            return [f"UPDATE `{d}`.acct SET email = NULL WHERE id = {ia}",
                    f"UPDATE `{d}`.acct SET email = '{a}' WHERE id = {ib}",
                    f"UPDATE `{d}`.acct SET email = '{b}' WHERE id = {ia}"]
        return [f"UPDATE `{d}`.acct SET bal = bal - 3, note = {self._lit(self.rng.choice(['n', None, 'é']))}, "
                f"seen = NOW(6) WHERE id = {i}"]

    def _ledger(self) -> list[str]:
        d = self.db
        key = (self.rng.randrange(self.keys // 10), self.rng.randrange(20))
        if key not in self.ledger:
            self.ledger.add(key)
            amount = self.rng.randint(-2**63, 2**63 - 1)
            if not self.ledger_memo:
                return [f"INSERT INTO `{d}`.ledger (acct, seq, amount) VALUES ({key[0]}, {key[1]}, {amount})"]
            return [f"INSERT INTO `{d}`.ledger (acct, seq, amount, memo) VALUES ({key[0]}, {key[1]}, "
                    f"{amount}, {self._lit(self.rng.choice([None, 'm', '🚀']))})"]
        where = f"acct = {key[0]} AND seq = {key[1]}"
        r = self.rng.random()
        if r < 0.4:
            self.ledger.discard(key)
            return [f"DELETE FROM `{d}`.ledger WHERE {where}"]
        if r < 0.55:
            new = (key[0], key[1] + 100 + self.rng.randrange(1000))
            if new in self.ledger:
                return []
            self.ledger.discard(key)
            self.ledger.add(new)
            return [f"UPDATE `{d}`.ledger SET seq = {new[1]} WHERE {where}"]
        return [f"UPDATE `{d}`.ledger SET amount = {self.rng.randint(-1000, 1000)} WHERE {where}"]

    def _tags(self) -> list[str]:
        d = self.db
        tag = f"t{self.rng.randrange(self.keys // 5)}"
        if tag not in self.tags:
            self.tags.add(tag)
            return [f"INSERT INTO `{d}`.tags VALUES ('{tag}', {self.rng.randrange(10)})"]
        r = self.rng.random()
        if r < 0.4:
            self.tags.discard(tag)
            return [f"DELETE FROM `{d}`.tags WHERE tag = '{tag}'"]
        if r < 0.6:
            new = f"t{self.rng.randrange(self.keys // 5)}"
            if new in self.tags:
                return []
            self.tags.discard(tag)
            self.tags.add(new)
            return [f"UPDATE `{d}`.tags SET tag = '{new}' WHERE tag = '{tag}'"]
        return [f"UPDATE `{d}`.tags SET weight = {self.rng.randrange(10)} WHERE tag = '{tag}'"]

    def _events(self) -> list[str]:
        d = self.db
        if not self.events or self.rng.random() < 0.5:
            row = (self.rng.choice(["a", "b", None]), self.rng.randrange(50))
            self.events.append(row)
            return [f"INSERT INTO `{d}`.events (kind, n) VALUES ({self._lit(row[0])}, {row[1]})"]
        i = self.rng.randrange(len(self.events))
        kind, n = self.events[i]
        where = f"kind {'IS NULL' if kind is None else '= ' + self._lit(kind)} AND n = {n}"
        if self.rng.random() < 0.5:
            del self.events[i]
            return [f"DELETE FROM `{d}`.events WHERE {where} LIMIT 1"]
        new = self.rng.randrange(50)
        self.events[i] = (kind, new)
        return [f"UPDATE `{d}`.events SET n = {new} WHERE {where} LIMIT 1"]

    def transaction(self) -> list[str]:
        out: list[str] = []
        while not out:
            for _ in range(self.rng.randint(1, 3)):
                table = self.rng.choice(("acct", "acct", "ledger", "tags", "events")
                                        if self.keyless else ("acct", "acct", "ledger", "tags"))
                out += getattr(self, f"_{table}")()
        return out

    def run(self, n: int, stop: threading.Event | None = None, rate: float = 0) -> int:
        """n transactions (fewer if `stop` is set), at most `rate` per second if given; returns
        how many were committed."""
        done = 0
        started = time.monotonic()
        for _ in range(n):
            if stop is not None and stop.is_set():
                break
            self.commit_retrying("START TRANSACTION;" + ";".join(self.transaction()) + ";COMMIT")
            done += 1
            if rate:
                ahead = started + done / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        self.committed += done
        return done


def run_in_background(load: SourceWorkload, n: int,
                      rate: float = 0) -> tuple[threading.Thread, threading.Event]:
    """load.run(n, rate=rate) on a thread; set the event to stop early; the thread's `errors`
    holds what it raised."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            load.run(n, stop, rate)
        except BaseException as e:  # noqa: BLE001 - the test re-raises it through `errors`
            errors.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t, stop

