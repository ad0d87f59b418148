"""Faults in the MySQL leg of the whole pipeline: source MariaDB -> capture -> pumps -> `sluice
drainer` (sink mysql) -> downstream MariaDB, under a running source load.

Start the pipeline, load the source, kill -9 / freeze the drainer (or let a failpoint kill it
between a downstream commit and its checkpoint, or after a DDL), restart or let the standby take
over, and compare the downstream with the source typed, row for row: nothing lost, nothing
doubled; a fenced drainer writes nothing.
"""
from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator

import pytest

from tests.support.cluster import DrainerHandle, fresh_ts
from tests.support.pipeline import (Pipeline, SourceWorkload, checkpoint_rows, pipeline,
                                    run_in_background, typed_rows, tables_of, wait_equal)
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(240, func_only=True)   # module setup: two MariaDBs + cluster

# Lease TTL 4 s: the active stops itself 3 s after its last acknowledged keepalive was sent;
# a standby waits 5 s (TTL + margin) once the lease is gone. 2 s was too tight for a loaded CI
# machine: an instance lost its lease (no keepalive acknowledged for 2.1 s) while taking over.
HA = {"ha": True, "alive-ttl": 4, "ha-margin": 1.0}
# Source transactions per second while the drainer is killed and restarted: a steady load, not
# a growing backlog on a busy machine.
RATE = 60


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Pipeline]:  # type: ignore[no-untyped-def]
    with pipeline(tmp_path_factory.mktemp("mysql-faults"), etcd_module.endpoint,
                  producer_id="cap-mysql-faults") as p:
        yield p


def downstream_rows(p: Pipeline, db: str, table: str = "acct") -> int:
    try:
        return int(p.downstream.execute(f"SELECT COUNT(*) FROM `{db}`.`{table}`")[0][0])
    except Exception:  # noqa: BLE001 - the table is not there yet
        return 0


def applied_ts(p: Pipeline, name: str) -> int:
    """The highest commit_ts the MySQL sink of drainer `name` recorded as applied downstream."""
    try:
        return max((r[2] for r in checkpoint_rows(p, name) if r[0] != -1), default=0)
    except Exception:  # noqa: BLE001 - the checkpoint table is not there yet
        return 0


def wait_progress(p: Pipeline, name: str, handle: DrainerHandle, timeout: float = 90) -> None:
    """Until drainer `name` applied everything committed up to now (a fresh TSO ts): with the
    source load running, its sink's recorded commit_ts passes any ts taken now."""
    now = fresh_ts(p.cluster)

    def there() -> bool:
        assert handle.proc.alive(), handle.proc.log_text()[-3000:]
        return applied_ts(p, name) >= now
    wait_until(there, timeout, 0.2, what=f"{name} to apply past ts {now}")


def last_open(handle: DrainerHandle) -> dict[str, int]:
    """The fields of the sink's latest `mysql sink open` log line."""
    line = [ln for ln in handle.proc.log_text().splitlines() if "mysql sink open" in ln][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def sink_epoch(p: Pipeline, name: str) -> int:
    """The epoch in the MySQL sink's checkpoint table (slot -1) for drainer `name`."""
    return next(r[1] for r in checkpoint_rows(p, name) if r[0] == -1)


def restart(p: Pipeline, old: DrainerHandle, db: str,
            env: dict[str, str] | None = None) -> DrainerHandle:
    """Start drainer `old.name` again (it was stopped or killed) and wait for its sink to open
    (its log is appended to: count the lines)."""
    opens = old.proc.log_text().count("mysql sink open")
    new = p.start_drainer(old.name, db, wait_online=False, env=env)
    wait_until(lambda: new.proc.log_text().count("mysql sink open") > opens
               or not new.proc.alive(), 40, 0.1, what=f"{old.name}'s sink to open again")
    assert new.proc.log_text().count("mysql sink open") > opens, new.proc.log_text()[-3000:]
    return new


def wait_exit(handle: DrainerHandle, timeout: float = 60) -> int:
    wait_until(lambda: not handle.proc.alive(), timeout, 0.1, what=f"{handle.name} to exit")
    return handle.proc.popen.returncode  # type: ignore[union-attr]


@pytest.mark.timeout(300, func_only=True)   # four drainer starts: ~20 s each on a loaded machine
def test_kill9_mid_load_and_at_sink_failpoints_restart_in_safe_mode(pipe: Pipeline) -> None:
    """After a restart every transaction at or below the stored dispatched_upper is applied in
    safe mode, so whatever a crash left half-applied converges: kill -9 mid-load, exit after a
    worker's downstream commit before the checkpoint (`mysql-sink-after-commit`), and exit after
    a DDL ran downstream before its checkpoint (`mysql-sink-after-ddl`) — each restart runs in
    safe mode and the downstream ends equal to the source."""
    db = pipe.fresh_db("crash")
    name = "d-crash"
    drainer = pipe.start_drainer(name, db)
    load = SourceWorkload(pipe.source, db, seed=21, keys=600, keyless=False)
    load.create()
    loader, stop = run_in_background(load, 1_000_000, rate=RATE)
    try:
        # 1. kill -9 mid-load.
        wait_until(lambda: downstream_rows(pipe, db) >= 100, 60, 0.1, what="rows downstream")
        drainer.proc.kill9()
        # 2. The restart runs in safe mode, then exits between a worker's downstream commit and
        #    the checkpoint.
        drainer = restart(pipe, drainer, db, {"SLUICE_FAILPOINTS": "mysql-sink-after-commit=exit(137)@40"})
        opened = last_open(drainer)
        assert opened["safe_mode_until"] > opened["checkpoint"], opened
        assert wait_exit(drainer) == 137, drainer.proc.log_text()[-3000:]
        assert "failpoint mysql-sink-after-commit fired" in drainer.proc.log_text()

        # 3. The next restart runs in safe mode, then exits after a DDL ran downstream, before
        #    its checkpoint.
        drainer = restart(pipe, drainer, db, {"SLUICE_FAILPOINTS": "mysql-sink-after-ddl=exit(137)"})
        opened = last_open(drainer)
        assert opened["safe_mode_until"] > opened["checkpoint"], opened
        ddl = SourceWorkload(pipe.source, db, seed=22)
        ddl.execute(f"ALTER TABLE `{db}`.acct ADD COLUMN extra VARCHAR(16) NOT NULL DEFAULT 'x'")
        ddl.execute(f"UPDATE `{db}`.acct SET extra = 'y' WHERE id % 2 = 0")
        ddl.close()
        assert wait_exit(drainer, 90) == 137, drainer.proc.log_text()[-3000:]
        assert "failpoint mysql-sink-after-ddl fired" in drainer.proc.log_text()
        assert pipe.downstream.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND "
            "TABLE_NAME='acct' AND COLUMN_NAME='extra'", (db,)), "the DDL should have run"

        # 4. The last restart replays the DDL idempotently (safe mode) and goes on.
        drainer = restart(pipe, drainer, db)
        opened = last_open(drainer)
        assert opened["safe_mode_until"] > opened["checkpoint"], opened
    finally:
        stop.set()
        loader.join(30)
    assert not loader.errors, loader.errors  # type: ignore[attr-defined]
    load.close()
    wait_equal(pipe, db, timeout=90, watch=(drainer.proc,))
    assert "DDL already applied, skipped in safe mode" in drainer.proc.log_text()
    drainer.proc.stop()


def start_pair(p: Pipeline, name: str, db: str,
               env_a: dict[str, str] | None = None) -> tuple[DrainerHandle, DrainerHandle]:
    t0 = fresh_ts(p.cluster)
    a = p.start_drainer(name, db, instance=f"{name}-a", env=env_a, initial_commit_ts=t0, **HA)
    b = p.start_drainer(name, db, instance=f"{name}-b", wait_online=False, initial_commit_ts=t0,
                        **HA)
    p.cluster.wait_drainer_standby(b, timeout=90)
    return a, b


def test_kill9_active_mysql_drainer_standby_takes_over(pipe: Pipeline) -> None:
    """kill -9 the active drainer under load: the standby (same name) takes over the MySQL
    downstream — a higher epoch in the sink's checkpoint table — and the downstream ends equal
    to the source."""
    db = pipe.fresh_db("ha_kill")
    name = "d-ha-kill"
    a, b = start_pair(pipe, name, db)
    load = SourceWorkload(pipe.source, db, seed=31, keys=600, keyless=False)
    load.create()
    loader, stop = run_in_background(load, 1_000_000, rate=RATE)
    try:
        wait_until(lambda: downstream_rows(pipe, db) >= 100, 60, 0.1, what="rows downstream")
        epoch = sink_epoch(pipe, name)
        a.proc.kill9()
        pipe.cluster.wait_drainer_online(b, timeout=90)
        wait_progress(pipe, name, b)
    finally:
        stop.set()
        loader.join(30)
    assert not loader.errors, loader.errors  # type: ignore[attr-defined]
    load.close()
    wait_equal(pipe, db, timeout=90, watch=(b.proc,))
    assert sink_epoch(pipe, name) == epoch + 1
    assert b.proc.stop() == 0


def binlog_tables_since(p: Pipeline, file: str, pos: int) -> set[str]:
    """`db.table` of every Table_map event in the downstream's binlog after (file, pos)."""
    out: set[str] = set()
    files = [r[0] for r in p.downstream.execute("SHOW BINARY LOGS")]
    for f in files[files.index(file):]:
        for row in p.downstream.execute(f"SHOW BINLOG EVENTS IN '{f}'" + (f" FROM {pos}" if f == file else "")):
            if row[2] == "Table_map":
                m = re.search(r"\(([^)]*)\)", row[5])
                if m:
                    out.add(m.group(1).replace("`", ""))
    return out


@pytest.mark.parametrize("stall", ["applying", "inside-worker-txn"])
def test_sigstop_active_past_ttl_then_sigcont_writes_nothing(pipe: Pipeline, stall: str) -> None:
    """A stale writer writes nothing: SIGSTOP the active drainer past its lease TTL (while
    applying, or stalled inside a worker transaction at `mysql-sink-before-commit`); the standby
    takes over and catches up; after SIGCONT the old one exits (code 3) and the downstream's data
    tables, its binlog and the sink's epoch row show no write from it."""
    db = pipe.fresh_db(f"ha_stop_{stall.replace('-', '_')}")
    name = f"d-ha-stop-{stall}"
    env_a = ({"SLUICE_FAILPOINTS": "mysql-sink-before-commit=1*sleep(6000)@30"}
             if stall == "inside-worker-txn" else None)
    a, b = start_pair(pipe, name, db, env_a)
    file0, pos0 = pipe.downstream.execute("SHOW MASTER STATUS")[0][:2]
    load = SourceWorkload(pipe.source, db, seed=41, keys=600, keyless=False)
    load.create()
    loader, stop = run_in_background(load, 1_000_000, rate=RATE)
    try:
        if env_a:
            wait_until(lambda: "failpoint mysql-sink-before-commit fired" in a.proc.log_text(),
                       60, 0.05, what="a worker to stall before its commit")
        else:
            wait_until(lambda: downstream_rows(pipe, db) >= 100, 60, 0.05, what="rows downstream")
        epoch = sink_epoch(pipe, name)
        a.proc.signal(signal.SIGSTOP)
        pipe.cluster.wait_drainer_online(b, timeout=90)
        wait_progress(pipe, name, b)
    finally:
        stop.set()
        loader.join(30)
        if a.proc.alive() and not b.proc.alive():
            a.proc.signal(signal.SIGCONT)
    assert not loader.errors, loader.errors  # type: ignore[attr-defined]
    load.close()
    try:
        wait_equal(pipe, db, timeout=90, watch=(b.proc,))
        tables = tables_of(pipe.downstream, db)
        data = {t: typed_rows(pipe.downstream, db, t) for t in tables}
        slots = [r for r in checkpoint_rows(pipe, name) if r[0] != -2]   # -2: B's own progress
        assert sink_epoch(pipe, name) == epoch + 1
        # (The binlog check below can see writes: the sinks' row events are in it.)
        assert f"{db}.acct" in binlog_tables_since(pipe, file0, pos0)
        file, pos = pipe.downstream.execute("SHOW MASTER STATUS")[0][:2]
    finally:
        a.proc.signal(signal.SIGCONT)
    assert wait_exit(a, 20) == 3, a.proc.log_text()[-3000:]
    assert "no longer certainly the active instance" in a.proc.log_text()
    # The old process is gone, but a statement it sent just before may still be running in the
    # server: give it a moment to land (or to have been killed by the takeover) before looking.
    time.sleep(1.0)
    assert {t: typed_rows(pipe.downstream, db, t) for t in tables} == data, \
        "the fenced drainer changed the downstream"
    assert not [t for t in binlog_tables_since(pipe, file, pos) if t.startswith(f"{db}.")]
    assert [r for r in checkpoint_rows(pipe, name) if r[0] != -2] == slots, \
        "the fenced drainer wrote to the sink's checkpoint table"
    assert b.proc.alive()
    assert b.proc.stop() == 0
