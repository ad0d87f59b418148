"""The grpc sink's buffer: chunks from RawTxn batches and from merged columns serve the same stream.

Invariant (drainer/sinks/grpc.py): a pull after any commit_ts >= the buffer's start gets every
buffered transaction above it exactly once, in commit order, in responses of about
`response-bytes`; acknowledgements free what every consumer passed (whole chunks, then part of
one) and the room counts follow.
"""
from __future__ import annotations

import asyncio
import random

import pyarrow as pa

from sluice.drainer.columnar import ColumnBatch
from sluice.drainer.sink import Checkpoint
from sluice.drainer.sinks.grpc import GrpcSink, GrpcSinkConfig
from sluice.proto import sluice_pb2 as pb
from sluice.core.wire import frame_head


def txn(ct: int, size: int) -> tuple[int, int, bytes]:
    payload = ct.to_bytes(8, "big") * (size // 8 + 1)
    return ct, ct - 1, frame_head(len(payload)) + payload


def columns(txns: list[tuple[int, int, bytes]]) -> ColumnBatch:
    arr = pa.array([t[2] for t in txns], pa.binary())
    # A slice with an offset, as a merge's take of a larger array can give.
    padded = pa.concat_arrays([pa.array([b"pad"], pa.binary()), arr]).slice(1)
    return ColumnBatch(pa.array([t[0] for t in txns], pa.int64()),
                       pa.array([t[1] for t in txns], pa.int64()), padded)


async def pull(sink: GrpcSink, after: int, upto: int) -> list[tuple[list[bytes], int]]:
    """Responses (binlogs, watermark) from serve(after) until the watermark reaches upto."""
    out = []
    async for raw in sink.serve(after):
        resp = pb.DrainerPullResp.FromString(raw)
        out.append((list(resp.binlogs), resp.watermark))
        if resp.watermark >= upto:
            break
    return out


def payloads(t: tuple[int, int, bytes]) -> list[bytes]:
    return list(pb.DrainerPullResp.FromString(t[2]).binlogs)


def test_raw_and_column_chunks_serve_one_stream_and_trim_by_acks() -> None:
    async def main() -> None:
        rng = random.Random(3)
        sink = GrpcSink(GrpcSinkConfig(consumers=["a", "b"], response_bytes=3000,
                                       buffer_txns=10_000))
        await sink.open(Checkpoint(100))
        every: list[tuple[int, int, bytes]] = []
        ct = 100
        for k in range(12):
            batch = []
            for _ in range(rng.randint(1, 40)):
                ct += rng.randint(1, 5)
                batch.append(txn(ct, rng.randint(10, 700)))
            every += batch
            if k % 2:
                sink.apply_columns(columns(batch))
            else:
                sink.apply_raw(batch)
        top = every[-1][0]
        assert sink._n == len(every)
        assert sink._bytes == sum(len(t[2]) for t in every)
        for after in [100, *(rng.choice(every)[0] for _ in range(10)), top]:
            resps = await pull(sink, after, top)
            got = [b for r, _ in resps for b in r]
            assert got == [b for t in every if t[0] > after for b in payloads(t)]
            wms = [wm for _, wm in resps]
            assert wms == sorted(wms) and wms[-1] == top
            # about response-bytes each: only the last of a response may cross the limit
            for r, _ in resps[:-1]:
                assert sum(len(b) for b in r) < 3000 + 800
        # acks: the buffer keeps what the slowest consumer has not acknowledged
        mid = every[len(every) // 2][0]
        sink.ack("a", top)
        sink.ack("b", mid)
        left = [t for t in every if t[0] > mid]
        assert sink._n == len(left) and sink._bytes == sum(len(t[2]) for t in left)
        assert [b for r, _ in await pull(sink, mid, top) for b in r] == \
            [b for t in left for b in payloads(t)]
        sink.ack("b", top)
        assert sink._n == 0 and sink._bytes == 0 and sink.has_room()
        # and it goes on after the buffer emptied
        sink.apply_columns(columns([txn(top + 1, 50)]))
        assert [b for r, _ in await pull(sink, top, top + 1) for b in r] == payloads(txn(top + 1, 50))
    asyncio.run(asyncio.wait_for(main(), 20))


def test_room_counts_transactions_and_bytes_of_both_chunk_kinds() -> None:
    async def main() -> None:
        sink = GrpcSink(GrpcSinkConfig(consumers=["a"], buffer_txns=5, buffer_bytes=1 << 20))
        await sink.open(Checkpoint(0))
        sink.apply_raw([txn(1, 10), txn(2, 10)])
        assert sink.has_room()
        sink.apply_columns(columns([txn(3, 10), txn(4, 10), txn(5, 10)]))
        assert not sink.has_room()
        sink.ack("a", 3)
        assert sink.has_room() and sink._n == 2
    asyncio.run(asyncio.wait_for(main(), 20))
