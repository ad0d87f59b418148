"""The drainer's raw path (grpc sink) stage by stage, in one process: today's per-transaction
tuples against a columnar prototype (pyarrow), on the same pump responses.

Why: on the real path (`bench/drainer_merge.py --real --relay-floor`) a relay that forwards
the pumps' responses unmerged reaches 0.89-0.97x of reading the pumps directly, the drainer
0.54-0.66x; the gap is the drainer's per-transaction Python work. This measures that work per
stage, and what the same work costs when no Python object is made per transaction — the
design question for the next step, not a shipped path.

Data: --txns transactions (prewrite + commit, a 2-column insert each, like the real-path bench)
spread at random over --pumps pumps, serialized as the pumps send them with packed metadata
(PullBinlogsResp of up to 2 MiB; pump.storage.reader.packed_meta).

Ours (today, the code the drainer runs):
- reader: PumpReader._response_packed (arrays -> merge tuples, checks, slices);
- merge: Merger.push_many / advance per response, round-robin over pumps, pop_ready(2048);
- apply + sink: the drainer's tuple -> RawTxn fields, GrpcSink.apply_raw;
- serve: GrpcSink.serve building 1 MiB responses.
Prototype (pyarrow, not used by the drainer):
- segment: each response's arrays and binlogs as zero-copy Arrow arrays (int64 commit_ts and
  start_ts, a binary array over the framed binlogs), with the frame-start check;
- merge: per step, each source cut at the step bound, concatenated, sort_indices by commit_ts,
  start_ts checked against the last 4,096 emitted (is_in) and within the batch, binlogs taken
  in order into one buffer (a response's payload).
Both emit the same transactions in the same order (checked). CPU per transaction, gc off (the
drainer runs with a raised threshold), best of --repeat.

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
import pyarrow.compute as pc  # noqa: E402

from sluice.drainer.merger import Merger  # noqa: E402
from sluice.drainer.reader import PumpReader  # noqa: E402
from sluice.drainer.sink import Checkpoint  # noqa: E402
from sluice.drainer.sinks.grpc import GrpcSink, GrpcSinkConfig  # noqa: E402
from sluice.proto import sluice_pb2 as pb  # noqa: E402
from sluice.pump.storage.reader import frame_head, packed_meta  # noqa: E402

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
    for i in range(len(resps)):
        merger.add_source(f"p{i}", 0)
    by_pump = [[g for g in target.got if g[0] == f"p{i}"] for i in range(len(resps))]
    order = [g for row in zip_longest(*by_pump) for g in row if g]
    batches: list[list[Any]] = []
    t0 = time.process_time()
    for pump_id, items, wm in order:
        merger.push_many(pump_id, items)
        merger.advance(pump_id, wm)
        while got := merger.pop_ready(limit=POP_LIMIT):
            batches.append(got)
    for i in range(len(resps)):
        merger.advance(f"p{i}", 1 << 62)
    while got := merger.pop_ready(limit=POP_LIMIT):
        batches.append(got)
    times["merge"] = time.process_time() - t0

    sink = GrpcSink(GrpcSinkConfig(buffer_txns=1 << 30, buffer_bytes=1 << 40))

    async def apply_and_serve() -> bytes:
        await sink.open(Checkpoint(commit_ts=0))
        t0 = time.process_time()
        for items in batches:
            sink.apply_raw(list(map(_raw_fields, items)))
        times["apply + sink"] = time.process_time() - t0
        total, parts = sink._bytes, []
        t0 = time.process_time()
        got = 0
        async for resp in sink.serve(0):
            parts.append(resp)
            got += len(resp) - len(pb.DrainerPullResp(watermark=sink._top).SerializeToString())
            if got >= total:
                break
        times["serve"] = time.process_time() - t0
        # The served stream's binlogs, framed again: comparable with the prototype's output.
        return b"".join(_frame(b) for p in parts for b in pb.DrainerPullResp.FromString(p).binlogs)
    payload = asyncio.run(apply_and_serve())
    return times, payload


def _frame(binlog: bytes) -> bytes:
    return frame_head(len(binlog)) + binlog


# -- the columnar prototype ----------------------------------------------------------------------

def _varint(b: bytes, i: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        x = b[i]
        i += 1
        n |= (x & 0x7F) << shift
        shift += 7
        if x < 0x80:
            return n, i


def segment(raw: bytes) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(commit_ts, start_ts, framed binlogs) of one packed response, zero-copy over raw."""
    resp = pb.PullBinlogsResp.FromString(raw)
    n = len(resp.txn_end)
    end = resp.txn_end[-1]
    buf = pa.py_buffer(raw)
    fields, i = {}, end
    while i < len(raw) and raw[i] & 7 == 2:
        tag = raw[i] >> 3
        ln, i = _varint(raw, i + 1)
        fields[tag] = (i, ln)
        i += ln
    (a, la), (b, lb), (c, lc) = fields[5], fields[6], fields[7]
    cts = pa.Array.from_buffers(pa.int64(), n, [None, buf.slice(a, la)])
    sts = pa.Array.from_buffers(pa.int64(), n, [None, buf.slice(b, lb)])
    ends = pa.Array.from_buffers(pa.uint32(), n, [None, buf.slice(c, lc)])
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), ends.cast(pa.int32())])
    data = pa.Array.from_buffers(pa.uint8(), end, [None, buf.slice(0, end)])
    if not pc.all(pc.equal(data.take(offsets.slice(0, n)), 0x0A)).as_py():
        raise ValueError("packed metadata does not match the frames")
    binlogs = pa.Array.from_buffers(pa.binary(), n, [None, offsets.buffers()[1], buf.slice(0, end)])
    return cts, sts, binlogs


def columnar(resps: list[list[bytes]]) -> tuple[dict[str, float], bytes]:
    times: dict[str, float] = {}
    t0 = time.process_time()
    segs = [[segment(r) for r in rs] for rs in resps]
    times["segment"] = time.process_time() - t0

    t0 = time.process_time()
    k = len(resps)
    cts_all = [pa.chunked_array([s[0] for s in src]) for src in segs]
    sts_all = [pa.chunked_array([s[1] for s in src]) for src in segs]
    bin_all = [pa.chunked_array([s[2] for s in src]) for src in segs]
    offs, lens = [0] * k, [len(c) for c in cts_all]
    window = pa.array([], pa.int64())
    out: list[bytes] = []
    end_bound = 1 << 63
    while any(o < n for o, n in zip(offs, lens)):
        step = min((cts_all[i][offs[i] + POP_LIMIT].as_py() for i in range(k)
                    if offs[i] + POP_LIMIT < lens[i]), default=end_bound)
        cs, ss, bs = [], [], []
        for i in range(k):
            if offs[i] >= lens[i]:
                continue
            part = cts_all[i].slice(offs[i], POP_LIMIT)
            m = len(part) if step == end_bound else pc.sum(pc.less(part, step)).as_py() or 0
            cs += part.slice(0, m).chunks
            ss += sts_all[i].slice(offs[i], m).chunks
            bs += bin_all[i].slice(offs[i], m).chunks
            offs[i] += m
        cts = pa.chunked_array(cs, pa.int64())
        idx = pc.sort_indices(cts)
        sts = pa.chunked_array(ss, pa.int64()).take(idx)
        if (pc.any(pc.is_in(sts, value_set=window)).as_py()
                or pc.count_distinct(sts).as_py() != len(sts)):
            raise AssertionError("copies in generated data")
        window = pa.concat_arrays([window, sts.combine_chunks()])[-WINDOW:]
        taken = pa.chunked_array(bs, pa.binary()).take(idx).combine_chunks()
        offsets = memoryview(taken.buffers()[1]).cast("i")
        first, last = offsets[taken.offset], offsets[taken.offset + len(taken)]
        out.append(taken.buffers()[2][first:last].to_pybytes())
    times["merge + output"] = time.process_time() - t0
    return times, b"".join(out)


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
    t_col, p_col = best(columnar, resps, a.repeat)
    if p_ours != p_col:
        raise SystemExit("the two paths emitted different streams")
    us = 1e6 / a.txns
    print("\n| path | stage | CPU us per transaction |")
    print("|---|---|---|")
    for name, times in (("today (tuples)", t_ours), ("columnar prototype (pyarrow)", t_col)):
        for stage, t in times.items():
            print(f"| {name} | {stage} | {t * us:.3f} |")
        print(f"| {name} | **total** | **{sum(times.values()) * us:.3f}** |")
    print(f"\nratio (today / prototype): {sum(t_ours.values()) / sum(t_col.values()):.2f}x "
          "less CPU per transaction with the prototype; both streams identical")


if __name__ == "__main__":
    main()
