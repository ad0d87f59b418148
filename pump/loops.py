"""A pump's background loops: fake binlogs, resolution of old prewrites, GC."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from sluice.core import errors, grpcutil, ts
from sluice.core.registry import NodeKind, NodeState
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

if TYPE_CHECKING:
    from .server import PumpServer

log = logging.getLogger(__name__)


async def fake_binlog_loop(server: "PumpServer") -> None:
    """A fake binlog every heartbeat-interval, and every pull-heartbeat-interval while a drainer
    pulls, with a fresh TSO ts: idle pumps then never hold a drainer's merge back."""
    cfg = server.config
    last = 0.0
    while True:
        interval = cfg.pull_heartbeat_interval if server.pullers else cfg.heartbeat_interval
        wait = last + interval - time.monotonic()
        if wait > 0:
            await asyncio.sleep(min(wait, 0.2))
            continue
        last = time.monotonic()
        if server.state == "starting":
            continue
        try:
            t = await server.tso.get_ts()
            payload = pb.Binlog(tp=pb.FAKE, start_ts=t, commit_ts=t).SerializeToString()
            await server.storage.write([payload])
        except errors.SluiceError as e:
            log.warning("fake binlog not written: %s", e)


async def resolve_loop(server: "PumpServer") -> None:
    """Ask producers about prewrites older than txn-timeout (DESIGN §3 unresolved prewrites)."""
    cfg = server.config
    period = max(0.1, cfg.txn_timeout / 4)
    warned: dict[int, float] = {}   # start_ts -> when we last logged it (one line a minute each)
    while True:
        await asyncio.sleep(period)
        waiting = server.storage.unresolved(older_than_s=cfg.txn_timeout)
        for txn in waiting:
            try:
                await _resolve_one(server, txn.start_ts, txn.producer_id)
                warned.pop(txn.start_ts, None)
            except errors.SluiceError as e:
                if time.monotonic() - warned.get(txn.start_ts, -1e9) > 60:
                    warned[txn.start_ts] = time.monotonic()
                    log.warning("cannot resolve start_ts=%d of producer %s yet: %s", txn.start_ts,
                                txn.producer_id, e)
            server.metrics.unresolved_checks.inc()
        live = {t.start_ts for t in waiting}
        for start_ts in [s for s in warned if s not in live]:
            del warned[start_ts]


async def _resolve_one(server: "PumpServer", start_ts: int, producer_id: str) -> None:
    info = await asyncio.to_thread(server.registry.get, NodeKind.PRODUCER, producer_id)
    if info is None or not info.status.addr:
        raise errors.Unavailable(f"producer {producer_id!r} is not registered; resolve by hand "
                                 f"with `sluice ctl resolve-txn --start-ts {start_ts}`")
    channel = grpcutil.aio_channel(info.status.addr, server.config.security)
    try:
        resp = await pbg.ProducerStub(channel).TxnStatus(
            pb.TxnStatusReq(cluster_id=server.config.cluster_id, start_ts=start_ts), timeout=5)
    except grpc.RpcError as e:
        raise grpcutil.to_sluice_error(e) from None
    finally:
        await channel.close()
    if resp.state == pb.TXN_COMMITTED:
        log.info("producer %s says start_ts=%d committed at %d", producer_id, start_ts, resp.commit_ts)
        await server.storage.resolve(start_ts, resp.commit_ts)
    elif resp.state == pb.TXN_ROLLED_BACK:
        log.info("producer %s says start_ts=%d rolled back", producer_id, start_ts)
        await server.storage.resolve(start_ts, None)
    else:
        raise errors.Unavailable(f"producer {producer_id} does not know yet (state "
                                 f"{pb.TxnState.Name(resp.state)})")


async def gc_loop(server: "PumpServer") -> None:
    """GC with the safe ts of DESIGN §3: never past a non-offline drainer's durable checkpoint."""
    cfg = server.config
    while True:
        await asyncio.sleep(cfg.gc_interval)
        try:
            safe = await asyncio.to_thread(safe_gc_ts, server)
            stats = await server.storage.gc(safe)
            log.info("gc up to ts %d: %s", safe, stats)
        except errors.SluiceError as e:
            log.warning("gc skipped: %s", e)


def safe_gc_ts(server: "PumpServer") -> int:
    cfg = server.config
    safe = ts.compose(int((time.time() - cfg.gc_retention) * 1000))
    if cfg.gc_force:
        log.warning("gc-force is set: drainer checkpoints are ignored and binlogs they still need "
                    "may be deleted")
        return safe
    drainers, _ = server.registry.list(NodeKind.DRAINER)
    for d in drainers:
        if d.status.state != NodeState.OFFLINE.value:
            safe = min(safe, d.status.checkpoint)
    return safe
