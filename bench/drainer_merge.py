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

Run: .venv/bin/python bench/drainer_merge.py [--sources 5] [--per-source 200000] [--batch 1000]
"""
from __future__ import annotations

import argparse
import datetime
import gc
import heapq
import os
import platform
import random
import statistics
import time
from collections.abc import Callable

from sluice.drainer.merger import MergeItem, Merger
from sluice.proto import sluice_pb2 as pb

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=int, default=5)
    ap.add_argument("--per-source", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the median is shown")
    args = ap.parse_args()

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
