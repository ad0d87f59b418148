"""Drainer merge, in process: sluice.drainer.merger.Merger against heapq.merge on the same tuples.

Both sides merge the same pre-built MergeItem tuples (K sources, each sorted by commit_ts, commit
ts unique and randomly interleaved across sources) in the same invocation; every run's output is
checked equal to the baseline's. Times are CPU seconds of this process (time.process_time; the
machine is shared with other work), the median of --repeat runs per side, the sides alternating.
The baseline only merges; the Merger also keeps watermarks, the
duplicate window and the producer-position filter, so the ratio is the price of those.

Rows:
- bulk: every item pushed (push_many per source), then one pop_ready.
- streaming: items pushed round-robin in batches of --batch per source (a pump reader's
  PullBinlogs responses), pop_ready after every round — how the drainer drives it.
- streaming, 20% with positions: the same, with one producer's items (a capture) carrying
  increasing pb.Position values, which takes the per-item filter path.

Real path (`--real`, after the in-process rows): 3 pump processes preloaded with --binlogs
binlogs (prewrite + commit per transaction, commit_ts interleaved across pumps), then
- baseline: one client reads the 3 pumps' PullBinlogs streams concurrently (3 threads), no merge;
- ours: `sluice drainer` with the grpc sink merges the same streams and one consumer reads its
  Drainer.PullBinlogs, from the drainer's "online" log line to the last binlog received.
- tuples (`--tuples`): the same drainer with `columnar-merge = false` (per-transaction tuples,
  the route every other sink takes);
- relay (`--relay-floor`): bench/relay_floor.py reads the same streams as the drainer does and
  forwards each response unmerged: the cost of a Python process in the path before any
  per-transaction work (the floor a drainer can approach), from the consumer's pull.
Both read the same data in the same invocation; wall-clock binlogs/s, median of --real-repeat,
after --warmup uncounted rounds (the first round of a fresh cluster is slower on every side).

Run: .venv/bin/python bench/drainer_merge.py [--sources 5] [--per-source 200000] [--batch 1000]
     [--real] [--binlogs 300000] [--real-repeat 3] [--skip-in-process] [--relay-floor]
     [--tuples]
"""
from __future__ import annotations

import argparse
import datetime
import gc
import heapq
import itertools
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sluice.drainer.merger import MergeItem, Merger  # noqa: E402
from sluice.proto import sluice_pb2 as pb  # noqa: E402

FAR = 1 << 62


def build(sources: int, per_source: int, positions_share: float, seed: int) -> list[list[MergeItem]]:
    rng = random.Random(seed)
    streams: list[list[MergeItem]] = [[] for _ in range(sources)]
    names = [f"pump{i}" for i in range(sources)]
    remaining = [per_source] * sources
    ts = 1 << 40
    offset = 4
    while any(remaining):
        s = rng.randrange(sources)
        if not remaining[s]:
            continue
        remaining[s] -= 1
        ts += rng.randint(1, 8)
        if positions_share and rng.random() < positions_share:
            offset += 100
            streams[s].append(MergeItem(ts, ts - 3, names[s], "capture",
                                        pb.Position(file_seq=1, offset=offset), None))
        else:
            streams[s].append(MergeItem(ts, ts - 3, names[s], "app", None, None))
    return streams


def baseline(streams: list[list[MergeItem]]) -> list[MergeItem]:
    return list(heapq.merge(*streams))


def ours_bulk(streams: list[list[MergeItem]]) -> list[MergeItem]:
    m = Merger()
    for s in streams:
        m.add_source(s[0].source_id, 0)
    for s in streams:
        m.push_many(s[0].source_id, s)
    for s in streams:
        m.advance(s[0].source_id, FAR)
    return m.pop_ready()


def make_streaming(batch: int) -> Callable[[list[list[MergeItem]]], list[MergeItem]]:
    def ours_streaming(streams: list[list[MergeItem]]) -> list[MergeItem]:
        m = Merger()
        names = [s[0].source_id for s in streams]
        for name in names:
            m.add_source(name, 0)
        out: list[MergeItem] = []
        longest = max(len(s) for s in streams)
        for lo in range(0, longest, batch):
            for name, s in zip(names, streams):
                if lo < len(s):
                    m.push_many(name, s[lo:lo + batch])
            out += m.pop_ready()
        for name in names:
            m.advance(name, FAR)
        out += m.pop_ready()
        return out
    return ours_streaming


def timed(fn: Callable[[list[list[MergeItem]]], list[MergeItem]],
          streams: list[list[MergeItem]]) -> tuple[float, list[MergeItem]]:
    gc.collect()
    t0 = time.process_time()
    out = fn(streams)
    return time.process_time() - t0, out


# -- real path ------------------------------------------------------------------------------

def preload(cluster, binlogs: int, group: int = 5000) -> tuple[int, dict[str, int]]:  # type: ignore[no-untyped-def]
    """Write binlogs/2 small transactions over the 3 pumps; returns (ts before, count per pump)."""
    import random

    from tests.support.binlogs import TS, commit, prewrite
    rng = random.Random(7)
    ts = TS(cluster.tso_addrs, cluster.cluster_id)
    chans = {p: h.stub() for p, h in cluster.pumps.items()}
    names = sorted(chans)
    value = pb.PrewriteValue(schema_version=1, mutations=[pb.TableMutation(
        table_id=1, schema_name="b", table_name="t", changes=[pb.RowChange(
            tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(int=1), pb.Datum(str="x" * 64)]))])]
    ).SerializeToString()
    counts = dict.fromkeys(names, 0)
    t0 = ts.get()
    txns = binlogs // 2
    while txns > 0:
        k = min(group, txns)
        txns -= k
        first = ts.get(k)
        pumps = [rng.choice(names) for _ in range(k)]
        for phase in ("prewrite", "commit"):
            if phase == "commit":
                c0 = ts.get(k)
            by: dict[str, list[bytes]] = {p: [] for p in names}
            for i, p in enumerate(pumps):
                s = first + i
                by[p].append(prewrite(s, value) if phase == "prewrite" else commit(s, c0 + i))
            for p, payloads in by.items():
                if payloads:
                    chans[p][1].WriteBinlogs(pb.WriteBinlogsReq(
                        cluster_id=cluster.cluster_id, payloads=payloads), timeout=120)
                    counts[p] += len(payloads)
    for ch, _ in chans.values():
        ch.close()
    ts.close()
    return t0, counts


def read_until(stream: Any, expect: int) -> int:
    """Read a PullBinlogs stream until `expect` binlogs came; how many came."""
    n = 0
    for resp in stream:
        n += len(resp.binlogs)
        if n >= expect:
            break
    return n


def read_pumps(cluster, after: int, counts: dict[str, int]) -> float:  # type: ignore[no-untyped-def]
    """Baseline: the 3 pumps' PullBinlogs streams read concurrently, no merge; binlogs/s."""
    import grpc

    from sluice.core import grpcutil
    from sluice.proto import sluice_pb2_grpc as pbg

    def one(addr: str, expect: int) -> None:
        ch = grpc.insecure_channel(addr, options=grpcutil.CHANNEL_OPTIONS)
        stream = pbg.PumpStub(ch).PullBinlogs(pb.PullBinlogsReq(
            cluster_id=cluster.cluster_id, after_commit_ts=after), timeout=600)
        read_until(stream, expect)
        stream.cancel()
        ch.close()
    threads = [threading.Thread(target=one, args=(cluster.pumps[p].addr, n)) for p, n in counts.items()]
    cpu0 = pump_cpu(cluster)
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(counts.values()) / (time.time() - t0)
    print(f"    baseline cpu s: pumps {pump_cpu(cluster) - cpu0:.2f}", flush=True)
    return rate


def pump_cpu(cluster) -> float:  # type: ignore[no-untyped-def]
    import psutil
    total = 0.0
    for h in cluster.pumps.values():
        c = psutil.Process(h.proc.pid).cpu_times()
        total += c.user + c.system
    return total


def read_drainer(cluster, name: str, after: int, total: int,  # type: ignore[no-untyped-def]
                 columnar: bool = True) -> float:
    """Ours: drainer (grpc sink) from its online log line to the consumer's last binlog;
    `columnar` False: the drainer merges per-transaction tuples (columnar-merge = false)."""
    import grpc

    from sluice.core import grpcutil
    from sluice.proto import sluice_pb2_grpc as pbg
    from tests.support.procs import port_open
    import psutil
    cpu0 = pump_cpu(cluster)
    # The consumer connects as soon as the drainer serves (not after a poll of its online
    # state: at ~0.3 s per run a 100 ms poll would be a third of the measurement); the clock
    # still starts at the drainer's own "online: merging" line.
    d = cluster.start_drainer(name, sink="grpc", wait_online=False, **{
        "initial-commit-ts": after, "to.consumers": ["bench"], "checkpoint-interval": 1.0,
        "columnar-merge": columnar})
    dproc = psutil.Process(d.proc.pid)
    # A channel made before the drainer listens connects only after grpc's reconnect backoff
    # (measured: 95-320 ms after the drainer served, even with a 5 ms backoff asked). A consumer
    # of a running drainer connects at once; so does this one: the channel is made once the
    # port is open (the drainer listens before it registers online).
    host, port = d.addr.rsplit(":", 1)
    while not port_open(int(port), host):
        if not d.proc.alive():
            raise RuntimeError(f"drainer exited: {d.proc.log_text()[-2000:]}")
        time.sleep(0.002)
    ch = grpc.insecure_channel(d.addr, options=grpcutil.CHANNEL_OPTIONS)
    n = 0
    deadline = time.monotonic() + 120
    while True:
        stream = pbg.DrainerStub(ch).PullBinlogs(pb.DrainerPullReq(
            cluster_id=cluster.cluster_id, after_commit_ts=after, consumer_id="bench"),
            timeout=600, wait_for_ready=True)
        try:
            first = next(stream)
            t_first = time.time()
            dcpu0 = sum(dproc.cpu_times()[:2])   # from the first response: after start-up
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            time.sleep(0.01)   # the sink is not open yet
    last = after
    for resp in itertools.chain([first], stream):
        n += len(resp.binlogs)
        if resp.watermark > last + 100_000_000:  # ack now and then: keeps the buffer bounded
            pbg.DrainerStub(ch).Ack(pb.AckReq(cluster_id=cluster.cluster_id, consumer_id="bench",
                                              commit_ts=resp.watermark))
            last = resp.watermark
        if n >= total:
            break
    t_end = time.time()
    print(f"    ours cpu s: pumps {pump_cpu(cluster) - cpu0:.2f}, drainer "
          f"{sum(dproc.cpu_times()[:2]) - dcpu0:.2f} (after start-up)", flush=True)
    stream.cancel()
    ch.close()
    started = None
    for line in d.proc.log_text().splitlines():
        if "online: merging" in line:
            started = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                tzinfo=datetime.timezone.utc).timestamp()
    assert started is not None
    print(f"    ours: first response {1000 * (t_first - started):.0f} ms after online, last "
          f"{1000 * (t_end - started):.0f} ms", flush=True)
    d.proc.stop()
    return total / (t_end - started)


def read_relay(cluster, after: int, total: int) -> float:  # type: ignore[no-untyped-def]
    """The floor: bench/relay_floor.py forwards the pumps' responses unmerged; binlogs/s from
    the consumer's pull (the relay opens its pump streams then) to the last binlog."""
    import grpc
    import psutil

    from sluice.core import grpcutil
    from sluice.proto import sluice_pb2_grpc as pbg
    from tests.support.procs import Proc, free_port, port_open, wait_until
    addr = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, str(Path(__file__).with_name("relay_floor.py")), "--listen", addr,
            "--cluster-id", str(cluster.cluster_id), "--after", str(after)]
    for p in sorted(cluster.pumps):
        argv += ["--pump", cluster.pumps[p].addr]
    proc = Proc("relay-floor", argv, cluster.workdir / "relay-floor.log").start()
    try:
        host, port = addr.rsplit(":", 1)
        wait_until(lambda: port_open(int(port), host), timeout=30)
        rproc = psutil.Process(proc.pid)
        cpu0, rcpu0 = pump_cpu(cluster), sum(rproc.cpu_times()[:2])
        ch = grpc.insecure_channel(addr, options=grpcutil.CHANNEL_OPTIONS)
        t0 = time.time()
        stream = pbg.DrainerStub(ch).PullBinlogs(pb.DrainerPullReq(
            cluster_id=cluster.cluster_id, after_commit_ts=after), timeout=600)
        read_until(stream, total)
        t_end = time.time()
        stream.cancel()
        ch.close()
        print(f"    relay cpu s: pumps {pump_cpu(cluster) - cpu0:.2f}, relay "
              f"{sum(rproc.cpu_times()[:2]) - rcpu0:.2f}", flush=True)
        return total / (t_end - t0)
    finally:
        proc.stop()


def real_path(binlogs: int, repeat: int, relay: bool = False, tuples: bool = False,
              warmup: int = 1) -> None:
    import tempfile

    from tests.support.cluster import Cluster
    from tests.support.procs import EtcdServer
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-drainer-"))
    etcd = EtcdServer(work / "etcd").start()
    cluster = Cluster(work, etcd.endpoint)
    try:
        cluster.start_tso()
        for i in range(3):
            # gc-interval: the pumps' default (the test cluster's is 1 s: a GC pass every
            # second, in the middle of ~0.3 s measurements)
            cluster.start_pump(f"pump-{i + 1}", **{"storage.sync": False, "gc-interval": 60.0})
        t = time.monotonic()
        after, counts = preload(cluster, binlogs)
        total = sum(counts.values())
        print(f"preloaded {total:,} binlogs over 3 pumps in {time.monotonic() - t:.1f}s "
              f"({', '.join(f'{p}: {n:,}' for p, n in counts.items())})", flush=True)
        base, ours, floor, tup = [], [], [], []
        for w in range(warmup):
            # Every side once, not counted: the first round of a fresh cluster ran 30-50% slower
            # on every side (pumps' CPU included).
            read_pumps(cluster, after, counts)
            read_drainer(cluster, f"bench-warmup-{w}", after, total)
            print(f"  warm-up round {w + 1} done (not counted)", flush=True)
        for r in range(repeat):
            base.append(read_pumps(cluster, after, counts))
            ours.append(read_drainer(cluster, f"bench-{r}", after, total))
            if tuples:
                tup.append(read_drainer(cluster, f"bench-tuples-{r}", after, total, columnar=False))
            if relay:
                floor.append(read_relay(cluster, after, total))
            print(f"  run {r + 1}: pumps read {base[-1]:,.0f} binlogs/s, drainer merged "
                  f"{ours[-1]:,.0f} binlogs/s"
                  + (f", drainer in tuples {tup[-1]:,.0f} binlogs/s" if tuples else "")
                  + (f", relay (no merge) {floor[-1]:,.0f} binlogs/s" if relay else ""),
                  flush=True)
    finally:
        cluster.stop()
        etcd.stop()
    b, o = statistics.median(base), statistics.median(ours)
    print()
    print("| what | baseline | ours | ratio | machine | date |")
    print("|---|---|---|---|---|---|")
    print(f"| 3 pumps -> drainer (grpc sink) -> consumer vs reading the 3 pumps' PullBinlogs, "
          f"{total:,} binlogs | {b:,.0f}/s | {o:,.0f}/s | {o / b:.2f}x | {os.cpu_count()} cores | "
          f"{datetime.date.today().isoformat()} |")
    if tup:
        t = statistics.median(tup)
        print(f"| same, the drainer merging per-transaction tuples (columnar-merge = false) | "
              f"{b:,.0f}/s | {t:,.0f}/s | {t / b:.2f}x | {os.cpu_count()} cores | "
              f"{datetime.date.today().isoformat()} |")
    if floor:
        f = statistics.median(floor)
        print(f"| 3 pumps -> relay forwarding responses unmerged (bench/relay_floor.py) -> consumer, "
              f"same baseline | {b:,.0f}/s | {f:,.0f}/s | {f / b:.2f}x | {os.cpu_count()} cores | "
              f"{datetime.date.today().isoformat()} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=int, default=5)
    ap.add_argument("--per-source", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the median is shown")
    ap.add_argument("--real", action="store_true", help="also run the real-process path")
    ap.add_argument("--binlogs", type=int, default=300_000)
    ap.add_argument("--real-repeat", type=int, default=3)
    ap.add_argument("--skip-in-process", action="store_true")
    ap.add_argument("--warmup", type=int, default=1,
                    help="real path: rounds of the baseline and the drainer run first, not counted")
    ap.add_argument("--tuples", action="store_true",
                    help="real path: also time the drainer with columnar-merge = false")
    ap.add_argument("--relay-floor", action="store_true",
                    help="real path: also time bench/relay_floor.py (forwards, never merges)")
    args = ap.parse_args()
    if not args.skip_in_process:
        in_process(args)
    if args.real:
        print()
        real_path(args.binlogs, args.real_repeat, args.relay_floor, args.tuples, args.warmup)


def in_process(args: argparse.Namespace) -> None:

    plain = build(args.sources, args.per_source, 0.0, seed=1)
    with_pos = build(args.sources, args.per_source, 0.2, seed=2)
    total = args.sources * args.per_source
    rows = [
        ("bulk (push all, one pop_ready)", plain, ours_bulk),
        (f"streaming (batches of {args.batch}, pop each round)", plain,
         make_streaming(args.batch)),
        (f"streaming, 20% with positions", with_pos, make_streaming(args.batch)),
    ]
    print(f"Drainer merge, {args.sources} sources x {args.per_source} items ({total} total), "
          f"median of {args.repeat} runs per side")
    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}; date: "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print("baseline: list(heapq.merge(*sources)) on the same MergeItem tuples")
    print()
    hdr = (f"| {'what':<48} | {'baseline cpu s':>14} | {'ours cpu s':>10} | {'ratio':>5} "
           f"| {'items/s':>10} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for what, streams, fn in rows:
        want: list[MergeItem] | None = None
        tb: list[float] = []
        to: list[float] = []
        for _ in range(args.repeat):  # alternate sides so drift on a shared machine hits both
            t, out = timed(baseline, streams)
            tb.append(t)
            want = out
            t, out = timed(fn, streams)
            to.append(t)
            if out != want:
                raise SystemExit(f"{what}: output differs from heapq.merge")
            del out
        b, o = statistics.median(tb), statistics.median(to)
        print(f"| {what:<48} | {b:>14.3f} | {o:>10.3f} | {b / o:>5.2f} | {total / o:>10,.0f} |")
    print()
    print("ratio = baseline time / ours time (>= 1: ours is faster); items/s = ours")


if __name__ == "__main__":
    main()
