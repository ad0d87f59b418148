"""MySQL sink apply throughput: MySQLSink (causality workers, merged batches) vs a naive single-thread apply.

Both sides apply the same pre-built transactions (RandomWorkload: inserts, updates, deletes,
primary-key changes, unique-key swaps over four tables, one of them keyless; every Datum kind)
to a fresh database on the same MariaDB, started by this script (apt's mariadbd, 127.0.0.1).
`--keyless both` (the default) runs the workload twice, with and without the keyless table: a
keyless table's UPDATE/DELETE must find its row by the full row image, a scan that grows with the
table on both sides, so at 50k transactions that one table dominates the database's CPU; the
two tables show the apply path with and without it.
Each side's result is checked equal to the workload's in-memory model, so a fast wrong answer
cannot win.

- naive: one connection, one downstream transaction per source transaction, one statement per
  row (the translator's and SQL builder's own output, so decoding costs the same on both sides).
- sink: drainer/sinks/mysql.py with each of --workers worker counts, --batch rows per worker
  batch (--backlog: rows per transaction when a worker is backlogged), fed --apply-batch
  transactions per apply() call, flushed at the end.

Lag: sink — from an apply() call to the first checkpoint() covering its last transaction
(checkpoint() polled every 2 ms); naive — from the start of the same chunk of --apply-batch
transactions to its last COMMIT. p50/p99 over the chunks.

Decode paths (issue 23): the sink runs once per --paths entry — `native` (Translator: the
native Prewrite decode, native/src/prewrite.rs, and causality keys, native/src/causality.rs),
`pykeys` (native decode, the former Python causality keys) and `python` (the former all-Python
decode, tests/support/pytranslate.py) — so "CPU s Python" compares the drainer process as a whole.
Before that, the decode + translate step alone on the same transactions, in this process:
CPU µs per transaction and per row of the join (Txn.from_binlogs: the native txnjoin.rs vs the
former Python join, tests/support/pyjoin.py), of the all-Python translate path, of the native
decode with the former Python causality keys (PyKeysTranslator) and of the native decode with
the native keys (causality.rs) — process_time, gc off, every step once per round so old and new
alternate, the median of --decode-repeat rounds, the load average of each round printed.

Wall-clock times; the sides alternate per repeat and the median is reported. The machine is
shared: the load average is printed with the results; compare ratios within one run only.

Run: .venv/bin/python bench/drainer_apply.py [--txns 50000] [--keys N (default: --txns)]
     [--workers 4,16] [--keyless both|with|without] [--batch 20] [--backlog 500] [--repeat 1]
     [--durable]   (--durable: innodb_flush_log_at_trx_commit=1, sync_binlog=1)
     [--paths native,python] [--decode-repeat 5] [--decode-only]
"""
from __future__ import annotations

import argparse
import psutil
import asyncio
import datetime
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sluice.drainer.sink import Checkpoint  # noqa: E402
from sluice.drainer.sinks.mysql import MySQLSink, MySQLSinkConfig  # noqa: E402
from sluice.drainer.sql import row_sql  # noqa: E402
from sluice.drainer.translator import Translator  # noqa: E402
from sluice.drainer.txn import Txn  # noqa: E402
from tests.support.mariadb import MariaDBServer  # noqa: E402
from tests.support import pyjoin  # noqa: E402
from tests.support.pytranslate import PyKeysTranslator, PyTranslator  # noqa: E402
from tests.support.rows import RandomWorkload, create_sql, fetch_rows, history_of  # noqa: E402


def cpu(server: MariaDBServer) -> tuple[float, float]:
    """(CPU seconds of this process, of mariadbd) so far."""
    own = psutil.Process().cpu_times()
    db = psutil.Process(server.proc.pid).cpu_times()
    return own.user + own.system, db.user + db.system


def prepare(server: MariaDBServer, wl: RandomWorkload, db: str) -> None:
    server.execute(f"DROP DATABASE IF EXISTS `{db}`")
    server.execute(f"CREATE DATABASE `{db}`")
    for t in wl.tables:
        server.execute(create_sql(t))


def naive(server: MariaDBServer, txns: list[Txn], history, chunk: int) -> tuple[float, list[float]]:
    """(seconds, per-chunk lag) applying one source transaction per downstream transaction."""
    tr = Translator()
    conn = server.connect()
    lags: list[float] = []
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION time_zone='+00:00', foreign_key_checks=0, "
                        "sql_mode='STRICT_TRANS_TABLES,NO_AUTO_VALUE_ON_ZERO'")
            t0 = time.perf_counter()
            for i in range(0, len(txns), chunk):
                c0 = time.perf_counter()
                for txn in txns[i:i + chunk]:
                    changes = tr.translate(txn, history)
                    if not changes:
                        continue
                    cur.execute("BEGIN")
                    for ch in changes:
                        for stmt in row_sql(ch, False):
                            cur.execute(stmt)
                    cur.execute("COMMIT")
                lags.append(time.perf_counter() - c0)
            return time.perf_counter() - t0, lags
    finally:
        conn.close()


def sink(server: MariaDBServer, txns: list[Txn], history, args: argparse.Namespace, workers: int,
         cp_schema: str, path: str = "native") -> tuple[float, list[float], int]:
    """(seconds, per-apply-call lag, conflicts) through MySQLSink."""
    cfg = MySQLSinkConfig(port=server.port, user=server.user, password=server.password,
                          worker_count=workers, txn_batch=args.batch, txn_batch_backlog=args.backlog,
                          checkpoint_schema=cp_schema)

    async def run() -> tuple[float, list[float], int]:
        s = MySQLSink(cfg, history, epoch=1, name="bench")
        if path == "python":
            s._translator = PyTranslator()
        elif path == "pykeys":
            s._translator = PyKeysTranslator()
        await s.open(Checkpoint(0))
        calls: list[tuple[float, int]] = []     # (apply() called, its last commit_ts)
        covered: dict[int, float] = {}
        stop = asyncio.Event()

        async def poll() -> None:
            nxt = 0
            while not stop.is_set() or nxt < len(calls):
                cp = s.checkpoint().commit_ts
                now = time.perf_counter()
                while nxt < len(calls) and calls[nxt][1] <= cp:
                    covered[nxt] = now
                    nxt += 1
                await asyncio.sleep(0.002)

        poller = asyncio.create_task(poll())
        try:
            t0 = time.perf_counter()
            for i in range(0, len(txns), args.apply_batch):
                part = txns[i:i + args.apply_batch]
                calls.append((time.perf_counter(), part[-1].commit_ts))
                await s.apply(part)
            await s.flush()
            elapsed = time.perf_counter() - t0
            stop.set()
            await asyncio.wait_for(poller, 10)
            return elapsed, [covered[i] - calls[i][0] for i in range(len(calls))], s.conflicts
        finally:
            stop.set()
            poller.cancel()
            await s.close()

    return asyncio.run(run())


def decode_stage(wl: RandomWorkload, txns: list[Txn], history, repeat: int) -> str:
    """CPU per transaction of the decode + translate step, both paths, same transactions."""
    from tests.support.rows import binlogs
    raw = [binlogs(t.prewrite, t.start_ts, t.commit_ts) for t in txns]
    data = txns[1:]
    rows = sum(len(m.changes) for t in data for m in t.prewrite.mutations)
    samples: dict[str, list[float]] = {}

    def run(name: str, fn) -> None:
        gc.disable()
        try:
            t0 = time.process_time()
            fn()
            samples.setdefault(name, []).append(time.process_time() - t0)
        finally:
            gc.enable()

    def translate(cls):
        def go() -> None:
            tr = cls()
            for t in data:
                tr.translate(t, history)
        return go

    def join(fn):
        def go() -> None:
            for p, c in raw[1:]:
                fn(p, c, "bench")
        return go

    def py_join(p, c, pump):
        return Txn._joined(pyjoin.py_join(p, c, pump), pump)

    loads = []
    for _ in range(repeat):   # every step once per round: old and new alternate
        run("python", translate(PyTranslator))
        run("pykeys", translate(PyKeysTranslator))
        run("native", translate(Translator))
        run("join_old", join(py_join))
        run("from_binlogs", join(Txn.from_binlogs))
        loads.append(os.getloadavg()[0])
    best = {k: statistics.median(v) for k, v in samples.items()}
    n = len(data)
    out = [f"## decode + translate step: {n} transactions, {rows} row changes, median of {repeat} "
           f"alternating rounds; load average (1 min) per round: "
           + " ".join(f"{x:.1f}" for x in loads),
           "| step | CPU µs/txn | CPU µs/row | ratio |", "|---|---|---|---|"]
    for name, label, base in (
            ("join_old", "join: Python (before issue 23's txnjoin.rs)", None),
            ("from_binlogs", "join: native txnjoin.rs + upb prewrite parse (after)", "join_old"),
            ("python", "translate: all-Python path", None),
            ("pykeys", "translate: native decode, Python causality keys (before)", "python"),
            ("native", "translate: native decode, native causality keys (after)", "pykeys")):
        v = best[name]
        ratio = f"{best[base] / v:.2f}x vs the row above" if base else ""
        out.append(f"| {label} | {v / n * 1e6:.1f} | {v / rows * 1e6:.2f} | {ratio} |")
    return "\n".join(out)


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def check(server: MariaDBServer, wl: RandomWorkload, side: str) -> None:
    conn = server.connect()
    try:
        for t in wl.tables:
            if fetch_rows(conn, t) != wl.expected(t):
                raise SystemExit(f"{side}: downstream {t.qualified} differs from the model")
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--txns", type=int, default=50000)
    ap.add_argument("--keys", type=int, default=0, help="key space (default: --txns)")
    ap.add_argument("--workers", default="4,16", help="comma-separated worker counts")
    ap.add_argument("--keyless", choices=("both", "with", "without"), default="both",
                    help="run the workload with the keyless table, without it, or both")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--backlog", type=int, default=500)
    ap.add_argument("--apply-batch", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--durable", action="store_true")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--paths", default="native,python",
                    help="decode paths of the sink side: native (today), pykeys (native decode, the former "
                         "Python causality keys), python (the former all-Python decode)")
    ap.add_argument("--decode-repeat", type=int, default=5)
    ap.add_argument("--decode-only", action="store_true", help="only the decode + translate step")
    args = ap.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]

    args.keys = args.keys or args.txns
    args.paths = [p for p in args.paths.split(",") if p]
    if args.decode_only:
        wl = RandomWorkload(args.seed, "bench_apply", keys=args.keys)
        txns = wl.transactions(args.txns, first_ts=1 << 40)
        print(f"# drainer decode + translate step; machine: {platform.machine()} {os.cpu_count()} cores, "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
        print(decode_stage(wl, txns, history_of(txns), args.decode_repeat))
        return
    modes = {"both": (True, False), "with": (True,), "without": (False,)}[args.keyless]
    started = time.perf_counter()
    load_start = os.getloadavg()
    extra = ["--innodb-flush-log-at-trx-commit=1", "--sync-binlog=1"] if args.durable else []
    tables: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-apply-") as tmp:
        server = MariaDBServer(Path(tmp), extra_args=extra).start()
        try:
            for keyless in modes:
                tables.append(run_mode(server, args, worker_counts, keyless))
        finally:
            server.stop()
    load_end = os.getloadavg()
    print(f"# drainer apply to MariaDB: {args.txns} transactions, keys {args.keys}, "
          f"{'durable' if args.durable else 'innodb_flush_log_at_trx_commit=2'}, median of {args.repeat}")
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, load average (1 min) "
          f"{load_start[0]:.1f} at start, {load_end[0]:.1f} at end, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"total run {time.perf_counter() - started:.0f} s")
    print(f"sink: txn-batch {args.batch}, txn-batch-backlog {args.backlog}, apply() calls of "
          f"{args.apply_batch} transactions; lag = apply() call -> checkpoint() covering it")
    for table in tables:
        print()
        print(table)


def run_mode(server: MariaDBServer, args: argparse.Namespace, worker_counts: list[int],
             keyless: bool) -> str:
    """Both sides on one workload; returns its result table."""
    wl = RandomWorkload(args.seed, "bench_apply", keys=args.keys, keyless=keyless)
    txns = wl.transactions(args.txns, first_ts=1 << 40)
    history = history_of(txns)
    rows = wl.rows
    stage = decode_stage(wl, txns, history, args.decode_repeat)
    sides = [(w, p) for w in worker_counts for p in args.paths]
    t_naive: list[float] = []
    lag_naive: list[float] = []
    c_naive: list[tuple[float, float]] = []
    t_sink: dict[tuple[int, str], list[float]] = {k: [] for k in sides}
    lag_sink: dict[tuple[int, str], list[float]] = {k: [] for k in sides}
    c_sink: dict[tuple[int, str], list[tuple[float, float]]] = {k: [] for k in sides}
    conflicts: dict[tuple[int, str], int] = {}
    loads: list[float] = []
    for r in range(args.repeat):
        prepare(server, wl, "bench_apply")
        a = cpu(server)
        t, lags = naive(server, txns, history, args.apply_batch)
        b = cpu(server)
        loads.append(os.getloadavg()[0])
        t_naive.append(t)
        lag_naive += lags
        c_naive.append((b[0] - a[0], b[1] - a[1]))
        check(server, wl, "naive")
        for w, path in sides:
            prepare(server, wl, "bench_apply")
            a = cpu(server)
            t, lags, conflicts[w, path] = sink(server, txns, history, args, w,
                                               f"bench_cp_{int(keyless)}_{r}_{w}_{path}", path)
            b = cpu(server)
            loads.append(os.getloadavg()[0])
            c_sink[w, path].append((b[0] - a[0], b[1] - a[1]))
            t_sink[w, path].append(t)
            lag_sink[w, path] += lags
            check(server, wl, f"sink ({w} workers, {path} decode)")
    n = statistics.median(t_naive)
    out = [f"## {'with' if keyless else 'without'} the keyless table: {rows} row changes "
           f"({len(wl.tables)} tables); load average after each side {min(loads):.1f}-{max(loads):.1f}",
           "| side | workers | seconds | rows/s | ratio vs naive | lag p50 | lag p99 | "
           "CPU s Python | CPU ms Python per txn | CPU s mariadbd | conflicts |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    cn = statistics.median(c[0] for c in c_naive), statistics.median(c[1] for c in c_naive)
    ntx = len(txns) - 1
    out.append(f"| naive (txn per txn) | 1 | {n:.2f} | {rows / n:.0f} | 1.00x | "
               f"{pct(lag_naive, 50):.3f} s | {pct(lag_naive, 99):.3f} s | {cn[0]:.2f} | "
               f"{cn[0] / ntx * 1e3:.3f} | {cn[1]:.2f} | |")
    for k in sides:
        s = statistics.median(t_sink[k])
        cs = statistics.median(c[0] for c in c_sink[k]), statistics.median(c[1] for c in c_sink[k])
        out.append(f"| sink, {k[1]} decode | {k[0]} | {s:.2f} | {rows / s:.0f} | {n / s:.2f}x | "
                   f"{pct(lag_sink[k], 50):.3f} s | {pct(lag_sink[k], 99):.3f} s | {cs[0]:.2f} | "
                   f"{cs[0] / ntx * 1e3:.3f} | {cs[1]:.2f} | {conflicts[k]} |")
    return stage + "\n\n" + "\n".join(out)


if __name__ == "__main__":
    main()
