"""PumpsClient: writes a producer's Prewrite and Commit/Rollback binlogs to the pumps (DESIGN §5).

Invariants this module keeps:
- **commit_ts is fetched only after every prewrite is durably acknowledged** (§2.2): a
  `write_prewrites` returns only when every pump holding the prewrite has acknowledged it, and
  its `PrewriteAck.watermark` is the highest served watermark among those acks; `check_commit_ts`
  refuses a commit_ts at or below it, and `write_commits` checks again before sending anything.
  A FAILED_PRECONDITION from a pump on a commit is raised at once: no retry, no failover.
- **One transaction, one commit_ts** (§2.5): a failed-over prewrite keeps its start_ts; the
  Commit/Rollback goes, unchanged, to every pump that acknowledged the prewrite, and is re-sent
  later to pumps that failed while the prewrite was in flight (they may hold a copy nobody
  acknowledged); a pump holds at most one decision per start_ts and refuses a different one.
- **Only online, alive, available pumps get new prewrites.** Pumps come from the registry (list
  at revision R, watch from R+1; the watcher re-lists after a compaction or an etcd restart).
  A pump becomes unavailable after `max_failures` consecutive failed writes and is probed with
  an empty WriteBinlogs (first after at most a second, then every `probe_interval_s`) until one
  succeeds. Commits and rollbacks still go to a pausing/closing pump that holds the prewrite.

Concurrent callers are coalesced per pump by one `WriteBatcher` (one channel each); a caller's
list of binlogs is never split across pumps or batches, except that a prewrite bigger than
`max_binlog_size` is written as parts (same start_ts) in several calls, in order, to the same
pump(s).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from sluice.core import errors, grpcutil
from sluice.core.errors import NoPumpAvailable
from sluice.core.etcd import Etcd
from sluice.core.log import kv
from sluice.core.registry import NodeInfo, NodeKind, NodeState, Registry, Watcher
from sluice.core.tls import SecurityConfig
from sluice.core.registry import CONFIG_PATH
from sluice.proto import sluice_pb2 as pb

from .acks import (CommitNotAcknowledged, PrewriteAck, check_commit_ts, group_calls,
                   split_prewrite)
from .batcher import WriteBatcher
from .binlogs import Encoded, encode
from .pump_state import (ChannelRef, ClientMetrics, Failover, PumpState, close_ref,
                         gather_results, replicas_of)
from .routing import Candidate, make_selector

__all__ = ["PrewriteAck", "NoPumpAvailable", "CommitNotAcknowledged", "PumpsClient",
           "check_commit_ts", "split_prewrite"]

log = logging.getLogger(__name__)

FIRST_PROBE_S = 1.0                   # a pump just marked unavailable is probed this soon
PROBE_TIMEOUT_S = 2.0
REDELIVERY_MAX = 100_000              # commit/rollback requests kept for re-sending, all pumps
ORPHANS_MAX = 100_000                 # start_ts whose prewrite may sit on a failed pump
# Errors that say "this request is wrong", not "this pump is down": never retried elsewhere.
_FINAL = (errors.InvalidArgument, errors.AlreadyExists, errors.FailedPrecondition,
          errors.NotFound, errors.OutOfRange)
# Pump states in which it still takes commits and rollbacks for prewrites it holds.
_DECIDING = (NodeState.ONLINE, NodeState.PAUSING, NodeState.CLOSING)
_ONLINE = NodeState.ONLINE
_PREWRITE, _COMMIT, _ROLLBACK = pb.PREWRITE, pb.COMMIT, pb.ROLLBACK


class PumpsClient:
    """Routes binlogs to the cluster's pumps. Create, `await start()`, use, `await close()`."""

    def __init__(self, etcd_endpoints: str, cluster_id: int, *, selector: str = "range",
                 security: SecurityConfig | None = None, max_failures: int = 3,
                 retry_backoff_s: float = 0.1, probe_interval_s: float = 30.0,
                 max_binlog_size: int = 64 << 20, write_timeout_s: float = 10.0,
                 linger_s: float = 0.0) -> None:
        if max_failures < 1:
            raise errors.ConfigError(f"max_failures must be >= 1, got {max_failures}")
        if not 0 <= linger_s <= 0.001:
            raise errors.ConfigError(f"linger_s must be within 0..0.001 s, got {linger_s}")
        self.etcd_endpoints = etcd_endpoints
        self.cluster_id = cluster_id
        self.selector = make_selector(selector)
        self.security = security
        self.max_failures = max_failures
        self.retry_backoff_s = retry_backoff_s
        self.probe_interval_s = probe_interval_s
        self.max_binlog_size = max_binlog_size
        self.write_timeout_s = write_timeout_s
        self.linger_s = linger_s
        self.replicas = 1
        self.metrics = ClientMetrics()
        self._pumps: dict[str, PumpState] = {}
        self._candidates: list[Candidate] | None = None
        self._orphans: OrderedDict[int, frozenset[str]] = OrderedDict()
        self._redelivery_count = 0
        # Acknowledged writes, counted as plain ints on the hot path and added to the
        # Prometheus counters by the maintenance loop (`_flush_metrics`).
        self._n_prewrites = self._n_commits = self._n_binlogs = 0
        self._flushed = (0, 0, 0)
        self._etcd: Etcd | None = None
        self._registry: Registry | None = None
        self._watcher: Watcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the cluster's replicas setting, list the pumps at R and watch them from R+1."""
        self._loop = asyncio.get_running_loop()
        self._etcd = Etcd(self.etcd_endpoints, self.security)
        self._registry = Registry(self._etcd, self.cluster_id)
        config = await asyncio.to_thread(self._registry.get_json, CONFIG_PATH)
        self.replicas = replicas_of(config, self._registry.cluster_key(CONFIG_PATH))
        nodes, revision = await asyncio.to_thread(self._registry.list, NodeKind.PUMP)
        for info in nodes:
            self._apply(info.node_id, info)
        self._watcher = await asyncio.to_thread(
            self._registry.watch, NodeKind.PUMP, self._on_change, (nodes, revision))
        self._spawn(self._maintain(), "pumps-client-maintenance")
        log.info("pumps client started: %d pump(s), %d available, replicas=%d, selector=%s",
                 len(self._pumps), len(self.available_pumps()), self.replicas, self.selector.name)

    async def close(self) -> None:
        self._closed = True
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in self._pumps.values():
            await self._close_pump_channel(p)
        self._flush_metrics()
        if self._redelivery_count:
            log.warning("pumps client closed with %d commit/rollback request(s) not re-sent; the "
                        "pumps resolve those prewrites with TxnStatus", self._redelivery_count)
        if self._etcd is not None:
            await asyncio.to_thread(self._etcd.close)

    @property
    def pending_decisions(self) -> int:
        """Commits/rollbacks waiting to be re-sent to a pump that was unreachable."""
        return self._redelivery_count

    def available_pumps(self) -> list[str]:
        """Pumps that take new prewrites now (online, alive, available), sorted by id."""
        return [c.node_id for c in self._candidate_list()]

    # -- prewrites ---------------------------------------------------------------------------
    async def write_prewrite(self, binlog: pb.Binlog) -> PrewriteAck:
        return await self.write_prewrites([binlog])

    async def write_prewrites(self, binlogs: Sequence[pb.Binlog | Encoded]) -> PrewriteAck:
        """Durably write these prewrites to one pump (`replicas` pumps), atomically when they fit
        in one call; returns after every holder acknowledged. Routed by binlogs[0].start_ts.
        Binlogs come as messages or as wire bytes (client/binlogs.py)."""
        if not binlogs:
            raise errors.InvalidArgument("write_prewrites needs at least one binlog")
        binlogs = [encode(b) for b in binlogs]
        for b in binlogs:
            if b.tp != _PREWRITE or b.start_ts <= 0:
                raise errors.InvalidArgument(
                    f"write_prewrites takes PREWRITE binlogs with start_ts > 0, got "
                    f"{pb.BinlogType.Name(b.tp)} start_ts={b.start_ts}")
        start_ts = binlogs[0].start_ts
        limit = self.max_binlog_size
        payloads = [b.raw for b in binlogs]
        if len(payloads) == 1 and len(payloads[0]) <= limit:
            calls = [payloads]   # the common case: one call
        else:
            if any(len(raw) > limit for raw in payloads):
                payloads = [part for raw in payloads for part in
                            (split_prewrite(pb.Binlog.FromString(raw), limit)
                             if len(raw) > limit else [raw])]
            calls = group_calls(payloads, limit)
        held: dict[str, int] = {}
        failed_here: dict[str, str] = {}
        if self.replicas == 1 and len(calls) == 1:
            # The common case, without the failover bookkeeping's allocations.
            first = self.selector.first(start_ts, self._candidate_list())
            if first is not None:
                p = self._pumps[first]
                try:
                    wm = await self._write(p, calls[0], prewrite=True)
                except Failover as e:
                    failed_here[p.node_id] = str(e)
                except BaseException:
                    self._remember_orphans(binlogs, {p.node_id})
                    raise
                else:
                    self._n_prewrites += 1
                    return PrewriteAck(start_ts, (p.node_id,), wm)
        tried = set(failed_here)
        while len(held) < self.replicas:
            targets = self._pick(start_ts, self.replicas - len(held),
                                 exclude=set(held) | set(failed_here), failed_here=failed_here)
            if tried:
                self.metrics.failovers.inc(len(targets))
                log.info("prewrite start_ts=%d fails over to %s", start_ts,
                         ", ".join(p.node_id for p in targets),
                         extra=kv(start_ts=start_ts, failed=",".join(failed_here)))
            tried.update(p.node_id for p in targets)
            results = await gather_results(self._write_calls(p, calls) for p in targets)
            final: BaseException | None = None
            for p, r in zip(targets, results):
                if isinstance(r, Failover):
                    failed_here[p.node_id] = str(r)
                elif isinstance(r, BaseException):
                    final = final or r
                else:
                    held[p.node_id] = r
            if final is not None:
                self._remember_orphans(binlogs, tried)
                raise final
        self._remember_orphans(binlogs, tried - set(held))
        self._n_prewrites += 1
        return PrewriteAck(start_ts, tuple(held), max(held.values()))

    async def _write_calls(self, p: PumpState, calls: list[list[bytes]]) -> int:
        wm = 0
        for payloads in calls:
            wm = max(wm, await self._write(p, payloads, prewrite=True))
        return wm

    def _pick(self, start_ts: int, count: int, exclude: set[str],
              failed_here: dict[str, str]) -> list[PumpState]:
        candidates = self._candidate_list()
        if exclude:
            candidates = [c for c in candidates if c.node_id not in exclude]
        ranked = self.selector.rank(start_ts, candidates)
        if len(ranked) >= count:
            return [self._pumps[i] for i in ranked[:count]]
        raise NoPumpAvailable(self._no_pump_message(start_ts, count, exclude, failed_here))

    def _no_pump_message(self, start_ts: int, count: int, exclude: set[str],
                         failed_here: dict[str, str]) -> str:
        head = (f"no pump can take the prewrite of start_ts={start_ts} (replicas={self.replicas}, "
                f"{count} more pump(s) needed)")
        if not self._pumps:
            return f"{head}: no pumps registered in cluster {self.cluster_id} (etcd {self.etcd_endpoints})"
        reasons = []
        for node_id in sorted(self._pumps):
            p = self._pumps[node_id]
            if node_id in failed_here:
                why = f"failed for this transaction ({failed_here[node_id]})"
            elif node_id in exclude:
                why = "already holds it"
            else:
                why = p.why_not()
            reasons.append(f"{node_id} ({p.addr}): {why}")
        return f"{head}: " + "; ".join(reasons)

    def _remember_orphans(self, binlogs: Iterable[Encoded], pumps: set[str]) -> None:
        if not pumps:
            return
        frozen = frozenset(pumps)
        for b in binlogs:
            self._orphans[b.start_ts] = self._orphans.get(b.start_ts, frozenset()) | frozen
        while len(self._orphans) > ORPHANS_MAX:
            start_ts, where = self._orphans.popitem(last=False)
            log.warning("forgetting that start_ts=%d may sit on %s unacknowledged; that pump "
                        "resolves it with TxnStatus", start_ts, ",".join(sorted(where)))

    # -- commits and rollbacks -------------------------------------------------------------
    async def write_commits(self, binlogs: Sequence[pb.Binlog | Encoded], ack: PrewriteAck) -> None:
        """Write these COMMIT/ROLLBACK binlogs to every pump in ack.pumps (atomically per pump),
        retrying; a pump that stays unreachable gets them later (CommitNotAcknowledged when none
        acknowledged them). FAILED_PRECONDITION and other request errors raise at once."""
        if not binlogs:
            raise errors.InvalidArgument("write_commits needs at least one binlog")
        binlogs = [encode(b) for b in binlogs]
        for b in binlogs:
            tp = b.tp
            if (tp != _COMMIT and tp != _ROLLBACK) or b.start_ts <= 0:
                raise errors.InvalidArgument(
                    f"write_commits takes COMMIT/ROLLBACK binlogs with start_ts > 0, got "
                    f"{pb.BinlogType.Name(b.tp)} start_ts={b.start_ts}")
            if tp == _COMMIT and b.commit_ts <= ack.watermark:
                check_commit_ts(b.commit_ts, ack)   # raises
        payloads = [b.raw for b in binlogs]
        if self._orphans:
            orphans: set[str] = set()
            for b in binlogs:
                orphans |= self._orphans.pop(b.start_ts, frozenset())
            for node_id in sorted(orphans - set(ack.pumps)):
                self._queue_redelivery(node_id, ack.start_ts, payloads)
        results: list[int | BaseException]
        if len(ack.pumps) == 1:
            # The common case awaited directly: a coroutine layer per write is measurable CPU.
            try:
                results = [await self._commit_to(ack.pumps[0], payloads)]
            except Failover as e:
                results = [e]
        else:
            results = await gather_results(self._commit_to(node_id, payloads) for node_id in ack.pumps)
        pending = []
        for node_id, r in zip(ack.pumps, results):
            if isinstance(r, Failover):
                pending.append((node_id, str(r)))
                self._queue_redelivery(node_id, ack.start_ts, payloads)
            elif isinstance(r, BaseException):
                raise r
        if pending and len(pending) == len(ack.pumps):
            raise CommitNotAcknowledged(
                f"commit/rollback of start_ts={ack.start_ts} not acknowledged: "
                + "; ".join(f"{n}: {why}" for n, why in pending)
                + ". The client re-sends it when the pump is back, and the pump resolves the "
                "prewrite with the producer's TxnStatus after its txn-timeout")
        if pending:
            log.warning("commit of start_ts=%d acknowledged by %d of %d pumps; re-sent later to %s",
                        ack.start_ts, len(ack.pumps) - len(pending), len(ack.pumps),
                        ", ".join(n for n, _ in pending))
        self._n_commits += 1

    async def _commit_to(self, node_id: str, payloads: list[bytes]) -> int:
        p = self._pumps.get(node_id)
        if p is None:
            raise Failover(f"pump {node_id} is no longer registered")
        if p.state not in _DECIDING:
            raise Failover(f"pump {node_id} is {p.state.value}")
        return await self._write(p, payloads, prewrite=False)

    def _queue_redelivery(self, node_id: str, start_ts: int, payloads: list[bytes]) -> None:
        p = self._pumps.get(node_id)
        if p is None:
            return
        if start_ts in p.redeliver:
            return  # one decision per start_ts: the first is the one the pump may already hold
        p.redeliver[start_ts] = payloads
        self._redelivery_count += 1
        while self._redelivery_count > REDELIVERY_MAX:
            victim = max(self._pumps.values(), key=lambda q: len(q.redeliver))
            dropped, _ = victim.redeliver.popitem(last=False)
            self._redelivery_count -= 1
            log.warning("redelivery queue full: dropped the decision of start_ts=%d for %s; that "
                        "pump resolves it with TxnStatus", dropped, victim.node_id)
        self.metrics.redelivery.set(self._redelivery_count)
        self._wake.set()

    # -- one write to one pump, with retries -------------------------------------------------
    async def _write(self, p: PumpState, payloads: list[bytes], prewrite: bool) -> int:
        attempts = 0
        while True:
            if prewrite and not (p.state is _ONLINE and p.alive and p.available
                                 and p.batcher is not None):   # PumpState.takes_prewrites, inlined
                raise Failover(p.why_not())
            batcher = p.batcher
            if batcher is None:
                raise Failover(f"pump {p.node_id} has no connection")
            try:
                wm = await batcher.write_many(payloads)
            except _FINAL:
                raise
            except errors.SluiceError as e:
                attempts += 1
                self._on_failure(p, e)
                if attempts >= self.max_failures or not p.available:
                    raise Failover(f"{type(e).__name__}: {e}") from None
                await asyncio.sleep(self.retry_backoff_s * (2 ** (attempts - 1)))
                continue
            if p.failures or not p.available:
                self._on_success(p)
            self._n_binlogs += len(payloads)
            return wm

    def _on_failure(self, p: PumpState, e: errors.SluiceError) -> None:
        p.failures += 1
        p.last_error = f"{type(e).__name__}: {e}"
        self.metrics.failures.labels(p.node_id).inc()
        if p.available and p.failures >= self.max_failures:
            p.available = False
            p.next_probe = time.monotonic() + min(FIRST_PROBE_S, self.probe_interval_s)
            self._changed()
            log.warning("pump %s unavailable after %d consecutive failed writes: %s", p.node_id,
                        p.failures, p.last_error,
                        extra=kv(pump=p.node_id, addr=p.addr, failures=p.failures))
            self._wake.set()

    def _on_success(self, p: PumpState) -> None:
        p.failures = 0
        if not p.available:
            self._mark_available(p, "a write succeeded")

    def _mark_available(self, p: PumpState, why: str) -> None:
        p.available = True
        p.failures = 0
        self._changed()
        log.info("pump %s available again: %s", p.node_id, why, extra=kv(pump=p.node_id, addr=p.addr))
        self._wake.set()

    # -- probes and redelivery ---------------------------------------------------------------
    def _flush_metrics(self) -> None:
        now = (self._n_prewrites, self._n_commits, self._n_binlogs)
        pre, com, binl = (a - b for a, b in zip(now, self._flushed))
        if pre:
            self.metrics.prewrites.inc(pre)
        if com:
            self.metrics.commits.inc(com)
        if binl:
            self.metrics.binlogs.inc(binl)
        self._flushed = now

    async def _maintain(self) -> None:
        tick = min(1.0, self.probe_interval_s)
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=tick)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            self._flush_metrics()
            now = time.monotonic()
            jobs = []
            for p in list(self._pumps.values()):
                if p.batcher is None or p.state not in _DECIDING:
                    continue
                if not p.available and now >= p.next_probe:
                    jobs.append(self._probe(p))
                elif p.available and p.redeliver:
                    jobs.append(self._redeliver(p))
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)

    async def _probe(self, p: PumpState) -> None:
        assert p.batcher is not None
        p.next_probe = time.monotonic() + self.probe_interval_s
        try:
            await p.batcher.probe(min(PROBE_TIMEOUT_S, self.write_timeout_s))
        except errors.SluiceError as e:
            p.last_error = f"probe: {type(e).__name__}: {e}"
            log.debug("probe of pump %s failed: %s", p.node_id, e)
            return
        if not p.available:
            self._mark_available(p, "probe succeeded")
        if p.redeliver:
            await self._redeliver(p)

    async def _redeliver(self, p: PumpState) -> None:
        while p.redeliver and p.available and p.batcher is not None:
            start_ts, payloads = next(iter(p.redeliver.items()))
            try:
                await p.batcher.write_many(payloads)
                self._on_success(p)
                outcome = "delivered"
            except (errors.FailedPrecondition, errors.AlreadyExists) as e:
                # Usually "without its prewrite": the failed attempt never reached this pump.
                outcome = f"not needed ({type(e).__name__}: {e})"
            except errors.SluiceError as e:
                self._on_failure(p, e)
                return
            if p.redeliver.pop(start_ts, None) is not None:
                self._redelivery_count -= 1
            self.metrics.redelivery.set(self._redelivery_count)
            log.debug("re-sent decision of start_ts=%d to %s: %s", start_ts, p.node_id, outcome)

    # -- registry --------------------------------------------------------------------------
    def _on_change(self, kind: NodeKind, node_id: str, info: NodeInfo | None) -> None:
        # Watcher thread: hand the change to the event loop, in order.
        loop = self._loop
        if loop is None or self._closed:
            return
        try:
            loop.call_soon_threadsafe(self._apply, node_id, info)
        except RuntimeError:
            pass  # loop closed under us: we are shutting down

    def _apply(self, node_id: str, info: NodeInfo | None) -> None:
        if self._closed:
            return
        p = self._pumps.get(node_id)
        if info is None:
            if p is not None:
                del self._pumps[node_id]
                self._redelivery_count -= len(p.redeliver)
                p.redeliver.clear()
                self._spawn(self._close_pump_channel(p), f"close {node_id}")
                log.info("pump %s removed from the registry", node_id)
                self._changed()
            return
        st = info.status
        if p is None:
            p = self._pumps[node_id] = PumpState(info)
            self._connect(p)
            log.info("pump %s at %s: %s%s", node_id, p.addr, p.state.value,
                     "" if p.alive else " (not alive)", extra=kv(pump=node_id))
            self._changed()
            return
        old_state, old_alive = p.state, p.alive
        p.state, p.alive, p.score, p.labels = NodeState(st.state), info.alive, st.score, dict(st.labels)
        if st.addr != p.addr:
            old = ChannelRef(p.channel, p.batcher)
            p.addr = st.addr
            self._connect(p)
            self._spawn(close_ref(old), f"close old channel {node_id}")
        if (old_state, old_alive) != (p.state, p.alive):
            log.info("pump %s: %s%s -> %s%s", node_id, old_state.value,
                     "" if old_alive else " (not alive)", p.state.value,
                     "" if p.alive else " (not alive)", extra=kv(pump=node_id))
            if p.alive and not old_alive and not p.available:
                p.next_probe = 0.0   # it came back: probe now rather than at the next interval
                self._wake.set()
            if p.state == NodeState.OFFLINE and p.redeliver:
                log.warning("pump %s is offline%s with %d undelivered commit/rollback request(s)",
                            node_id, " (lost)" if p.labels.get("lost") == "true" else "",
                            len(p.redeliver))
                self._redelivery_count -= len(p.redeliver)
                p.redeliver.clear()
                self.metrics.redelivery.set(self._redelivery_count)
        self._changed()

    def _connect(self, p: PumpState) -> None:
        p.channel = grpcutil.aio_channel(p.addr, self.security)
        p.batcher = WriteBatcher(p.channel, self.cluster_id, max_batch=512, max_inflight=2,
                                 linger_s=self.linger_s, timeout_s=self.write_timeout_s)

    async def _close_pump_channel(self, p: PumpState) -> None:
        await close_ref(ChannelRef(p.channel, p.batcher))
        p.channel, p.batcher = None, None

    def _changed(self) -> None:
        self._candidates = None
        self.metrics.available.set(len(self._candidate_list()))

    def _candidate_list(self) -> list[Candidate]:
        if self._candidates is None:
            self._candidates = [Candidate(p.node_id, p.score)
                                for _, p in sorted(self._pumps.items()) if p.takes_prewrites]
        return self._candidates

    def _spawn(self, coro, name: str) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
