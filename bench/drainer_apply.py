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

sysbench shape (issue 23, `--sysbench`): 4 tables `sbtest1..4` pre-filled with --sb-rows rows,
each transaction sysbench `oltp_write_only`'s writes (an index update, a non-index update, a
delete and the insert of that id back), every COMMIT positioned as the capture's are. The
drainer's MySQL step per transaction as the syncer runs it — `Txn.from_framed` of the merged
bytes, then `MySQLSink.apply` — fed --apply-batch transactions per call, paced at --rate
transactions per second (a bounded rate: small batches, partial worker batches nudged out),
then flushed. Old and new trees alternate within every round, each in its own process
(`--base-rev`: the baseline tree from `git archive`, its `sluice.*` packages and its own
native module, built by bench/trees.py's prepare_base); reported: CPU ms per transaction of the drainer process
(user + system, all threads) and of mariadbd, and the CPU µs per transaction of the in-process
stages (`from_framed`, `translate`, `batch_sql` over 20-row worker batches; process_time, gc
off, the least of 3 passes); medians over --repeat rounds, load average per run. The child runs
with the drainer's GC settings (drainer/main.py tune_gc), as the drainer process does. Each run's downstream is checked
equal to the workload's model.

Run: .venv/bin/python bench/drainer_apply.py [--txns 50000] [--keys N (default: --txns)]
     [--workers 4,16] [--keyless both|with|without] [--batch 20] [--backlog 500] [--repeat 1]
     [--durable]   (--durable: innodb_flush_log_at_trx_commit=1, sync_binlog=1)
     [--paths native,python] [--decode-repeat 5] [--decode-only]
     .venv/bin/python bench/drainer_apply.py --sysbench [--base-rev HEAD~1 | --base-tree DIR] [--txns 8000]
     [--sb-rows 10000] [--apply-batch 16] [--rate 1500] [--repeat 3]
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
if "--sysbench-child" in sys.argv and "--tree" in sys.argv:
    # A baseline tree (base_tree): its `sluice.*` and `tests.*` come first.
    _tree = sys.argv[sys.argv.index("--tree") + 1]
    sys.path[0:0] = ([str(Path(_tree) / "_native"), str(Path(_tree) / "_ns"), _tree]
                     if (Path(_tree) / "_ns").exists() else [_tree])

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


# --------------------------------------------------------------------------------------------
# sysbench shape, old tree vs new tree alternating (issue 23)
# --------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def base_tree(rev: str, into: Path) -> Path:
    """The baseline tree of rev (git archive) with a `sluice` namespace of symlinks and its own
    native module (bench/trees.py's prepare_base: the trees' native modules differ), so a
    process that puts `<tree>/_native` and `<tree>/_ns` first on sys.path runs that tree."""
    import shutil
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trees import prepare_base
    tree = prepare_base(rev, into)
    if not (tree / "tests/support/sysbench_rows.py").exists():
        shutil.copy(ROOT / "tests/support/sysbench_rows.py", tree / "tests/support/sysbench_rows.py")
    return tree


def sb_prepare(server: MariaDBServer, args: argparse.Namespace) -> None:
    from tests.support.sysbench_rows import SysbenchWorkload
    wl = SysbenchWorkload(args.seed, "sbtest", rows=args.sb_rows)
    server.execute("DROP DATABASE IF EXISTS `sbtest`")
    server.execute("DROP DATABASE IF EXISTS `sluice_bench_cp`")
    server.execute("CREATE DATABASE `sbtest`")
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            for t in wl.tables:
                cur.execute(create_sql(t).replace("PRIMARY KEY (`id`)", "PRIMARY KEY (`id`), KEY `k_1` (`k`)"))
                cur.executemany(f"INSERT INTO `sbtest`.`{t.name}` VALUES (%s,%s,%s,%s)", wl.initial_rows(t))
            cur.execute("COMMIT")
    finally:
        conn.close()


def sb_child(args: argparse.Namespace) -> None:
    """One tree's run (its own process; sys.path was set before any sluice import)."""
    import json
    from sluice.drainer.sql import batch_sql
    from sluice.drainer.txn import frame
    from sluice.proto import sluice_pb2 as pb
    from tests.support.rows import binlogs as make_binlogs
    from tests.support.sysbench_rows import SysbenchWorkload
    import pymysql

    wl = SysbenchWorkload(args.seed, "sbtest", rows=args.sb_rows)
    txns = wl.transactions(args.txns, first_ts=1 << 40)
    history = history_of(txns)
    framed = []
    for i, t in enumerate(txns):
        p, c = make_binlogs(t.prewrite, t.start_ts, t.commit_ts,
                            position=pb.Position(file_seq=1, offset=4 + 1000 * i))
        framed.append(frame(p + [c]))
    n = len(framed) - 1
    # In-process stages (gc off, process_time), before the sink run; the least of 3 passes
    # (on a shared machine the least is the pass the other processes disturbed least).
    stages: dict[str, float] = {}
    for _ in range(3):
        gc.disable()
        t0 = time.process_time()
        joined = [Txn.from_framed(f, "pump-1")[0] for f in framed]
        t1 = time.process_time()
        tr = Translator()
        flat = [c for t in joined[1:] for c in tr.translate(t, history)]
        t2 = time.process_time()
        for i in range(0, len(flat), 20):
            part = flat[i:i + 20]
            batch_sql(part, [False] * len(part))
        t3 = time.process_time()
        gc.enable()
        del joined, flat
        for k, v in (("from_framed", (t1 - t0) / len(framed)), ("translate", (t2 - t1) / n),
                     ("batch_sql", (t3 - t2) / n)):
            stages[k] = min(stages.get(k, 1e9), v * 1e6)
    gc.collect()
    # The drainer process's own GC settings (drainer/main.py: frozen start-up objects, rare
    # collections): with the default thresholds this run's collections were ~6% of its CPU,
    # which the drainer does not pay.
    from sluice.drainer.main import tune_gc
    tune_gc()
    from tests.support.mariadb import ROOT_PASSWORD
    cfg = MySQLSinkConfig(port=args.port, user="root", password=ROOT_PASSWORD, checkpoint_schema="sluice_bench_cp",
                          txn_batch=args.batch, txn_batch_backlog=args.backlog)

    async def run() -> tuple[float, float, float]:
        s = MySQLSink(cfg, history, epoch=1, name="bench")
        await s.open(Checkpoint(0))
        try:
            period = args.apply_batch / args.rate if args.rate else 0.0
            own0, db0 = psutil.Process().cpu_times(), psutil.Process(args.db_pid).cpu_times()
            w0 = time.perf_counter()
            nxt = w0
            for i in range(0, len(framed), args.apply_batch):
                batch = [Txn.from_framed(f, "pump-1")[0] for f in framed[i:i + args.apply_batch]]
                await s.apply(batch)
                if period:
                    nxt += period
                    delay = nxt - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
            await s.flush()
            wall = time.perf_counter() - w0
            own1, db1 = psutil.Process().cpu_times(), psutil.Process(args.db_pid).cpu_times()
            return (wall, own1.user + own1.system - own0.user - own0.system,
                    db1.user + db1.system - db0.user - db0.system)
        finally:
            await s.close()

    wall, own, db = asyncio.run(run())
    conn = pymysql.connect(host="127.0.0.1", port=args.port, user="root", password=ROOT_PASSWORD)
    try:
        with conn.cursor() as cur:
            for t in wl.tables:
                cur.execute(f"SELECT id, k, c, pad FROM `sbtest`.`{t.name}` ORDER BY id")
                if [tuple(r) for r in cur.fetchall()] != wl.expected(t):
                    raise SystemExit(f"downstream sbtest.{t.name} differs from the model")
    finally:
        conn.close()
    print(json.dumps({"wall": wall, "cpu_ms_txn": own / n * 1e3, "db_ms_txn": db / n * 1e3,
                      "stages": stages, "load": os.getloadavg()[0]}))


def sb_main(args: argparse.Namespace) -> None:
    import json
    import subprocess
    started = time.perf_counter()
    load_start = os.getloadavg()
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-sb-") as tmp:
        base = Path(args.base_tree) if args.base_tree else base_tree(args.base_rev, Path(tmp))
        server = MariaDBServer(Path(tmp) / "db").start()
        try:
            for r in range(args.repeat):
                for side, tree in (("old", base), ("new", ROOT)):
                    sb_prepare(server, args)
                    cmd = [sys.executable, __file__, "--sysbench-child", "--tree", str(tree),
                           "--port", str(server.port), "--db-pid", str(server.proc.pid),
                           "--txns", str(args.txns), "--sb-rows", str(args.sb_rows), "--seed", str(args.seed),
                           "--apply-batch", str(args.apply_batch), "--rate", str(args.rate),
                           "--batch", str(args.batch), "--backlog", str(args.backlog)]
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                    res = json.loads(out.strip().splitlines()[-1])
                    runs[side].append(res)
                    print(f"round {r + 1} {side}: {res['cpu_ms_txn']:.3f} ms/txn drainer, "
                          f"{res['db_ms_txn']:.3f} mariadbd, wall {res['wall']:.1f} s, load {res['load']:.1f}, "
                          + ", ".join(f"{k} {v:.1f} µs" for k, v in res["stages"].items()), flush=True)
        finally:
            server.stop()
    med = {side: {k: statistics.median(x[k] for x in rs) for k in ("wall", "cpu_ms_txn", "db_ms_txn")}
           for side, rs in runs.items()}
    st_med = {side: {k: statistics.median(x["stages"][k] for x in rs) for k in rs[0]["stages"]}
              for side, rs in runs.items()}
    loads = [x["load"] for rs in runs.values() for x in rs]
    print(f"# MySQL drainer, sysbench oltp_write_only shape: {args.txns} transactions (4 row changes "
          f"each, 4 tables of {args.sb_rows} rows), apply() calls of {args.apply_batch} transactions "
          f"paced at {args.rate or 'unbounded'} tps, txn-batch {args.batch}, 4 workers; old = "
          f"{args.base_tree or args.base_rev}, new = this tree; median of {args.repeat} alternating rounds")
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, load average (1 min) {load_start[0]:.1f} "
          f"at start, {min(loads):.1f}-{max(loads):.1f} after the runs, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; total {time.perf_counter() - started:.0f} s")
    print("| measure | old | new | old/new |")
    print("|---|---|---|---|")
    for k, label in (("cpu_ms_txn", "drainer CPU ms/txn (process, all threads)"),
                     ("db_ms_txn", "mariadbd CPU ms/txn"), ("wall", "wall s")):
        print(f"| {label} | {med['old'][k]:.3f} | {med['new'][k]:.3f} | {med['old'][k] / med['new'][k]:.2f}x |")
    for k in st_med["old"]:
        print(f"| stage {k}, CPU µs/txn | {st_med['old'][k]:.1f} | {st_med['new'][k]:.1f} | "
              f"{st_med['old'][k] / st_med['new'][k]:.2f}x |")


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
    ap.add_argument("--sysbench", action="store_true", help="the sysbench shape, old tree vs new")
    ap.add_argument("--base-rev", default="HEAD~1", help="--sysbench: the baseline revision")
    ap.add_argument("--base-tree", help="--sysbench: a baseline tree prepared before (bench/trees.py "
                    "prepare_base), instead of building one from --base-rev")
    ap.add_argument("--sb-rows", type=int, default=10000)
    ap.add_argument("--rate", type=float, default=1500, help="--sysbench: transactions per second, 0 = unpaced")
    ap.add_argument("--sysbench-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--db-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sysbench_child:
        sb_child(args)
        return
    if args.sysbench:
        sb_main(args)
        return
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
