"""Capture throughput, against raw iteration of mysql-replication's BinLogStreamReader over the
same binlog, in one run (best of N, interleaved: the machine is shared).

Baseline: the library's reader (`FixedBinLogStreamReader`: BinLogStreamReader with only the
COM_BINLOG_DUMP length fixed — the unfixed one cannot read a binlog bigger than the socket
buffers in non-blocking mode, see capture/reader.py) iterated to the binlog's end, touching
`ev.rows` of every rows event (what any consumer must do to get values).

1. decode only — ours: capture.reader.BinlogReader over the same range: strict TableMap
   handling, the native row decoder (native/, `sluice_native`) into pb.Row/pb.Datum, schema
   tracking, whole transactions. In the same invocation the same reader with the old all-Python
   row decoder (tests/support/pydecode.py, the differential tests' oracle) shows what the native
   core changed. The reader frames rows, GTID, XID and known TableMap events natively and reads
   the dump connection's packets itself (capture/reader.py); the baseline is the library alone.
   The same reader with the native TxnScanner off (every event through Python, as before it)
   runs next to it in every repeat.
   Each decode-only run also reports its CPU time (this process's user + system)
   per source transaction, which a loaded machine disturbs far less than the wall time.
2. end to end — ours: the `sluice capture` process streaming the same range into two pump
   processes (etcd + TSO + 2 pumps on this machine), timed from its `connected` log line to the
   moment its metrics say every source transaction is committed to the pumps (prewrites,
   TSO, commits: all acknowledged, fsynced). Events/s = binlog events / that time.

    .venv/bin/python bench/capture.py [--txns 3000] [--rows-per-txn 5] [--repeat 3] [--port PORT]
                                      [--sysbench-txns N] [--median] [--profile]
                                      [--e2e-only] [--baseline-tree DIR ...] [--profile-e2e FILE]
                                      [--rate TPS --rate-seconds S [--variant NAME:KEY=V,...]]

The end-to-end runs also report the capture process's CPU per source transaction (/proc, from
the last metrics poll showing 0 committed to the one showing all committed). `--baseline-tree`
(repeatable) runs the capture from other checkouts (`git archive <commit> | tar -x -C DIR`)
through this venv, alternating with this checkout in every repeat: the baseline of the same
invocation. `--profile-e2e FILE` writes a py-spy profile (GIL samples) of this checkout's last run, and of the
first baseline tree's last run to FILE.baseline.

3. bounded rate (`--rate TPS`) — the capture live, not behind: etcd + TSO + 2 pumps, then per
   run a fresh `sluice capture` at the source's current GTID, and sysbench `oltp_write_only`
   paced at `--rate` for `--rate-seconds`; the window runs from the capture's first metrics
   answer in the streaming state until its metrics say every sysbench transaction is committed.
   Per source transaction it reports the capture process's CPU (/proc, all threads) and that of
   its main thread (the event loop) and of its busiest other thread (the binlog reader), its
   voluntary context switches (/proc/<pid>/task/*/status: every time a thread of it blocked and
   was woken — socket reads that waited, loop wake-ups, gRPC completions, GIL hand-overs between
   its threads), its groups, the
   pumps' write requests (their `sluice_pump_write_requests_total`) and, when the tree exports
   them, the reader's socket reads and the loop's cross-thread wake-ups; and the CPU per source
   transaction of the TSO, the two pumps and etcd over the same window (every group costs work
   there too). `--baseline-tree` alternates as in 2; `--variant NAME:KEY=V[,KEY=V]` runs this
   checkout with other capture settings (e.g. `min0:group-min-interval-ms=0`) in the rotation.

With --sysbench-txns the binlog is sysbench `oltp_write_only` instead (1 table of 10k rows
prepared first, then N transactions at full speed with 4 threads: per transaction two UPDATEs
with before/after images, a DELETE and an INSERT — about 10 binlog events).

Without --port it starts a throwaway MariaDB (tests/support/mariadb.py). Prints one table.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import typing
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pymysqlreplication.row_event import RowsEvent  # noqa: E402

from sluice.capture.reader import BinlogReader, FixedBinLogStreamReader  # noqa: E402
from sluice.capture.schema import SchemaTracker, TableFilter  # noqa: E402
from tests.support import pydecode  # noqa: E402

TABLE = """CREATE TABLE IF NOT EXISTS bench_capture.sbtest (
  id INT UNSIGNED PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL, pad CHAR(60) NOT NULL,
  amount DECIMAL(12,2), created DATETIME(6), flag TINYINT, note VARCHAR(255), big BIGINT UNSIGNED,
  score DOUBLE)"""


def load(conn, txns: int, rows: int) -> None:  # type: ignore[no-untyped-def]
    cur = conn.cursor()
    cur.execute("CREATE DATABASE IF NOT EXISTS bench_capture")
    cur.execute("DROP TABLE IF EXISTS bench_capture.sbtest")
    cur.execute(TABLE)
    n = 0
    for _ in range(txns):
        conn.begin()
        vals = []
        for _ in range(rows):
            n += 1
            vals.append((n, n * 7 % 1000, f"{n:0120d}"[:120], "x" * 60, f"{n}.25",
                         "2024-01-02 03:04:05.678901", n % 2, f"note {n} ✓", n * 1_000_003, n / 3))
        cur.executemany("INSERT INTO bench_capture.sbtest VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", vals)
        conn.commit()


def run_baseline(settings: dict, start: str) -> tuple[int, float, float]:
    c0 = time.process_time()
    t0 = time.perf_counter()
    s = FixedBinLogStreamReader(dict(settings), server_id=9101, blocking=False, is_mariadb=True,
                                auto_position=start, enable_logging=False)
    events = 0
    for ev in s:
        events += 1
        if isinstance(ev, RowsEvent):
            ev.rows  # noqa: B018 - decode the values
    s.close()
    return events, time.perf_counter() - t0, time.process_time() - c0


def run_ours(settings: dict, start: str, python_decoder: bool = False,
             by_event: bool = False) -> tuple[int, int, float, float]:
    c0 = time.process_time()
    t0 = time.perf_counter()
    tracker = (pydecode.python_decode_tracker("bench", TableFilter()) if python_decoder
               else SchemaTracker("bench", TableFilter()))
    r = BinlogReader(dict(settings), replica_server_id=9102, tracker=tracker,
                     gtid_state=start, blocking=False)
    if python_decoder:
        pydecode.use_python_decoder(r)
    if by_event:
        r._stream._scanner = None   # every event through Python (the path before TxnScanner)
    txns = rows = 0
    for t in r.transactions():
        txns += 1
        rows += sum(len(m.changes) for m in t.mutations)
    r.close()
    return txns, rows, time.perf_counter() - t0, time.process_time() - c0


def _log_time(text: str, marker: str) -> float | None:
    for line in text.splitlines():
        if marker in line:
            stamp = line.split(" ", 1)[0].rstrip("Z")
            return dt.datetime.fromisoformat(stamp).replace(tzinfo=dt.timezone.utc).timestamp()
    return None


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Runs `sluice` with the `sluice.*` packages taken from another checkout (a baseline commit's
# tree), through this venv's editable-install finder: same interpreter, same native module.
_TREE_LAUNCHER = """
import runpy, sys
import __editable___sluice_0_1_0_finder as f
here, tree = sys.argv[1], sys.argv[2]
for k, v in list(f.MAPPING.items()):
    if v.startswith(here):
        f.MAPPING[k] = tree + v[len(here):]
sys.argv = ["sluice", *sys.argv[3:]]
runpy.run_module("sluice.ctl.main", run_name="__main__")
"""


def _start_capture(cluster: typing.Any, producer: str, server_port: int, password: str, start: str,
                   tree: Path | None, extra: dict[str, object] | None = None) -> tuple[typing.Any, str]:
    """A capture process from GTID `start` (from `tree`'s checkout when given) and its metrics
    address."""
    from tests.support.cluster import set_args
    from tests.support.procs import PYTHON, Proc, free_port, sluice_argv
    metrics = f"127.0.0.1:{free_port()}"
    settings = {
        "producer-id": producer, "cluster-id": cluster.cluster_id, "etcd": cluster.etcd,
        "tso": cluster.tso_addrs, "start-position": f"gtid:{start}", "metrics-addr": metrics,
        "source.host": "127.0.0.1", "source.port": server_port, "source.user": "root",
        "source.password": password, "source.server-id": 9200 + int(producer.rsplit("-", 1)[1]),
        "source.name": producer, **(extra or {}),
    }
    argv = sluice_argv("capture", *set_args(settings))
    if tree is not None:
        here = str(Path(__file__).resolve().parents[1])
        argv = [PYTHON, "-c", _TREE_LAUNCHER, here, str(tree.resolve()), *argv[3:]]
    proc = Proc(producer, argv, cluster.workdir / f"{producer}.log").start()
    return proc, metrics


def spy_table(path: Path, top: int = 14) -> str:
    """py-spy raw (collapsed) stacks -> markdown: the top frames by self and by inclusive share."""
    selfs: dict[str, int] = {}
    totals: dict[str, int] = {}
    n = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        n += c
        selfs[frames[-1]] = selfs.get(frames[-1], 0) + c
        for f in set(frames):
            totals[f] = totals.get(f, 0) + c
    if not n:
        return "(no samples)"
    rows = [f"{n} {'thread' if _SPY_NATIVE else 'GIL'} samples", "", "| frame (self time) | self | total |", "|---|---:|---:|"]
    for f, c in sorted(selfs.items(), key=lambda kv: -kv[1])[:top]:
        rows.append(f"| `{f}` | {100 * c / n:.1f}% | {100 * totals[f] / n:.1f}% |")
    rows += ["", "| frame (inclusive) | total |", "|---|---:|"]
    for f, c in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
        rows.append(f"| `{f}` | {100 * c / n:.1f}% |")
    return "\n".join(rows)


def run_end_to_end(cluster, server_port: int, password: str, start: str, txns: int,  # type: ignore[no-untyped-def]
                   producer: str, tree: Path | None = None, profile: Path | None = None
                   ) -> tuple[float, float]:
    """(seconds from the capture's `connected` to `txns` source transactions committed, the
    capture process's CPU seconds over the catch-up). The CPU window opens at the last metrics
    poll (every 20 ms) that still showed 0 transactions committed, so start-up (imports,
    recovery) is outside it, and closes when all `txns` are committed. `tree`: run the capture
    from that checkout instead of this one (the baseline of the same invocation)."""
    from tests.support.procs import PYTHON, Proc
    proc, metrics = _start_capture(cluster, producer, server_port, password, start, tree)
    spy = None
    cpu0: float | None = None
    pattern = re.compile(r"^sluice_capture_transactions_total (\S+)$", re.M)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if not proc.alive():
                raise RuntimeError(f"capture exited:\n{proc.log_text()[-3000:]}")
            try:
                text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=1).read().decode()
            except OSError:
                time.sleep(0.05)
                continue
            m = pattern.search(text)
            done_txns = float(m.group(1)) if m else 0.0
            if done_txns == 0:
                cpu0 = _cpu_s(proc.pid)
                if profile is not None and spy is None:
                    # From the first metrics answer (imports done), the GIL holder only (--gil):
                    # the capture's own Python CPU over the catch-up.
                    spy = Proc(f"{producer}-py-spy", [
                        str(Path(PYTHON).parent / "py-spy"), "record", "--pid", str(proc.pid),
                        "--gil", "--nonblocking", "--function", "--rate", "200", "--format", "raw",
                        "--output", str(profile)], cluster.workdir / f"{producer}-py-spy.log").start()
            if done_txns >= txns:
                done, cpu1 = time.time(), _cpu_s(proc.pid)
                t0 = _log_time(proc.log_text(), "capture connected")
                assert t0 is not None
                if cpu0 is None:
                    raise RuntimeError("the capture committed transactions before its metrics "
                                       "answered: no CPU window")
                return done - t0, cpu1 - cpu0
            # Every 20 ms until the CPU window opens, then every 100 ms: each poll costs the
            # capture a metrics render, which is not per-transaction work.
            time.sleep(0.02 if done_txns == 0 else 0.1)
        raise RuntimeError("end-to-end run did not finish in 120 s")
    finally:
        if spy is not None:
            spy.signal(2)     # SIGINT: py-spy writes its output and exits
            assert spy.popen is not None
            try:
                spy.popen.wait(30)
            except subprocess.TimeoutExpired:
                pass
            spy.stop()
        proc.stop()


def _scrape(addr: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=2).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def _thread_cpu_s(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of a process so far, by thread id (/proc)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue    # a thread that ended meanwhile
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _ctx_switches(pid: int) -> int:
    """Voluntary context switches of every thread of a process so far: each time one of its
    threads blocked (a socket read that waited, the loop's poll, a GIL hand-over) and was woken.
    Involuntary ones (preemption) measure the machine's load, not the capture, and are left out."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    n += int(line.split()[1])
        except OSError:
            pass    # a thread that ended meanwhile
    return n


@dataclasses.dataclass
class RateRun:
    """One bounded-rate run of one tree: totals over its window."""
    txns: int              # sysbench transactions (= source transactions)
    tps: float             # sysbench's achieved rate
    cpu_s: float           # capture process CPU over the window
    ctx: int               # its context switches
    groups: float
    pump_writes: float     # write requests acknowledged by the two pumps
    reads: float | None    # the reader's socket reads (None: the tree does not export it)
    wakeups: float | None  # cross-thread wake-ups of the event loop (None: not exported)
    group_ms: float        # mean prewrite -> commit-ack time of a group
    drain_s: float         # from sysbench's end to the last transaction committed
    loop_s: float = float("nan")     # the main thread's CPU over the window (the event loop)
    reader_s: float = float("nan")   # the busiest other thread's: the binlog reader
    # CPU over the same window of the processes every group also costs: the TSO, the two
    # pumps, etcd (the capture's group size changes their work too)
    others_s: dict[str, float] = dataclasses.field(default_factory=dict)


_READS = "sluice_capture_source_reads_total"
# --profile-native: py-spy samples every non-idle thread with native frames (not --gil)
_SPY_NATIVE = False
_WAKEUPS = "sluice_capture_loop_wakeups_total"


def run_rate(cluster, server_port: int, password: str, sb, rate: int, seconds: int,  # type: ignore[no-untyped-def]
             producer: str, pump_metrics: list[str], tree: Path | None = None,
             profile: Path | None = None, extra: dict[str, object] | None = None,
             others: dict[str, int] | None = None) -> RateRun:
    """A fresh capture at the source's current GTID, then sysbench paced at `rate` for `seconds`
    while it streams live into the pumps; totals from its streaming start to all committed."""
    from tests.support.procs import PYTHON, Proc
    import pymysql
    with pymysql.connect(host="127.0.0.1", port=server_port, user="root", password=password) as c, \
            c.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        start = cur.fetchone()[0] or ""
    proc, metrics = _start_capture(cluster, producer, server_port, password, start, tree, extra)
    others = others or {}
    spy = None
    try:
        deadline = time.time() + 60
        while True:
            if not proc.alive():
                raise RuntimeError(f"capture exited:\n{proc.log_text()[-3000:]}")
            if time.time() > deadline:
                raise RuntimeError("the capture did not reach the streaming state in 60 s")
            try:
                m0 = _scrape(metrics)
            except OSError:
                time.sleep(0.1)
                continue
            if m0.get('sluice_capture_state{state="streaming"}') == 1:
                break
            time.sleep(0.1)
        time.sleep(1.0)    # settle: the first heartbeat, imports of lazily loaded modules

        def pumps_writes() -> float:
            return sum(_scrape(a).get("sluice_pump_write_requests_total", 0.0) for a in pump_metrics)

        if profile is not None:
            spy = Proc(f"{producer}-py-spy", [
                str(Path(PYTHON).parent / "py-spy"), "record", "--pid", str(proc.pid),
                # every running thread with its native frames (gRPC's C threads, the native
                # decode), so the shares are of the process's CPU, not of the GIL's holder
                # (--native needs the process paused per sample: not the run to read CPU from)
                *(["--native", "--threads"] if _SPY_NATIVE else ["--gil", "--nonblocking"]),
                "--function", "--rate", "200", "--format", "raw",
                "--output", str(profile)], cluster.workdir / f"{producer}-py-spy.log").start()
        m0, w0 = _scrape(metrics), pumps_writes()
        cpu0, ctx0, th0 = _cpu_s(proc.pid), _ctx_switches(proc.pid), _thread_cpu_s(proc.pid)
        o0 = {k: _cpu_s(pid) for k, pid in others.items()}
        res = sb.run(seconds, rate)
        ended = time.time()
        want = m0.get("sluice_capture_transactions_total", 0.0) + res.transactions
        deadline = time.time() + 120
        while True:
            m1 = _scrape(metrics)
            if m1.get("sluice_capture_transactions_total", 0.0) >= want:
                break
            if time.time() > deadline or not proc.alive():
                raise RuntimeError(f"the capture did not commit {res.transactions} transactions "
                                   f"(at {m1.get('sluice_capture_transactions_total')} of {want})")
            time.sleep(0.05)
        drained = time.time()
        cpu1, ctx1, th1 = _cpu_s(proc.pid), _ctx_switches(proc.pid), _thread_cpu_s(proc.pid)
        others_s = {k: _cpu_s(pid) - o0[k] for k, pid in others.items()}
        th = {t: c - th0.get(t, 0.0) for t, c in th1.items()}
        loop_s = th.pop(proc.pid, float("nan"))
        w1 = pumps_writes()
        # The counters of the reads and wake-ups are published by the capture once a second.
        time.sleep(1.2)
        m2 = _scrape(metrics)

        def delta(name: str, after: dict[str, float] = m1) -> float:
            return after.get(name, 0.0) - m0.get(name, 0.0)

        gs = delta("sluice_capture_group_seconds_sum")
        gc = delta("sluice_capture_group_seconds_count")
        return RateRun(
            txns=res.transactions, tps=res.tps, cpu_s=cpu1 - cpu0, ctx=ctx1 - ctx0,
            groups=delta("sluice_capture_groups_total"), pump_writes=w1 - w0,
            reads=delta(_READS, m2) if _READS in m2 else None,
            wakeups=delta(_WAKEUPS, m2) if _WAKEUPS in m2 else None,
            group_ms=1000 * gs / gc if gc else float("nan"), drain_s=drained - ended,
            loop_s=loop_s, reader_s=max(th.values(), default=float("nan")), others_s=others_s)
    finally:
        if spy is not None:
            spy.signal(2)
            assert spy.popen is not None
            try:
                spy.popen.wait(30)
            except subprocess.TimeoutExpired:
                pass
            spy.stop()
        proc.stop()


def _other_ms(runs: list[RateRun], key: str) -> str:
    """Median ms CPU per transaction of the TSO, the pumps, etcd or all with the capture."""
    vals = []
    for r in runs:
        o = r.others_s
        if not o:
            return "n/a"
        v = r.cpu_s + sum(o.values()) if key == "all" else sum(
            x for k, x in o.items() if k == key or (key == "pumps" and k.startswith("pump-")))
        vals.append(1000 * v / r.txns)
    return f"{statistics.median(vals):.4f}"


def print_rate(a, variants: list[tuple[str, list[RateRun]]], loads: list[float]) -> None:  # type: ignore[no-untyped-def]
    med = statistics.median
    print(f"bounded rate: sysbench oltp_write_only at --rate {a.rate} for {a.rate_seconds} s, capture "
          f"live into 2 pumps; median of {a.repeat}, alternating; load average at each run's start: "
          f"{', '.join(f'{x:.1f}' for x in loads)}")
    print()
    print("| capture | tps | CPU ms / txn | runs (CPU ms/txn) | reader thread ms / txn | loop thread ms / txn "
          "| voluntary ctx switches / txn | socket reads / txn "
          "| loop wake-ups / txn | txns / group | pump writes / txn | group ms | drain s "
          "| TSO ms / txn | pumps ms / txn | etcd ms / txn | capture + TSO + pumps + etcd ms / txn |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, runs in variants:
        per = [1000 * r.cpu_s / r.txns for r in runs]

        def m(f):  # type: ignore[no-untyped-def]
            vals = [f(r) for r in runs]
            return "n/a" if any(v is None for v in vals) else f"{med(vals):.3f}"
        print(f"| {name} | {med(r.tps for r in runs):,.0f} | {med(per):.4f} | "
              f"{', '.join(f'{x:.4f}' for x in per)} | {med(1000 * r.reader_s / r.txns for r in runs):.4f} | "
              f"{med(1000 * r.loop_s / r.txns for r in runs):.4f} | {m(lambda r: r.ctx / r.txns)} | "
              f"{m(lambda r: None if r.reads is None else r.reads / r.txns)} | "
              f"{m(lambda r: None if r.wakeups is None else r.wakeups / r.txns)} | "
              f"{m(lambda r: r.txns / r.groups if r.groups else 0.0)} | "
              f"{m(lambda r: r.pump_writes / r.txns)} | {m(lambda r: r.group_ms)} | "
              f"{m(lambda r: r.drain_s)} | "
              + " | ".join(_other_ms(runs, k) for k in ("tso", "pumps", "etcd", "all")) + " |")
    if len(variants) > 1:
        base = med(1000 * r.cpu_s / r.txns for r in variants[0][1])
        for name, runs in variants[1:]:
            ours = med(1000 * r.cpu_s / r.txns for r in runs)
            print(f"| {name} vs {variants[0][0]} (CPU) | | {base / ours:.2f}x less | | | | | | | | | | | | | | |")
    print(f"machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
          f"python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}")


def _parse_variant(text: str) -> tuple[str, dict[str, object]]:
    name, _, rest = text.partition(":")
    pairs = [kv.split("=", 1) for kv in rest.split(",") if kv.strip()]
    if not name or not pairs or any(len(kv) != 2 for kv in pairs):
        raise SystemExit(f"--variant {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE]")
    def typed(v: str) -> object:
        try:
            return int(v)
        except ValueError:
            return v
    return name, {k.strip(): typed(v.strip()) for k, v in pairs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--txns", type=int, default=3000)
    ap.add_argument("--rows-per-txn", type=int, default=5)
    ap.add_argument("--port", type=int)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--median", action="store_true",
                    help="report the median of the repeats instead of the best (a loaded machine)")
    ap.add_argument("--no-end-to-end", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one native decode-only run (cProfile) and print its top frames")
    ap.add_argument("--baseline-tree", type=Path, action="append", default=[],
                    help="end to end: also run the capture from this checkout (e.g. `git archive` of "
                         "the baseline commit), alternating with this one in every repeat; "
                         "repeatable (intermediate steps), the first is the baseline")
    ap.add_argument("--profile-e2e", type=Path,
                    help="py-spy (GIL samples, raw collapsed stacks) of this checkout's capture in the "
                         "last end-to-end repeat, written to this file (the first baseline tree's "
                         "to FILE.baseline)")
    ap.add_argument("--e2e-only", action="store_true",
                    help="skip the decode-only runs (count transactions with one native run)")
    ap.add_argument("--sysbench-txns", type=int, default=0,
                    help="read a sysbench oltp_write_only binlog of this many transactions")
    ap.add_argument("--rate", type=int, default=0,
                    help="bounded-rate mode: sysbench paced at this many tps while the capture "
                         "streams live (see 3. above)")
    ap.add_argument("--rate-seconds", type=int, default=30)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=V[,KEY=V]",
                    help="--rate: also run this checkout with these capture settings (e.g. "
                         "'min0:group-min-interval-ms=0'), alternating with the others; repeatable")
    ap.add_argument("--profile-rate", type=Path,
                    help="--rate: py-spy (GIL samples) of this checkout's last run to FILE, the "
                         "first baseline tree's to FILE.baseline")
    ap.add_argument("--profile-native", action="store_true",
                    help="--profile-rate: sample every running thread with native frames "
                         "(py-spy --native --threads) instead of the GIL holder only")
    a = ap.parse_args()
    global _SPY_NATIVE
    _SPY_NATIVE = a.profile_native
    workdir = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    server = cluster = etcd = None
    if a.port is None:
        from tests.support.mariadb import MariaDBServer
        server = MariaDBServer(workdir / "mariadb").start()
        port, password = server.port, server.password
    else:
        port, password = a.port, os.environ.get("BENCH_PASSWORD", "sluice-root")
    settings = {"host": "127.0.0.1", "port": port, "user": "root", "password": password}
    import pymysql
    conn = pymysql.connect(**settings, autocommit=True)
    try:
        cur = conn.cursor()
        sb = None
        if a.sysbench_txns:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from e2e_support import Sysbench
            sb = Sysbench(port, password, tables=1, table_size=10_000, threads=4)
            sb.prepare()
        if a.rate:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from e2e_support import Sysbench
            from tests.support.cluster import Cluster
            from tests.support.procs import EtcdServer, free_port
            sb = Sysbench(port, password, tables=1, table_size=10_000, threads=4)
            sb.prepare()
            etcd = EtcdServer(workdir / "etcd").start()
            cluster = Cluster(workdir, etcd.endpoint)
            cluster.start_tso()
            pump_metrics = [f"127.0.0.1:{free_port()}" for _ in range(2)]
            for p, addr in zip(("pump-1", "pump-2"), pump_metrics):
                cluster.start_pump(p, wait_online=False, **{"metrics-addr": addr})
            for p in ("pump-1", "pump-2"):
                cluster.wait_pump_writable(cluster.pumps[p])
            others = {"tso": cluster.procs[0].pid, "etcd": etcd.proc.pid,
                      **{p: h.proc.pid for p, h in cluster.pumps.items()}}
            variants = [_parse_variant(v) for v in a.variant]
            trees: list[Path | None] = [*a.baseline_tree, *[None] * len(variants), None]
            extras: list[dict[str, object] | None] = [None] * len(a.baseline_tree) + [
                v[1] for v in variants] + [None]
            runs: list[list[RateRun]] = [[] for _ in trees]
            loads = []
            n = 0
            for i in range(a.repeat):
                for j, tree in enumerate(trees):
                    loads.append(os.getloadavg()[0])
                    prof = None
                    if a.profile_rate is not None and i == a.repeat - 1:
                        if tree is None:
                            prof = a.profile_rate
                        elif j == 0:
                            prof = a.profile_rate.with_name(a.profile_rate.name + ".baseline")
                    runs[j].append(run_rate(cluster, port, password, sb, a.rate, a.rate_seconds,
                                            f"bench-cap-{n}", pump_metrics, tree, prof,
                                            extras[j], others))
                    n += 1
            names = [f"{'baseline' if j == 0 else 'step'} tree {t}" for j, t in enumerate(a.baseline_tree)]
            names += [f"this checkout, {v[0]}" for v in variants]
            print_rate(a, list(zip([*names, "this checkout"], runs)), loads)
            if a.profile_rate is not None:
                base_prof = a.profile_rate.with_name(a.profile_rate.name + ".baseline")
                for what, path in (("the baseline tree's", base_prof), ("this checkout's", a.profile_rate)):
                    if path.exists():
                        print()
                        print(f"py-spy of {what} capture, last repeat ({path}):")
                        print(spy_table(path))
            return
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        start = cur.fetchone()[0] or ""
        if sb is not None:
            import subprocess
            out = subprocess.run(sb.argv("run", f"--events={a.sysbench_txns}", "--time=0"),
                                 capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                raise RuntimeError(f"sysbench run failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
        else:
            load(conn, a.txns, a.rows_per_txn)
        if not a.no_end_to_end:
            from tests.support.cluster import Cluster
            from tests.support.procs import EtcdServer
            etcd = EtcdServer(workdir / "etcd").start()
            cluster = Cluster(workdir, etcd.endpoint)
            cluster.start_tso()
            for p in ("pump-1", "pump-2"):
                cluster.start_pump(p, wait_online=False)
            for p in ("pump-1", "pump-2"):
                cluster.wait_pump_writable(cluster.pumps[p])
        base, ours, old, by_event = [], [], [], []
        e2e: list[tuple[float, float]] = []
        e2e_trees: list[list[tuple[float, float]]] = [[] for _ in a.baseline_tree]
        loads: list[float] = []
        if a.e2e_only:
            events, _, _ = run_baseline(settings, start)
            txns, rows, _, _ = run_ours(settings, start)
        for i in range(a.repeat):
            if not a.e2e_only:
                events, bt, bc = run_baseline(settings, start)
                base.append((bt, bc))
                txns, rows, pt, pc = run_ours(settings, start, python_decoder=True)
                old.append((pt, pc))
                txns, rows, et_, ec_ = run_ours(settings, start, by_event=True)
                by_event.append((et_, ec_))
                txns, rows, ot, oc = run_ours(settings, start)
                ours.append((ot, oc))
            if cluster is not None:
                # Alternating, close together: the machine is shared.
                k = len(a.baseline_tree) + 1
                for j, tree in enumerate(a.baseline_tree):
                    loads.append(os.getloadavg()[0])
                    prof = (a.profile_e2e.with_name(a.profile_e2e.name + ".baseline")
                            if a.profile_e2e is not None and j == 0 and i == a.repeat - 1 else None)
                    e2e_trees[j].append(run_end_to_end(cluster, port, password, start, txns,
                                                       f"bench-cap-{k * i + j}", tree, profile=prof))
                loads.append(os.getloadavg()[0])
                e2e.append(run_end_to_end(cluster, port, password, start, txns,
                                          f"bench-cap-{k * i + k - 1}",
                                          profile=a.profile_e2e if i == a.repeat - 1 else None))
        pick = statistics.median if a.median else min
        stat = f"median of {a.repeat}" if a.median else f"best of {a.repeat}"
        if a.e2e_only:
            print(f"end to end over {events} events ({txns} txns, {rows} rows), {stat}; load "
                  f"average at each run's start: {', '.join(f'{x:.1f}' for x in loads)}")
            print()
            print("| capture | wall s | txns/s | capture CPU ms per source txn | runs (CPU ms/txn) |")
            print("|---|---|---|---|---|")
            variants = [(f"{'baseline' if j == 0 else 'step'} tree {tree}", e2e_trees[j])
                        for j, tree in enumerate(a.baseline_tree)] + [("this checkout", e2e)]
            for name, runs in variants:
                w, c = pick(w for w, _ in runs), pick(c for _, c in runs)
                print(f"| {name} | {w:.2f} | {txns / w:,.0f} | {1000 * c / txns:.4f} | "
                      f"{', '.join(f'{1000 * c_ / txns:.4f}' for _, c_ in runs)} |")
            if a.baseline_tree:
                cb = pick(c for _, c in e2e_trees[0])
                for name, runs in variants[1:]:
                    print(f"| {name} vs baseline (CPU) | | | {cb / pick(c for _, c in runs):.2f}x less | |")
            if a.profile_e2e is not None:
                base_prof = a.profile_e2e.with_name(a.profile_e2e.name + ".baseline")
                for what, path in (("the baseline tree's", base_prof), ("this checkout's", a.profile_e2e)):
                    if path.exists():
                        print()
                        print(f"py-spy of {what} capture, last repeat ({path}):")
                        print(spy_table(path))
            print(f"machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
                  f"python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}, "
                  f"date {time.strftime('%Y-%m-%d %H:%M')}, {stat}")
            return
        bt, pt, et, ot = (pick(w for w, _ in runs) for runs in (base, old, by_event, ours))
        bcpu, pcpu, ecpu, ocpu = (pick(c for _, c in runs) for runs in (base, old, by_event, ours))
        ms = 1000 / txns
        print(f"decode only over {events} events ({txns} txns, {rows} rows), {stat}:")
        print()
        print("| reader | events/s (wall) | x baseline | CPU ms per source txn | x baseline (CPU) |")
        print("|---|---|---|---|---|")
        print(f"| baseline: BinLogStreamReader + .rows | {events / bt:,.0f} | 1.00x | {bcpu * ms:.3f} | 1.00x |")
        print(f"| BinlogReader, old Python row decoder | {events / pt:,.0f} | {bt / pt:.2f}x | "
              f"{pcpu * ms:.3f} | {bcpu / pcpu:.2f}x |")
        print(f"| BinlogReader, native row decoder, event by event (no TxnScanner) | {events / et:,.0f} | "
              f"{bt / et:.2f}x | {ecpu * ms:.3f} | {bcpu / ecpu:.2f}x |")
        print(f"| BinlogReader, native row decoder, whole transactions (TxnScanner) | {events / ot:,.0f} | "
              f"{bt / ot:.2f}x | {ocpu * ms:.3f} | {bcpu / ocpu:.2f}x |")
        print(f"| whole transactions vs event by event | | {et / ot:.2f}x | | {ecpu / ocpu:.2f}x |")
        print("| runs, CPU ms per source txn: event by event / whole | | | "
              f"{', '.join(f'{c * ms:.3f}' for _, c in by_event)} / "
              f"{', '.join(f'{c * ms:.3f}' for _, c in ours)} | |")
        print(f"| native vs old Python decoder | | {pt / ot:.2f}x | | {pcpu / ocpu:.2f}x |")
        if e2e:
            et, ec = pick(w for w, _ in e2e), pick(c for _, c in e2e)
            print()
            print(f"end to end (capture process -> 2 pumps, all committed): {events / et:,.0f} events/s "
                  f"({txns / et:,.0f} txns/s), {bt / et:.2f}x the baseline's decode rate; capture "
                  f"CPU {1000 * ec / txns:.4f} ms per source txn")
        if a.profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            run_ours(settings, start)
            prof.disable()
            st = pstats.Stats(prof)
            total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
            print()
            print("| top frames of the native decode-only run (own time) | share |")
            print("|---|---|")
            rows_ = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:15]  # type: ignore[attr-defined]
            native = [kv for kv in st.stats.items()  # type: ignore[attr-defined]
                      if ("RowDecoder" in kv[0][2] or "MergeFromString" in kv[0][2]
                          or kv[0][0].endswith("types.py") and kv[0][2] == "decode")
                      and kv not in rows_]
            for (file, line, func), v in rows_ + native:
                where = f"{Path(file).name}:{line}" if line else file
                print(f"| `{func}` ({where}) | {100 * v[2] / total:.1f}% |")
        print(f"machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
              f"python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}, "
              f"date {time.strftime('%Y-%m-%d')}, {stat}")
    finally:
        conn.close()
        if cluster is not None:
            cluster.stop()
        if etcd is not None:
            etcd.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
