"""The floor of any Python drainer: a relay that forwards pump responses without merging.

Used by `bench/drainer_merge.py --real --relay-floor` as a third side of the real-path run. It
reads the pumps' PullBinlogs streams exactly as the drainer does (grpc.aio, responses as bytes,
packed metadata) and serves a Drainer.PullBinlogs stream, but does no per-transaction work at
all: each pump response's framed binlogs (already DrainerPullResp field 1) go out as they came,
with a watermark. The order is not commit order; what it measures is what a separate Python
process in the path costs before it merges anything (two gRPC hops, asyncio, copies).

Run: relay_floor.py --listen HOST:PORT --cluster-id N --after TS --pump ADDR [--pump ADDR ...]
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from sluice.core import grpcutil  # noqa: E402
from sluice.proto import sluice_pb2 as pb  # noqa: E402

log = logging.getLogger("relay-floor")
_PULL = "/sluice.v1.Pump/PullBinlogs"
_resp_from = pb.PullBinlogsResp.FromString


def _tail(watermark: int) -> bytes:
    return pb.DrainerPullResp(watermark=watermark).SerializeToString()


class Relay:
    def __init__(self, pumps: list[str], cluster_id: int, after: int) -> None:
        self.pumps, self.cluster_id, self.after = pumps, cluster_id, after
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=8)
        self.tasks: list[asyncio.Task[None]] = []

    async def _read(self, addr: str) -> None:
        channel = grpcutil.aio_channel(addr)
        req = pb.PullBinlogsReq(cluster_id=self.cluster_id, after_commit_ts=self.after,
                                consumer_id="relay-floor", packed_meta=True)
        call = channel.unary_stream(_PULL, request_serializer=pb.PullBinlogsReq.SerializeToString,
                                    response_deserializer=None)(req)
        try:
            while True:
                raw = await call.read()
                if raw is grpc.aio.EOF:
                    return
                resp = _resp_from(raw)
                ends = resp.txn_end
                if ends:
                    await self.queue.put(raw[:ends[-1]] + _tail(resp.watermark))
        finally:
            call.cancel()
            await channel.close()

    async def pull(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if not self.tasks:
            self.tasks = [asyncio.create_task(self._read(a)) for a in self.pumps]
        while True:
            yield await self.queue.get()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True)
    ap.add_argument("--cluster-id", type=int, required=True)
    ap.add_argument("--after", type=int, required=True)
    ap.add_argument("--pump", action="append", required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    relay = Relay(args.pump, args.cluster_id, args.after)
    server = grpcutil.aio_server()
    handler: Any = grpc.method_handlers_generic_handler("sluice.v1.Drainer", {
        "PullBinlogs": grpc.unary_stream_rpc_method_handler(relay.pull)})
    server.add_generic_rpc_handlers((handler,))
    grpcutil.add_port(server, args.listen)
    await server.start()
    log.info("relay serving at %s for %d pumps", args.listen, len(args.pump))
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
