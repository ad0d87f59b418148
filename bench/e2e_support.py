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

import calendar
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        proc = subprocess.Popen(self.argv("run", *extra), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()),  # type: ignore[union-attr]
                                  name="sysbench-out", daemon=True)
        reader.start()
        # sysbench's own CPU (the load generator shares the machine), from its exit rusage.
        code, cpu_s = wait_rusage(proc, seconds + 60)
        ended = time.time()
        reader.join(10)
        text = "".join(chunks)
        if code is None:
            raise RuntimeError(f"sysbench ran past {seconds + 60}s:\n{text[-2000:]}")
        if code != 0:
            raise RuntimeError(f"sysbench run failed ({code}):\n{text[-3000:]}")
        return SysbenchResult.parse(text, started, ended, rate, cpu_s)


def wait_rusage(proc: subprocess.Popen[Any], timeout: float) -> tuple[int | None, float]:
    """Wait for a child we started and return (exit code, its user+system CPU seconds, its own
    children included) from wait4; (None, cpu) if it ran past `timeout` (then it is killed)."""
    deadline = time.monotonic() + timeout
    killed = False
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return (None if killed else proc.returncode), ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline and not killed:
            proc.kill()
            killed = True
        time.sleep(0.05)


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
                 producer: str, interval: float = 0.1, security: Any = None) -> None:
        super().__init__(name, probes, interval)
        from sluice.core.etcd import Etcd
        from sluice.core.registry import Registry
        # `sluice cluster up` runs etcd with mutual TLS unless `insecure = true`: the cluster's
        # client certificates (a plaintext client only ever sees ConnectionFailedError).
        self.etcd = Etcd(etcd, security if security is not None and security.enabled else None)
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
    p95: float
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
    return LagStats(len(window), len(window) - len(pts), percentile(lags, 50), percentile(lags, 95),
                    percentile(lags, 99),
                    max(lags) if lags else math.nan, slope,
                    percentile([y for _, y in pts[:third]], 50),
                    percentile([y for _, y in pts[-third:]], 50))


# ---------------------------------------------------------------------------------------------
# Where the time goes: CPU per process, Prometheus counters
# ---------------------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(ppid, utime+stime+cutime+cstime in seconds) from /proc/<pid>/stat; None if gone.

    cutime/cstime hold the children this process has waited for; its live children are counted
    by walking the process tree (`proc_cpu_seconds`)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: the fields after it start after the last ')'.
    f = raw[raw.rindex(")") + 2:].split()
    # f[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14..17.
    return int(f[1]), sum(int(x) for x in f[11:15]) / CLK_TCK


def proc_cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User+system CPU seconds of each named process, its live descendants (a Spark drainer's
    JVM, started by spark-submit's shell) and the descendants it has reaped, read from
    /proc/<pid>/stat. A descendant that is itself named is counted under its own name only (the
    cluster's supervisor is every Sluice process's parent). A name whose process is gone is
    left out."""
    stats: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _proc_stat(int(d))
            if st is not None:
                stats[int(d)] = st
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    named = set(pids.values())
    out: dict[str, float] = {}
    for name, root in pids.items():
        if root not in stats:
            continue
        total, todo = 0.0, [root]
        while todo:
            pid = todo.pop()
            total += stats[pid][1]
            todo.extend(k for k in kids.get(pid, ()) if k not in named)
        out[name] = total
    return out


cpu_seconds = proc_cpu_seconds


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


_BATCH_LINE = re.compile(r"^(\S+)Z .* spark batch committed (.*)$")
_KV = re.compile(r"(\w+)=(\S+)")


def spark_batches(log: Path, t0: float, t1: float) -> dict[str, Any] | None:
    """What the Spark drainer's log says of the batches it committed between wall times t0
    and t1 (its "spark batch committed" lines): how many, rows each, and how long the commit's
    steps took. Explains the lag into Spark: a row waits for its batch to close (batch-interval)
    and then for the commit."""
    if not log.exists():
        return None
    rows: list[int] = []
    commit_s: list[float] = []
    ends: list[float] = []
    for line in log.read_text(errors="replace").splitlines():
        m = _BATCH_LINE.match(line)
        if not m:
            continue
        ts = _log_time(m.group(1))
        if not t0 <= ts <= t1:
            continue
        f = dict(_KV.findall(m.group(2)))
        rows.append(int(f.get("rows", 0)))
        commit_s.append(sum(float(f.get(k, 0)) for k in ("changelog_s", "current_s", "marker_s")))
        ends.append(ts)
    if not rows:
        return {"batches": 0}
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return {"batches": len(rows), "rows_p50": percentile(rows, 50),
            "commit_s_p50": percentile(commit_s, 50), "commit_s_p90": percentile(commit_s, 90),
            "commit_s_max": max(commit_s),
            "between_commits_s_p50": percentile(gaps, 50) if gaps else None}


_STALL_LINE = re.compile(r"^(\S+)Z .* event loop ran again after ([0-9.]+)s blocked(?:; CPU seconds "
                         r"by thread since the warning: (.*))?$")


def _log_time(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + stamp[19:])


def loop_stalls(logs: Path, t0: float, t1: float) -> dict[str, list[dict[str, Any]]]:
    """Per process log in `logs` (the cluster's logs/ folder), the event-loop stalls that ended
    between wall times t0 and t1 (core/loopwatch.py's "ran again" lines): how long each lasted
    and which threads used the CPU meanwhile. A stalled loop stops every stream of its process:
    a lag spike with a stall beside it has its cause named."""
    out: dict[str, list[dict[str, Any]]] = {}
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        for line in log.read_text(errors="replace").splitlines():
            if "event loop ran again" not in line:
                continue
            m = _STALL_LINE.match(line)
            if m is None or not t0 <= _log_time(m.group(1)) <= t1:
                continue
            out.setdefault(log.stem, []).append(
                {"at": m.group(1), "seconds": float(m.group(2)), "threads": m.group(3) or ""})
    return out


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))


# ---------------------------------------------------------------------------------------------
# Profiles: py-spy sampling of the Sluice processes under load
# ---------------------------------------------------------------------------------------------

def py_spy_path() -> str | None:
    """py-spy from this venv (requirements.txt pins it), else from PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    import shutil
    return shutil.which("py-spy")


@dataclass
class Profile:
    name: str
    pid: int
    samples: int = 0                       # samples kept (GIL holder, or non-idle threads)
    errors: str = ""                       # py-spy's complaint, if it produced nothing
    self_counts: dict[str, int] = field(default_factory=dict)    # leaf frame -> samples
    total_counts: dict[str, int] = field(default_factory=dict)   # frame on the stack -> samples
    cpu_s: float = math.nan                # py-spy's own CPU

    def top(self, n: int) -> list[tuple[str, float, float]]:
        """The n frames with the largest self share: (frame, self share, total share)."""
        if not self.samples:
            return []
        rows = sorted(self.self_counts.items(), key=lambda kv: -kv[1])[:n]
        return [(f, c / self.samples, self.total_counts.get(f, 0) / self.samples) for f, c in rows]

    def top_total(self, n: int, skip: set[str]) -> list[tuple[str, float]]:
        """The n frames with the largest inclusive share not in `skip` (the module level and
        event-loop frames every stack passes through)."""
        if not self.samples:
            return []
        rows = [(f, c) for f, c in self.total_counts.items() if f not in skip]
        rows.sort(key=lambda kv: -kv[1])
        return [(f, c / self.samples) for f, c in rows[:n]]


_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def short_frame(frame: str, repo: Path) -> str:
    """`func (path:line)` with the path made short: repo-relative, or from site-packages on."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    path = m.group("file")
    for prefix in (str(repo) + "/", "site-packages/", "/lib/python3"):
        i = path.find(prefix)
        if i >= 0:
            path = path[i + len(prefix):] if prefix != "/lib/python3" else "stdlib:" + path.rsplit("/", 1)[-1]
            break
    return f"{m.group('fn')} ({path}{':' + m.group('line') if m.group('line') else ''})"


def parse_collapsed(text: str, repo: Path) -> tuple[int, dict[str, int], dict[str, int]]:
    """py-spy's raw (collapsed stacks) output: `root;...;leaf count` per line →
    (samples, leaf frame counts, inclusive frame counts, each frame counted once per stack)."""
    samples, leaf, total = 0, {}, {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [short_frame(f, repo) for f in stack.split(";")]
        samples += n
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
        for f in set(frames):
            total[f] = total.get(f, 0) + n
    return samples, leaf, total


class PySpy:
    """`py-spy record --format raw` on several processes at once for a bounded time.

    --nonblocking: the target is not paused for each sample (a paused capture would add lag to
    what is measured); a sample may then see a stack mid-change, a small error on shares.
    --function: samples are grouped by function, not by line.
    mode "gil" (--gil): only the thread holding the GIL is sampled, so a share is of the time
    the process ran Python code or native code called with the GIL held (the Rust core, C
    extensions that keep it): its Python CPU. mode "active": every thread py-spy does not judge
    idle; on a loaded machine a thread waiting for a core or a reply (select, socket reads)
    often counts as active, so these shares are of wall time, not of CPU."""

    def __init__(self, pids: dict[str, int], seconds: int, rate: int, outdir: Path, repo: Path,
                 mode: str = "gil") -> None:
        self.pids, self.seconds, self.rate, self.mode = pids, seconds, rate, mode
        self.outdir, self.repo = outdir, repo
        self.procs: dict[str, tuple[subprocess.Popen[Any], Path, Path]] = {}

    def start(self) -> "PySpy":
        exe = py_spy_path()
        if exe is None:
            raise RuntimeError("py-spy not found: .venv/bin/pip install -r requirements.txt")
        self.outdir.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            out, log = self.outdir / f"{name}.collapsed", self.outdir / f"{name}.log"
            argv = [exe, "record", "--pid", str(pid), "--format", "raw", "--output", str(out),
                    "--duration", str(self.seconds), "--rate", str(self.rate), "--nonblocking",
                    "--function", *(["--gil"] if self.mode == "gil" else [])]
            with log.open("w") as f:
                self.procs[name] = (subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                                     stdin=subprocess.DEVNULL), out, log)
        return self

    def finish(self) -> list[Profile]:
        """Wait for every recorder (bounded) and parse what each wrote."""
        out: list[Profile] = []
        for name, (proc, path, log) in self.procs.items():
            code, cpu = wait_rusage(proc, self.seconds + 60)
            prof = Profile(name, self.pids[name], cpu_s=cpu)
            text = path.read_text(errors="replace") if path.exists() else ""
            prof.samples, prof.self_counts, prof.total_counts = parse_collapsed(text, self.repo)
            if code != 0 or not prof.samples:
                prof.errors = f"py-spy exit {code}: " + " ".join(
                    log.read_text(errors="replace").split())[-300:]
            out.append(prof)
        return out

    def stop(self) -> None:
        for proc, _, _ in self.procs.values():
            if proc.returncode is None and proc.poll() is None:
                proc.kill()
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(proc.pid, 0)


# Frames every stack of a process passes through; left out of the inclusive ranking.
_ROOTISH = re.compile(r"^(?:[\w<>.]+\.)?(<module>|_run_module_as_main|_run_code|run|run_forever|"
                      r"run_until_complete|_run_once|_run|main|_bootstrap|_bootstrap_inner|"
                      r"select|_main|wrapper|invoke|__call__|cli|serve|_worker) \(")


def profiles_markdown(profiles: list[Profile], top: int, header: str) -> str:
    """One markdown table per process: the top frames by self share, with their inclusive
    share, then the largest inclusive frames (the entry points where the time is spent)."""
    lines = [header, ""]
    for p in profiles:
        lines.append(f"**{p.name}** (pid {p.pid}): {p.samples:,} samples"
                     + (f"; py-spy used {p.cpu_s:.1f} s CPU" if not math.isnan(p.cpu_s) else "")
                     + (f"; {p.errors}" if p.errors else ""))
        lines.append("")
        if not p.samples:
            continue
        lines += ["| frame (self time) | self | total |", "|---|---:|---:|"]
        for f, s_, t in p.top(top):
            lines.append(f"| `{f}` | {s_:.1%} | {t:.1%} |")
        skip = {f for f in p.total_counts if _ROOTISH.match(f)}
        inc = p.top_total(top, skip)
        if inc:
            lines += ["", "| frame (inclusive) | total |", "|---|---:|"]
            for f, t in inc:
                lines.append(f"| `{f}` | {t:.1%} |")
        lines.append("")
    return "\n".join(lines)


def stream_lags(samples: dict[str, dict[str, float]]) -> dict[str, float]:
    """Seconds each drainer's view of each pump is behind that pump's own served watermark, from
    one scrape of every process ({"drainer-x<pump-1": s}); a stream that stops being read while
    its pump serves on shows here long before any probe."""
    from sluice.core.ts import physical_ms
    served = {name: m["sluice_pump_served_watermark"] for name, m in samples.items()
              if name.startswith("pump-") and m.get("sluice_pump_served_watermark")}
    out: dict[str, float] = {}
    for name, m in samples.items():
        if not name.startswith("drainer-"):
            continue
        for pump, wm in served.items():
            seen = m.get(f'sluice_drainer_pump_watermark{{pump="{pump}"}}')
            if seen:
                out[f"{name}<{pump}"] = (physical_ms(int(wm)) - physical_ms(int(seen))) / 1000
    return out


class StreamLagSampler:
    """Scrapes every pump and drainer once a second while a phase runs; keeps each stream's
    largest lag (stream_lags)."""

    def __init__(self, metrics_addrs: dict[str, str], every: float = 1.0) -> None:
        self.addrs = {k: a for k, a in metrics_addrs.items() if k.startswith(("pump-", "drainer-"))}
        self.every = every
        self.worst: dict[str, float] = {}    # stream -> largest lag seen (s)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-lag", daemon=True)

    def start(self) -> StreamLagSampler:
        if self.addrs:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._halt.wait(self.every):
            for stream, lag in stream_lags({k: scrape(a) for k, a in self.addrs.items()}).items():
                self.worst[stream] = max(lag, self.worst.get(stream, lag))

    def stop(self) -> dict[str, float]:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return {k: round(v, 2) for k, v in sorted(self.worst.items())}
