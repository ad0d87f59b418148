"""MySQL sink apply throughput: MySQLSink (causality workers, batches) vs a naive single-thread apply.

Both sides apply the same pre-built transactions (RandomWorkload: inserts, updates, deletes,
primary-key changes, unique-key swaps over four tables; every Datum kind) to a fresh database on
the same MariaDB, started by this script (apt's mariadbd, 127.0.0.1). Each side's result is
checked equal to the workload's in-memory model, so a fast wrong answer cannot win.

- naive: one connection, one downstream transaction per source transaction, one statement per
  row (the translator's and SQL builder's own output, so decoding costs the same on both sides).
- sink: drainer/sinks/mysql.py with --workers workers and --batch rows per downstream
  transaction, fed --apply-batch transactions per apply() call, flushed at the end.

Wall-clock times (the sides alternate per repeat; the median is reported). The machine is shared:
the load average is printed with the results.

Run: .venv/bin/python bench/drainer_apply.py [--txns 50000] [--keys 20000] [--workers 16]
     [--batch 20] [--durable]   (--durable: innodb_flush_log_at_trx_commit=1, sync_binlog=1)
"""
from __future__ import annotations

import argparse
import psutil
import asyncio
import datetime
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


def naive(server: MariaDBServer, txns: list[Txn], history) -> float:
    tr = Translator()
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION time_zone='+00:00', foreign_key_checks=0, "
                        "sql_mode='STRICT_TRANS_TABLES,NO_AUTO_VALUE_ON_ZERO'")
            t0 = time.perf_counter()
            for txn in txns:
                changes = tr.translate(txn, history)
                if not changes:
                    continue
                cur.execute("BEGIN")
                for ch in changes:
                    for stmt in row_sql(ch, False):
                        cur.execute(stmt)
                cur.execute("COMMIT")
            return time.perf_counter() - t0
    finally:
        conn.close()


def sink(server: MariaDBServer, txns: list[Txn], history, args: argparse.Namespace, cp_schema: str) -> tuple[float, int]:
    cfg = MySQLSinkConfig(port=server.port, user=server.user, password=server.password,
                          worker_count=args.workers, txn_batch=args.batch, checkpoint_schema=cp_schema)

    async def run() -> tuple[float, int]:
        s = MySQLSink(cfg, history, epoch=1, name="bench")
        await s.open(Checkpoint(0))
        try:
            t0 = time.perf_counter()
            for i in range(0, len(txns), args.apply_batch):
                await s.apply(txns[i:i + args.apply_batch])
            await s.flush()
            return time.perf_counter() - t0, s.conflicts
        finally:
            await s.close()

    return asyncio.run(run())


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
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--apply-batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--durable", action="store_true")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    extra = ["--innodb-flush-log-at-trx-commit=1", "--sync-binlog=1"] if args.durable else []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-apply-") as tmp:
        server = MariaDBServer(Path(tmp), extra_args=extra).start()
        try:
            wl = RandomWorkload(args.seed, "bench_apply", keys=args.keys)
            txns = wl.transactions(args.txns, first_ts=1 << 40)
            history = history_of(txns)
            rows = wl.rows
            t_naive: list[float] = []
            t_sink: list[float] = []
            c_naive: list[tuple[float, float]] = []
            c_sink: list[tuple[float, float]] = []
            conflicts = 0
            for r in range(args.repeat):
                prepare(server, wl, "bench_apply")
                a = cpu(server)
                t_naive.append(naive(server, txns, history))
                b = cpu(server)
                c_naive.append((b[0] - a[0], b[1] - a[1]))
                check(server, wl, "naive")
                prepare(server, wl, "bench_apply")
                a = cpu(server)
                t, conflicts = sink(server, txns, history, args, f"bench_cp_{r}")
                b = cpu(server)
                c_sink.append((b[0] - a[0], b[1] - a[1]))
                t_sink.append(t)
                check(server, wl, "sink")
        finally:
            server.stop()
    n, s = statistics.median(t_naive), statistics.median(t_sink)
    load = os.getloadavg()
    print(f"# drainer apply to MariaDB: {args.txns} transactions, {rows} row changes, "
          f"keys {args.keys}, {'durable' if args.durable else 'innodb_flush_log_at_trx_commit=2'}")
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, load {load[0]:.1f}, "
          f"{datetime.date.today()}")
    print("| what | naive (1 thread, txn per txn) | sink | ratio |")
    print("|---|---|---|---|")
    print(f"| seconds | {n:.2f} | {s:.2f} | {n / s:.2f}x |")
    print(f"| rows/s | {rows / n:.0f} | {rows / s:.0f} | {n / s:.2f}x |")
    print(f"| txns/s | {args.txns / n:.0f} | {args.txns / s:.0f} | |")
    cn = statistics.median(c[0] for c in c_naive), statistics.median(c[1] for c in c_naive)
    cs = statistics.median(c[0] for c in c_sink), statistics.median(c[1] for c in c_sink)
    print(f"| CPU s, Python process | {cn[0]:.2f} | {cs[0]:.2f} | {cn[0] / cs[0]:.2f}x |")
    print(f"| CPU s, mariadbd | {cn[1]:.2f} | {cs[1]:.2f} | {cn[1] / cs[1]:.2f}x |")
    print(f"| rows per CPU s (both) | {rows / sum(cn):.0f} | {rows / sum(cs):.0f} | "
          f"{sum(cn) / sum(cs):.2f}x |")
    print(f"sink: {args.workers} workers, txn-batch {args.batch}, apply batches of "
          f"{args.apply_batch} transactions, {conflicts} causality conflicts")


if __name__ == "__main__":
    main()
