"""TSO client: batched, pipelined timestamps from whichever TSO server leads right now.

Invariant (linearizable): a timestamp handed to a caller was allocated after that caller asked,
and every timestamp this client returns is greater than every one it returned before (it refuses
a range that goes backwards). Batching, pipelining, fail-over and retries: docs/tso.md
("Client"). The leader record lives here because it is the contract between TSO servers and
every client (`core` must not import `tso`); its etcd key is named in core/registry.py.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import threading
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import grpc

from sluice.proto import sluice_pb2 as pb, sluice_pb2_grpc as pbg

from . import errors, grpcutil
from .etcd import Etcd
from .registry import tso_leader_key
from .tls import SecurityConfig

log = logging.getLogger(__name__)

MAX_TS_BATCH = 100_000          # largest `count` one GetTS may ask for
_CORE_ERROR = "Internal error from Core"
_LEADER_HINT = re.compile(r"leader is (\S+)")
# CANCELLED: a server that shuts down cancels its open streams; the next leader answers.
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.CANCELLED}

T = TypeVar("T")


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
    raw, _ = etcd.get(tso_leader_key(cluster_id))
    return LeaderInfo.from_json(raw) if raw else None


class _Batch:
    """Callers that share one GetTS request: waiter i gets first + the counts before it."""

    __slots__ = ("total", "waiters", "born", "sent")

    def __init__(self, born: float) -> None:
        self.total = 0
        self.waiters: list[tuple[int, asyncio.Future[int]]] = []
        self.born = born            # loop time the first caller joined (for deadline_s)
        self.sent = 0.0             # loop time the request was last written


class _StreamTimeout(Exception):
    """The oldest request on the stream stayed unanswered for rpc_timeout_s."""


class _StreamEnded(Exception):
    """The server closed the stream without a status error."""


class TSOClient:
    """asyncio TSO client. Create and use it inside one event loop; `await close()` at the end."""

    def __init__(self, addrs: list[str] | None, cluster_id: int, *, etcd: Etcd | None = None,
                 security: SecurityConfig | None = None, deadline_s: float = 10.0,
                 rpc_timeout_s: float = 1.0, max_inflight: int = 2, stream: bool = True) -> None:
        if not addrs and etcd is None:
            raise errors.ConfigError("TSOClient needs TSO addresses or an etcd client")
        if max_inflight < 1:
            raise errors.ConfigError(f"TSOClient max_inflight must be >= 1, got {max_inflight}")
        self.addrs = list(addrs or [])
        self.cluster_id = cluster_id
        self.etcd = etcd
        self.security = security
        self.deadline_s = deadline_s
        self.rpc_timeout_s = rpc_timeout_s
        self.max_inflight = max_inflight
        self._stubs: dict[str, tuple[grpc.aio.Channel, pbg.TSOStub]] = {}
        self._addr: str | None = self.addrs[0] if self.addrs else None
        self.stream = stream                    # False: unary GetTS only (benchmarks, old servers)
        self._unary_only: set[str] = set()      # servers that answered UNIMPLEMENTED to the stream
        self._queue: collections.deque[_Batch] = collections.deque()   # not sent; last one open
        self._inflight: collections.deque[_Batch] = collections.deque()  # sent, in order
        self._wake: asyncio.Future[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_ts = 0
        self._tried: list[str] = []
        self._last_error = "no TSO address known"
        self._progress = False                  # a response arrived since the last failure
        self._closed = False
        self.requests_sent = 0                  # GetTS requests written (stream or unary)

    async def get_ts(self) -> int:
        return await self._join(1)

    async def get_ts_range(self, count: int) -> tuple[int, int]:
        """(first, count): the timestamps first .. first + count - 1, all fresh."""
        if not 1 <= count <= MAX_TS_BATCH:
            raise errors.InvalidArgument(f"count {count} out of range 1..{MAX_TS_BATCH}")
        return await self._join(count), count

    def _join(self, count: int) -> asyncio.Future[int]:
        """Add the caller to the open batch (a new one when it would overflow MAX_TS_BATCH)."""
        if self._closed:
            raise errors.Unavailable("TSO client is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut = loop.create_future()
        queue = self._queue
        if queue and queue[-1].total + count <= MAX_TS_BATCH:
            batch = queue[-1]
        else:
            batch = _Batch(loop.time())
            queue.append(batch)
        batch.total += count
        batch.waiters.append((count, fut))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run(), name="tso-client")
        else:
            self._kick()
        return fut

    def _kick(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def close(self) -> None:
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        closed = errors.Unavailable("TSO client closed")
        for batch in (*self._inflight, *self._queue):
            self._fail(batch, closed)
        self._inflight.clear()
        self._queue.clear()
        for channel, _ in self._stubs.values():
            await channel.close()
        self._stubs.clear()

    # -- the worker: one session per leader, failing over -------------------------------------
    async def _run(self) -> None:
        try:
            await self._serve_batches()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug here must not leave callers waiting forever
            log.exception("TSO client worker failed")
            for batch in (*self._inflight, *self._queue):
                self._fail(batch, errors.SluiceError(f"TSO client worker failed: {e!r}"))
            self._inflight.clear()
            self._queue.clear()

    async def _serve_batches(self) -> None:
        backoff = 0.02
        while True:
            if not self._queue:
                await self._wait()
                continue
            if self._addr is None and self.etcd is not None:
                self._addr = await self._leader_from_etcd()
                if self._addr is None:
                    self._last_error = ("no TSO leader registered in etcd "
                                        f"({tso_leader_key(self.cluster_id)})")
            addr = self._addr
            hinted = False
            if addr is not None:
                if addr not in self._tried:
                    self._tried.append(addr)
                self._progress = False
                try:
                    if not self.stream or addr in self._unary_only:
                        await self._unary_session(addr)
                    else:
                        await self._stream_session(addr)
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - classified below; waiters get errors
                    hinted = self._failed(addr, e)
                if self._progress:
                    backoff = 0.02
            self._expire()
            if not hinted and self._queue:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.5)

    async def _wait(self) -> None:
        assert self._loop is not None
        self._wake = self._loop.create_future()
        try:
            await self._wake
        finally:
            self._wake = None

    def _failed(self, addr: str, e: Exception) -> bool:
        """Classify a session's end; True when following a leader hint (retry at once)."""
        # Whatever was in flight is sent again, ahead of later callers.
        self._queue.extendleft(reversed(self._inflight))
        self._inflight.clear()
        if isinstance(e, _StreamTimeout):
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, str(e)
        elif isinstance(e, _StreamEnded):
            code, details = grpc.StatusCode.UNAVAILABLE, str(e)
        elif isinstance(e, grpc.aio.AioRpcError):
            code, details = e.code(), e.details() or ""
            if code == grpc.StatusCode.INTERNAL and _CORE_ERROR in details:
                # grpc.aio's status for a write on a connection that died, not the server's.
                code = grpc.StatusCode.UNAVAILABLE
        else:
            # A misbehaving server (see _read_responses); the worker must survive it.
            log.warning("TSO stream to %s failed: %r", addr, e)
            code, details = grpc.StatusCode.UNAVAILABLE, repr(e)
        if self._progress:
            self._tried = [addr]
        if code == grpc.StatusCode.UNIMPLEMENTED and addr not in self._unary_only:
            log.info("TSO %s has no GetTSStream; using unary GetTS", addr)
            self._unary_only.add(addr)
            return True
        if code not in _RETRYABLE:
            # The server answers requests in order: the oldest unanswered one caused this.
            if self._queue:
                self._fail(self._queue.popleft(), grpcutil.to_sluice_error(e))
            return True
        self._last_error = f"{addr}: {code.name} {details}"
        log.debug("TSO stream to %s ended: %s", addr, self._last_error)
        return self._switch(addr, details)

    def _expire(self) -> None:
        """Fail the batches whose callers have waited deadline_s."""
        assert self._loop is not None
        now = self._loop.time()
        if not any(now - b.born >= self.deadline_s for b in self._queue):
            return
        error = errors.Unavailable(
            f"no TSO leader answered within {self.deadline_s:.1f}s "
            f"(tried {', '.join(self._tried) or 'nothing'}; last error: {self._last_error})")
        keep = [b for b in self._queue if now - b.born < self.deadline_s]
        for b in self._queue:
            if now - b.born >= self.deadline_s:
                self._fail(b, error)
        self._queue.clear()
        self._queue.extend(keep)

    # -- batches ---------------------------------------------------------------------------
    def _take(self) -> _Batch:
        """The queued batches that fit into one request, merged (the first always fits)."""
        queue = self._queue
        batch = queue.popleft()
        while queue and batch.total + queue[0].total <= MAX_TS_BATCH:
            more = queue.popleft()
            batch.total += more.total
            batch.waiters.extend(more.waiters)
            batch.born = min(batch.born, more.born)
        return batch

    def _resolve(self, batch: _Batch, addr: str, first: int, count: int) -> None:
        if first <= self._last_ts or count != batch.total:
            self._fail(batch, errors.SluiceError(
                f"TSO {addr} answered first_ts={first} count={count} for count={batch.total}, "
                f"not above the last ts {self._last_ts}: refusing it"))
            return
        self._last_ts = first + count - 1
        self._progress = True
        for n, fut in batch.waiters:
            if not fut.done():          # a caller may have been cancelled meanwhile
                fut.set_result(first)
            first += n

    @staticmethod
    def _fail(batch: _Batch, error: BaseException) -> None:
        for _, fut in batch.waiters:
            if not fut.done():
                fut.set_exception(error)

    # -- one stream to one server ----------------------------------------------------------
    async def _stream_session(self, addr: str) -> None:
        """Pipeline requests on one GetTSStream until it breaks (raises) or the client closes."""
        loop = self._loop
        assert loop is not None
        call = self._stub(addr).GetTSStream()
        reader = loop.create_task(self._read_responses(call, addr), name="tso-client-reader")
        reader.add_done_callback(lambda _: self._kick())
        timed_out = False

        def watchdog() -> None:
            nonlocal timed_out, timer
            inflight = self._inflight
            if inflight and loop.time() - inflight[0].sent >= self.rpc_timeout_s:
                timed_out = True
                self._kick()
            else:
                timer = loop.call_later(self.rpc_timeout_s / 4, watchdog)

        timer = loop.call_later(self.rpc_timeout_s / 4, watchdog)
        inflight, queue = self._inflight, self._queue
        try:
            while True:
                while queue and len(inflight) < self.max_inflight and not reader.done():
                    batch = self._take()
                    batch.sent = loop.time()
                    inflight.append(batch)
                    self.requests_sent += 1
                    try:
                        await call.write(pb.GetTSReq(cluster_id=self.cluster_id,
                                                     count=batch.total))
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
                        await self._write_failed(reader, addr, e)
                if reader.done():
                    if not reader.cancelled():
                        reader.result()     # raises the stream's error
                    raise _StreamEnded(f"{addr} closed the GetTSStream")
                if timed_out:
                    raise _StreamTimeout(f"no GetTSStream response within "
                                         f"{self.rpc_timeout_s:.1f}s")
                await self._wait()
        finally:
            timer.cancel()
            reader.cancel()
            call.cancel()

    async def _write_failed(self, reader: asyncio.Task[None], addr: str, e: Exception) -> None:
        """A write failed because the call ended (a dead connection surfaces as INTERNAL
        "Internal error from Core" on the write): the reader holds the call's real status."""
        await asyncio.wait([reader], timeout=self.rpc_timeout_s)
        if reader.done() and not reader.cancelled():
            reader.result()
        raise _StreamEnded(f"{addr}: GetTSStream write failed: {e!r}") from None

    async def _read_responses(self, call: grpc.aio.StreamStreamCall, addr: str) -> None:
        inflight = self._inflight
        kick = self._kick
        resolve = self._resolve
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                return
            if not inflight:
                raise errors.SluiceError(f"TSO {addr} sent a response nobody asked for")
            resolve(inflight.popleft(), addr, resp.first_ts, resp.count)
            kick()

    async def _unary_session(self, addr: str) -> None:
        """Unary GetTS, one RPC in flight (servers without GetTSStream)."""
        stub = self._stub(addr)
        while self._queue:
            batch = self._take()
            self._inflight.append(batch)
            self.requests_sent += 1
            resp = await stub.GetTS(pb.GetTSReq(cluster_id=self.cluster_id, count=batch.total),
                                    timeout=self.rpc_timeout_s)
            self._inflight.popleft()
            self._resolve(batch, addr, resp.first_ts, resp.count)

    # -- following the leader --------------------------------------------------------------
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
        # Like asyncio.run: let gRPC's own tasks finish instead of destroying them pending.
        self._run(self._drain_tasks())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @staticmethod
    async def _drain_tasks() -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> "SyncTSOClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
