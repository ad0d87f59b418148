"""kill -9 and SIGSTOP stories for an application producer (tests/support/app_producer.py): a
transaction is in the database exactly when the pumps commit it, with the commit_ts of its
outbox row — also when the application dies at the worst moment and a pump must decide from the
outbox alone."""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import decode
from tests.support.cluster import CLUSTER_ID, Cluster
from tests.support.procs import PYTHON, REPO, Proc, wait_until

pytestmark = pytest.mark.timeout(120)

DB = "txn_fault"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path_factory.mktemp("txn-fault"), etcd_module.endpoint)
    try:
        c.start_tso()
        c.start_pump("pump-1", **{"txn-timeout": 1.0, "storage.sync": False})
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def db(mariadb_module):  # type: ignore[no-untyped-def]
    mariadb_module.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
    mariadb_module.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(32))", database=DB)
    return mariadb_module


class App:
    """One application process; its events are the JSON lines of its output."""

    def __init__(self, cluster: Cluster, db, name: str, ids: int, failpoints: str) -> None:  # type: ignore[no-untyped-def]
        self.outbox = f"outbox_{name.replace('-', '_')}"
        self.proc = Proc(name, [
            PYTHON, "-m", "tests.support.app_producer", "--etcd", cluster.etcd,
            "--cluster-id", str(CLUSTER_ID), "--producer-id", name,
            "--dsn", db.dsn(DB) + f"?table={self.outbox}", "--table", f"{DB}.t",
            "--first-id", str(ids), "--alive-ttl", "2",
        ], cluster.workdir / f"{name}.log", env={"SLUICE_FAILPOINTS": failpoints}, cwd=REPO).start()

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.proc.log_text().splitlines()
                if line.startswith("{")]

    def event(self, kind: str, timeout: float = 30.0) -> dict:
        def find() -> dict | None:
            for e in self.events():
                if e["event"] == kind:
                    return e
            if not self.proc.alive():
                raise AssertionError(f"app exited before {kind!r}:\n{self.proc.log_text()[-3000:]}")
            return None
        return wait_until(find, timeout, 0.05, what=f"app event {kind}")  # type: ignore[return-value]


def pump_state(cluster: Cluster, start_ts: int) -> tuple[int, int]:
    ch, stub = cluster.pumps["pump-1"].stub()
    try:
        r = stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=start_ts), timeout=5)
        return r.state, r.commit_ts
    finally:
        ch.close()


def wait_decided(cluster: Cluster, start_ts: int, timeout: float = 30.0) -> tuple[int, int]:
    return wait_until(lambda: (lambda s: s if s[0] != pb.TXN_UNKNOWN else None)(
        pump_state(cluster, start_ts)), timeout, 0.1,
        what=f"the pump to resolve start_ts={start_ts}")  # type: ignore[return-value]


def pulled(cluster: Cluster, after: int, upto: int) -> dict[int, int]:
    """start_ts -> commit_ts of everything committed in (after, upto]."""
    ch, stub = cluster.pumps["pump-1"].stub()
    out: dict[int, int] = {}
    stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=after),
                              timeout=30)
    try:
        for resp in stream:
            for b in map(decode, resp.binlogs):
                if b.tp == pb.COMMIT and b.commit_ts <= upto:
                    out[b.start_ts] = b.commit_ts
            if resp.watermark >= upto:
                break
    finally:
        stream.cancel()
        ch.close()
    return out


def test_kill9_between_db_commit_and_commit_binlog_is_resolved_committed_from_the_outbox(
        cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """The application dies after the DB COMMIT, before the Commit binlog: a pump decides from
    the outbox DSN (the application is gone) and commits it with the outbox's commit_ts."""
    app = App(cluster, db, "app-kill-after", 1, "txn-after-db-commit=exit(137)")
    try:
        begin = app.event("begin")
        assert app.proc.popen.wait(30) == 137  # type: ignore[union-attr]
        s = begin["start_ts"]
        rows = db.execute(f"SELECT commit_ts FROM {DB}.{app.outbox} WHERE start_ts = %s", (s,))
        assert len(rows) == 1 and rows[0][0] > s
        c = rows[0][0]
        assert db.execute(f"SELECT v FROM {DB}.t WHERE id = 1") == [("row-1",)]
        assert wait_decided(cluster, s) == (pb.TXN_COMMITTED, c)
        assert pulled(cluster, s - 1, c).get(s) == c
    finally:
        app.proc.stop()


def test_kill9_before_db_commit_is_rolled_back(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """The application dies with its outbox row uncommitted: the database drops the
    transaction, and a pump decides it rolled back from the outbox."""
    app = App(cluster, db, "app-kill-before", 11, "txn-before-db-commit=exit(137)")
    try:
        begin = app.event("begin")
        assert app.proc.popen.wait(30) == 137  # type: ignore[union-attr]
        s = begin["start_ts"]
        assert wait_decided(cluster, s) == (pb.TXN_ROLLED_BACK, 0)
        assert db.execute(f"SELECT COUNT(*) FROM {DB}.t WHERE id = 11") == [(0,)]
        assert db.execute(f"SELECT commit_ts FROM {DB}.{app.outbox} WHERE start_ts = %s",
                          (s,)) == [(None,)]
    finally:
        app.proc.stop()


def test_stopped_application_past_txn_timeout_never_commits(cluster: Cluster, db) -> None:  # type: ignore[no-untyped-def]
    """SIGSTOP after the prewrite, past txn-timeout and the alive TTL: the pump decides rolled
    back by writing to the outbox, so after SIGCONT the late COMMIT fails: the row is neither in
    the database nor downstream."""
    app = App(cluster, db, "app-stopped", 21, "txn-after-prewrite=1*sleep(3000)")
    try:
        s = app.event("begin")["start_ts"]
        wait_until(lambda: pump_state(cluster, s)[0] == pb.TXN_UNKNOWN, 10, 0.02,
                   what="the prewrite to reach the pump")
        os.kill(app.proc.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert wait_decided(cluster, s) == (pb.TXN_ROLLED_BACK, 0)
        assert time.monotonic() - stopped_at < 30
        os.kill(app.proc.pid, signal.SIGCONT)
        err = app.event("error")
        assert err["start_ts"] == s and err["type"] == "TxnAborted", err
        assert app.event("done")
        assert db.execute(f"SELECT COUNT(*) FROM {DB}.t WHERE id = 21") == [(0,)]
        assert db.execute(f"SELECT commit_ts FROM {DB}.{app.outbox} WHERE start_ts = %s",
                          (s,)) == [(None,)]
        assert pump_state(cluster, s) == (pb.TXN_ROLLED_BACK, 0)
    finally:
        app.proc.stop()
