"""CPU per transaction of the Spark drainer's apply path: the Python process and its JVM, apart.

Each run is a child process (one JVM per process, so JVM settings differ per run) that opens a
SparkSink with the sink's default session settings (local[*], shuffle partitions, JVM options
as spark_sink/session.py and SparkSinkConfig have them; `--conf k=v` adds spark-conf entries),
creates the tables, then applies pre-built sysbench-like transactions through `SparkSink.apply`
in chunks of 500 (as the drainer's apply loop hands them over), cutting a batch every
--batch-txns transactions with flush() (the batch size is the bench's, not the clock's: the
numbers do not depend on how fast a loaded machine runs the feed). The transactions are joined
from real Prewrite and Commit payloads (`Txn.from_binlogs`, with a capture-like position and
source) over four `sbtest` tables (`id INT` primary key, `k INT`, `c CHAR(120)`, `pad
CHAR(60)`), each one sysbench oltp_read_write's writes: an update of `k`, an update of `c`, a
delete and an insert of the same id (4 row changes). The tables' final state is checked
against the model, so a fast wrong answer cannot win.

Reported per run, for the --batches measured after --warm-batches (JIT warm-up): ms CPU per
transaction of the Python process (every thread) and of the JVM (the gateway process and its
descendants, /proc/<pid>/stat), the JVM's CPU seconds per batch, the median commit wall time,
the load average, and the JVM threads that used the most CPU (names without digits). The parent
alternates the variants (`--variant label=child-args`, the first is the baseline; `--base-rev REV`
puts first a baseline tree of REV with its own native module, bench/trees.py) for --rounds rounds, rotating their order, and prints
medians and each variant's total against the first.

Run: .venv/bin/python bench/spark_cpu.py [--batch-txns 4000] [--batches 4] [--warm-batches 3]
     [--rounds 3] [--variant label=args ...]  (child args include --current-state
     equality-deletes)
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
T0 = 1 << 40
CLK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _stat(pid: int) -> tuple[int, float]:
    """(ppid, CPU seconds: utime + stime + cutime + cstime) of pid. The children it has waited
    for count: Hadoop's local filesystem used to run a `chmod` process per file, whose CPU only
    this shows (live children are counted by tree_cpu themselves)."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[1]), sum(int(x) for x in rest[11:15]) / CLK


def tree_cpu(root: int) -> float:
    """CPU seconds of root and every live descendant, with the children each has waited for."""
    kids: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid, c = _stat(int(d))
            except (OSError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
            cpu[int(d)] = c
    total, todo = 0.0, [root]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo += kids.get(p, [])
    return total


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of pid's threads, summed by thread name with digits removed (JIT compiler,
    GC, executor task threads ...)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = "".join(ch for ch in raw[raw.index("(") + 1:raw.rindex(")")] if not ch.isdigit())
        rest = raw.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(rest[11]) + int(rest[12])) / CLK
    return out


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


# -- child ---------------------------------------------------------------------------------------

def child(a: argparse.Namespace) -> None:
    if a.tree:
        # `sluice` (and, for a tree prepare_base built, `sluice_native`) from a baseline tree
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from trees import tree_path
        sys.path[0:0] = tree_path(a.tree)
    sys.path.insert(1, str(REPO))
    os.environ.setdefault("TZ", "UTC")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import asyncio
    import random

    import sluice
    from sluice.drainer.sink import Checkpoint
    from sluice.drainer.txn import SchemaHistory, Txn
    from sluice.proto import sluice_pb2 as pb
    from sluice.spark_sink.config import SparkSinkConfig
    from sluice.spark_sink.session import session
    from sluice.spark_sink.sink import SparkSink
    from tests.support.rows import Table, binlogs, col, prewrite_value, schema_txn
    import sluice_native
    log(f"child: sluice from {list(sluice.__path__)[0]}, sluice_native from {sluice_native.__file__}")

    tables = [Table(200 + i, "sbtest", f"sbtest{i + 1}",
                    [col("id", "int(11)", nullable=False), col("k", "int(11)", nullable=False),
                     col("c", "char(120)", nullable=False), col("pad", "char(60)", nullable=False)],
                    primary=["id"]) for i in range(4)]
    rnd = random.Random(a.seed)
    rows_per_table = 10_000
    model = [{i: (rnd.randrange(rows_per_table), "c" * 119, "p" * 59) for i in range(1, rows_per_table + 1)}
             for _ in tables]

    def text(n: int) -> str:
        return "-".join(f"{rnd.randrange(10 ** 11):011d}" for _ in range(n))

    count = a.batch_txns * (a.warm_batches + a.batches)
    log(f"child: building {count} transactions")
    schema = SchemaHistory()
    first = schema_txn(T0, *tables)
    schema.apply(first)
    txns: list[Txn] = []
    touched: list[set[int]] = [set() for _ in tables]   # the current tables start empty
    for n in range(count):
        ti = rnd.randrange(len(tables))
        t, m = tables[ti], model[ti]
        ids = rnd.sample(range(1, rows_per_table + 1), 3)
        touched[ti].update(ids)
        ch = []
        i = ids[0]
        k, c, pad = m[i]
        ch.append(t.update({"id": i, "k": k, "c": c, "pad": pad}, {"k": k + 1}))
        m[i] = (k + 1, c, pad)
        i = ids[1]
        k, c, pad = m[i]
        nc = text(10)
        ch.append(t.update({"id": i, "k": k, "c": c, "pad": pad}, {"c": nc}))
        m[i] = (k, nc, pad)
        i = ids[2]
        k, c, pad = m[i]
        ch.append(t.delete(id=i, k=k, c=c, pad=pad))
        npad = text(5)
        ch.append(t.insert(id=i, k=k, c=c, pad=npad))
        m[i] = (k, c, npad)
        cts = T0 + 10 + n * 2
        pos = pb.Position(file_seq=1, offset=4 + n * 600, file_name="mysql-bin.000001",
                          gtids=[pb.GtidPos(domain_id=0, server_id=1, seq_no=n + 1)],
                          ts_ms=1_700_000_000_000 + n, server_id=1)
        src = pb.SourceInfo(name="bench", server_id=1, gtid=f"0-1-{n + 1}", file="mysql-bin.000001",
                            pos=4 + n * 600, ts_ms=1_700_000_000_000 + n)
        pre, com = binlogs(prewrite_value(t.mutation(*ch), source=src), cts - 1, cts,
                           position=pos)
        txns.append(Txn.from_binlogs(pre, com, pump_id="pump-1"))

    conf = dict(kv.split("=", 1) for kv in a.conf)
    # Batches are cut by flush() alone (the bench decides their size, not the clock).
    kw: dict[str, Any] = {"batch_interval": 10 ** 6, "batch_rows": 10 ** 9}
    if a.current_state:
        kw["current_state"] = a.current_state
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-sparkcpu-"))
    cfg = SparkSinkConfig(warehouse=str(work / "warehouse"), log_level="ERROR", spark_conf=conf,
                          **kw)
    spark = session(cfg)
    from pyspark import SparkContext
    jvm = SparkContext._gateway.proc.pid  # type: ignore[attr-defined]
    sink = SparkSink(cfg, schema, "bench", 1, spark, owner="bench")
    by_thread: dict[str, float] = {}

    async def batches(part: list[Txn], per_batch: int, times: list[float]) -> None:
        """part in batches of per_batch transactions, each applied in chunks of 500 (as the
        apply loop hands them over) and committed by flush(); times gets each flush's wall s."""
        for s in range(0, len(part), per_batch):
            for c in range(s, min(len(part), s + per_batch), 500):
                await sink.apply(part[c:min(c + 500, s + per_batch)])
            t = time.monotonic()
            await sink.flush()
            times.append(time.monotonic() - t)

    async def go() -> dict[str, Any]:
        await sink.open(Checkpoint(0))
        await sink.apply([first])
        await sink.flush()
        nw = a.batch_txns * a.warm_batches
        await batches(txns[:nw], a.batch_txns, [])
        load0 = os.getloadavg()[0]
        py0, jvm0, threads0, t0 = self_cpu(), tree_cpu(jvm), thread_cpu(jvm), time.monotonic()
        times: list[float] = []
        await batches(txns[nw:], a.batch_txns, times)
        py, jv, wall = self_cpu() - py0, tree_cpu(jvm) - jvm0, time.monotonic() - t0
        threads = {k: round(v - threads0.get(k, 0.0), 2) for k, v in thread_cpu(jvm).items()
                   if v - threads0.get(k, 0.0) >= 0.05}
        n = len(txns) - nw
        out = {"py_ms": py * 1000 / n, "jvm_ms": jv * 1000 / n, "txns": n, "wall_s": wall,
               "jvm_s_per_batch": jv / len(times), "commit_s": statistics.median(times),
               "load_start": load0, "load_end": os.getloadavg()[0],
               "jvm_threads": dict(sorted(threads.items(), key=lambda kv: -kv[1])[:8])}
        await sink.close()
        return out

    try:
        out = asyncio.run(go())
        # The state the sink left is the model's: a fast wrong answer cannot win.
        for t, m, ids in zip(tables, model, touched):
            got = spark.sql(f"SELECT count(*), sum(k), sum(length(c) + length(pad)) "
                            f"FROM sbtest.{t.name}").collect()[0]
            want = (len(ids), sum(m[i][0] for i in ids), sum(len(m[i][1]) + len(m[i][2]) for i in ids))
            if tuple(got) != want:
                raise SystemExit(f"sbtest.{t.name}: (rows, sum k, text length) {tuple(got)}, model {want}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps(out), flush=True)


# -- parent --------------------------------------------------------------------------------------

def parent(a: argparse.Namespace) -> None:
    variants = [(v.split("=", 1)[0], shlex.split(v.split("=", 1)[1]) if "=" in v else [])
                for v in (a.variant or ["current="])]
    if a.base_rev:
        # the baseline first: its own Python and native module, this checkout's jars
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from trees import prepare_base
        log(f"building the tree of {a.base_rev} with its native module")
        base = prepare_base(a.base_rev, Path(tempfile.mkdtemp(prefix="sluice-bench-sparkcpu-base-")))
        (base / "jars").symlink_to(REPO / "jars")
        variants.insert(0, (f"base {a.base_rev}", ["--tree", str(base)]))
    common = ["--batch-txns", str(a.batch_txns), "--batches", str(a.batches),
              "--warm-batches", str(a.warm_batches), "--seed", str(a.seed)]
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in variants}
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for label, extra in order:
            log(f"round {r + 1}: {label} {' '.join(extra)} (load {os.getloadavg()[0]:.2f})")
            p = subprocess.run([sys.executable, __file__, "--child", *common, *extra],
                               capture_output=True, text=True, cwd=REPO)
            lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode or not lines:
                sys.stderr.write(p.stderr[-4000:])
                raise SystemExit(f"{label}: child failed (exit {p.returncode})")
            res = json.loads(lines[-1][7:])
            for x in p.stderr.splitlines():
                if "JVM thread CPU" in x:
                    log("  " + x)
            threads = res.pop("jvm_threads")
            results[label].append(res)
            log(f"  {label}: python {res['py_ms']:.4f} ms/txn, jvm {res['jvm_ms']:.4f} ms/txn "
                f"({res['jvm_s_per_batch']:.2f} s per batch), commit {res['commit_s']:.2f} s, "
                f"load {res['load_start']:.2f}-{res['load_end']:.2f}; JVM threads (s): {threads}")
    med = {label: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
           for label, rs in results.items()}
    base = med[variants[0][0]]
    print(f"\nSpark drainer apply path, CPU per transaction — {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} "
          f"UTC, {os.cpu_count()} cores; {a.batches} batches of {a.batch_txns} transactions measured "
          f"after {a.warm_batches}, median of {a.rounds} alternating runs")
    print("| variant | Python ms/txn | JVM ms/txn | total ms/txn | total vs first | JVM s/batch | "
          "commit s (wall) | load avg (start-end) |\n|---|---:|---:|---:|---:|---:|---:|---|")
    for label, extra in variants:
        m = med[label]
        tot, btot = m["py_ms"] + m["jvm_ms"], base["py_ms"] + base["jvm_ms"]
        loads = ", ".join(f"{x['load_start']:.1f}-{x['load_end']:.1f}" for x in results[label])
        print(f"| {label} (`{' '.join(extra)}`) | {m['py_ms']:.4f} | {m['jvm_ms']:.4f} | {tot:.4f} | "
              f"{tot / btot:.2f}x | {m['jvm_s_per_batch']:.2f} | {m['commit_s']:.2f} | {loads} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--tree", default="", help="child: import sluice from this tree")
    ap.add_argument("--conf", action="append", default=[], help="child: a spark-conf k=v")
    ap.add_argument("--current-state", default="",
                    help="child: the sink's current-state (delete | equality-deletes)")
    ap.add_argument("--batch-txns", type=int, default=4000, help="transactions per batch")
    ap.add_argument("--batches", type=int, default=4, help="batches measured")
    ap.add_argument("--warm-batches", type=int, default=3, help="batches before (not measured)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", action="append", help="label=child args (first: the baseline)")
    ap.add_argument("--base-rev", default="",
                    help="a baseline variant first: this git revision with its own native module")
    a = ap.parse_args()
    (child if a.child else parent)(a)


if __name__ == "__main__":
    main()
