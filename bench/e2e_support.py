"""Pieces of bench/e2e.py: sysbench runs, probe rows and their visibility pollers, lag statistics,
per-process CPU and Prometheus samples.

Lag is measured with probe rows, the same way on every side: one writer thread inserts a row
into `bench_probe.probe` on the source every `interval` seconds (autocommit) and notes the wall
time at which the COMMIT returned, and the GTID MariaDB gave the transaction (`@@last_gtid`).
A poller per sink notes the first wall time at which the row is visible there:
- a MariaDB replica or downstream: `SELECT id FROM bench_probe.probe WHERE id > <all seen>`
  every 50 ms;
- Spark: the Spark drainer's durable checkpoint in etcd (written right after the sink's commit
  point, the `ADD PARTITION` on `_sluice_commits`, at every checkpoint save; DESIGN §2.6) carries
  the capture's source position, whose `gtid=` is the GTID state after the last committed source
  transaction: a probe whose GTID seq_no is at or below it is in the committed view a Spark
  reader queries. This is conservative by at most the time between the commit point and the
  etcd write that follows it (one etcd put).
lag = seen − committed; both clocks are this process's `time.time()`.
"""
from __future__ import annotations

import json
import math
import re
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pymysql

PROBE_DB = "bench_probe"
PROBE_DDL = (f"CREATE TABLE IF NOT EXISTS {PROBE_DB}.probe (id BIGINT PRIMARY KEY, "
             "src_ms BIGINT NOT NULL, phase VARCHAR(32) NOT NULL)")

_T0 = time.monotonic()


def say(msg: str) -> None:
    """A progress line on stderr (the report goes to stdout)."""
    print(f"[e2e {time.strftime('%H:%M:%S')} +{time.monotonic() - _T0:6.1f}s] {msg}",
          file=sys.stderr, flush=True)


def connect(port: int, password: str, database: str | None = None) -> pymysql.connections.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user="root", password=password,
                           database=database, autocommit=True, connect_timeout=5,
                           read_timeout=30, write_timeout=30)


# ---------------------------------------------------------------------------------------------
# sysbench
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sysbench:
    port: int
    password: str
    tables: int
    table_size: int
    threads: int

    def argv(self, command: str, *extra: str) -> list[str]:
        return ["sysbench", "oltp_write_only", "--db-driver=mysql", "--mysql-host=127.0.0.1",
                f"--mysql-port={self.port}", "--mysql-user=root", f"--mysql-password={self.password}",
                "--mysql-db=sbtest", f"--tables={self.tables}", f"--table-size={self.table_size}",
                f"--threads={self.threads}", *extra, command]

    def prepare(self) -> None:
        with connect(self.port, self.password) as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE IF NOT EXISTS sbtest")
        out = subprocess.run(self.argv("prepare"), capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"sysbench prepare failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")

    def run(self, seconds: int, rate: int = 0) -> "SysbenchResult":
        """Run the workload for `seconds` (rate 0: as fast as it goes); blocks; bounded."""
        extra = [f"--time={seconds}", "--report-interval=1", "--percentile=99"]
        if rate:
            extra.append(f"--rate={rate}")
        started = time.time()
        # sysbench's own CPU (the load generator shares the machine): the only child that ends
        # while this runs, so the children's rusage delta is its.
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(self.argv("run", *extra), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            text, _ = proc.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate(timeout=10)
            raise RuntimeError(f"sysbench ran past {seconds + 60}s:\n{text[-2000:]}")
        ended = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"sysbench run failed ({proc.returncode}):\n{text[-3000:]}")
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
        return SysbenchResult.parse(text, started, ended, rate, cpu_s)


@dataclass(frozen=True)
class SysbenchResult:
    started: float
    ended: float
    rate: int
    tps: float                 # sysbench's "transactions: N (X per sec.)"
    transactions: int
    per_second: list[float]    # tps of each 1 s report
    lat_p99_ms: float
    errors: int
    cpu_s: float = math.nan    # sysbench's own user+system CPU seconds

    @classmethod
    def parse(cls, text: str, started: float, ended: float, rate: int,
              cpu_s: float = math.nan) -> "SysbenchResult":
        m = re.search(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec", text)
        if m is None:
            raise RuntimeError(f"no summary in sysbench output:\n{text[-2000:]}")
        per = [float(x) for x in re.findall(r"\] thds: \d+ tps: ([\d.]+)", text)]
        p99 = re.search(r"99th percentile:\s+([\d.]+)", text)
        err = re.search(r"ignored errors:\s+(\d+)", text)
        return cls(started, ended, rate, float(m.group(2)), int(m.group(1)), per,
                   float(p99.group(1)) if p99 else math.nan, int(err.group(1)) if err else 0,
                   cpu_s)


# ---------------------------------------------------------------------------------------------
# Probe rows
# ---------------------------------------------------------------------------------------------

@dataclass
class Probe:
    id: int
    committed: float           # wall time the source COMMIT returned
    gtid_seq: int              # seq_no of the transaction's GTID on the source
    phase: str
    seen: dict[str, float] = field(default_factory=dict)   # sink -> first wall time visible


class Probes:
    """Writes probe rows on the source and records when each sink first shows them."""

    def __init__(self, port: int, password: str) -> None:
        self.port, self.password = port, password
        self.lock = threading.Lock()
        self.items: list[Probe] = []
        self.phase = "setup"
        self._next = 1
        self._conn: pymysql.connections.Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.interval = 0.2

    def create_table(self) -> None:
        with connect(self.port, self.password) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {PROBE_DB}")
            cur.execute(PROBE_DDL)
            cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {PROBE_DB}.probe")
            self._next = int(cur.fetchone()[0]) + 1

    def insert(self, phase: str | None = None) -> Probe:
        """Insert one probe row now (the writer thread calls this; so may the main thread)."""
        with self.lock:
            if self._conn is None:
                self._conn = connect(self.port, self.password)
            pid, self._next = self._next, self._next + 1
            ph = phase or self.phase
            with self._conn.cursor() as cur:
                cur.execute(f"INSERT INTO {PROBE_DB}.probe VALUES (%s, %s, %s)",
                            (pid, int(time.time() * 1000), ph))
                committed = time.time()
                cur.execute("SELECT @@last_gtid")
                gtid = cur.fetchone()[0] or "0-0-0"
            p = Probe(pid, committed, int(gtid.rsplit("-", 1)[1]), ph)
            self.items.append(p)
            return p

    def start(self, interval: float) -> None:
        self.interval = interval
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="probe-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                self.insert()
            except pymysql.MySQLError as e:
                say(f"probe insert failed: {e!r}")
                with self.lock:
                    self._conn = None
            nxt += self.interval
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def close(self) -> None:
        self.stop()
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def snapshot(self) -> list[Probe]:
        with self.lock:
            return list(self.items)

    def mark(self, sink: str, pred: Callable[[Probe], bool], now: float) -> None:
        with self.lock:
            for p in self.items:
                if sink not in p.seen and pred(p):
                    p.seen[sink] = now

    def wait_seen(self, sink: str, probe: Probe, timeout: float) -> float | None:
        """Seconds from the probe's commit to its visibility in `sink`, or None at the timeout."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            t = probe.seen.get(sink)
            if t is not None:
                return t - probe.committed
            time.sleep(0.05)
        return None


class Poller:
    """A thread that polls one sink and marks probes visible there."""

    def __init__(self, name: str, probes: Probes, interval: float) -> None:
        self.name, self.probes, self.interval = name, probes, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"poll-{name}", daemon=True)
        self.errors = 0
        self.last_error = ""

    def start(self) -> "Poller":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - a sink not ready yet; retried, counted
                self.errors += 1
                self.last_error = repr(e)
                self.reset()
            self._stop.wait(self.interval)

    def poll(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.reset()


class RowPoller(Poller):
    """Probe rows visible in a MariaDB (a native replica or Sluice's MySQL downstream)."""

    def __init__(self, name: str, probes: Probes, port: int, password: str, interval: float = 0.05) -> None:
        super().__init__(name, probes, interval)
        self.port, self.password = port, password
        self._conn: pymysql.connections.Connection | None = None
        self._floor = 0      # every id <= floor is seen

    def poll(self) -> None:
        if self._conn is None:
            self._conn = connect(self.port, self.password)
        with self._conn.cursor() as cur:
            cur.execute(f"SELECT id FROM {PROBE_DB}.probe WHERE id > %s", (self._floor,))
            ids = {int(r[0]) for r in cur.fetchall()}
        now = time.time()
        if ids:
            self.probes.mark(self.name, lambda p: p.id in ids, now)
        with self.probes.lock:
            for p in self.probes.items:
                if p.id > self._floor and self.name in p.seen and p.id == self._floor + 1:
                    self._floor = p.id
                elif p.id > self._floor + 1:
                    break

    def reset(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self._conn = None


class CheckpointPoller(Poller):
    """Probes committed in the Spark sink: the drainer's etcd checkpoint position for the capture."""

    def __init__(self, name: str, probes: Probes, etcd: str, cluster_id: int, drainer: str,
                 producer: str, interval: float = 0.1) -> None:
        super().__init__(name, probes, interval)
        from sluice.core.etcd import Etcd
        from sluice.core.registry import Registry
        self.etcd = Etcd(etcd)
        self.registry = Registry(self.etcd, cluster_id)
        self.drainer, self.producer = drainer, producer
        self.seq = 0

    def poll(self) -> None:
        from sluice.core.position import parse_position
        from sluice.drainer.checkpoint import read_checkpoint
        cp = read_checkpoint(self.registry, self.drainer)
        now = time.time()
        if cp is None or self.producer not in cp.positions:
            return
        pos = parse_position(cp.positions[self.producer])
        seq = max((g.seq_no for g in pos.gtids if g.domain_id == 0), default=0)
        if seq > self.seq:
            self.seq = seq
            self.probes.mark(self.name, lambda p: p.gtid_seq <= seq, now)

    def stop(self) -> None:
        super().stop()
        self.etcd.close()


class LagSampler(threading.Thread):
    """Seconds_Behind_Master of a native replica, once a second."""

    def __init__(self, port: int, password: str) -> None:
        super().__init__(name="sbm", daemon=True)
        self.port, self.password = port, password
        self.samples: list[tuple[float, float | None]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        conn = connect(self.port, self.password)
        try:
            while not self._halt.is_set():
                with conn.cursor(pymysql.cursors.DictCursor) as cur:
                    cur.execute("SHOW SLAVE STATUS")
                    row = cur.fetchone() or {}
                v = row.get("Seconds_Behind_Master")
                self.samples.append((time.time(), None if v is None else float(v)))
                self._halt.wait(1.0)
        finally:
            conn.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def between(self, t0: float, t1: float) -> list[float]:
        return [v for t, v in self.samples if t0 <= t <= t1 and v is not None]


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


@dataclass(frozen=True)
class LagStats:
    probes: int
    missing: int               # never seen before the deadline
    p50: float
    p99: float
    max: float
    slope: float               # lag growth, seconds of lag per second of run (least squares)
    first_third_p50: float
    last_third_p50: float

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else round(v, 4) if isinstance(v, float) else v)
                for k, v in self.__dict__.items()}


def lag_stats(probes: list[Probe], sink: str, t0: float, t1: float) -> LagStats:
    """Lag of the probes committed in [t0, t1) into `sink` (unseen probes count as missing)."""
    window = [p for p in probes if t0 <= p.committed < t1]
    pts = [(p.committed - t0, p.seen[sink] - p.committed) for p in window if sink in p.seen]
    lags = [lag for _, lag in pts]
    slope = math.nan
    if len(pts) >= 3:
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        den = sum((x - mx) ** 2 for x, _ in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / den if den else math.nan
    third = max(1, len(pts) // 3)
    return LagStats(len(window), len(window) - len(pts), percentile(lags, 50), percentile(lags, 99),
                    max(lags) if lags else math.nan, slope,
                    percentile([y for _, y in pts[:third]], 50),
                    percentile([y for _, y in pts[-third:]], 50))


# ---------------------------------------------------------------------------------------------
# Where the time goes: CPU per process, Prometheus counters
# ---------------------------------------------------------------------------------------------

def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User+system CPU seconds of each named process and its children (a Spark drainer's JVM)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        total = 0.0
        try:
            p = psutil.Process(pid)
            for q in [p, *p.children(recursive=True)]:
                try:
                    t = q.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
        except psutil.Error:
            continue
        out[name] = total
    return out


def cpu_percent(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """%CPU (100 = one core) per process between two `cpu_seconds` samples."""
    return {k: round(100 * (after[k] - before.get(k, 0.0)) / seconds, 1)
            for k in after if seconds > 0}


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def scrape(addr: str) -> dict[str, float]:
    """Every sample of a Prometheus endpoint as {"name{labels}": value}; {} when unreachable."""
    try:
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=2).read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def metric_rates(before: dict[str, float], after: dict[str, float], seconds: float,
                 keep: re.Pattern[str]) -> dict[str, float]:
    """Per-second deltas of counters (`_total`, `_sum`, `_count`) and end values of gauges, for
    names matching `keep` (process-level python_/process_ samples dropped)."""
    out: dict[str, float] = {}
    for k, v in after.items():
        if not keep.search(k) or k.startswith(("python_", "process_")) or "_created" in k:
            continue
        base = k.split("{", 1)[0]
        if base.endswith(("_total", "_sum", "_count")):
            out[k + " /s"] = round((v - before.get(k, 0.0)) / seconds, 3) if seconds > 0 else 0.0
        elif not base.endswith("_bucket"):
            out[k] = round(v, 3)
    return out


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))
