"""TSO leadership through an etcd lease, fenced by a persisted window.

Invariant: a leader serves only while its lease is certainly alive on a monotonic clock (checked
right before each reply), and a new leader starts strictly above the window every earlier leader
persisted, persisting its own in the transaction that creates its leader key. Why that holds
even for a stalled old leader: docs/tso.md ("How fencing works").

One dedicated thread owns all etcd traffic of the election; the event loop only reads the term.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from sluice.core import failpoint
from sluice.core.errors import EtcdUnavailable, NotLeader, SluiceError, Unavailable
from sluice.core.etcd import Etcd
from sluice.core.keywatch import KeyWatch
from sluice.core.log import kv
from sluice.core.registry import tso_leader_key, tso_window_key
from sluice.core.tso_client import LeaderInfo

from .allocator import Allocator

log = logging.getLogger(__name__)


@dataclass
class Term:
    """One tenure as leader. Only `alive_until` changes (keepalive acks push it forward)."""

    id: int
    lease: int
    epoch: int
    ttl: int                 # granted TTL in seconds (etcd may raise the requested one)
    leader_value: bytes      # our leader key's value, compared on every window extension
    leader_rev: int          # our leader key's mod_revision
    alive_until: float       # monotonic seconds


def window_value(physical_ms: int, epoch: int, name: str) -> str:
    return json.dumps({"physical_ms": physical_ms, "epoch": epoch, "leader": name},
                      separators=(",", ":"))


def parse_window(raw: bytes | None) -> tuple[int, int]:
    """(physical_ms, epoch) of a stored window; (0, 0) when absent."""
    if not raw:
        return 0, 0
    d = json.loads(raw)
    return int(d["physical_ms"]), int(d.get("epoch", 0))


# The longest the leader's election thread sleeps between its duties.
LEADER_MAX_SLEEP_S = 0.5


class Leadership:
    """Campaigns for, holds and gives up the TSO leadership of one cluster."""

    def __init__(self, etcd: Etcd, cluster_id: int, name: str, advertise_addr: str,
                 allocator: Allocator, *, lease_ttl: int = 3, window_ms: int = 3000,
                 margin_ms: int = 500, on_change: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.etcd = etcd
        self.cluster_id = cluster_id
        self.name = name
        self.addr = advertise_addr
        self.allocator = allocator
        self.lease_ttl = lease_ttl
        self.window_ms = window_ms
        self.margin_s = margin_ms / 1000.0
        self.on_change = on_change
        self.clock = clock
        self.leader_key = tso_leader_key(cluster_id)
        self.window_key = tso_window_key(cluster_id)
        self.term: Term | None = None
        self.known_leader: LeaderInfo | None = None
        self.etcd_error: str | None = None     # last etcd failure, cleared by any success
        self._term_seq = 0
        self._stale_leases: list[int] = []     # leases of resigned terms, revoked when possible
        self._etcd_lock = threading.Lock()     # one window transaction at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tso-leadership", daemon=True)
        # Read at least every lease TTL even if the watch died silently: a failover then takes
        # at most one TTL longer.
        self._leader_watch = KeyWatch(etcd, self.leader_key, fallback=float(lease_ttl),
                                      clock=clock)

    # -- called from the event loop ----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def serving_deadline(self, term_id: int) -> float:
        """Until when (monotonic) the lease that covers an allocation made now is certainly alive."""
        term = self.term
        return term.alive_until if term is not None and term.id == term_id else 0.0

    def check_serving(self, term_id: int, deadline: float) -> None:
        """Raise unless `term_id` is still the current term and its lease is certainly alive now.

        `deadline` is `serving_deadline` taken at allocation: a reply held up past the lease
        that covered its allocation (a stall, a GC pause) is refused rather than sent late.
        """
        term = self.term
        now = self.clock()
        if term is None or term.id != term_id:
            raise self.not_serving_error()
        if now >= term.alive_until:
            raise self.not_serving_error(term)
        if now >= deadline:
            raise Unavailable(f"lease not certainly alive at reply time: reply held "
                              f"{now - deadline:.1f}s past the lease that covered its "
                              "allocation; retry")

    def not_serving_error(self, term: Term | None = None) -> SluiceError:
        if self.etcd_error is not None:
            return EtcdUnavailable(f"not leader: etcd at {self.etcd.endpoints_text} unavailable, "
                                   f"cannot confirm TSO leadership ({self.etcd_error})")
        if term is not None:
            return NotLeader(f"lease of {self.name} not certainly alive "
                             f"({self.clock() - (term.alive_until - term.ttl + self.margin_s):.1f}s "
                             "since the last acknowledged keepalive)")
        leader = self.known_leader
        if leader is not None and leader.name != self.name:
            return NotLeader(f"leader is {leader.addr} ({leader.name})")
        return NotLeader("no TSO leader elected yet")

    def ensure_window(self, term_id: int, needed_physical: int) -> None:
        """Blocking: persist a window reaching `needed_physical` (run via asyncio.to_thread)."""
        term = self.term
        if term is None or term.id != term_id:
            raise self.not_serving_error()
        self._extend(term, needed_physical)

    def stop(self) -> None:
        """Stop campaigning and give up leadership (revoke the lease: a standby takes over now)."""
        self._stop.set()
        self._thread.join(timeout=self.etcd.timeout + 2)
        term = self.term
        if term is not None:
            self._resign("shutting down")
        self._revoke_stale()

    # -- the election thread --------------------------------------------------------------
    def _loop(self) -> None:
        poll = min(0.25, self.lease_ttl / 4)
        keepalive_every = self.lease_ttl / 3
        last_keepalive = 0.0
        while not self._stop.is_set():
            try:
                term = self.term
                if term is None:
                    # A standby campaigns when the leader key changed (it is deleted when the
                    # leader's lease ends), not on every poll: one Range per change instead of
                    # four a second.
                    if not self._leader_watch.wait(poll):
                        continue
                    self._revoke_stale()
                    self._campaign()
                    last_keepalive = self.clock()
                    continue
                if self.clock() >= term.alive_until:
                    self._resign("lease not certainly alive")
                    continue
                if self.clock() - last_keepalive >= keepalive_every:
                    last_keepalive = self.clock()
                    self._keepalive(term)
                    if self.term is not term:
                        continue
                self._maybe_extend(term)
                self._stop.wait(self._leader_sleep(term, last_keepalive + keepalive_every))
                continue
            except EtcdUnavailable as e:
                self._leader_watch.again()
                self._etcd_failed(e)
            except Exception:  # noqa: BLE001 - the election thread must survive anything
                self._leader_watch.again()
                log.exception("TSO election loop failed; retrying")
            self._stop.wait(min(poll, 0.1))
        self._leader_watch.cancel()

    def _leader_sleep(self, term: Term, keepalive_due: float) -> float:
        """Until the leader's next duty: a keepalive, the lease's safe end, or the window
        extension (due when the window reaches less than window-ms/2 past the clock); at most
        LEADER_MAX_SLEEP_S, since allocations may run ahead of the clock (the serving path then
        extends the window itself) — a few wakeups a second instead of ten at idle."""
        now = self.clock()
        # _maybe_extend extends once the window is below what the clock's ms needs
        needed = self._extension_needed(int(time.time() * 1000))
        extend_in = (self.allocator.window + 1 - needed) / 1000
        # + 1 ms: a timed wait may end a hair early, and the duty would then wait another turn
        due = min(keepalive_due - now, term.alive_until - now, extend_in) + 0.001
        return min(LEADER_MAX_SLEEP_S, max(0.005, due))

    def _etcd_ok(self) -> None:
        if self.etcd_error is not None:
            log.info("etcd reachable again", extra=kv(endpoints=self.etcd.endpoints_text))
        self.etcd_error = None

    def _etcd_failed(self, e: Exception) -> None:
        if self.etcd_error is None:
            log.warning("etcd unavailable", extra=kv(error=str(e)))
        self.etcd_error = str(e)

    def _campaign(self) -> None:
        raw, _ = self.etcd.get(self.leader_key)
        self._etcd_ok()
        if raw is not None:
            info = LeaderInfo.from_json(raw)
            if info != self.known_leader:
                log.info("TSO leader observed", extra=kv(leader=info.name, addr=info.addr,
                                                         epoch=info.epoch))
            self.known_leader = info
            return
        wraw, wmeta = self.etcd.get(self.window_key)
        old_window, old_epoch = parse_window(wraw)
        sent = self.clock()
        with self.etcd.errors(f"lease grant ttl={self.lease_ttl}"):
            lease = self.etcd.client.lease(self.lease_ttl)
        ttl = int(lease.ttl)
        epoch = old_epoch + 1
        start = max(int(time.time() * 1000), old_window + 1)
        window = start + self.window_ms
        info = LeaderInfo(name=self.name, addr=self.addr, lease=lease.id, epoch=epoch)
        value = info.to_json()
        tx = self.etcd.tx
        window_unchanged = (tx.mod(self.window_key) == wmeta.mod_revision if wmeta is not None
                            else tx.version(self.window_key) == 0)
        try:
            ok, resp = self.etcd.txn(
                [tx.version(self.leader_key) == 0, window_unchanged],
                [tx.put(self.leader_key, value, lease.id),
                 tx.put(self.window_key, window_value(window, epoch, self.name)),
                 tx.get(self.leader_key)])
        except EtcdUnavailable:
            # The outcome is unknown: revoking the lease removes our key if it was written.
            self._stale_leases.append(lease.id)
            raise
        if not ok:
            self._stale_leases.append(lease.id)
            return
        rev = resp[2][0][1].mod_revision
        self._term_seq += 1
        term = Term(id=self._term_seq, lease=lease.id, epoch=epoch, ttl=ttl,
                    leader_value=value.encode(), leader_rev=rev,
                    alive_until=sent + ttl - self.margin_s)
        self.allocator.begin_term(term.id, start, window)
        self.term = term
        self.known_leader = info
        log.info("became TSO leader", extra=kv(name=self.name, addr=self.addr, epoch=epoch,
                                               lease=lease.id, ttl=ttl, start_physical=start,
                                               previous_window=old_window, window=window))
        if self.on_change:
            self.on_change(True)

    def _keepalive(self, term: Term) -> None:
        failpoint.inject("tso-before-keepalive")
        sent = self.clock()
        remaining = self.etcd.keepalive(term.lease)
        self._etcd_ok()
        if remaining <= 0:
            self._resign("lease expired in etcd")
            return
        # Only an acknowledged keepalive extends the lease, from the moment it was sent.
        term.alive_until = max(term.alive_until, sent + remaining - self.margin_s)

    def _maybe_extend(self, term: Term) -> None:
        now_ms = int(time.time() * 1000)
        high = self.allocator.high_physical(now_ms)
        self._extend(term, self._extension_needed(high))

    def _extension_needed(self, physical_ms: int) -> int:
        """The window to have persisted once allocations reach `physical_ms`: half a window
        ahead, well before it runs out, so allocation never waits for etcd (and `_leader_sleep`
        wakes when the clock reaches that)."""
        return physical_ms + self.window_ms // 2

    def _extend(self, term: Term, needed: int) -> None:
        """Persist a window >= needed (aiming window-ms past it), conditioned on our leader key."""
        with self._etcd_lock:
            if self.allocator.window >= needed or self.term is not term:
                return
            new_window = needed + self.window_ms // 2
            tx = self.etcd.tx
            ok, _ = self.etcd.txn(
                [tx.mod(self.leader_key) == term.leader_rev,
                 tx.value(self.leader_key) == term.leader_value],
                [tx.put(self.window_key, window_value(new_window, term.epoch, self.name))])
            self._etcd_ok()
            if not ok:
                self._resign("leader key changed: another TSO took over")
                raise self.not_serving_error()
            self.allocator.set_window(term.id, new_window)
            log.debug("window extended", extra=kv(window=new_window, epoch=term.epoch))

    def _resign(self, reason: str) -> None:
        term = self.term
        if term is None:
            return
        self.term = None
        self.allocator.end_term()
        self._stale_leases.append(term.lease)
        self._leader_watch.again()    # campaign again at once, revoking this term's lease first
        log.warning("lost TSO leadership", extra=kv(name=self.name, epoch=term.epoch,
                                                    reason=reason))
        if self.on_change:
            self.on_change(False)

    def _revoke_stale(self) -> None:
        """Revoke leases of resigned terms so their leader key goes away at once."""
        while self._stale_leases:
            lease = self._stale_leases[0]
            try:
                with self.etcd.errors("lease revoke"):
                    try:
                        self.etcd.client.revoke_lease(lease)
                    except grpc.RpcError as e:
                        if e.code() != grpc.StatusCode.NOT_FOUND:
                            raise
            except EtcdUnavailable:
                return
            self._stale_leases.pop(0)
