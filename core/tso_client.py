"""TSO client: batched timestamps from whichever TSO server leads right now.

Concurrent callers are coalesced: while one GetTS(count) RPC is in flight, new requests queue,
and the next RPC asks for all of them at once (PD's batching). With one RPC in flight at a time
and a TSO that is monotonic across leaders, every timestamp this client returns is greater than
every timestamp it returned before; the client checks that and refuses a range that goes
backwards rather than hand it out.

The leader is found through the etcd leader key when an `Etcd` is given, otherwise by trying the
listed addresses (following the "leader is ADDR" hint a standby gives). UNAVAILABLE and timeouts
are retried with backoff up to `deadline_s`, then Unavailable is raised naming what was tried.

The etcd keys and the leader record live here because they are the contract between TSO servers
(`sluice.tso`) and every client; `core` must not import `tso`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import grpc

from sluice.proto import sluice_pb2 as pb, sluice_pb2_grpc as pbg

from . import errors, grpcutil
from .etcd import Etcd
from .tls import SecurityConfig

log = logging.getLogger(__name__)

MAX_TS_BATCH = 100_000          # largest `count` one GetTS may ask for
_LEADER_HINT = re.compile(r"leader is (\S+)")
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}

T = TypeVar("T")


def leader_key(cluster_id: int) -> str:
    return f"/sluice/{cluster_id}/tso/leader"


def window_key(cluster_id: int) -> str:
    return f"/sluice/{cluster_id}/tso/window"


@dataclass(frozen=True)
class LeaderInfo:
    """The value of the leader key (bound to the leader's lease)."""

    name: str
    addr: str
    lease: int
    epoch: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "LeaderInfo":
        d = json.loads(raw)
        return cls(name=str(d["name"]), addr=str(d["addr"]), lease=int(d["lease"]),
                   epoch=int(d["epoch"]))


def read_leader(etcd: Etcd, cluster_id: int) -> LeaderInfo | None:
    """The current TSO leader from etcd (blocking), or None when no leader holds the key."""
    raw, _ = etcd.get(leader_key(cluster_id))
    return LeaderInfo.from_json(raw) if raw else None


class TSOClient:
    """asyncio TSO client. Create and use it inside one event loop; `await close()` at the end."""

    def __init__(self, addrs: list[str] | None, cluster_id: int, *, etcd: Etcd | None = None,
                 security: SecurityConfig | None = None, deadline_s: float = 10.0,
                 rpc_timeout_s: float = 1.0) -> None:
        if not addrs and etcd is None:
            raise errors.ConfigError("TSOClient needs TSO addresses or an etcd client")
        self.addrs = list(addrs or [])
        self.cluster_id = cluster_id
        self.etcd = etcd
        self.security = security
        self.deadline_s = deadline_s
        self.rpc_timeout_s = rpc_timeout_s
        self._stubs: dict[str, tuple[grpc.aio.Channel, pbg.TSOStub]] = {}
        self._addr: str | None = self.addrs[0] if self.addrs else None
        self._pending: list[tuple[int, asyncio.Future[int]]] = []
        self._worker: asyncio.Task[None] | None = None
        self._last_ts = 0
        self._closed = False

    async def get_ts(self) -> int:
        first, _ = await self.get_ts_range(1)
        return first

    async def get_ts_range(self, count: int) -> tuple[int, int]:
        """(first, count): the timestamps first .. first + count - 1, all fresh."""
        if not 1 <= count <= MAX_TS_BATCH:
            raise errors.InvalidArgument(f"count {count} out of range 1..{MAX_TS_BATCH}")
        if self._closed:
            raise errors.Unavailable("TSO client is closed")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((count, fut))
        if self._worker is None:
            self._worker = asyncio.create_task(self._run(), name="tso-client-batcher")
        return await fut, count

    async def close(self) -> None:
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        for _, fut in self._pending:
            if not fut.done():
                fut.set_exception(errors.Unavailable("TSO client closed"))
        self._pending.clear()
        for channel, _ in self._stubs.values():
            await channel.close()
        self._stubs.clear()

    # -- batching -------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while self._pending:
                n = self._take_count()
                batch = self._pending[:n]
                del self._pending[:n]
                total = sum(count for count, _ in batch)
                try:
                    first = await self._call(total)
                except asyncio.CancelledError:
                    for _, fut in batch:
                        fut.cancel()
                    raise
                except Exception as e:  # noqa: BLE001 - every waiter of the batch gets it
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                for count, fut in batch:
                    if not fut.done():
                        fut.set_result(first)
                    first += count
                # Let the callers just answered run first: most ask again at once, and they
                # should join the next RPC instead of each starting a batch of one.
                await asyncio.sleep(0)
        finally:
            self._worker = None

    def _take_count(self) -> int:
        """How many queued requests fit into one GetTS (each alone always fits)."""
        n, total = 0, 0
        for count, _ in self._pending:
            if total + count > MAX_TS_BATCH:
                break
            total += count
            n += 1
        return n

    # -- one RPC, following the leader ------------------------------------------------------
    def _stub(self, addr: str) -> pbg.TSOStub:
        entry = self._stubs.get(addr)
        if entry is None:
            channel = grpcutil.aio_channel(addr, self.security)
            entry = (channel, pbg.TSOStub(channel))
            self._stubs[addr] = entry
        return entry[1]

    async def _leader_from_etcd(self) -> str | None:
        assert self.etcd is not None
        try:
            info = await asyncio.to_thread(read_leader, self.etcd, self.cluster_id)
        except errors.EtcdUnavailable as e:
            log.debug("TSO leader lookup failed: %s", e)
            return None
        return info.addr if info else None

    async def _call(self, count: int) -> int:
        deadline = time.monotonic() + self.deadline_s
        backoff = 0.02
        last_error = "no TSO address known"
        tried: list[str] = []
        req = pb.GetTSReq(cluster_id=self.cluster_id, count=count)
        while True:
            if self._addr is None and self.etcd is not None:
                self._addr = await self._leader_from_etcd()
                if self._addr is None:
                    last_error = f"no TSO leader registered in etcd ({leader_key(self.cluster_id)})"
            addr = self._addr
            hinted = False
            if addr is not None:
                if addr not in tried:
                    tried.append(addr)
                try:
                    resp = await self._stub(addr).GetTS(req, timeout=self.rpc_timeout_s)
                except grpc.aio.AioRpcError as e:
                    if e.code() not in _RETRYABLE:
                        raise grpcutil.to_sluice_error(e) from None
                    last_error = f"{addr}: {e.code().name} {e.details()}"
                    hinted = self._switch(addr, e.details() or "")
                else:
                    first = int(resp.first_ts)
                    if first <= self._last_ts or resp.count != count:
                        raise errors.SluiceError(
                            f"TSO {addr} answered first_ts={first} count={resp.count} for count="
                            f"{count}, not above the last ts {self._last_ts}: refusing it")
                    self._last_ts = first + count - 1
                    return first
            now = time.monotonic()
            if now >= deadline:
                raise errors.Unavailable(
                    f"no TSO leader answered within {self.deadline_s:.1f}s "
                    f"(tried {', '.join(tried) or 'nothing'}; last error: {last_error})")
            if not hinted:
                await asyncio.sleep(min(backoff, max(0.0, deadline - now)))
                backoff = min(backoff * 2, 0.5)

    def _switch(self, addr: str, details: str) -> bool:
        """Pick the next address after `addr` failed; True when following a leader hint."""
        m = _LEADER_HINT.search(details)
        if m and m.group(1) != addr:
            self._addr = m.group(1)
            return True
        if self.etcd is not None:
            self._addr = None
        elif self.addrs:
            i = self.addrs.index(addr) if addr in self.addrs else -1
            self._addr = self.addrs[(i + 1) % len(self.addrs)]
        return False


class SyncTSOClient:
    """A blocking TSOClient for tools and threads: runs its own event loop in a thread."""

    def __init__(self, addrs: list[str] | None, cluster_id: int, *, etcd: Etcd | None = None,
                 security: SecurityConfig | None = None, deadline_s: float = 10.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tso-client",
                                        daemon=True)
        self._thread.start()
        self._client = TSOClient(addrs, cluster_id, etcd=etcd, security=security,
                                 deadline_s=deadline_s)
        self._timeout = deadline_s + 5

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._timeout)

    def get_ts(self) -> int:
        return self._run(self._client.get_ts())

    def get_ts_range(self, count: int) -> tuple[int, int]:
        return self._run(self._client.get_ts_range(count))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> "SyncTSOClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
