"""A lease-backed etcd key kept alive by a background thread (`alive` keys, leader keys)."""

from __future__ import annotations

import logging
import threading
import time

from . import failpoint
from .errors import EtcdUnavailable, InvalidArgument
from .etcd import Etcd

log = logging.getLogger(__name__)


class Heartbeat:
    """A lease-backed key kept alive by a background thread.

    Keepalive every ttl/3. If the lease is lost (it expired while etcd or this process was
    stalled), a new lease is granted and the key put again — unless `reacquire=False` (leader
    keys), in which case the heartbeat stops and `lost` becomes true.
    """

    FAILPOINT = "registry-heartbeat-keepalive"

    def __init__(self, etcd: Etcd, key: str, value: bytes | str, ttl: int,
                 reacquire: bool = True) -> None:
        if ttl < 1:
            raise InvalidArgument(f"heartbeat ttl must be >= 1 s, got {ttl}")
        self.etcd, self.key, self.value, self.ttl = etcd, key, value, int(ttl)
        self.reacquire = reacquire
        self._lock = threading.Lock()
        self._lease_id: int | None = None
        self._alive_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False
        self.reacquired = 0  # how many times the lease was lost and granted again

    @property
    def lease_id(self) -> int | None:
        with self._lock:
            return self._lease_id

    def alive_until_monotonic(self) -> float:
        """Monotonic send time of the last acknowledged keepalive (or grant) + its TTL."""
        with self._lock:
            return self._alive_until

    def start(self) -> Heartbeat:
        """Grant the lease and put the key now (raises EtcdUnavailable), then keep it alive."""
        self._acquire()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat {self.key}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and revoke the lease (which deletes the key)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        lease = self.lease_id
        if lease is not None and not self.lost:
            try:
                self.etcd.revoke(lease)
            except EtcdUnavailable as e:
                log.warning("heartbeat %s: revoke failed, key expires with its lease: %s", self.key, e)
        with self._lock:
            self._lease_id, self._alive_until = None, 0.0

    def _acquire(self) -> None:
        sent = time.monotonic()
        lease = self.etcd.grant(self.ttl)
        with self._lock:
            self._lease_id = lease
        self.etcd.put(self.key, self.value, lease=lease)
        with self._lock:
            self._alive_until = sent + self.ttl

    def _run(self) -> None:
        interval = max(self.ttl / 3.0, 0.1)
        retry = min(interval, 0.5)
        need_acquire = failing = False
        wait = interval
        while not self._stop.wait(wait):
            try:
                failpoint.inject(self.FAILPOINT)
                if need_acquire:
                    self._acquire()
                    need_acquire = False
                    self.reacquired += 1
                    log.warning("heartbeat %s: lease was lost; granted a new one and put the key "
                                "again", self.key)
                    wait = interval
                else:
                    sent = time.monotonic()
                    lease = self.lease_id
                    remaining = self.etcd.keepalive(lease) if lease is not None else 0
                    if remaining > 0:
                        with self._lock:
                            self._alive_until = sent + min(remaining, self.ttl)
                        wait = interval
                    else:
                        with self._lock:
                            self._alive_until = 0.0
                        if not self.reacquire:
                            self.lost = True
                            log.warning("heartbeat %s: lease lost; not reacquiring", self.key)
                            return
                        need_acquire, wait = True, 0.0
            except EtcdUnavailable as e:
                # Once per outage at warning level: retries every 0.5 s would flood the log.
                if not failing:
                    log.warning("heartbeat %s: %s; retrying", self.key, e)
                failing, wait = True, retry
                continue
            if failing:
                log.info("heartbeat %s: etcd reachable again", self.key)
                failing = False
