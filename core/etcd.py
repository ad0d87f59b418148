"""etcd access through `etcd-sdk-python` (`import pyetcd`, the etcd3 API).

`Etcd` wraps the client so that every failure surfaces as EtcdUnavailable with a message naming
the endpoints, and so a restarted etcd is used again at once (the library otherwise blacklists a
failed endpoint for five minutes). Calls are blocking: async code runs them with
`asyncio.to_thread`.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pyetcd
from pyetcd import exceptions as etcd_exc

from .errors import ConfigError, EtcdUnavailable
from .tls import SecurityConfig

log = logging.getLogger(__name__)

# How long a failed endpoint is skipped when others exist (pyetcd's default is 300 s).
ENDPOINT_RETRY_S = 1.0


def parse_endpoints(endpoints: str | list[str]) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` (an optional http:// or https:// is dropped; a bare port means
    127.0.0.1) -> [(host, port)]. ConfigError naming the bad endpoint otherwise."""
    if isinstance(endpoints, str):
        endpoints = [e for e in endpoints.split(",") if e.strip()]
    out = []
    for ep in endpoints:
        text = ep.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
        host, _, port = text.rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/ "):
            raise ConfigError(f"etcd endpoint {ep.strip()!r} is not host:port "
                              "(e.g. 127.0.0.1:2379; several separated by commas)")
        out.append((host or "127.0.0.1", int(port)))
    return out


def check_endpoints(endpoints: str | list[str], where: str) -> None:
    """ConfigError `<where>: ...` unless endpoints parse (checked with the config, before any
    connection is tried)."""
    try:
        if not parse_endpoints(endpoints):
            raise ConfigError("no etcd endpoints (set host:port, e.g. 127.0.0.1:2379)")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


class Etcd:
    """A blocking etcd client with Sluice's error mapping. Thread-safe like pyetcd's client."""

    def __init__(self, endpoints: str | list[str], security: SecurityConfig | None = None,
                 timeout: float = 5.0) -> None:
        self.endpoints_text = endpoints if isinstance(endpoints, str) else ",".join(endpoints)
        creds = security.channel_credentials() if security is not None and security.enabled else None
        eps = [pyetcd.Endpoint(host, port, secure=creds is not None, creds=creds,
                               time_retry=ENDPOINT_RETRY_S if len(parse_endpoints(endpoints)) > 1 else 0,
                               opts=[("grpc.initial_reconnect_backoff_ms", 100),
                                     ("grpc.max_reconnect_backoff_ms", 1000)])
               for host, port in parse_endpoints(endpoints)]
        if not eps:
            raise EtcdUnavailable("no etcd endpoints configured")
        self.tls = creds is not None
        self.timeout = timeout
        self.client = pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout, failover=True)
        self.tx = self.client.transactions
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """Translate library and gRPC failures into EtcdUnavailable naming the operation."""
        try:
            yield
        except (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError,
                etcd_exc.NoServerAvailableError, etcd_exc.InternalServerError,
                etcd_exc.WatchTimedOut) as e:
            raise EtcdUnavailable(f"etcd at {self.endpoints_text} unavailable during {what}: "
                                  f"{type(e).__name__}{self._tls_hint()}") from None
        except grpc.RpcError as e:
            raise EtcdUnavailable(f"etcd at {self.endpoints_text} failed during {what}: "
                                  f"{e.code().name} {e.details()}") from None
        except ValueError as e:  # pyetcd: "Trying to use a failed node"
            raise EtcdUnavailable(f"etcd at {self.endpoints_text} unavailable during {what}: "
                                  f"{e}{self._tls_hint()}") from None

    def _tls_hint(self) -> str:
        """A refused TLS handshake looks like a dead etcd to the client: say what to check."""
        if self.tls:
            return (" (over mutual TLS: if etcd runs, check that ssl-ca is the CA that signed "
                    "etcd's certificate and signed this client's ssl-cert, and that etcd's "
                    "certificate names this host)")
        return (" (plaintext: if etcd runs with TLS, as `sluice cluster up` runs it unless "
                "`insecure = true`, give the cluster's certificates: `sluice ctl --cluster-dir "
                "DIR`, --ssl-ca/--ssl-cert/--ssl-key, or a [security] table)")

    # -- key/value -------------------------------------------------------------------------
    def get(self, key: str) -> tuple[bytes | None, Any]:
        """(value, metadata) — metadata has mod_revision, create_revision, version, lease_id."""
        with self.errors(f"get {key}"):
            return self.client.get(key)

    def get_prefix(self, prefix: str) -> tuple[list[tuple[bytes, Any]], int]:
        """All keys under prefix and the store revision they were read at."""
        with self.errors(f"list {prefix}"):
            resp = self.client.get_prefix_response(prefix)
            kvs = [(kv.value, _Meta(kv)) for kv in resp.kvs]
            return kvs, resp.header.revision

    def has_prefix(self, prefix: str) -> bool:
        """Whether any key starts with prefix (one count-only range request, no values read)."""
        with self.errors(f"count {prefix}"):
            resp = self.client.get_prefix_response(prefix, count_only=True)
            return resp.count > 0

    def put(self, key: str, value: bytes | str, lease: int | None = None) -> int:
        """Returns the revision of the write."""
        with self.errors(f"put {key}"):
            resp = self.client.put(key, value, lease=lease)
            return resp.header.revision

    def delete(self, key: str) -> bool:
        with self.errors(f"delete {key}"):
            return bool(self.client.delete(key))

    def txn(self, compare: list, success: list, failure: list | None = None) -> tuple[bool, list]:
        with self.errors("transaction"):
            return self.client.transaction(compare=compare, success=success, failure=failure or [])

    def revision(self) -> int:
        with self.errors("status"):
            resp = self.client.get_response("\0")
            return resp.header.revision

    # -- leases ----------------------------------------------------------------------------
    def grant(self, ttl: int) -> int:
        with self.errors(f"lease grant ttl={ttl}"):
            return self.client.lease(ttl).id

    def keepalive(self, lease_id: int) -> int:
        """Refresh a lease once; returns the remaining TTL (<= 0: the lease is gone)."""
        with self.errors("lease keepalive"):
            for resp in self.client.refresh_lease(lease_id):
                return int(resp.TTL)
        return 0

    def revoke(self, lease_id: int) -> None:
        with self.errors("lease revoke"):
            self.client.revoke_lease(lease_id)

    # -- watches ---------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, callback: Any, start_revision: int | None = None) -> int:
        """Call callback(WatchResponse | Exception) for every change under prefix."""
        with self.errors(f"watch {prefix}"):
            kwargs = {"start_revision": start_revision} if start_revision else {}
            return self.client.add_watch_prefix_callback(prefix, callback, **kwargs)

    def watch_key(self, key: str, callback: Any) -> int:
        """Call callback(WatchResponse | Exception) for every change of one key."""
        with self.errors(f"watch {key}"):
            return self.client.add_watch_callback(key, callback)

    def cancel_watch(self, watch_id: int) -> None:
        with contextlib.suppress(Exception):
            self.client.cancel_watch(watch_id)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()

    def wait_ready(self, deadline_s: float = 10.0) -> None:
        end = time.monotonic() + deadline_s
        while True:
            try:
                self.revision()
                return
            except EtcdUnavailable:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)


class _Meta:
    """Metadata of a key read by a range request (mirrors pyetcd's KVMetadata)."""

    __slots__ = ("key", "create_revision", "mod_revision", "version", "lease_id")

    def __init__(self, kv: Any) -> None:
        self.key = kv.key
        self.create_revision = kv.create_revision
        self.mod_revision = kv.mod_revision
        self.version = kv.version
        self.lease_id = kv.lease
