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


def main() -> None:
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
