"""Conflict detection and parallel dispatch of row changes (TiDB-Binlog pkg/loader's causality).

Invariant: two row changes that share a causality key are applied in source order. A change goes
to the worker that holds one of its keys; a key is held by a worker from dispatch until that
worker has committed the change carrying it. A change whose keys are held by two different
workers cannot keep both orders, so it forces a flush of all workers (everything dispatched is
committed) before it is dispatched. Each worker commits its changes in the order it received
them, in batches of at most `batch_size`.

Progress: `applied()` is the highest commit_ts c such that every change of every transaction with
commit_ts <= c is committed by its worker (a worker's queue is in commit order, so its first
uncommitted change bounds it). Transactions are marked done by the caller once all their changes
are dispatched, so a transaction split over several workers counts only when all have committed.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sluice.core.errors import SluiceError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Causality:
    """key -> (worker, sequence number of the last change carrying it on that worker)."""

    def __init__(self, worker_count: int) -> None:
        if worker_count < 1:
            raise ValueError("worker_count must be >= 1")
        self.worker_count = worker_count
        self._relations: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._relations)

    def route(self, keys: Sequence[str], committed: Sequence[int]) -> int | None:
        """The worker for a change with these keys, or None on a conflict (flush first).

        `committed[w]` is the last sequence number worker w has committed; a key whose last
        change is committed is free again, so it no longer pins its worker."""
        held = -1
        for key in keys:
            rel = self._relations.get(key)
            if rel is None:
                continue
            worker, seq = rel
            if seq <= committed[worker]:
                continue
            if held == -1:
                held = worker
            elif held != worker:
                return None
        if held != -1:
            return held
        if not keys:
            return 0
        return zlib.crc32(keys[0].encode("utf-8", "surrogatepass")) % self.worker_count

    def record(self, keys: Sequence[str], worker: int, seq: int) -> None:
        for key in keys:
            self._relations[key] = (worker, seq)

    def prune(self, committed: Sequence[int]) -> None:
        """Forget keys whose last change is committed (they are free anyway)."""
        self._relations = {k: v for k, v in self._relations.items() if v[1] > committed[v[0]]}

    def reset(self) -> None:
        self._relations.clear()


class WorkerFailed(SluiceError):
    """A worker stopped on an error; the error itself is chained and re-raised by the caller."""


class _Flush:
    """A latch the dispatcher waits on until every worker has committed what it received."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._cond = threading.Condition()

    def done(self) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._count <= 0)


_STOP = object()
_NUDGE = object()


class Dispatcher(Generic[T]):
    """`worker_count` threads, each calling execute(worker, items) on batches it committed.

    execute must commit the batch (or raise); it runs in the worker's thread. One thread (the
    caller of dispatch/mark_done/flush) drives the dispatcher; applied() may be read from any.
    """

    def __init__(self, worker_count: int, batch_size: int,
                 execute: Callable[[int, list[T]], None], queue_size: int = 1024,
                 on_conflict: Callable[[], None] | None = None, name: str = "apply") -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.worker_count, self.batch_size = worker_count, batch_size
        self._execute = execute
        self._on_conflict = on_conflict
        self.causality = Causality(worker_count)
        self._queues: list[queue.Queue[Any]] = [queue.Queue(queue_size) for _ in range(worker_count)]
        # committed[w]: last sequence number worker w committed (written by w only).
        self.committed = [0] * worker_count
        self._dispatched = [0] * worker_count
        # Per worker: (first seq, commit_ts) for each run of changes of one transaction.
        self._pending: list[collections.deque[tuple[int, int]]] = [
            collections.deque() for _ in range(worker_count)]
        self._last_ts = [0] * worker_count
        self._frontier = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._run, args=(w,), name=f"{name}-worker-{w}",
                                          daemon=True) for w in range(worker_count)]
        self.conflicts = 0
        self.flushes = 0
        self._started = False

    # -- driving ------------------------------------------------------------------------------

    def start(self, frontier: int = 0) -> None:
        self._frontier = frontier
        for t in self._threads:
            t.start()
        self._started = True

    def dispatch(self, keys: Sequence[str], item: T, commit_ts: int) -> int:
        """Queue one change (blocks while the worker's queue is full); returns its worker."""
        self.check()
        worker = self.causality.route(keys, self.committed)
        if worker is None:
            self.conflicts += 1
            if self._on_conflict is not None:
                self._on_conflict()
            self.flush()
            worker = self.causality.route(keys, self.committed)
            assert worker is not None, "every key is free after a flush"
        with self._lock:
            seq = self._dispatched[worker] + 1
            self._dispatched[worker] = seq
            if self._last_ts[worker] != commit_ts:
                self._pending[worker].append((seq, commit_ts))
                self._last_ts[worker] = commit_ts
        self.causality.record(keys, worker, seq)
        if len(self.causality) > 200_000:
            self.causality.prune(self.committed)
        self._put(worker, (seq, item))
        return worker

    def mark_done(self, commit_ts: int) -> None:
        """Every change of the transaction commit_ts (and of all before it) is dispatched."""
        with self._lock:
            if commit_ts > self._frontier:
                self._frontier = commit_ts

    def nudge(self) -> None:
        """Ask every worker to commit its partial batch without waiting for it (end of input)."""
        self.check()
        for w in range(self.worker_count):
            self._put(w, _NUDGE)

    def flush(self) -> None:
        """Wait until every worker committed everything dispatched; raises a worker's error."""
        self.check()
        latch = _Flush(self.worker_count)
        for w in range(self.worker_count):
            self._put(w, latch)
        latch.wait()
        self.flushes += 1
        self.check()
        self.causality.reset()

    def applied(self) -> int:
        with self._lock:
            low = self._frontier
            for w in range(self.worker_count):
                pending = self._pending[w]
                done = self.committed[w]
                while pending:
                    nxt_first = pending[1][0] if len(pending) > 1 else self._dispatched[w] + 1
                    if nxt_first - 1 <= done:
                        pending.popleft()
                    else:
                        break
                if pending:
                    low = min(low, pending[0][1] - 1)
            return low

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    @property
    def error(self) -> BaseException | None:
        return self._error

    def close(self) -> None:
        """Stop the workers after what is queued (not waiting for a stuck execute)."""
        if not self._started:
            return
        for q in self._queues:
            try:
                q.put(_STOP, timeout=5)
            except queue.Full:
                log.warning("worker queue full at close; the worker thread is left to die with "
                            "the process")
        for t in self._threads:
            t.join(timeout=10)

    def _put(self, worker: int, item: Any) -> None:
        q = self._queues[worker]
        while True:
            try:
                q.put(item, timeout=0.5)
                return
            except queue.Full:
                self.check()

    # -- workers ------------------------------------------------------------------------------

    def _run(self, w: int) -> None:
        q = self._queues[w]
        batch: list[tuple[int, T]] = []
        while True:
            item = q.get()
            if item is _STOP:
                self._commit(w, batch)
                return
            if isinstance(item, _Flush):
                self._commit(w, batch)
                batch = []
                item.done()
                continue
            if item is _NUDGE:
                self._commit(w, batch)
                batch = []
                continue
            batch.append(item)
            if len(batch) >= self.batch_size:
                self._commit(w, batch)
                batch = []

    def _commit(self, w: int, batch: list[tuple[int, T]]) -> None:
        if not batch or self._error is not None:
            return
        try:
            self._execute(w, [item for _, item in batch])
            self.committed[w] = batch[-1][0]
        except BaseException as e:  # noqa: BLE001 - handed to the dispatching thread
            if self._error is None:
                self._error = e
            log.error("worker %d failed: %r", w, e)
