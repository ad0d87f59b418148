"""The drainer's raw path (grpc sink) stage by stage, in one process: the tuple route
(drainer.merger) against the columnar route (drainer.columnar), on the same pump responses.

Why: on the real path (`bench/drainer_merge.py --real --relay-floor`) a relay that forwards
the pumps' responses unmerged reaches ~0.9x of reading the pumps directly; what a drainer
adds beyond that is per-transaction work. This measures that work per stage for both routes.

Data: --txns transactions (prewrite + commit, a 2-column insert each, like the real-path bench)
spread at random over --pumps pumps, serialized as the pumps send them with packed metadata
(PullBinlogsResp of up to 2 MiB; pump.storage.reader.packed_meta).

- tuples: PumpReader._response_packed (arrays -> merge tuples), Merger.push_many / advance per
  response round-robin over pumps and pop_ready(2048), the drainer's RawTxn fields into
  GrpcSink.apply_raw, GrpcSink.serve building 1 MiB responses;
- columns: drainer.columnar.segment (Arrow arrays over each response), ColumnarMerge
  push_segment / advance / pop_ready(2048) (ColumnBatch), GrpcSink.apply_columns, serve.
Both emit the same stream (checked byte for byte). CPU per transaction (time.process_time), gc
off (the drainer runs with a raised threshold), best of --repeat.

Run: .venv/bin/python bench/drainer_stages.py [--txns 150000] [--pumps 3] [--repeat 3]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import operator
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from sluice.drainer.columnar import ColumnarMerge, segment  # noqa: E402
from sluice.drainer.merger import Merger  # noqa: E402
from sluice.drainer.reader import PumpReader  # noqa: E402
from sluice.drainer.sink import Checkpoint  # noqa: E402
from sluice.drainer.sinks.grpc import GrpcSink, GrpcSinkConfig  # noqa: E402
from sluice.proto import sluice_pb2 as pb  # noqa: E402
from sluice.core.wire import frame_head, packed_meta  # noqa: E402

RESPONSE_BYTES = 2 << 20
POP_LIMIT = 2048
WINDOW = 4096
_raw_fields = operator.itemgetter(0, 1, 5)


def build(txns: int, pumps: int, seed: int = 1) -> list[list[bytes]]:
    """Each pump's serialized PullBinlogsResp messages (packed metadata), commit order."""
    rng = random.Random(seed)
    value = pb.PrewriteValue(schema_version=1, mutations=[pb.TableMutation(
        table_id=1, schema_name="b", table_name="t", changes=[pb.RowChange(
            tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(int=1), pb.Datum(str="x" * 64)]))])]
    ).SerializeToString()
    base = 1 << 60
    per: list[list[tuple[int, int, bytes]]] = [[] for _ in range(pumps)]
    for i in range(txns):
        st = base + 2 * i
        pw = pb.Binlog(tp=pb.PREWRITE, start_ts=st, prewrite_value=value).SerializeToString()
        cm = pb.Binlog(tp=pb.COMMIT, start_ts=st, commit_ts=st + 1).SerializeToString()
        per[rng.randrange(pumps)].append(
            (st + 1, st, frame_head(len(pw)) + pw + frame_head(len(cm)) + cm))
    out = []
    for items in per:
        resps, i = [], 0
        while i < len(items):
            parts, cts, sts, ends, end = [], [], [], [], 0
            while i < len(items) and end < RESPONSE_BYTES:
                ct, st, framed = items[i]
                parts.append(framed)
                end += len(framed)
                cts.append(ct)
                sts.append(st)
                ends.append(end)
                i += 1
            resps.append(b"".join(parts) + packed_meta(cts, sts, ends, [], [])
                         + pb.PullBinlogsResp(watermark=cts[-1]).SerializeToString())
        out.append(resps)
    return out


# -- today's stages ------------------------------------------------------------------------------

class _Collect:
    def __init__(self) -> None:
        self.got: list[tuple[str, list[tuple], int]] = []

    def deliver(self, pump_id: str, items: list[tuple], watermark: int, binlogs: int) -> None:
        self.got.append((pump_id, items, watermark))


def ours(resps: list[list[bytes]]) -> tuple[dict[str, float], bytes]:
    times: dict[str, float] = {}
    target = _Collect()
    readers = [PumpReader(f"p{i}", "-", 0, target, cluster_id=1, consumer_id="bench")  # type: ignore[arg-type]
               for i in range(len(resps))]
    t0 = time.process_time()
    for reader, rs in zip(readers, resps):
        for raw in rs:
            reader._response_packed(raw, pb.PullBinlogsResp.FromString(raw))
    times["reader"] = time.process_time() - t0

    merger = Merger(0)
    batches = _merge(merger, target.got, len(resps), merger.push_many, times)

    return times, _sink_and_serve(batches, times,
                                  lambda sink, b: sink.apply_raw(list(map(_raw_fields, b))))


def _merge(merge: Any, delivered: list[tuple[str, Any, int]], pumps: int,
           push: Callable[[str, Any], None], times: dict[str, float]) -> list[Any]:
    """Deliveries round-robin over the pumps, a pop after each (as the drainer's loop does),
    then every pump far ahead and the last pops; the batches, timed as "merge"."""
    for i in range(pumps):
        merge.add_source(f"p{i}", 0)
    by_pump = [[g for g in delivered if g[0] == f"p{i}"] for i in range(pumps)]
    order = [g for row in zip_longest(*by_pump) for g in row if g]
    batches: list[Any] = []
    t0 = time.process_time()
    for pump_id, items, wm in order:
        push(pump_id, items)
        merge.advance(pump_id, wm)
        while got := merge.pop_ready(limit=POP_LIMIT):
            batches.append(got)
    for i in range(pumps):
        merge.advance(f"p{i}", 1 << 62)
    while got := merge.pop_ready(limit=POP_LIMIT):
        batches.append(got)
    times["merge"] = time.process_time() - t0
    return batches


def _sink_and_serve(batches: list[Any], times: dict[str, float],
                    apply: Callable[[GrpcSink, Any], None]) -> bytes:
    """Apply every batch to a grpc sink, then serve it all; the served stream's binlogs."""
    sink = GrpcSink(GrpcSinkConfig(buffer_txns=1 << 30, buffer_bytes=1 << 40))

    async def main() -> bytes:
        await sink.open(Checkpoint(commit_ts=0))
        t0 = time.process_time()
        for b in batches:
            apply(sink, b)
        times["apply + sink"] = time.process_time() - t0
        total, parts = sink._bytes, []
        tail = len(pb.DrainerPullResp(watermark=sink._top).SerializeToString())
        t0 = time.process_time()
        got = 0
        async for resp in sink.serve(0):
            parts.append(resp)
            got += len(resp) - tail
            if got >= total:
                break
        times["serve"] = time.process_time() - t0
        # framed again: the two routes' streams compare byte for byte
        return b"".join(_frame(b) for p in parts for b in pb.DrainerPullResp.FromString(p).binlogs)
    return asyncio.run(main())


def _frame(binlog: bytes) -> bytes:
    return frame_head(len(binlog)) + binlog


# -- the columnar route (drainer/columnar.py) --------------------------------------------------

def columns(resps: list[list[bytes]]) -> tuple[dict[str, float], bytes]:
    times: dict[str, float] = {}
    segs: list[tuple[str, Any, int]] = []
    t0 = time.process_time()
    for i, rs in enumerate(resps):
        after = 0
        for raw in rs:
            got = segment(raw, pb.PullBinlogsResp.FromString(raw), after)
            assert got is not None and len(got[0]) == 1
            pieces, top = got
            after = top
            segs.append((f"p{i}", pieces[0], top))
    times["reader (segment)"] = time.process_time() - t0

    merge = ColumnarMerge(0)
    batches = _merge(merge, segs, len(resps), merge.push_segment, times)
    assert merge.columnar_emitted == sum(map(len, batches)), "left the columnar route"
    return times, _sink_and_serve(batches, times, lambda sink, b: sink.apply_columns(b))


def best(fn: Callable[[list[list[bytes]]], tuple[dict[str, float], bytes]],
         resps: list[list[bytes]], repeat: int) -> tuple[dict[str, float], bytes]:
    runs = []
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            runs.append(fn(resps))
        finally:
            gc.enable()
    keep = min(runs, key=lambda r: sum(r[0].values()))
    return keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--txns", type=int, default=150_000)
    ap.add_argument("--pumps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    resps = build(a.txns, a.pumps)
    print(f"drainer raw-path stages, {a.txns:,} transactions over {a.pumps} pumps "
          f"({sum(map(len, resps))} responses), best of {a.repeat}; {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, pyarrow {pa.__version__}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    t_ours, p_ours = best(ours, resps, a.repeat)
    t_col, p_col = best(columns, resps, a.repeat)
    if p_ours != p_col:
        raise SystemExit("the two paths emitted different streams")
    us = 1e6 / a.txns
    print("\n| path | stage | CPU us per transaction |")
    print("|---|---|---|")
    for name, times in (("tuples (drainer.merger)", t_ours), ("columns (drainer.columnar)", t_col)):
        for stage, t in times.items():
            print(f"| {name} | {stage} | {t * us:.3f} |")
        print(f"| {name} | **total** | **{sum(times.values()) * us:.3f}** |")
    print(f"\nratio: {sum(t_ours.values()) / sum(t_col.values()):.2f}x less CPU per transaction "
          "on the columnar route; both streams identical")


if __name__ == "__main__":
    main()
