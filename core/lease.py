"""A lease held by this process, and whether it is *certainly* still alive.

Invariant: `certainly_alive()` is true only while the lease is certainly alive in etcd, judged
on a monotonic clock (alive_until = send time of the last acknowledged keepalive + the TTL etcd
reported - margin), so a process that checks it right before each write never writes after etcd
could have handed the lease's keys to someone else. When the deadline passes, `on_lost` is called
once and the keeper stops; a lost lease is never re-granted here. Why the rule holds: docs/tso.md
("How fencing works", 3 and 4), which keeps its own copy of it in its election loop.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .errors import EtcdUnavailable
from .etcd import Etcd

log = logging.getLogger(__name__)

__all__ = ["LeaseKeeper"]


class LeaseKeeper:
    """Keeps one granted lease alive from a background thread; tells when it is certainly alive.

    Build it with `granted(...)` right after the grant (pass the monotonic time taken *before*
    the grant request was sent), then `start()`.
    """

    def __init__(self, etcd: Etcd, lease_id: int, ttl: int, sent: float, margin_s: float,
                 on_lost: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, what: str = "lease") -> None:
        self.etcd = etcd
        self.lease_id = lease_id
        self.ttl = int(ttl)
        self.margin_s = margin_s
        self.on_lost = on_lost
        self.clock = clock
        self.what = what
        self._lock = threading.Lock()
        self._alive_until = sent + self.ttl - margin_s
        self._last_ack = sent
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- queries (any thread) -------------------------------------------------------------------
    @property
    def alive_until(self) -> float:
        with self._lock:
            return self._alive_until

    def certainly_alive(self) -> bool:
        """True only while the lease is certainly alive now (never a cached flag)."""
        with self._lock:
            return self._lost is None and self.clock() < self._alive_until

    def lost_reason(self) -> str | None:
        """Why the lease is not certainly alive now, or None if it is."""
        with self._lock:
            if self._lost is not None:
                return self._lost
            now = self.clock()
            if now >= self._alive_until:
                return (f"{self.what} not certainly alive: {now - self._last_ack:.1f}s since the "
                        f"send time of the last acknowledged keepalive (ttl {self.ttl}s, margin "
                        f"{self.margin_s:.1f}s)")
            return None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> LeaseKeeper:
        self._thread = threading.Thread(target=self._run, name=f"keepalive {self.what}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, revoke: bool = True) -> None:
        """Stop keeping it alive; revoke it (its keys vanish now) unless told not to."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.etcd.timeout + 1)
        if revoke:
            try:
                self.etcd.revoke(self.lease_id)
            except EtcdUnavailable as e:
                log.warning("%s: revoke failed; its keys expire with the lease: %s", self.what, e)

    # -- the keeper thread ----------------------------------------------------------------------
    def _declare_lost(self, reason: str) -> None:
        with self._lock:
            if self._lost is not None:
                return
            self._lost = reason
        log.warning("%s lost: %s", self.what, reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    def _run(self) -> None:
        every = self.ttl / 3.0
        next_keepalive = self.clock() + every
        failing = False
        while not self._stop.is_set():
            now = self.clock()
            reason = self.lost_reason()
            if reason is not None:
                self._declare_lost(reason)
                return
            if now < next_keepalive:
                # Wake no later than the deadline: the owner must learn of it on time even when
                # there is nothing else to do.
                self._stop.wait(max(0.01, min(next_keepalive, self.alive_until) - now))
                continue
            sent = self.clock()
            try:
                remaining = self.etcd.keepalive(self.lease_id)
            except EtcdUnavailable as e:
                if not failing:
                    log.warning("%s: keepalive failed, retrying until the deadline: %s", self.what, e)
                failing = True
                next_keepalive = self.clock() + min(0.2, every)
                continue
            if failing:
                log.info("%s: keepalive acknowledged again", self.what)
                failing = False
            if remaining <= 0:
                self._declare_lost(f"{self.what} expired in etcd")
                return
            with self._lock:
                # From the send time: etcd may have received it any time after.
                self._alive_until = max(self._alive_until, sent + remaining - self.margin_s)
                self._last_ack = max(self._last_ack, sent)
            next_keepalive = sent + every
