"""`sluice demo`: the whole pipeline, MariaDB to Spark, started, loaded, verified and stopped.

It starts a local cluster through `sluice cluster up`'s own code (etcd, 2 TSOs, 2 pumps, a
Spark drainer and its standby sharing one Iceberg warehouse with its embedded catalog, a local
MariaDB and the capture) in a fresh directory, creates a sample `shop` schema, runs a workload
(sysbench `oltp_write_only` when installed, plus a built-in shop generator) with a live progress
line, writes a probe row once the workload stops and waits until the Spark tables show it, then
compares every source table with its Spark current-state table row for row (`sluice ctl
verify`'s library).

The terminal shows the demo's own progress only: the JVM of the demo's Spark session writes its
banner and log lines to `logs/demo-spark.log`; the progress line is redrawn in place on a
terminal (plain lines otherwise, e.g. in CI logs).

Invariant: the demo exits 0 only when every source table equals its Spark table; and it stops
every process it started (`sluice cluster down`, by recorded pid) on every way out — success,
failure, Ctrl-C — unless `--keep` is given; on a failure the logs stay and their path is printed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.core import ts as tsmod
from sluice.core.errors import ConfigError, SluiceError, Unavailable
from sluice.core.secrets import mask_dsn

from . import cluster, verify
from .cluster_config import Layout, to_toml
from .demo_workload import PROBE_DB, SCHEMA, SHOP, ShopGenerator

SYSBENCH_DB = "sbtest"
DRAINER = "spark"
ROOT_PASSWORD = "sluice-root"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="cluster directory (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true",
                        help="leave the cluster running (and its directory) when the demo ends")
    parser.add_argument("--duration", type=float, default=60.0, metavar="SECONDS",
                        help="how long the workload runs (default 60)")
    parser.add_argument("--short", action="store_true",
                        help="~10 s of the built-in generator on small tables (tests and CI)")
    parser.add_argument("--show-failover", action="store_true",
                        help="kill -9 the TSO leader mid-workload and show the standby take over")
    parser.add_argument("--no-sysbench", action="store_true",
                        help="use only the built-in generator even when sysbench is installed")
    parser.add_argument("--wait-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="how long to wait for the Spark tables to catch up (default 300)")


# ---------------------------------------------------------------------------------------------
# The cluster the demo runs
# ---------------------------------------------------------------------------------------------

# Extra Spark settings (a JSON object) for every JVM of the demo: its drainers' and its own
# session's (which reads the drainer's [to] table). A test-speed knob, not a user option: the
# demo's test passes the test JVM flags (tests/support/spark.py TEST_CONF).
SPARK_CONF_ENV = "SLUICE_DEMO_SPARK_CONF"


def _extra_spark_conf() -> dict[str, str]:
    import json
    text = os.environ.get(SPARK_CONF_ENV, "")
    try:
        extra = json.loads(text) if text else {}
    except ValueError as e:
        raise ConfigError(f"{SPARK_CONF_ENV} is not a JSON object: {e}") from None
    if not isinstance(extra, dict):
        raise ConfigError(f"{SPARK_CONF_ENV} is not a JSON object: {text[:100]}")
    return {str(k): str(v) for k, v in extra.items()}


def demo_spec(short: bool) -> dict[str, Any]:
    """The cluster TOML of the demo (a `sluice cluster up --config` file)."""
    return {
        "cluster-id": 1,
        # A Spark drainer opens a JVM and, on a fresh warehouse, creates the catalog and tables.
        "start-timeout": 900.0,
        "stop-timeout": 15.0,
        "tso": {"count": 2, "lease-ttl": 3},
        "pump": {"count": 2, "config": {
            "heartbeat-interval": 1.0, "pull-heartbeat-interval": 0.5,
            "storage": {"stop-write-at-available-space": 256 << 20}}},
        "drainers": [{
            "name": DRAINER, "sink": "spark", "standby": True,
            # The drainer and its standby share their data dir: one warehouse, one catalog.
            "to": {"warehouse": "{data}/warehouse", "master": "local[2]", "shuffle-partitions": 2,
                   "batch-interval": 2.0 if short else 3.0, "batch-rows": 20_000,
                   "spark-conf": {"spark.ui.showConsoleProgress": "false",
                                  "spark.driver.memory": "768m", **_extra_spark_conf()}},
            # A generous lease: a JVM-heavy drainer on a busy machine must not lose it to a
            # late keepalive (the standby would then start a second Spark session).
            "config": {"alive-ttl": 10, "ha-margin": 1.0, "checkpoint-interval": 1.0},
        }],
        "mariadb": {"enabled": True, "root-password": ROOT_PASSWORD},
        "capture": {"enabled": True, "config": {
            "filter": {"include-databases": [SHOP, SYSBENCH_DB, PROBE_DB]}}},
    }


# ---------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------

def scrape(addr: str, name: str) -> float | None:
    """The sum of a Prometheus metric's samples at http://addr/metrics (None: unreachable)."""
    if not addr:
        return None
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=1) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Console:
    """The demo's terminal. Messages are whole lines; on a terminal the progress line is redrawn
    in place (carriage return, cut to the terminal's width) below them, elsewhere each progress
    line is a plain line of its own."""

    def __init__(self, out: Any = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.lock = threading.Lock()
        self.live = ""

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self.out.fileno()).columns
        except (OSError, ValueError, AttributeError):
            columns = 0
        # A terminal that reports no size (0 columns: some ptys) gets a generous line.
        return max(20, columns - 1) if columns > 0 else 159

    def say(self, text: str = "", file: Any = None, flush: bool = True) -> None:
        """A message line (print-compatible for the demo's own calls)."""
        with self.lock:
            if self.live:
                self.out.write("\r\033[K")
                self.out.flush()
            (file or self.out).write(f"{text}\n")
            (file or self.out).flush()
            if self.live:
                self.out.write(self.live)
                self.out.flush()

    def status(self, line: str) -> None:
        """The progress line: redrawn in place on a terminal, a plain line otherwise."""
        with self.lock:
            if self.tty:
                self.live = line[:self._width()]
                self.out.write("\r" + self.live + "\033[K")
            else:
                self.out.write(line + "\n")
            self.out.flush()

    def end_status(self) -> None:
        """Leave the last progress line on screen; later messages go below it."""
        with self.lock:
            if self.live:
                self.out.write("\n")
                self.out.flush()
                self.live = ""


@dataclass
class Progress:
    """The numbers of one progress line."""

    source_txns: int = 0
    captured: int = 0
    pump_binlogs: int = 0
    applied_txns: int = 0
    checkpoint: int = 0
    lag: float = 0.0


@dataclass
class Demo:
    layout: Layout
    args: argparse.Namespace
    state: Any = None
    db: Any = None                     # pymysql connection (progress, probe)
    db_lock: threading.Lock = field(default_factory=threading.Lock)
    health: Any = None                 # cluster.Health, opened by the first progress line
    commits_at_start: int = 0
    started: float = field(default_factory=time.monotonic)
    console: Console = field(default_factory=Console)

    def say(self, text: str = "", file: Any = None, flush: bool = True) -> None:
        self.console.say(text, file=file, flush=flush)

    # -- the source --------------------------------------------------------------------------

    @property
    def mariadb_addr(self) -> str:
        return self.state.find("mariadb").addr

    def source_dsn(self) -> str:
        return f"mysql://root:{ROOT_PASSWORD}@{self.mariadb_addr}"

    def connect(self) -> Any:
        import pymysql
        host, _, port = self.mariadb_addr.rpartition(":")
        return pymysql.connect(host=host, port=int(port), user="root", password=ROOT_PASSWORD,
                               charset="utf8mb4", autocommit=False, connect_timeout=10)

    def binlog_commits(self) -> int:
        with self.db_lock, self.db.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Binlog_commits'")
            row = cur.fetchone()
        return int(row[1]) if row else 0

    # -- progress ----------------------------------------------------------------------------

    def progress(self) -> Progress:
        p = Progress()
        with contextlib.suppress(Exception):
            p.source_txns = self.binlog_commits() - self.commits_at_start
        cap = self.state.find("capture")
        p.captured = int(scrape(cap.metrics_addr, "sluice_capture_transactions_total") or 0)
        p.pump_binlogs = int(sum(scrape(r.metrics_addr, "sluice_pump_binlogs_written_total") or 0
                                 for r in self.state.processes if r.kind == "pump"))
        p.applied_txns = int(sum(scrape(r.metrics_addr, "sluice_drainer_txns_total") or 0
                                 for r in self.state.processes if r.kind == "drainer"))
        with contextlib.suppress(Exception):
            if self.health is None:
                self.health = cluster.Health(self.state)
            info = self.health.node("drainer", DRAINER)
            p.checkpoint = info.status.checkpoint if info is not None else 0
        p.lag = tsmod.lag_seconds(p.checkpoint) if p.checkpoint else 0.0
        return p

    def line(self, phase: str) -> str:
        p = self.progress()
        lag = f"{p.lag:6.1f}s" if p.checkpoint else "     -"
        return (f"[{time.monotonic() - self.started:5.0f}s] {phase:<9} source {p.source_txns:>6} "
                f"txns | captured {p.captured:>6} | in pumps {p.pump_binlogs:>7} binlogs | "
                f"to Spark {p.applied_txns:>6} txns | lag {lag}")

    def progress_loop(self, stop: threading.Event, phase: Callable[[], str]) -> None:
        every = 1.0 if self.console.tty else (2.0 if self.args.short else 5.0)
        while not stop.wait(every):
            with contextlib.suppress(Exception):
                self.console.status(self.line(phase()))


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    if args.short:
        args.duration = min(args.duration, 10.0)
    if args.duration <= 0:
        raise ConfigError(f"--duration must be > 0, got {args.duration}")
    for binary in ("etcd", "mariadbd", "java"):
        if shutil.which(binary) is None:
            raise ConfigError(f"`{binary}` not found on PATH: run ./install.sh (or `make demo`)")
    own_dir = not args.dir
    root = Path(args.dir or tempfile.mkdtemp(prefix="sluice-demo-")).resolve()
    layout = Layout(root)
    demo = Demo(layout, args)
    ok = False
    try:
        ok = _run(demo)
        return 0 if ok else 1
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
        return 130
    except SluiceError as e:
        print(f"sluice demo: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for closing in (demo.db, demo.health):
            if closing is not None:
                with contextlib.suppress(Exception):
                    closing.close()
        _stop_verify_session()
        if args.keep:
            print(f"\nthe cluster keeps running in {root}:\n"
                  f"  sluice cluster status --dir {root}\n  sluice cluster down --dir {root}")
        else:
            print("stopping the cluster", flush=True)
            left = cluster.down(layout, quiet=True)
            if left:
                print(f"sluice demo: some processes did not stop; see `sluice cluster status "
                      f"--dir {root}`", file=sys.stderr)
            if ok and own_dir:
                shutil.rmtree(root, ignore_errors=True)
            else:
                print(f"logs kept in {root / 'logs'}")


_SESSION: dict[str, Any] = {}


def _warm_spark(conf_path: str, jvm_log: str) -> None:
    """Start this process's SparkSession (20-40 s under load) while the workload runs; the
    JVM's own output goes to jvm_log, not to the demo's terminal."""
    try:
        _SESSION["target"] = verify.spark_target_from(conf_path, jvm_output=jvm_log)
    except BaseException as e:  # noqa: BLE001 - reported when the verification needs it
        _SESSION["error"] = e


def _stop_verify_session() -> None:
    t = _SESSION.pop("thread", None)
    if t is not None:
        t.join(120)
    target = _SESSION.pop("target", None)
    if target is not None:
        with contextlib.suppress(Exception):
            target.close()
        # The demo's JVM ends and is reaped before the demo exits (no orphan, no zombie).
        from sluice.spark_sink.session import shutdown_jvm
        with contextlib.suppress(Exception):
            shutdown_jvm()


def _run(demo: Demo) -> bool:
    args, layout = demo.args, demo.layout
    print(f"sluice demo: a local cluster in {layout.root}", flush=True)
    layout.root.mkdir(parents=True, exist_ok=True)
    conf = layout.root / "demo-cluster.toml"
    conf.write_text(to_toml(demo_spec(args.short)))
    if cluster.up(layout, conf, []) != 0:
        raise Unavailable("the cluster did not start (see the lines above)")
    demo.state = cluster.read_state(layout)
    drainer_conf = demo.state.find(DRAINER).config_path

    jvm_log = str(layout.log("demo-spark"))
    warm = threading.Thread(target=_warm_spark, args=(drainer_conf, jvm_log),
                            name="spark-warmup", daemon=True)
    warm.start()
    _SESSION["thread"] = warm

    demo.db = demo.connect()
    demo.db.autocommit(True)
    with demo.db_lock, demo.db.cursor() as cur:
        for sql in SCHEMA:
            cur.execute(sql)
    small = args.short
    gen = ShopGenerator(demo.connect, seed=11, customers=50 if small else 500,
                        skus=30 if small else 200)
    gen.load()
    use_sysbench = not small and not args.no_sysbench and shutil.which("sysbench") is not None
    host, _, port = demo.mariadb_addr.rpartition(":")
    sysbench_base = ["sysbench", "oltp_write_only", f"--mysql-host={host}", f"--mysql-port={port}",
                     "--mysql-user=root", f"--mysql-password={ROOT_PASSWORD}",
                     f"--mysql-db={SYSBENCH_DB}", "--tables=2", "--table-size=2000",
                     "--db-driver=mysql"]
    if use_sysbench:
        with demo.db_lock, demo.db.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {SYSBENCH_DB}")
        print("sysbench oltp_write_only: preparing 2 tables of 2000 rows", flush=True)
        _sysbench(demo, [*sysbench_base, "prepare"], 300)
    demo.commits_at_start = demo.binlog_commits()

    workload = ("sysbench oltp_write_only + the shop generator" if use_sysbench
                else "the built-in shop generator")
    print(f"workload: {workload} for {args.duration:.0f}s", flush=True)
    stop_work, stop_progress = threading.Event(), threading.Event()
    phase = ["workload"]
    threads = [threading.Thread(target=gen.run, args=(stop_work,), name="shop", daemon=True)]
    sysbench_proc = None
    if use_sysbench:
        sysbench_proc = subprocess.Popen(
            [*sysbench_base, "--threads=2", f"--time={int(args.duration)}", "--report-interval=0",
             "run"], stdout=open(layout.root / "logs" / "sysbench.log", "ab"),
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    ticker = threading.Thread(target=demo.progress_loop, args=(stop_progress, lambda: phase[0]),
                              name="progress", daemon=True)
    work_started = time.monotonic()
    for t in threads:
        t.start()
    ticker.start()
    try:
        if args.show_failover:
            stop_work.wait(args.duration / 2)
            _tso_failover(demo)
        stop_work.wait(max(0.0, args.duration - (time.monotonic() - work_started)))
        stop_work.set()
        for t in threads:
            t.join(60)
        if sysbench_proc is not None:
            try:
                sysbench_proc.wait(60)
            except subprocess.TimeoutExpired:
                sysbench_proc.kill()
                sysbench_proc.wait(10)
        worked = time.monotonic() - work_started
        if gen.error is not None:
            demo.say(f"warning: the shop generator stopped early: {gen.error}", flush=True)
        source_txns = demo.binlog_commits() - demo.commits_at_start

        # The probe: committed after every workload transaction, so once Spark shows it, the
        # drainer's checkpoint has passed the source's final position.
        with demo.db_lock, demo.db.cursor() as cur:
            cur.execute(f"INSERT INTO {PROBE_DB}.probe VALUES (1, UTC_TIMESTAMP(6))")
        probe_at = time.monotonic()
        phase[0] = "draining"
        demo.say(f"workload done: {source_txns} source transactions in {worked:.1f}s; waiting for "
              "the probe row to show in Spark", flush=True)
        warm.join(args.wait_timeout)
        if "error" in _SESSION:
            raise Unavailable(f"could not open a Spark session on the sink's catalog: "
                              f"{_SESSION['error']} (the JVM's output: {jvm_log})")
        target = _SESSION.get("target")
        if target is None:
            raise Unavailable("the Spark session did not start in time")
        _wait_probe(target, args.wait_timeout)
        demo.say(f"the probe row is in Spark {time.monotonic() - probe_at:.1f}s after its commit",
              flush=True)
    finally:
        stop_work.set()
        stop_progress.set()
        ticker.join(5)
        demo.console.end_status()
        if sysbench_proc is not None and sysbench_proc.poll() is None:
            sysbench_proc.kill()
            sysbench_proc.wait(10)

    print("verifying: every source table against its Spark current-state table", flush=True)
    verify_started = time.monotonic()
    tables = [f"{SHOP}.customers", f"{SHOP}.orders", f"{SHOP}.order_items", f"{SHOP}.inventory"]
    if use_sysbench:
        tables += [f"{SYSBENCH_DB}.sbtest1", f"{SYSBENCH_DB}.sbtest2"]
    source = verify.MySQLSide(demo.source_dsn())
    try:
        results = verify.verify_tables(source, target, tables, chunk_rows=10_000)
    finally:
        source.close()
    for line in verify.format_results(results):
        print(line)
    changes = _changelog_counts(target, tables)
    elapsed = time.monotonic() - demo.started
    rows = sum(r.rows for r in results)
    print("\nsummary")
    print(f"  tables verified      {len(results)} ({sum(r.ok for r in results)} match)")
    print(f"  rows compared        {rows}")
    per_table = ", ".join(f"{t.split('.', 1)[1]} {n}" for t, n in changes.items())
    print(f"  changes in changelog {sum(changes.values())} ({per_table})")
    print(f"  source transactions  {source_txns} in {worked:.1f}s "
          f"({source_txns / worked:.0f} txn/s)")
    print(f"  verification         {time.monotonic() - verify_started:.1f}s")
    print(f"  elapsed              {elapsed:.1f}s")
    print("\nnext: query the Spark tables (with --keep the cluster is still running):")
    print(f"  sluice spark-sql --config {drainer_conf} --tables")
    print(f"  sluice spark-sql --config {drainer_conf} \"SELECT * FROM {SHOP}.orders ORDER BY id "
          "DESC LIMIT 10\"")
    print(f"  sluice spark-sql --config {drainer_conf} \"SELECT _op, _commit_ts, id, status FROM "
          f"{SHOP}.orders_changelog ORDER BY _commit_ts DESC, _seq DESC LIMIT 20\"")
    as_of = _middle_batch(target)
    if as_of is not None:
        print(f"  sluice spark-sql --config {drainer_conf} --as-of {as_of} \"SELECT count(*) "
              "FROM orders\"")
    print(f"  sluice ctl verify --source {mask_dsn(demo.source_dsn())} --spark-config "
          f"{drainer_conf} --tables {SHOP}.orders")
    print(f"  sluice ctl --cluster-dir {layout.root} drainers")
    bad = [r for r in results if not r.ok]
    if bad:
        print(f"\nFAILED: {bad[0].first_difference()}", file=sys.stderr)
        return False
    print(f"\nOK: all {len(results)} tables match the source row for row")
    return True


def _sysbench(demo: Demo, argv: list[str], timeout: float) -> None:
    with open(demo.layout.root / "logs" / "sysbench.log", "ab") as log:
        out = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if out.returncode != 0:
        raise Unavailable(f"sysbench failed (exit {out.returncode}); see "
                          f"{demo.layout.root / 'logs' / 'sysbench.log'}")


def _wait_probe(target: verify.SparkTarget, timeout: float) -> None:
    view = target.view(PROBE_DB, "probe")
    end = time.monotonic() + timeout
    last = ""
    while time.monotonic() < end:
        try:
            if target.exists(PROBE_DB, "probe") and target.spark.sql(
                    f"SELECT id FROM {view} WHERE id = 1").collect():
                return
        except Exception as e:  # noqa: BLE001 - the views appear with the first batch
            last = f" (last error: {str(e).splitlines()[0][:200]})"
        time.sleep(1.0)
    raise Unavailable(f"the probe row did not reach Spark within {timeout:.0f}s{last}")


def _changelog_counts(target: verify.SparkTarget, tables: list[str]) -> dict[str, int]:
    out = {}
    for t in tables:
        db, name = t.split(".", 1)
        with contextlib.suppress(Exception):
            changelog = target.changelog(db, name)
            out[t] = int(target.spark.sql(f"SELECT count(*) FROM {changelog}").collect()[0][0])
    return out


def _middle_batch(target: verify.SparkTarget) -> int | None:
    """The commit_ts of a batch halfway through the run (an example for --as-of)."""
    from sluice.spark_sink.tables import q
    with contextlib.suppress(Exception):
        ts = [r[0] for r in target.spark.sql(
            f"SELECT commit_ts FROM {q(target.catalog, 'sluice', '_sluice_commits')} "
            "ORDER BY batch").collect()]
        return int(ts[len(ts) // 2]) if ts else None
    return None


def _tso_failover(demo: Demo) -> None:
    """kill -9 the TSO leader; the standby serves within the lease TTL and the pipeline goes on."""
    health = cluster.Health(demo.state)
    try:
        tsos = [r for r in demo.state.processes if r.kind == "tso" and cluster.running(r)]
        leader = next((r for r in tsos if _role(health, r) == "leader"), None)
        if leader is None:
            demo.say("failover: no TSO leader found; skipped", flush=True)
            return
        demo.say(f"failover: kill -9 {leader.name} (pid {leader.pid}), the TSO leader", flush=True)
        os.kill(leader.pid, 9)
        killed = time.monotonic()
        others = [r for r in tsos if r is not leader]
        end = killed + 30
        while time.monotonic() < end:
            new = next((r for r in others if _role(health, r) == "leader"), None)
            if new is not None:
                demo.say(f"failover: {new.name} took over in {time.monotonic() - killed:.1f}s; "
                      "timestamps keep increasing", flush=True)
                return
            time.sleep(0.1)
        demo.say("failover: no new TSO leader within 30s", flush=True)
    finally:
        health.close()


def _role(health: cluster.Health, r: Any) -> str:
    try:
        return health.tso_role(r)
    except Exception:  # noqa: BLE001 - a TSO that does not answer has no role
        return ""
