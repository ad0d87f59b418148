"""The Spark drainer's Python path per transaction, without the JVM: packed pump responses ->
merge tuples (PumpReader._response_packed) -> joined transactions (Txn.from_framed) -> the
per-table row tuples the sink buffers (`(*CHANGELOG_META values, *values)`,
SchemaChanges._buffer_txn).

Transactions in the sysbench shape (as bench/spark_cpu.py): four `sbtest` tables (`id INT`
primary key, `k INT`, `c CHAR(120)`, `pad CHAR(60)`), each transaction an update of `k`, an
update of `c`, a delete and an insert of the same id (4 row changes, 4 changelog rows), with a
capture-like producer position (file, offset, GTID, server id, ts-ms) on every COMMIT and a
SourceInfo, laid out as a pump's packed responses (--per-response transactions, a FAKE each 64).

Old vs new alternate, each run a child process importing `sluice` from its tree (`--variant
label=--tree DIR`; `--base-rev REV` puts first a baseline tree of REV built with its own native
module by bench/trees.py; a plain `git archive` as DIR uses this checkout's native module). Each child times every step --repeat times
(CPU `process_time`, gc off: the steps' own cost), then --repeat times more with the drainer's
gc settings (drainer/main.py `tune_gc`), the responses taken a twentieth at a time through the
three steps (as the drainer interleaves them) while the buffered rows of the whole batch stay
alive, as they do until a Spark commit takes them (`*_gc`: each step with the collections its
own allocations trigger). It prints CPU µs per transaction (median
of its repeats) and a digest of the buffered rows: every variant must print the same digest
(the same tuples), or the run stops. The parent prints the medians over --rounds rounds (the
variants' order rotates each round) with the load average (1 min) beside each.

Run: .venv/bin/python bench/spark_rows.py [--txns 10000] [--rounds 5] [--repeat 3]
       [--base-rev HEAD~1] [--variant "old=--tree DIR"] [--variant new=]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T0 = 1 << 40
STEPS = ("read", "join", "buffer", "total", "read_gc", "join_gc", "buffer_gc", "total_gc")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- child ---------------------------------------------------------------------------------------

def child(a: argparse.Namespace) -> None:
    if a.tree:
        # `sluice` (and, for a tree prepare_base built, `sluice_native`) from a baseline tree
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from trees import tree_path
        sys.path[0:0] = tree_path(a.tree)
    sys.path.insert(1, str(REPO))
    import gc
    import random

    import sluice
    import sluice_native
    log(f"child: sluice from {list(sluice.__path__)[0]}, sluice_native from {sluice_native.__file__}")

    from sluice.core.wire import frame_head, packed_meta
    from sluice.drainer.reader import PumpReader
    from sluice.drainer.txn import SchemaHistory, Txn
    from sluice.proto import sluice_pb2 as pb
    from sluice.spark_sink import tables as T
    from sluice.spark_sink.config import SparkSinkConfig
    from sluice.spark_sink.sink import SparkSink, _Buffer
    from tests.support.rows import Table, binlogs, col, prewrite_value, schema_txn

    tables = [Table(200 + i, "sbtest", f"sbtest{i + 1}",
                    [col("id", "int(11)", nullable=False), col("k", "int(11)", nullable=False),
                     col("c", "char(120)", nullable=False), col("pad", "char(60)", nullable=False)],
                    primary=["id"]) for i in range(4)]
    rnd = random.Random(a.seed)
    per_table = 10_000
    model = [{i: (rnd.randrange(per_table), "c" * 119, "p" * 59) for i in range(1, per_table + 1)}
             for _ in tables]

    def text(n: int) -> str:
        return "-".join(f"{rnd.randrange(10 ** 11):011d}" for _ in range(n))

    schema = SchemaHistory()
    schema.apply(schema_txn(T0, *tables))
    # Packed responses as a pump lays them out (core/wire.py), every COMMIT positioned.
    raws: list[bytes] = []
    frames: list[bytes] = []
    cts: list[int] = []
    sts: list[int] = []
    ends: list[int] = []
    fakes: list[int] = []
    pos_idx: list[int] = []
    end = 0

    def flush() -> None:
        nonlocal frames, cts, sts, ends, fakes, pos_idx, end
        if cts:
            raws.append(b"".join(frames) + packed_meta(cts, sts, ends, fakes, pos_idx)
                        + pb.PullBinlogsResp(watermark=cts[-1]).SerializeToString())
        frames, cts, sts, ends, fakes, pos_idx, end = [], [], [], [], [], [], 0

    def add(b: bytes) -> None:
        nonlocal end
        head = frame_head(len(b))
        frames.extend((head, b))
        end += len(head) + len(b)

    ts = T0 + 10
    for n in range(a.txns):
        if len(cts) % 64 == 63:
            ts += 2
            add(pb.Binlog(tp=pb.FAKE, start_ts=ts, commit_ts=ts).SerializeToString())
            cts.append(ts), sts.append(ts), ends.append(end), fakes.append(len(cts) - 1)
        ti = rnd.randrange(len(tables))
        t, m = tables[ti], model[ti]
        ids = rnd.sample(range(1, per_table + 1), 3)
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
        ts += 2
        pos = pb.Position(file_seq=1, offset=4 + n * 600, file_name="mysql-bin.000001",
                          gtids=[pb.GtidPos(domain_id=0, server_id=1, seq_no=n + 1)],
                          ts_ms=1_700_000_000_000 + n, server_id=1)
        src = pb.SourceInfo(name="bench", server_id=1, gtid=f"0-1-{n + 1}", file="mysql-bin.000001",
                            pos=4 + n * 600, ts_ms=1_700_000_000_000 + n)
        pre, com = binlogs(prewrite_value(t.mutation(*ch), source=src), ts - 1, ts, position=pos)
        for b in pre:
            add(b)
        add(com)
        pos_idx.append(len(cts))
        cts.append(ts), sts.append(ts - 1), ends.append(end)
        if len(cts) >= a.per_response:
            flush()
    flush()

    class Target:
        def __init__(self) -> None:
            self.items: list[tuple] = []

        def deliver(self, pump_id: str, items, watermark: int, nb: int) -> None:
            self.items += items

    resp_from = pb.PullBinlogsResp.FromString

    def read() -> list[tuple]:
        target = Target()
        r = PumpReader("pump-1", "127.0.0.1:1", 0, target, cluster_id=1, consumer_id="bench")
        for raw in raws:
            r._response_packed(raw, resp_from(raw))
        return target.items

    sink = SparkSink(SparkSinkConfig(warehouse="/nonexistent"), schema, "bench", 1, None,
                     owner="bench")
    for t in tables:
        sink._states[t.table_id] = T.plan(None, t.info, "sbtest")[0]

    def join(items: list[tuple]) -> list[Txn]:
        return [Txn.from_framed(it[5], it[2], it[0])[0] for it in items]

    def buffer(txns: list[Txn]) -> _Buffer:
        sink._buf = _Buffer()
        for txn in txns:
            sink._buffer_txn(txn)
        return sink._buf

    def timed(fn, *args):  # type: ignore[no-untyped-def]
        gc.disable()
        try:
            t0 = time.process_time()
            out = fn(*args)
            return time.process_time() - t0, out
        finally:
            gc.enable()

    items = read()
    assert len(items) == a.txns, (len(items), a.txns)
    txns = join(items)
    buf = buffer(txns)
    assert buf.count == 4 * a.txns, buf.count
    digest = hashlib.sha256(repr(sorted(buf.rows.items())).encode()).hexdigest()[:16]
    got: dict[str, list[float]] = {s: [] for s in STEPS}
    for _ in range(a.repeat):
        s_read, items = timed(read)
        s_join, txns = timed(join, items)
        s_buf, _ = timed(buffer, txns)
        got["read"].append(s_read)
        got["join"].append(s_join)
        got["buffer"].append(s_buf)
        got["total"].append(s_read + s_join + s_buf)
    del items, txns
    # The three steps with the drainer's gc settings, the batch's rows alive until the end.
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    # Responses are read and transactions buffered a slice at a time, as the drainer interleaves
    # them, so each step pays for the collections its own allocations trigger.
    for _ in range(a.repeat):
        spent = {"read": 0.0, "join": 0.0, "buffer": 0.0}
        sink._buf = _Buffer()
        for lo in range(0, len(raws), max(1, len(raws) // 20)):
            part = raws[lo:lo + max(1, len(raws) // 20)]
            t0 = time.process_time()
            target = Target()
            r = PumpReader("pump-1", "127.0.0.1:1", 0, target, cluster_id=1, consumer_id="bench")
            for raw in part:
                r._response_packed(raw, resp_from(raw))
            t1 = time.process_time()
            txns = join(target.items)
            t2 = time.process_time()
            for txn in txns:
                sink._buffer_txn(txn)
            t3 = time.process_time()
            spent["read"] += t1 - t0
            spent["join"] += t2 - t1
            spent["buffer"] += t3 - t2
        for k, v in spent.items():
            got[f"{k}_gc"].append(v)
        got["total_gc"].append(sum(spent.values()))
        sink._buf = _Buffer()
        gc.collect()
    print(json.dumps({"digest": digest, "load": os.getloadavg()[0],
                      "us": {s: statistics.median(v) / a.txns * 1e6 for s, v in got.items()}}))


# -- parent --------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--txns", type=int, default=10_000)
    ap.add_argument("--per-response", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--variant", action="append", default=[],
                    help="label=child args (first: the baseline); default: this tree only")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default="", help="(child) import sluice from this tree")
    ap.add_argument("--base-rev", default="",
                    help="a baseline variant first: this git revision with its own native module")
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    variants = [v.split("=", 1) for v in (a.variant or ["new="])]
    if a.base_rev:
        # the baseline first: its own Python and native module (bench/trees.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from trees import prepare_base
        log(f"building the tree of {a.base_rev} with its native module")
        base = prepare_base(a.base_rev, Path(tempfile.mkdtemp(prefix="sluice-bench-sparkrows-base-")))
        variants.insert(0, [f"base {a.base_rev}", f"--tree {base}"])
    res: dict[str, list[dict]] = {label: [] for label, _ in variants}
    digests = set()
    for rnd in range(a.rounds):
        order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
        for label, extra in order:
            cmd = [sys.executable, __file__, "--child", "--txns", str(a.txns), "--per-response",
                   str(a.per_response), "--repeat", str(a.repeat), "--seed", str(a.seed),
                   *shlex.split(extra)]
            load0 = os.getloadavg()[0]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            r["load0"] = load0
            res[label].append(r)
            digests.add(r["digest"])
            log(f"round {rnd + 1} {label}: " + "  ".join(f"{s} {r['us'][s]:.2f}" for s in STEPS)
                + f"  (µs/txn; load {load0:.1f}..{r['load']:.1f})")
    if len(digests) != 1:
        sys.exit(f"the variants buffered different rows (digests {sorted(digests)})")
    loads = [x for rs in res.values() for r in rs for x in (r["load0"], r["load"])]
    print(f"spark drainer Python path: {a.txns} sysbench-shape txns (4 row changes each), "
          f"{a.per_response} per response, {a.rounds} rounds x {a.repeat} repeats, load avg "
          f"(1 min) {min(loads):.1f}..{max(loads):.1f}; rows equal (digest {digests.pop()})")
    base = variants[0][0]
    print("CPU µs per transaction, median of rounds:")
    print("| step | " + " | ".join(label for label, _ in variants) + " | ratio (first / each) |")
    for s in STEPS:
        med = {label: statistics.median(r["us"][s] for r in res[label]) for label, _ in variants}
        ratios = ", ".join(f"{med[base] / med[label]:.2f}x" for label, _ in variants[1:])
        print(f"| {s} | " + " | ".join(f"{med[label]:.2f}" for label, _ in variants)
              + f" | {ratios} |")


if __name__ == "__main__":
    main()
