"""Capture decode throughput: our reader (events -> whole transactions of pb.Datum rows) against
raw iteration of mysql-replication's BinLogStreamReader over the same binlog, in one run.

Baseline: BinLogStreamReader(is_mariadb, auto_position) iterated to the binlog's end, touching
`ev.rows` of every rows event (what any consumer must do to get values).
Ours: capture.reader.BinlogReader over the same range: strict TableMap handling, our own value
decoding into pb.Row/pb.Datum, schema tracking, whole transactions.

    .venv/bin/python bench/capture.py [--txns 2000] [--rows-per-txn 5] [--port PORT]

Without --port it starts a throwaway MariaDB (tests/support/mariadb.py). Prints one table.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pymysqlreplication import BinLogStreamReader  # noqa: E402
from pymysqlreplication.row_event import RowsEvent  # noqa: E402

from sluice.capture.reader import BinlogReader  # noqa: E402
from sluice.capture.schema import SchemaTracker, TableFilter  # noqa: E402

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


def run_baseline(settings: dict, start: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    s = BinLogStreamReader(dict(settings), server_id=9101, blocking=False, is_mariadb=True,
                           auto_position=start, enable_logging=False)
    events = 0
    for ev in s:
        events += 1
        if isinstance(ev, RowsEvent):
            ev.rows  # noqa: B018 - decode the values
    s.close()
    return events, time.perf_counter() - t0


def run_ours(settings: dict, start: str) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    r = BinlogReader(dict(settings), replica_server_id=9102, tracker=SchemaTracker("bench", TableFilter()),
                     gtid_state=start, blocking=False)
    txns = rows = 0
    for t in r.transactions():
        txns += 1
        rows += sum(len(m.changes) for m in t.mutations)
    r.close()
    return txns, rows, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--txns", type=int, default=2000)
    ap.add_argument("--rows-per-txn", type=int, default=5)
    ap.add_argument("--port", type=int)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    server = None
    if a.port is None:
        from tests.support.mariadb import MariaDBServer
        server = MariaDBServer(Path(tempfile.mkdtemp(prefix="bench-capture-"))).start()
        port, password = server.port, server.password
    else:
        port, password = a.port, os.environ.get("BENCH_PASSWORD", "sluice-root")
    settings = {"host": "127.0.0.1", "port": port, "user": "root", "password": password}
    import pymysql
    conn = pymysql.connect(**settings, autocommit=True)
    try:
        cur = conn.cursor()
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        start = cur.fetchone()[0] or ""
        load(conn, a.txns, a.rows_per_txn)
        base, ours = [], []
        for _ in range(a.repeat):   # interleaved, best of N: the machine is shared
            events, bt = run_baseline(settings, start)
            base.append(bt)
            txns, rows, ot = run_ours(settings, start)
            ours.append(ot)
        bt, ot = min(base), min(ours)
        print(f"| what | baseline (BinLogStreamReader + .rows) | ours (BinlogReader -> pb rows) | ratio |")
        print(f"|---|---|---|---|")
        print(f"| events/s over {events} events ({txns} txns, {rows} rows) | {events / bt:,.0f} | "
              f"{events / ot:,.0f} | {bt / ot:.2f}x |")
        print(f"machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
              f"python {platform.python_version()}, date {time.strftime('%Y-%m-%d')}, best of {a.repeat}")
    finally:
        conn.close()
        if server is not None:
            server.destroy()


if __name__ == "__main__":
    main()
