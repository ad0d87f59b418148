"""The fault matrix's cluster, workload and checks (tests/fault/test_matrix.py).

One real cluster: etcd, two TSOs, three pumps (replicas 1), a source MariaDB read by `sluice
capture`, a Spark drainer with a standby (HA, one name) writing Iceberg tables (the embedded
catalog in the name's warehouse), and a MySQL
drainer into a second MariaDB. `MatrixLoad` keeps a rate-limited random workload running on the
source on a thread; `Matrix.probe` writes a probe row and waits until both drainers have it
durably, which is how each fault step proves the pipeline recovered before the next.

Random choices (which pump, kill timing, failpoint hit counts) come from one seed, printed, so a
failing run can be repeated with SLUICE_MATRIX_SEED=<seed>.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.core.etcd import Etcd
from sluice.core.registry import Registry
from sluice.core.tso_client import read_leader
from sluice.drainer import ha
from sluice.drainer.checkpoint import read_checkpoint
from sluice.drainer.txn import Txn
from tests.support.capture import (PumpLog, SourceLoad, gtid_of, gtid_pos, source_table,
                                   start_capture)
from tests.support.cluster import Cluster, DrainerHandle, fresh_ts, set_args
from tests.support.mariadb import MariaDBServer
from tests.support.procs import Proc, free_port, port_open, sluice_argv, wait_until

SCHEMA = "mx"
TABLES = ("acct", "item", "log", "probe")
PRODUCER = "cap-mx"
SPARK = "d-spark"
MYSQL = "d-mysql"
PUMPS = ("pump-1", "pump-2", "pump-3")
TSOS = ("tso-1", "tso-2")
# Lease TTL 5 s: an active drainer stops itself 4 s after its last acknowledged keepalive was
# sent; a standby campaigns 6 s after the lease is gone. (2 s lost leases to a starved etcd on
# a loaded 2-core machine: a takeover nobody asked for, and one more Spark session to start.)
HA = {"ha": True, "alive-ttl": 5, "ha-margin": 1.0}
TSO_LEASE_S = 3
EXIT_FENCED = 3                       # drainer/node_state.py: a stale HA drainer's exit code
# A Spark session starts in 20-40 s on an idle 2-core machine, minutes when it is loaded.
SPARK_START_S = 900.0
# A probe lands in the MySQL downstream within seconds, in Spark within a few batches; both
# take minutes when other test runs load the machine.
PROBE_S = 300.0


def until(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.2) -> None:
    """wait_until, except that an AssertionError (a process died, the workload failed) ends
    the wait at once instead of being retried until the deadline."""
    def check() -> object:
        try:
            return cond()
        except AssertionError as e:
            raise _Fatal(e) from e
    try:
        wait_until(check, timeout, interval, what=what)
    except _Fatal as e:
        raise e.args[0] from None


class _Fatal(BaseException):
    """Carries an AssertionError through wait_until, which retries on Exception."""


def seed_from_env() -> int:
    return int(os.environ.get("SLUICE_MATRIX_SEED") or time.time_ns() % 1_000_000)


class MatrixLoad(SourceLoad):
    """SourceLoad's inserts, updates and deletes over acct/item/log, plus primary-key changes,
    run on a thread at a bounded rate until stopped."""

    def __init__(self, db: MariaDBServer, schema: str, seed: int) -> None:
        super().__init__(db, schema, seed)
        self.key_changes = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _statement(self, cur: Any) -> None:
        if self.rng.random() < 0.12:
            table = self.rng.choice(["acct", "item"])
            ids = self.ids[table]
            if len(ids) >= 20:
                old = self.rng.choice(sorted(ids))
                self.next_id += 1
                cur.execute(f"UPDATE {self.schema}.{table} SET id = %s WHERE id = %s",
                            (self.next_id, old))
                ids.discard(old)
                ids.add(self.next_id)
                self.key_changes += 1
                return
        super()._statement(cur)

    def start(self, pace_s: float) -> None:
        def run() -> None:
            try:
                self.run(10**9, self._stop, pace_s)
            except BaseException as e:  # noqa: BLE001 - surfaced by stop()
                self.error = e
        self._thread = threading.Thread(target=run, name="matrix-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            assert not self._thread.is_alive(), "the source workload did not stop"
        if self.error is not None:
            raise AssertionError(f"the source workload failed: {self.error!r}") from self.error

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the source workload failed: {self.error!r}") from self.error


@dataclass
class Matrix:
    """Everything the matrix runs, started by `start` and stopped (by pid) by `stop`."""

    workdir: Path
    cluster: Cluster
    source: MariaDBServer
    downstream: MariaDBServer
    seed: int
    rng: Any
    etcd: Etcd = field(init=False)
    reg: Registry = field(init=False)
    tsos: dict[str, tuple[Proc, str]] = field(default_factory=dict)
    spark: dict[str, DrainerHandle] = field(default_factory=dict)   # instance -> handle
    mysql: DrainerHandle | None = None
    capture: Proc | None = None
    captures: int = 0
    load: MatrixLoad | None = None
    pump_log: PumpLog | None = None
    gtid_before: str = ""
    probes: int = 0
    gone: set[str] = field(default_factory=set)   # processes meant to be down right now
    timings: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.etcd = Etcd(self.cluster.etcd, timeout=3)
        self.reg = Registry(self.etcd, self.cluster.cluster_id)

    # -- start / stop ------------------------------------------------------------------------

    def start_tso(self, name: str, addr: str | None = None, wait: bool = True) -> Proc:
        """Start (or restart at its old address) TSO `name`; wait: until it listens."""
        if addr is None:
            addr = f"127.0.0.1:{free_port()}"
            self.cluster.tso_addrs.append(addr)
        proc = Proc(name, sluice_argv("tso", *set_args({
            "cluster-id": self.cluster.cluster_id, "name": name, "addr": addr,
            "etcd": self.cluster.etcd, "lease-ttl": TSO_LEASE_S})), self.workdir / f"{name}.log").start()
        self.cluster.procs.append(proc)
        self.tsos[name] = (proc, addr)
        if wait:
            self.wait_tso(name)
        return proc

    def wait_tso(self, name: str) -> None:
        proc, addr = self.tsos[name]
        port = int(addr.rsplit(":", 1)[1])
        wait_until(lambda: port_open(port) or not proc.alive(), 20, what=f"{name} to listen")
        assert proc.alive(), proc.log_text()[-3000:]

    def start(self, pace_s: float) -> None:
        # The Spark drainer's first session is the run's long pole (steps 1-5 run while it
        # starts), so it starts as soon as a timestamp can be had; the TSOs start together.
        for name in TSOS:
            self.start_tso(name, wait=False)
        for name in TSOS:
            self.wait_tso(name)
        for p in PUMPS:
            self.cluster.start_pump(p, wait_online=False)
        t0 = fresh_ts(self.cluster)
        spark_to = {"to.batch-interval": 3.0,
                    "initial-commit-ts": t0}
        self.spark["spark-a"] = self.cluster.start_drainer(
            SPARK, sink="spark", instance="spark-a", wait_online=False, **HA, **spark_to)
        for p in PUMPS:
            self.cluster.wait_pump_writable(self.cluster.pumps[p])
        # A GTID to start the capture after: everything of SCHEMA (its CREATE DATABASE too) then
        # flows through the pipeline, so both sinks create their tables from the captured DDL.
        # (t0 is older: the drainers and the pumps' own log start before anything captured.)
        self.source.execute("CREATE DATABASE IF NOT EXISTS mx_before")
        self.gtid_before = gtid_pos(self.source)
        self.pump_log = PumpLog(self.cluster, t0)
        self.mysql = self.cluster.start_drainer(MYSQL, sink="mysql", wait_online=False, **{
            "initial-commit-ts": t0, "to.host": "127.0.0.1", "to.port": self.downstream.port,
            "to.user": self.downstream.user, "to.password": self.downstream.password,
            "to.worker-count": 4, "to.checkpoint-schema": "sluice_cp"})
        self.wait_log(self.spark["spark-a"].proc, "active at", 0, 30)
        self.spark["spark-b"] = self.cluster.start_drainer(
            SPARK, sink="spark", instance="spark-b", wait_online=False, **HA, **spark_to)
        self.cluster.wait_drainer_standby(self.spark["spark-b"], timeout=30)
        self.cluster.wait_drainer_online(self.mysql, timeout=60)
        self.start_capture()
        self.load = MatrixLoad(self.source, SCHEMA, self.seed)
        self.load.create()
        self.load.ddl(f"CREATE TABLE {SCHEMA}.probe (id INT PRIMARY KEY, step VARCHAR(64), "
                      "at DATETIME(6)) ENGINE=InnoDB")
        self.load.start(pace_s)

    def spark_online_lines(self) -> dict[str, int]:
        return {k: h.proc.log_text().count("online: merging") for k, h in self.spark.items()}

    def wait_spark_online(self, before: dict[str, int], timeout: float = SPARK_START_S) -> None:
        """Until the Spark instance holding the leader key logged `online: merging` (again)."""
        def online() -> bool:
            self.check_alive()
            leader = ha.read_leader(self.reg, SPARK)
            inst = next((k for k, h in self.spark.items()
                         if leader is not None and h.addr == leader.addr), None)
            return inst is not None and (self.spark[inst].proc.log_text().count("online: merging")
                                         > before.get(inst, 0))
        until(online, timeout, "the active Spark drainer to be online")

    def stop(self) -> None:
        if self.load is not None:
            with contextlib.suppress(BaseException):
                self.load.stop()
            self.load.close()
        if self.pump_log is not None:
            self.pump_log.close()
        for proc, _ in self.tsos.values():
            proc.signal(signal.SIGCONT)
        for h in self.spark.values():
            h.proc.signal(signal.SIGCONT)
        self.cluster.stop()
        self.etcd.close()

    def start_capture(self, env: dict[str, str] | None = None, wait: bool = True) -> Proc:
        self.captures += 1
        self.capture = start_capture(self.cluster, self.source, PRODUCER,
                                     name=f"cap-{self.captures}", env=env,
                                     **{"start-position": f"gtid:{self.gtid_before}"})
        if wait:
            self.wait_log(self.capture, "capture streaming", 0, 30)
        return self.capture

    # -- what runs ---------------------------------------------------------------------------

    def procs(self) -> dict[str, Proc]:
        """The processes that must be alive now (not the ones a step took down on purpose)."""
        out: dict[str, Proc] = {name: p for name, (p, _) in self.tsos.items()}
        out.update({n: h.proc for n, h in self.cluster.pumps.items()})
        out.update({n: h.proc for n, h in self.spark.items()})
        if self.mysql is not None:
            out[MYSQL] = self.mysql.proc
        if self.capture is not None:
            out["capture"] = self.capture
        return {n: p for n, p in out.items() if n not in self.gone}

    def capture_log_count(self, text: str) -> int:
        """Occurrences of `text` in the logs of every capture process so far."""
        return sum(p.read_text(errors="replace").count(text)
                   for p in self.workdir.glob("cap-*.log"))

    def check_alive(self) -> None:
        # The capture is in procs(): it never exits on its own. A pump lost between a group's
        # prewrites and commits makes it restart in-process (capture/main.py run_restarting).
        for name, p in self.procs().items():
            assert p.alive(), (f"{name} exited ({p.popen.returncode}):\n"  # type: ignore[union-attr]
                               f"{p.log_text()[-3000:]}")
        if self.load is not None:
            self.load.check()

    def active_spark(self) -> str:
        """The Spark drainer instance holding the HA leader key."""
        leader = ha.read_leader(self.reg, SPARK)
        assert leader is not None, "no active Spark drainer"
        return next(k for k, h in self.spark.items() if h.addr == leader.addr)

    def spark_epoch(self) -> int:
        """The epoch of the Spark drainer's leader key (taken at takeover, before the new
        active one opens its sink); 0 while no instance holds it."""
        leader = ha.read_leader(self.reg, SPARK)
        return leader.epoch if leader is not None else 0

    def tso_leader(self) -> str:
        leader = read_leader(self.etcd, self.cluster.cluster_id)
        assert leader is not None, "no TSO leader"
        return leader.name

    def wait_log(self, proc: Proc, text: str, before: int, timeout: float) -> None:
        """Until `proc`'s log holds more than `before` occurrences of `text` (logs are appended
        across restarts, so a restart's own line is told apart by the count)."""
        def seen() -> bool:
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited:\n{proc.log_text()[-3000:]}")
            return proc.log_text().count(text) > before
        until(seen, timeout, f"{proc.name} to log {text!r}", 0.1)

    def wait_prewarmed(self, proc: Proc) -> None:
        """Until a standby Spark drainer's JVM and catalog are up (hot standby); a
        failed prewarm ends the wait at once instead of after SPARK_START_S."""
        def warm() -> bool:
            text = proc.log_text()
            text = text[text.rfind("ha on, campaigning"):]   # this incarnation (logs append)
            assert "prewarm failed" not in text, f"{proc.name}'s prewarm failed:\n{text[-3000:]}"
            return "sink spark prewarmed" in text
        until(warm, SPARK_START_S, f"{proc.name} to prewarm its Spark sink", 0.2)

    def wait_exit(self, proc: Proc, timeout: float, what: str) -> int:
        wait_until(lambda: not proc.alive(), timeout, 0.05, what=what)
        return proc.popen.returncode  # type: ignore[union-attr]

    def ctl(self, *args: str) -> str:
        r = subprocess.run(sluice_argv("ctl", "--etcd", self.cluster.etcd, "--cluster-id",
                                       str(self.cluster.cluster_id), *args),
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, f"sluice ctl {' '.join(args)}: {r.stdout}{r.stderr}"
        return r.stdout

    # -- recovery probe ----------------------------------------------------------------------

    def probe(self, step: str, timeout: float = PROBE_S, drainers: tuple[str, ...] = (SPARK, MYSQL)
              ) -> float:
        """Write a probe row at the source; wait until the MySQL downstream holds it and the
        drainers' durable checkpoints passed a timestamp taken after that. Returns seconds."""
        t0 = time.monotonic()
        self.probes += 1
        n = self.probes
        self.source.execute(f"INSERT INTO {SCHEMA}.probe VALUES (%s, %s, NOW(6))", (n, step))

        def downstream_has_it() -> bool:
            self.check_alive()
            try:
                return bool(self.downstream.execute(
                    f"SELECT 1 FROM {SCHEMA}.probe WHERE id = %s", (n,)))
            except Exception:  # noqa: BLE001 - the table appears with the first replayed DDL
                return False
        until(downstream_has_it, timeout, f"probe {n} ({step}) in the downstream")
        ts = fresh_ts(self.cluster)

        def checkpoints_passed() -> bool:
            self.check_alive()
            return all((cp := read_checkpoint(self.reg, name)) is not None and cp.commit_ts >= ts
                       for name in drainers)
        until(checkpoints_passed, max(10.0, timeout - (time.monotonic() - t0)),
              f"the checkpoints of {', '.join(drainers)} past probe {n} ({step})")
        return time.monotonic() - t0

    # -- reporting ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        print(f"[matrix seed={self.seed}] step {name}", flush=True)
        try:
            yield
        except BaseException:
            print(f"[matrix seed={self.seed}] FAILED in step {name!r} after "
                  f"{time.monotonic() - t0:.1f}s; log tails:", flush=True)
            self.print_tails()
            raise
        self.timings.append((name, time.monotonic() - t0))
        print(f"[matrix] step {name} done in {self.timings[-1][1]:.1f}s", flush=True)

    def print_tails(self, chars: int = 2500) -> None:
        seen: set[Path] = set()
        for p in self.cluster.procs:
            if p.log_path in seen:
                continue
            seen.add(p.log_path)
            print(f"----- {p.log_path.name} (pid {p.pid}, "
                  f"{'alive' if p.alive() else f'exit {p.popen.returncode}'}) -----")  # type: ignore[union-attr]
            print(p.log_text()[-chars:])
        print(f"----- downstream error log -----\n{self.downstream.error_log()[-1000:]}", flush=True)

    # -- final checks ------------------------------------------------------------------------

    def pipeline_txns(self, want: list[str], timeout: float = 90) -> list[Txn]:
        """The capture's transactions as the pumps serve them (their own PullBinlogs), one per
        start_ts as the drainer keeps them (failover copies share it)."""
        assert self.pump_log is not None

        def dedup() -> list[Txn]:
            by_start: dict[int, Txn] = {}
            for t in self.pump_log.txns(PRODUCER):  # type: ignore[union-attr]
                by_start.setdefault(t.start_ts, t)
            return sorted(by_start.values(), key=lambda t: t.commit_ts)
        self.pump_log.wait_for(lambda: set(want) <= {gtid_of(t) for t in dedup()}, timeout,
                               what="the pumps to hold every source GTID")
        return dedup()

    def source_rows(self, table: str) -> dict[Any, dict[str, Any]]:
        return source_table(self.source, SCHEMA, table)

    def downstream_rows(self, table: str) -> dict[Any, dict[str, Any]]:
        return source_table(self.downstream, SCHEMA, table)


def spark_rows(spark: Any, table: str, columns: list[str]) -> dict[Any, dict[str, Any]]:
    """The Spark current-state view of SCHEMA.table, keyed by its first column."""
    cols = ", ".join(f"`{c}`" for c in columns)
    rows = spark.sql(f"SELECT {cols} FROM {SCHEMA}.`{table}`").collect()
    out = {r[0]: dict(zip(columns, tuple(r))) for r in rows}
    assert len(out) == len(rows), f"Spark {SCHEMA}.{table}: a key appears twice in the view"
    return out


def changelog_keys(spark: Any) -> list[tuple[int, int]]:
    """(_commit_ts, _seq) of every row of every table's changelog (`_seq` numbers a
    transaction's row changes across its tables, so the pair is unique over the union)."""
    union = " UNION ALL ".join(f"SELECT _commit_ts, _seq FROM {SCHEMA}.`{t}_changelog`"
                               for t in TABLES)
    return [(int(r[0]), int(r[1])) for r in spark.sql(union).collect()]


def duplicates(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(p for p, n in Counter(pairs).items() if n > 1)


__all__ = ["SCHEMA", "TABLES", "PRODUCER", "SPARK", "SPARK_START_S", "MYSQL", "PUMPS", "TSOS", "HA", "EXIT_FENCED",
           "Matrix", "MatrixLoad", "seed_from_env", "spark_rows", "changelog_keys", "duplicates",
           "stale_commits_after_fence"]


def stale_commits_after_fence(warehouse: str, stale: int, new: int) -> dict[str, list[int]]:
    """Per Iceberg table of the Spark drainer (read by pyiceberg, no JVM): the epochs of the
    snapshots on main after epoch `new`'s fence snapshot, when any is `stale` (or the table has
    no fence of `new`: listed as [-1])."""
    from tests.support.spark import main_ancestry, pyiceberg_catalog, summary_of
    cat = pyiceberg_catalog(warehouse)
    bad: dict[str, list[int]] = {}
    for ns in cat.list_namespaces():
        for ident in cat.list_tables(ns):
            name = ".".join(ident)
            snaps = [summary_of(s) for s in main_ancestry(cat.load_table(name))]
            epochs = [int(s.get("sluice.epoch", "0")) for s in snaps]
            fence = next((k for k, s in enumerate(snaps) if s.get("sluice.fence") == "true"
                          and epochs[k] == new), None)
            if fence is None:
                bad[name] = [-1]
            elif stale in epochs[fence:]:
                bad[name] = epochs[fence:]
    return bad
