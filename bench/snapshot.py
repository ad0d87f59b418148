"""Snapshot read throughput: chunked reads against one streaming SELECT *, in one run.

Baseline: `SELECT * FROM sbtest1` through pymysql's SSCursor (unbuffered, streamed), rows
discarded — the fastest a Python client reads the table, and no snapshot at all (no chunks, no
consistency with the binlog).
Ours: capture.snapshot's ChunkSplitter + one range SELECT per chunk (what both snapshot modes
run per chunk), with parallelism 1 and 2 (threads, one connection each), rows read as pymysql
tuples; and the snapshot's own read (`select_rows`: every row made into the pb.Row that is
emitted, straight from its wire packet), with parallelism 1 and 2. Same connection settings (the
snapshot's `conv`) for all.

The table is sysbench-shaped (id INT PK, k INT, c CHAR(120), pad CHAR(60), KEY k_1(k)), loaded
with the sequence engine. While every side reads, a writer thread updates random rows
(`UPDATE ... SET k = k + 1, c = ...`, autocommit, --writes-per-s; updates only, so every side
reads the same row count).

    .venv/bin/python bench/snapshot.py [--rows 1000000] [--chunk-size 8192] [--repeat 2]
                                       [--writes-per-s 200] [--port P]

Without --port it starts a throwaway MariaDB (tests/support/mariadb.py). Prints one table.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pymysql  # noqa: E402
import pymysql.cursors  # noqa: E402

from sluice.capture.snapshot.chunks import ChunkSplitter, SplitOptions  # noqa: E402
from sluice.capture.snapshot.keys import load_shape  # noqa: E402
from sluice.capture.snapshot.reader import (RowConverter, SNAPSHOT_CONV, chunk_sql,  # noqa: E402
                                            select_rows, snapshot_connect)

DB = "bench_snapshot"


def load(settings: dict, rows: int) -> None:
    conn = pymysql.connect(**settings, autocommit=True)
    try:
        cur = conn.cursor()
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"USE {DB}")
        cur.execute("DROP TABLE IF EXISTS sbtest1")
        cur.execute("CREATE TABLE sbtest1 (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
                    "k INT NOT NULL DEFAULT 0, c CHAR(120) NOT NULL DEFAULT '', "
                    "pad CHAR(60) NOT NULL DEFAULT '', KEY k_1 (k)) ENGINE=InnoDB")
        step = 50_000
        for lo in range(1, rows + 1, step):
            hi = min(rows, lo + step - 1)
            cur.execute("INSERT INTO sbtest1 SELECT seq, FLOOR(RAND(seq) * %s), "
                        "LEFT(REPEAT(CONCAT(MD5(seq), '-'), 4), 119), LEFT(REPEAT(MD5(-seq), 2), 59) "
                        f"FROM seq_{lo}_to_{hi}", (rows,))
        cur.execute("ANALYZE TABLE sbtest1")
    finally:
        conn.close()


def baseline(settings: dict) -> tuple[int, float]:
    conn = pymysql.connect(**settings, database=DB, conv=SNAPSHOT_CONV,
                           cursorclass=pymysql.cursors.SSCursor)
    t0 = time.perf_counter()
    n = 0
    with conn.cursor() as cur:
        cur.execute("SELECT * FROM sbtest1")
        for _ in cur:
            n += 1
    el = time.perf_counter() - t0
    conn.close()
    return n, el


def chunked(settings: dict, chunk_size: int, parallelism: int, convert: bool) -> tuple[int, int, float]:
    conns = [snapshot_connect(settings) for _ in range(parallelism)]
    t0 = time.perf_counter()
    shape = load_shape(conns[0], DB, "sbtest1")
    splitter = ChunkSplitter(conns[0], shape.key, SplitOptions(chunk_size=chunk_size))
    lock = threading.Lock()
    counts = [0] * parallelism
    chunks = [0]
    conv = RowConverter(shape.columns)

    def work(i: int) -> None:
        conn = conns[i]
        while True:
            with lock:
                c = splitter.next_chunk()
                if c is None:
                    return
                chunks[0] += 1
            sql, params = chunk_sql(shape, c)
            if convert:   # the snapshot's own read: rows made from the wire packets
                rows = select_rows(conn, sql, params, conv)
            else:
                with conn.cursor() as cur:
                    cur.execute(sql, params)
                    rows = cur.fetchall()
            counts[i] += len(rows)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(parallelism)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    el = time.perf_counter() - t0
    for c in conns:
        c.close()
    return sum(counts), chunks[0], el


class Writer:
    """Random single-row UPDATEs at a steady rate until stopped (the snapshot's live writes)."""

    def __init__(self, settings: dict, rows: int, per_s: float) -> None:
        self.settings, self.rows, self.per_s = settings, rows, per_s
        self.stop = threading.Event()
        self.done = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import random
        rnd = random.Random(5)
        conn = pymysql.connect(**self.settings, database=DB, autocommit=True)
        try:
            with conn.cursor() as cur:
                next_at = time.monotonic()
                while not self.stop.is_set():
                    cur.execute("UPDATE sbtest1 SET k = k + 1, c = %s WHERE id = %s",
                                (f"w{self.done}", rnd.randint(1, self.rows)))
                    self.done += 1
                    next_at += 1.0 / self.per_s
                    time.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--writes-per-s", type=float, default=200.0)
    ap.add_argument("--chunk-size", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--port", type=int)
    a = ap.parse_args()
    server = None
    if a.port is None:
        from tests.support.mariadb import MariaDBServer
        server = MariaDBServer(Path(tempfile.mkdtemp(prefix="bench-snapshot-"))).start()
        port, password = server.port, server.password
    else:
        port, password = a.port, os.environ.get("BENCH_PASSWORD", "sluice-root")
    settings = {"host": "127.0.0.1", "port": port, "user": "root", "password": password}
    try:
        load(settings, a.rows)
        results: dict[str, list[float]] = {k: [] for k in ("base", "p1", "p2", "p1conv", "p2conv")}
        meta: dict[str, int] = {}
        baseline(settings)  # warm the buffer pool once, so no variant pays for the first read
        writer = Writer(settings, a.rows, a.writes_per_s) if a.writes_per_s > 0 else None
        if writer is not None:
            writer.thread.start()
        t_start = time.monotonic()
        for _ in range(a.repeat):   # interleaved, best of N: the machine is shared
            n, el = baseline(settings)
            results["base"].append(el)
            meta["rows"] = n
            for key, p, conv in (("p1", 1, False), ("p2", 2, False), ("p1conv", 1, True),
                                 ("p2conv", 2, True)):
                got, chunks, el = chunked(settings, a.chunk_size, p, conv)
                assert got == n, f"{key}: read {got} rows, the table has {n}"
                results[key].append(el)
                meta["chunks"] = chunks
        if writer is not None:
            writer.stop.set()
            writer.thread.join(10)
        wrote = (f", {writer.done / (time.monotonic() - t_start):.0f} updates/s running"
                 if writer is not None else ", no writes")
        best = {k: min(v) for k, v in results.items()}
        n = meta["rows"]
        print("| what | baseline (SSCursor SELECT *) | ours | ratio |")
        print("|---|---|---|---|")
        for key, label in (("p1", "chunked, parallelism 1"), ("p2", "chunked, parallelism 2"),
                           ("p1conv", "chunked + pb.Row conversion, parallelism 1"),
                           ("p2conv", "chunked + pb.Row conversion, parallelism 2")):
            print(f"| rows/s, {label} ({n} rows, {meta['chunks']} chunks of {a.chunk_size}) | "
                  f"{n / best['base']:,.0f} | {n / best[key]:,.0f} | {best['base'] / best[key]:.2f}x |")
        print(f"machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
              f"python {platform.python_version()}, date {time.strftime('%Y-%m-%d')}, "
              f"best of {a.repeat}, load avg {os.getloadavg()[0]:.1f}{wrote}")
    finally:
        if server is not None:
            server.destroy()


if __name__ == "__main__":
    main()
