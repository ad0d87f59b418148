"""A pump's background loops: fake binlogs, resolution of old prewrites, GC."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from sluice.client.outbox import decide_by_writing
from sluice.core import errors, grpcutil, ts
from sluice.core.registry import NodeKind, NodeState
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from sluice.core.log import kv

if TYPE_CHECKING:
    from sluice.core.registry import Registry
    from sluice.core.tso_client import TSOClient

    from .config import PumpConfig
    from .metrics import PumpMetrics
    from .storage.sorter import UnresolvedTxn
    from .storage.storage import Storage

log = logging.getLogger(__name__)


# A timestamp a write's TSO check fetched at most this long ago is fresh enough for a fake
# binlog (pump writes under load fetch several a second; an idle pump fetches its own).
FAKE_REUSE_S = 0.25


async def fake_binlog_loop(cfg: "PumpConfig", tso: "TSOClient", storage: "Storage",
                           starting: Callable[[], bool], pulled: Callable[[], bool]) -> None:
    """A fake binlog with a fresh TSO ts whenever the served watermark would otherwise be older
    than heartbeat-interval, or pull-heartbeat-interval while a drainer pulls (`pulled()`): idle
    pumps then never hold a drainer's merge back, and busy ones, whose commits keep the
    watermark fresh, write none. No fake is written while `starting()`."""
    last = 0.0
    last_ts = 0
    while True:
        interval = cfg.pull_heartbeat_interval if pulled() else cfg.heartbeat_interval
        wait = last + interval - time.monotonic()
        if wait > 0:
            # Not past half the pulled interval: a drainer that starts pulling gets its first
            # fake soon, without five wakeups a second meanwhile.
            await asyncio.sleep(min(wait, cfg.pull_heartbeat_interval / 2))
            continue
        last = time.monotonic()
        if starting():
            continue
        age = storage.served_age_s(FAKE_REUSE_S)
        if age is not None and age < interval:
            # Commits moved the served watermark within the interval (under load, every group
            # does): a fake would add a write here and a binlog to every drainer for nothing.
            # TiDB-Binlog's pump, too, writes one only when nothing was written. Look again
            # when the watermark would be `interval` old.
            last -= age
            continue
        try:
            # Under load a write's TSO check fetched a timestamp a moment ago: issued to this
            # pump alone, it serves as the fake's ts without another TSO round trip.
            recent = storage.recent_tso_ts(FAKE_REUSE_S)
            t = recent if recent is not None and recent > last_ts else await tso.get_ts()
            last_ts = t
            payload = pb.Binlog(tp=pb.FAKE, start_ts=t, commit_ts=t).SerializeToString()
            await storage.write([payload])
        except errors.SluiceError as e:
            log.warning("fake binlog not written: %s", e)


async def resolve_loop(cfg: "PumpConfig", node_id: str, registry: "Registry",
                       storage: "Storage", metrics: "PumpMetrics") -> None:
    """Ask producers about prewrites older than txn-timeout (DESIGN §3 unresolved prewrites).

    One that cannot be resolved (producer gone, unknown, outbox unreachable) is never decided
    here: it becomes an alert — the `sluice_pump_stuck_prewrites` metric and an entry in this
    pump's registry status (`alerts`, shown by `sluice ctl pumps`, read by drainers) naming the
    start_ts, the producer, since when, why, and the `sluice ctl resolve-txn` to run — until it
    is resolved by its producer or by an operator (docs/operations.md, "Stuck prewrites")."""
    period = max(0.1, cfg.txn_timeout / 4)
    warned: dict[int, float] = {}   # start_ts -> when we last logged it (one line a minute each)
    published: list[dict[str, object]] | None = None
    since: dict[int, int] = {}      # start_ts -> wall ms its prewrite arrived (stable per txn)
    while True:
        await asyncio.sleep(period)
        waiting = storage.unresolved(older_than_s=cfg.txn_timeout)
        alerts: list[dict[str, object]] = []
        for txn in waiting:
            try:
                await _resolve_one(cfg, registry, storage, txn.start_ts, txn.producer_id)
                warned.pop(txn.start_ts, None)
            except errors.SluiceError as e:
                if txn.start_ts not in since:
                    since[txn.start_ts] = int(
                        (time.time() - (time.monotonic() - txn.since_monotonic)) * 1000)
                alerts.append(stuck_alert(node_id, txn, str(e), since[txn.start_ts]))
                if time.monotonic() - warned.get(txn.start_ts, -1e9) > 60:
                    warned[txn.start_ts] = time.monotonic()
                    log.warning("cannot resolve start_ts=%d of producer %r yet: %s; it holds "
                                "this pump's watermark and every drainer: see `sluice ctl pumps`",
                                txn.start_ts, txn.producer_id, e,
                                extra=kv(start_ts=txn.start_ts, producer=txn.producer_id))
            metrics.unresolved_checks.inc()
        live = {t.start_ts for t in waiting}
        for start_ts in [s for s in warned if s not in live]:
            del warned[start_ts]
        for start_ts in [s for s in since if s not in live]:
            del since[start_ts]
        alerts = [a for a in alerts
                  if storage.is_unresolved(int(a["start_ts"]))]  # type: ignore[arg-type]
        metrics.on_alerts(alerts)
        if alerts != published:
            try:
                await asyncio.to_thread(publish_alerts, registry, node_id, alerts)
                published = alerts
            except errors.SluiceError as e:
                log.warning("cannot publish %d stuck-prewrite alert(s) to the registry: %s",
                            len(alerts), e)


def resolve_command(start_ts: int) -> str:
    """What the operator runs once they know the transaction's fate in the source (it commits
    when the source committed it, with that commit_ts; otherwise it rolls back)."""
    return f"sluice ctl resolve-txn {start_ts} --commit-ts COMMIT_TS | --rollback"


def stuck_alert(pump_id: str, txn: "UnresolvedTxn", reason: str, since_ms: int
                ) -> dict[str, object]:
    return {"pump": pump_id, "start_ts": txn.start_ts, "producer": txn.producer_id,
            "since_ms": since_ms, "reason": reason, "command": resolve_command(txn.start_ts)}


def publish_alerts(registry: "Registry", node_id: str, alerts: list[dict[str, object]]
                   ) -> None:
    """Store the alerts in this pump's registry status (compare-and-swap; any state)."""
    registry.update(NodeKind.PUMP, node_id,
                    lambda old: dataclasses.replace(old, alerts=list(alerts)))


OUTBOX_LABEL = "outbox-dsn"
OUTBOX_TIMEOUT_S = 5.0


async def _resolve_one(cfg: "PumpConfig", registry: "Registry", storage: "Storage",
                       start_ts: int, producer_id: str) -> None:
    """Ask the producer's TxnStatus; when it is not alive or unreachable and it registered an
    outbox DSN, decide by writing to its outbox instead (DESIGN §5), so a pump never waits on
    an application that is down."""
    if not producer_id:
        raise errors.Unavailable("the prewrite names no producer (stored before pumps required "
                                 "one): nobody can be asked; an operator must decide")
    info = await asyncio.to_thread(registry.get, NodeKind.PRODUCER, producer_id)
    if info is None:
        raise errors.Unavailable(f"producer {producer_id!r} is not registered (any more): "
                                 "nobody can be asked; an operator must decide")
    dsn = info.status.labels.get(OUTBOX_LABEL, "")
    state: int | None = None
    commit_ts = 0
    how = ""
    if info.status.addr and (info.alive or not dsn):
        try:
            state, commit_ts = await _txn_status(cfg, info.status.addr, start_ts)
            how = "TxnStatus"
        except (errors.Unavailable, errors.DeadlineExceeded) as e:
            if not dsn:
                raise
            log.info("producer %s TxnStatus unreachable (%s): deciding start_ts=%d by its "
                     "outbox", producer_id, e, start_ts)
    if state is None:
        if not dsn:
            raise errors.Unavailable(f"producer {producer_id!r} has no TxnStatus address and no "
                                     f"{OUTBOX_LABEL} label: an operator must decide")
        state, commit_ts = await _decide_by_outbox(dsn, start_ts)
        how = "its outbox"
    if state == pb.TXN_COMMITTED:
        log.info("producer %s (%s): start_ts=%d committed at %d", producer_id, how, start_ts,
                 commit_ts)
        await storage.resolve(start_ts, commit_ts)
    elif state == pb.TXN_ROLLED_BACK:
        log.info("producer %s (%s): start_ts=%d rolled back", producer_id, how, start_ts)
        await storage.resolve(start_ts, None)
    else:
        raise errors.Unavailable(f"producer {producer_id} ({how}) does not know yet (state "
                                 f"{pb.TxnState.Name(state)})")


async def _txn_status(cfg: "PumpConfig", addr: str, start_ts: int) -> tuple[int, int]:
    channel = grpcutil.aio_channel(addr, cfg.security)
    try:
        resp = await pbg.ProducerStub(channel).TxnStatus(
            pb.TxnStatusReq(cluster_id=cfg.cluster_id, start_ts=start_ts), timeout=5)
    except grpc.RpcError as e:
        raise grpcutil.to_sluice_error(e) from None
    finally:
        await channel.close()
    return resp.state, resp.commit_ts


async def _decide_by_outbox(dsn: str, start_ts: int) -> tuple[int, int]:
    try:
        return await asyncio.to_thread(decide_by_writing, dsn, start_ts, OUTBOX_TIMEOUT_S)
    except errors.SluiceError:
        raise
    except Exception as e:  # noqa: BLE001 - a database error must not stop the resolver
        # The message may echo connection details: name the error type only, never the DSN.
        raise errors.Unavailable(f"outbox decision for start_ts={start_ts} failed: "
                                 f"{type(e).__name__}") from None


async def gc_loop(cfg: "PumpConfig", registry: "Registry", storage: "Storage") -> None:
    """GC with the safe ts of DESIGN §3: never past a non-offline drainer's durable checkpoint."""
    while True:
        await asyncio.sleep(cfg.gc_interval)
        try:
            safe = await asyncio.to_thread(safe_gc_ts, cfg, registry)
            stats = await storage.gc(safe)
            log.info("gc up to ts %d: %s", safe, stats)
        except errors.SluiceError as e:
            log.warning("gc skipped: %s", e)


def safe_gc_ts(cfg: "PumpConfig", registry: "Registry") -> int:
    safe = ts.compose(int((time.time() - cfg.gc_retention) * 1000))
    if cfg.gc_force:
        log.warning("gc-force is set: drainer checkpoints are ignored and binlogs they still need "
                    "may be deleted")
        return safe
    drainers, _ = registry.list(NodeKind.DRAINER)
    for d in drainers:
        if d.status.state != NodeState.OFFLINE.value:
            safe = min(safe, d.status.checkpoint)
    return safe
