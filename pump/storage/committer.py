"""The request queue and the committer thread: the one place storage state changes.

`submit` checks a request (closed, broken, disk guard, in-flight budget) and queues it; the
thread drains every queued request into one group, stages each in order (a failing request fails
alone and leaves nothing behind), persists the group once, and only then resolves the futures.
"""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from sluice.core import failpoint
from sluice.core.errors import (FailedPrecondition, InvalidArgument, ResourceExhausted,
                                SluiceError, Unavailable)
from sluice.proto import sluice_pb2 as pb

from .persist import persist
from .records import Stage
from .stage import Stager
from .state import StoreState

log = logging.getLogger(__name__)

MAX_GROUP_BYTES = 64 << 20
MAX_QUEUED_REQUESTS = 1 << 16
DISK_CHECK_INTERVAL_S = 1.0


class Kind:
    """What a request asks for (plain ints, not an Enum: compared on every request)."""

    WRITE = 0       # payloads: serialized Binlogs
    EPOCH = 1       # arg: (producer_id, epoch)
    CALL = 2        # arg: a function run on the committer thread, between groups
    STOP = 3


class Req:
    __slots__ = ("kind", "payloads", "nbytes", "loop", "fut", "arg", "from_client", "result",
                 "error")

    def __init__(self, kind: int, payloads: list[bytes] | None = None, nbytes: int = 0,
                 loop: asyncio.AbstractEventLoop | None = None, fut: Any = None,
                 arg: Any = None, from_client: bool = False) -> None:
        self.kind, self.payloads, self.nbytes = kind, payloads, nbytes
        self.loop, self.fut, self.arg = loop, fut, arg
        self.from_client = from_client
        self.result: Any = None
        self.error: BaseException | None = None


def _any_prewrite(payloads: list[bytes]) -> bool:
    """Whether a write carries a PREWRITE (decoded only when the disk is already low); an
    undecodable payload counts as one, so the write is refused here rather than judged later."""
    for p in payloads:
        try:
            if pb.Binlog.FromString(p).tp == pb.PREWRITE:
                return True
        except DecodeError:
            return True
    return False


def _complete(items: list[tuple[Any, Any, BaseException | None]],
              notify: list[Callable[[int], None]] | None = None, watermark: int = 0) -> None:
    for fut, result, error in items:
        if fut.done():
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    if notify:
        _notify(notify, watermark)


def _notify(callbacks: list[Callable[[int], None]], watermark: int) -> None:
    for cb in callbacks:
        try:
            cb(watermark)
        except Exception:  # noqa: BLE001 - a listener must not stop the others
            log.exception("storage loop listener failed")


class Committer:
    def __init__(self, state: StoreState, stager: Stager) -> None:
        self.state = state
        self.stager = stager
        self.listeners: list[Callable[[int], None]] = []
        # Callbacks run on an event loop after every durable group: in the same loop callback
        # as the group's acks to that loop, so a group wakes the loop once, not twice.
        self.loop_listeners: dict[asyncio.AbstractEventLoop, list[Callable[[int], None]]] = {}
        self._queue: queue.SimpleQueue[Req] = queue.SimpleQueue()
        self._carry: list[Req] = []
        self._budget_lock = threading.Lock()
        self.inflight_bytes = 0
        self._inflight_reqs = 0
        self._disk_checked = 0.0
        self.disk_free = -1
        self.broken: BaseException | None = None
        self.closed = False
        self._thread = threading.Thread(target=self._run, name="storage-committer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish queued requests and stop the thread; later requests fail. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._queue.put(Req(Kind.STOP))
        self._thread.join()
        while True:  # requests that raced with close()
            try:
                r = self._queue.get_nowait()
            except queue.Empty:
                break
            r.error = FailedPrecondition("storage is closed")
            self._finish([r])

    # -- submission (caller's thread) ----------------------------------------------------

    def check_writable(self, payloads: list[bytes] | None = None, metadata: bool = False
                       ) -> None:
        """Refuse writes when the storage failed, or new prewrites when the disk is nearly
        full (only PREWRITEs and empty probes: see docs/storage.md, "Disk guard")."""
        if self.closed:
            raise FailedPrecondition("storage is closed")
        if self.broken is not None:
            raise Unavailable(f"storage failed and refuses writes until restarted: "
                              f"{self.broken!r}")
        limit = self.state.options.stop_write_at_available_space
        if limit > 0:
            now = time.monotonic()
            if now - self._disk_checked >= DISK_CHECK_INTERVAL_S:
                st = os.statvfs(self.state.data_dir)
                free = st.f_bavail * st.f_frsize
                try:
                    # Tests make a running pump see a full disk: `pump-disk-full=raise(BYTES)@K`
                    # reports BYTES available (0 when not a number) from the K-th check on.
                    failpoint.inject("pump-disk-full")
                except failpoint.FailpointError as e:
                    free = int(str(e)) if str(e).isdigit() else 0
                self.disk_free = free
                self._disk_checked = now
            if self.disk_free < limit and not metadata and \
                    (not payloads or _any_prewrite(payloads)):
                raise ResourceExhausted(
                    f"pump disk nearly full: {self.disk_free} bytes available < "
                    f"stop-write-at-available-space {limit}; writes refused, reads continue")

    def size_check(self, payloads: list[bytes]) -> int:
        limit = self.state.options.max_binlog_size
        total = 0
        for i, p in enumerate(payloads):
            n = len(p)
            if n > limit:
                raise InvalidArgument(
                    f"binlog {i} is {n} bytes, over max-binlog-size {limit}: split the prewrite "
                    "into parts (part_no/part_count under one start_ts)")
            total += n
        return total

    def submit(self, req: Req) -> None:
        self.check_writable(req.payloads, metadata=req.kind == Kind.EPOCH)
        limit = self.state.options.max_inflight_bytes
        with self._budget_lock:
            if self.inflight_bytes + req.nbytes > limit:
                self.state.stats["rejected_requests"] += 1
                raise ResourceExhausted(
                    f"pump in-flight byte budget exhausted ({self.inflight_bytes} + "
                    f"{req.nbytes} > {limit}): retry later")
            if self._inflight_reqs >= MAX_QUEUED_REQUESTS:
                raise ResourceExhausted(f"pump write queue full ({self._inflight_reqs} requests)")
            self.inflight_bytes += req.nbytes
            self._inflight_reqs += 1
        self._queue.put(req)

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the committer thread, ordered with the writes."""
        if self.closed:
            raise FailedPrecondition("storage is closed")
        loop = asyncio.get_running_loop()
        req = Req(Kind.CALL, None, 0, loop, loop.create_future(), fn)
        with self._budget_lock:
            self._inflight_reqs += 1
        self._queue.put(req)
        return await req.fut

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if self._carry:
                items, self._carry = self._carry, []
            else:
                items = [self._queue.get()]
            size = sum(r.nbytes for r in items)
            while size < MAX_GROUP_BYTES:
                try:
                    r = self._queue.get_nowait()
                except queue.Empty:
                    break
                items.append(r)
                size += r.nbytes
            stop = False
            group: list[Req] = []
            for i, r in enumerate(items):
                if r.kind == Kind.STOP:
                    stop = True
                    self._carry = []
                    if group:
                        self._run_group(group)
                    group = []
                    for rest in items[i + 1:]:
                        rest.error = FailedPrecondition("storage is closed")
                        self._finish([rest])
                    break
                if r.kind == Kind.CALL:
                    if group:
                        self._run_group(group)
                        group = []
                    try:
                        r.result = r.arg()
                    except BaseException as e:  # noqa: BLE001 - handed to the caller
                        r.error = e
                    self._finish([r])
                else:
                    group.append(r)
            if group:
                self._run_group(group)
            if stop:
                return

    def _finish(self, reqs: list[Req], watermark: int | None = None) -> None:
        """Resolve the requests' futures; after a durable group (`watermark` given) also run
        the loop listeners, with the acks of their loop when there are any."""
        by_loop: dict[Any, list[tuple[Any, Any, BaseException | None]]] = {}
        nbytes = 0
        for r in reqs:
            nbytes += r.nbytes
            if r.loop is None:
                if r.error is not None:
                    r.fut.set_exception(r.error)
                else:
                    r.fut.set_result(r.result)
            else:
                by_loop.setdefault(r.loop, []).append((r.fut, r.result, r.error))
        with self._budget_lock:
            self.inflight_bytes -= nbytes
            self._inflight_reqs -= len(reqs)
        listeners = self.loop_listeners if watermark is not None else {}
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_complete, items, listeners.get(loop), watermark)
            except RuntimeError:
                log.debug("event loop closed before %d acks were delivered", len(items))
        for loop, callbacks in listeners.items():
            if loop not in by_loop and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(_notify, callbacks, watermark)
                except RuntimeError:
                    log.debug("event loop closed before a group was announced")

    def _run_group(self, reqs: list[Req]) -> None:
        if self.broken is not None:
            for r in reqs:
                r.error = Unavailable(f"storage failed: {self.broken!r}")
            self._finish(reqs)
            return
        stager = self.stager
        grp = Stage()
        ok: list[Req] = []
        for r in reqs:
            st = Stage()
            try:
                if r.kind == Kind.EPOCH:
                    r.result = stager.stage_epoch(st, grp, *r.arg)
                else:
                    assert r.payloads is not None
                    stager.stage_all(st, grp, r.payloads, r.from_client)
            except SluiceError as e:
                r.error = e
                continue
            except Exception as e:  # noqa: BLE001 - a bug must fail the request, not the thread
                log.exception("unexpected error validating a write")
                r.error = InvalidArgument(f"cannot process binlog: {e!r}")
                continue
            grp.merge(st)
            ok.append(r)
        failed = [r for r in reqs if r.error is not None]
        if failed:
            self._finish(failed)
        if not ok:
            return
        try:
            # Retries of stored binlogs alone change nothing: nothing to make durable.
            watermark = persist(self.state, grp) if grp.records or grp.producers \
                else self.state.served
        except BaseException as e:  # noqa: BLE001 - the storage stops accepting writes
            log.exception("storage write failed; refusing writes until restart")
            self.broken = e
            for r in ok:
                r.error = Unavailable(f"storage write failed: {e!r}")
            self._finish(ok)
            return
        n = len(grp.records)
        s = self.state.stats
        s["groups"] += 1
        s["group_binlogs"] += n
        s["group_requests"] += len(ok)
        s["last_group_binlogs"] = n
        if n > s["max_group_binlogs"]:
            s["max_group_binlogs"] = n
        failpoint.inject("storage-before-ack")
        for r in ok:
            if r.kind == Kind.WRITE:
                r.result = watermark
        self._finish(ok, watermark)
        for cb in self.listeners:
            try:
                cb(watermark)
            except Exception:  # noqa: BLE001 - a listener must not stop the committer
                log.exception("storage listener failed")
