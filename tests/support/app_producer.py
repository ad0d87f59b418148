"""A small application process for fault tests: an AppProducer that inserts rows, one per
transaction, and reports every step as a JSON line on stdout (flushed), so a test can kill -9,
SIGSTOP or SIGCONT it at a known point (failpoints from SLUICE_FAILPOINTS pick the point).

    python -m tests.support.app_producer --etcd HOST:PORT --cluster-id 7 --producer-id app-1 \
        --dsn mysql://root:pw@127.0.0.1:3306/db?table=sluice_outbox --table db.t --rows 3

Events: {"event": "started", "addr", "epoch"}, {"event": "begin", "start_ts", "id"},
{"event": "committed", "start_ts", "commit_ts", "id"}, {"event": "error", "start_ts", "id",
"type", "message"}, {"event": "done"}. Then it stays up (serving TxnStatus) until SIGTERM.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from sluice.client.app import AppProducer


def emit(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def main(args: argparse.Namespace) -> None:
    producer = AppProducer(args.etcd, args.cluster_id, args.producer_id, args.dsn,
                           alive_ttl_s=args.alive_ttl, prune_interval_s=0,
                           resolve_timeout_s=args.resolve_timeout)
    await producer.start()
    assert producer.server is not None
    emit(event="started", addr=producer.server.addr, epoch=producer.epoch)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        for i in range(args.first_id, args.first_id + args.rows):
            txn = producer.transaction()
            try:
                async with txn:
                    emit(event="begin", start_ts=txn.start_ts, id=i)
                    await txn.insert(args.table, {"id": i, "v": f"row-{i}"})
            except Exception as e:  # noqa: BLE001 - reported to the test, which decides
                emit(event="error", start_ts=txn.start_ts, id=i, type=type(e).__name__,
                     message=str(e))
                continue
            emit(event="committed", start_ts=txn.start_ts, commit_ts=txn.commit_ts, id=i)
        emit(event="done")
        await stop.wait()
    finally:
        await producer.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--etcd", required=True)
    p.add_argument("--cluster-id", type=int, required=True)
    p.add_argument("--producer-id", required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--first-id", type=int, default=1)
    p.add_argument("--alive-ttl", type=int, default=2)
    p.add_argument("--resolve-timeout", type=float, default=10.0)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main(p.parse_args()))
