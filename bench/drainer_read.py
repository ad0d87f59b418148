"""The drainer's read path, per transaction: what a PumpReader does with a packed PullBinlogs
response (upb parse + PumpReader._response_packed: array checks, slices, merge tuples), then what
the drainer does per merged transaction before a decoding sink (the MySQL sink) sees it —
unframe + join + prewrite parse (Txn.from_framed) — and `unframe` alone.

Old vs new in one invocation, alternating per round: `old` is the former all-Python join
(tests/support/pyjoin.py: upb Binlog messages per binlog), `new` the native one
(native/src/txnjoin.rs). In the packed read step, old means positioned COMMITs were unframed and
parsed as upb Binlogs; new reads them with `commit_position`. A capture producer positions every
transaction: --positioned 1 (the default) is the real case.

Transactions: --prewrite-bytes of prewrite value each (one part; every --multi-th in 3 parts),
a COMMIT with a producer position on every --positioned-th (0: none); --per-response transactions per
response (a FAKE each 64), like a pump's. CPU µs per transaction (process_time, gc off), the
median of --rounds, with the load average (1 min) beside every number: the machine is shared.

Run: .venv/bin/python bench/drainer_read.py [--txns 20000] [--per-response 256] [--rounds 7]

Trees (`--trees`, the lazy PrewriteValue of issue 23): what each drainer does per merged
transaction, the old tree against this one, each run in its own process with its own native
module (`--base-rev`: `git archive` of it and its native/ built into `<tree>/_native` — the two
native modules differ — or `--base-tree DIR` prepared that way), alternating old/new every round.
sysbench `oltp_write_only`-shaped transactions (tests/support/sysbench_rows.py: four `sbtest`
tables, an index update, a non-index update, a delete and the insert back), each with a SourceInfo
and a capture-like COMMIT position, framed as the merge carries them. Steps, CPU µs per
transaction (process_time, gc off, the least of --repeat passes in a child; the median over
--rounds rounds in the parent, the load average of every run printed):
- `join`: Txn.from_framed (the syncer's step: native join, then — old tree — the upb parse of
  the PrewriteValue, or — new — its check and facts);
- `schema check`: the syncer's `does this transaction change the schema` test;
- `spark`: SparkSink._changes_schema + _buffer_txn (the Spark sink's per-transaction work before
  a commit, no JVM: table states planned as bench/spark_rows.py does);
- `mysql`: Translator.translate (the MySQL sink's decode into row changes with causality keys);
- the Spark drainer's and the MySQL drainer's sum of their steps.
Both trees must buffer the same Spark tuples and the same row changes (digest checked).

Run: .venv/bin/python bench/drainer_read.py --trees [--base-rev HEAD~1 | --base-tree DIR]
     [--txns 20000] [--rounds 5] [--repeat 3]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--tree-child" in sys.argv:
    # A baseline tree (prepare_base): its native module and `sluice.*` come first.
    _tree = Path(sys.argv[sys.argv.index("--tree-child") + 1])
    if _tree != Path(__file__).resolve().parents[1]:
        sys.path[0:0] = [str(_tree / "_native"), str(_tree / "_ns")]

from sluice.core.wire import frame_head, packed_meta  # noqa: E402
from sluice.drainer import reader as reader_mod  # noqa: E402
from sluice.drainer.reader import PumpReader  # noqa: E402
from sluice.drainer.txn import Txn, unframe  # noqa: E402
from sluice.proto import sluice_pb2 as pb  # noqa: E402
from tests.support import pyjoin  # noqa: E402


class Sink:
    """A ReaderTarget keeping the merge tuples (a merge is not part of this bench)."""

    def __init__(self) -> None:
        self.items: list[tuple] = []

    def deliver(self, pump_id: str, items, watermark: int, binlogs: int) -> None:
        self.items += items


def prewrite_value(i: int, size: int) -> bytes:
    row = pb.Row(columns=[pb.Datum(int=i), pb.Datum(str="x" * max(1, size - 60)),
                          pb.Datum(int=i * 7)])
    return pb.PrewriteValue(
        source=pb.SourceInfo(name="src", gtid=f"0-1-{i}"),
        mutations=[pb.TableMutation(table_id=10, schema_name="shop", table_name="orders",
                                    table_version=1,
                                    changes=[pb.RowChange(tp=pb.INSERT, after=row)])]
    ).SerializeToString()


def responses(n: int, per: int, size: int, positioned: int, multi: int) -> list[bytes]:
    out, frames, cts, sts, ends, fakes, pos_idx = [], [], [], [], [], [], []
    end = 0
    ts = 1000

    def flush() -> None:
        nonlocal frames, cts, sts, ends, fakes, pos_idx, end
        if cts:
            out.append(b"".join(frames) + packed_meta(cts, sts, ends, fakes, pos_idx)
                       + pb.PullBinlogsResp(watermark=cts[-1]).SerializeToString())
        frames, cts, sts, ends, fakes, pos_idx, end = [], [], [], [], [], [], 0

    for i in range(n):
        if len(cts) % 64 == 63:
            ts += 2
            fake = pb.Binlog(tp=pb.FAKE, start_ts=ts, commit_ts=ts).SerializeToString()
            frames += [frame_head(len(fake)), fake]
            end += len(frame_head(len(fake))) + len(fake)
            cts.append(ts), sts.append(ts), ends.append(end), fakes.append(len(cts) - 1)
        ts += 2
        value = prewrite_value(i, size)
        parts = 3 if multi and i % multi == 0 else 1
        cut = -(-len(value) // parts)
        binlogs = [pb.Binlog(tp=pb.PREWRITE, start_ts=ts, producer_id="cap-1", part_no=p,
                             part_count=parts if parts > 1 else 0,
                             prewrite_value=value[p * cut:(p + 1) * cut]).SerializeToString()
                   for p in range(parts)]
        c = pb.Binlog(tp=pb.COMMIT, start_ts=ts, commit_ts=ts + 1, producer_id="cap-1")
        if positioned and i % positioned == 0:
            c.position.file_seq, c.position.offset = 3, i
            pos_idx.append(len(cts))
        binlogs.append(c.SerializeToString())
        for b in binlogs:
            head = frame_head(len(b))
            frames += [head, b]
            end += len(head) + len(b)
        cts.append(ts + 1), sts.append(ts), ends.append(end)
        if len(cts) >= per:
            flush()
    flush()
    return out


def timed(fn) -> float:
    gc.disable()
    try:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0
    finally:
        gc.enable()


# --------------------------------------------------------------------------------------------
# old tree vs new tree, per merged transaction (--trees)
# --------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def tree_child(a: argparse.Namespace) -> None:
    """One tree's steps (its own process; sys.path was set before any sluice import)."""
    import hashlib
    import json

    import sluice_native
    from sluice.drainer.translator import Translator
    from sluice.drainer.txn import frame
    from sluice.spark_sink import tables as T
    from sluice.spark_sink.config import SparkSinkConfig
    from sluice.spark_sink.sink import SparkSink, _Buffer
    from tests.support.rows import binlogs, history_of, prewrite_value as value_of, schema_txn
    from tests.support.sysbench_rows import SysbenchWorkload

    wl = SysbenchWorkload(a.seed, "sbtest", rows=10_000)
    t0 = 1 << 40
    framed: list[bytes] = []
    for n in range(a.txns):
        src = pb.SourceInfo(name="bench", server_id=1, gtid=f"0-1-{n + 1}", file="mysql-bin.000001",
                            pos=4 + n * 600, ts_ms=1_700_000_000_000 + n)
        pos = pb.Position(file_seq=1, offset=4 + n * 600, file_name="mysql-bin.000001",
                          gtids=[pb.GtidPos(domain_id=0, server_id=1, seq_no=n + 1)],
                          ts_ms=1_700_000_000_000 + n, server_id=1)
        pre, com = binlogs(value_of(*wl.next_mutations(), source=src), t0 + 2 * n + 9,
                           t0 + 2 * n + 10, position=pos)
        framed.append(frame(pre + [com]))
    history = history_of([schema_txn(t0, *wl.tables)])
    sink = SparkSink(SparkSinkConfig(warehouse="/nonexistent"), history, "bench", 1, None,
                     owner="bench")
    for t in wl.tables:
        sink._states[t.table_id] = T.plan(None, t.info, "sbtest")[0]
    translator = Translator()
    lazy = hasattr(Txn, "changes_schema")

    def join() -> list:
        return [Txn.from_framed(f, "pump-1", t0 + 2 * i + 10)[0] for i, f in enumerate(framed)]

    def schema_check(txns: list) -> int:
        if lazy:    # drainer/syncer.py of each tree
            return sum(1 for t in txns if t.changes_schema)
        n = 0
        for t in txns:
            pv = t.prewrite
            if pv.schema_snapshots or pv.HasField("ddl"):
                n += 1
        return n

    def spark(txns: list) -> _Buffer:
        sink._buf = _Buffer()
        for t in txns:
            if sink._changes_schema(t):
                raise SystemExit("a sysbench transaction changes no schema")
            sink._buffer_txn(t)
        return sink._buf

    def mysql(txns: list) -> list:
        return [translator.translate(t, history) for t in txns]

    def timed(fn, *args):  # type: ignore[no-untyped-def]
        gc.disable()
        try:
            c0 = time.process_time()
            out = fn(*args)
            return (time.process_time() - c0) / a.txns * 1e6, out
        finally:
            gc.enable()

    best: dict[str, float] = {}
    digest = ""
    for _ in range(a.repeat):
        s_join, txns = timed(join)
        s_check, nschema = timed(schema_check, txns)
        s_spark, buf = timed(spark, txns)
        s_mysql, changes = timed(mysql, txns)
        assert nschema == 0 and buf.count == 4 * a.txns, (nschema, buf.count)
        for k, v in (("join", s_join), ("schema check", s_check), ("spark", s_spark),
                     ("mysql", s_mysql)):
            best[k] = min(best.get(k, 1e18), v)
        digest = hashlib.sha256(repr((sorted(buf.rows.items()),
                                      [[(c.kind, c.commit_ts, c.before, c.after, c.keys) for c in cs]
                                       for cs in changes[:2000]])).encode()).hexdigest()[:16]
        del txns, buf, changes
        gc.collect()
    print(json.dumps({"steps": best, "digest": digest, "load": os.getloadavg()[0],
                      "native": sluice_native.__file__}))


def trees_main(a: argparse.Namespace) -> None:
    import datetime
    import json
    import subprocess
    import tempfile
    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-trees-") as tmp:
        from trees import prepare_base
        base = Path(a.base_tree) if a.base_tree else prepare_base(a.base_rev, Path(tmp))
        for r in range(a.rounds):
            order = (("old", base), ("new", ROOT)) if r % 2 == 0 else (("new", ROOT), ("old", base))
            for side, tree in order:
                cmd = [sys.executable, __file__, "--tree-child", str(tree), "--txns", str(a.txns),
                       "--repeat", str(a.repeat), "--seed", str(a.seed)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"{side} run failed:\n{done.stderr[-3000:]}")
                res = json.loads(done.stdout.strip().splitlines()[-1])
                runs[side].append(res)
                print(f"round {r + 1} {side}: " + ", ".join(f"{k} {v:.2f}" for k, v in res["steps"].items())
                      + f" µs/txn, load {res['load']:.1f}, digest {res['digest']}", flush=True)
    digests = {x["digest"] for rs in runs.values() for x in rs}
    if len(digests) != 1:
        raise SystemExit(f"the trees buffered different rows: {digests}")
    med = {side: {k: statistics.median(x["steps"][k] for x in rs) for k in rs[0]["steps"]}
           for side, rs in runs.items()}
    for side in med:
        m = med[side]
        m["Spark drainer (join + schema check + spark)"] = m["join"] + m["schema check"] + m["spark"]
        m["MySQL drainer (join + schema check + mysql)"] = m["join"] + m["schema check"] + m["mysql"]
    loads = [x["load"] for rs in runs.values() for x in rs]
    print(f"# per merged transaction, sysbench oltp_write_only shape ({a.txns} txns, 4 row changes, "
          f"SourceInfo + positioned COMMIT); old = {a.base_tree or a.base_rev}, new = this tree; "
          f"CPU µs per transaction, least of {a.repeat} passes per run, median of {a.rounds} "
          f"alternating runs per side")
    print(f"machine: {os.cpu_count()} cores, load average (1 min) {load0:.1f} at start, "
          f"{min(loads):.1f}-{max(loads):.1f} during the runs, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{time.perf_counter() - started:.0f} s")
    # Paired: each round's old run against its new run (adjacent in time), so a slow stretch of
    # the shared machine weighs on both sides of a ratio.
    def total(x: dict, mysql: bool) -> float:
        st = x["steps"]
        return st["join"] + st["schema check"] + (st["mysql"] if mysql else st["spark"])

    paired: dict[str, list[float]] = {k: [] for k in med["old"]}
    for o, n in zip(runs["old"], runs["new"]):
        for k in o["steps"]:
            paired[k].append(o["steps"][k] / n["steps"][k])
        paired["Spark drainer (join + schema check + spark)"].append(total(o, False) / total(n, False))
        paired["MySQL drainer (join + schema check + mysql)"].append(total(o, True) / total(n, True))
    print("| step | old µs | new µs | old/new of medians | median of per-round old/new (range) |")
    print("|---|---|---|---|---|")
    for k in med["old"]:
        r = paired[k]
        print(f"| {k} | {med['old'][k]:.2f} | {med['new'][k]:.2f} | {med['old'][k] / med['new'][k]:.2f}x "
              f"| {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}) |")


def main() -> None:
    if "--trees" in sys.argv or "--tree-child" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--trees", action="store_true")
        ap.add_argument("--tree-child", help=argparse.SUPPRESS)
        ap.add_argument("--base-rev", default="HEAD~1")
        ap.add_argument("--base-tree")
        ap.add_argument("--txns", type=int, default=20000)
        ap.add_argument("--rounds", type=int, default=5)
        ap.add_argument("--repeat", type=int, default=3)
        ap.add_argument("--seed", type=int, default=7)
        a = ap.parse_args()
        if a.tree_child:
            tree_child(a)
        else:
            trees_main(a)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--txns", type=int, default=20000)
    ap.add_argument("--per-response", type=int, default=256)
    ap.add_argument("--prewrite-bytes", type=int, default=300)
    ap.add_argument("--positioned", type=int, default=1)
    ap.add_argument("--multi", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    raws = responses(a.txns, a.per_response, a.prewrite_bytes, a.positioned, a.multi)

    def read() -> list[tuple]:
        sink = Sink()
        r = PumpReader("pump-1", "127.0.0.1:1", 0, sink, cluster_id=1, consumer_id="bench")
        resp_from = pb.PullBinlogsResp.FromString
        for raw in raws:
            r._response_packed(raw, resp_from(raw))
        return sink.items

    native_commit, native_position = reader_mod._commit_position, reader_mod._position

    def read_old() -> list[tuple]:
        # The former look at positioned entries: unframe + a upb Binlog per COMMIT.
        reader_mod._commit_position, reader_mod._position = pyjoin.py_commit_position, lambda p: p
        try:
            return read()
        finally:
            reader_mod._commit_position, reader_mod._position = native_commit, native_position

    items = read()
    assert len(items) == a.txns, (len(items), a.txns)
    assert read_old() == items
    payloads = [(it[5], it[2], it[0]) for it in items]
    # Both joins give equal transactions (the bench measures the same work).
    for p, src, ct in payloads[:: max(1, len(payloads) // 500)]:
        assert Txn.from_framed(p, src, ct) == pyjoin.py_from_framed(p, src, ct)

    steps = {
        "read old": read_old,
        "read new": read,
        "join old": lambda: [pyjoin.py_from_framed(p, s, c) for p, s, c in payloads],
        "join new": lambda: [Txn.from_framed(p, s, c) for p, s, c in payloads],
        "unframe old": lambda: [pyjoin.py_unframe(p, s, c) for p, s, c in payloads],
        "unframe new": lambda: [unframe(p, s, c) for p, s, c in payloads],
    }
    got: dict[str, list[float]] = {k: [] for k in steps}
    loads: list[float] = []
    for _ in range(a.rounds):
        for name, fn in steps.items():   # old and new alternate within every round
            got[name].append(timed(fn) / a.txns * 1e6)
        loads.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"drainer read path: {a.txns} txns, {len(raws)} responses of {a.per_response}, "
          f"{a.prewrite_bytes} B prewrite values, rounds {a.rounds}, load avg (1 min) "
          f"{min(loads):.1f}..{max(loads):.1f} (per round: {' '.join(f'{x:.1f}' for x in loads)})")
    print("CPU µs per transaction (median of rounds):")
    for step in ("read", "join", "unframe"):
        old, new = med[f"{step} old"], med[f"{step} new"]
        label = {"read": "packed response -> merge tuples (upb parse + PumpReader._response_packed)",
                 "join": "unframe + join + prewrite parse (syncer, MySQL sink)",
                 "unframe": "unframe alone"}[step]
        print(f"  {label}: old {old:.2f}  new {new:.2f}  -> {old / new:.2f}x")
    old_total = med["read old"] + med["join old"]
    new_total = med["read new"] + med["join new"]
    print(f"  read path total (read + join): old {old_total:.2f}  new {new_total:.2f}  -> "
          f"{old_total / new_total:.2f}x")


if __name__ == "__main__":
    main()
