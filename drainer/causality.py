"""Conflict detection and parallel dispatch of row changes (TiDB-Binlog pkg/loader's causality).

Invariant: two row changes that share a causality key are applied in source order. A change goes
to the worker that holds one of its keys; a key is held by a worker from dispatch until that
worker has committed the change carrying it. A change whose keys are held by several workers
cannot keep every order at once: it stays with one of them (the one with the most uncommitted
work) and waits until each of the others has committed everything it was given — only those
workers, the rest keep going (TiDB-Binlog's loader waits for the conflicting workers, not all).
Each worker commits its changes in the order it received them.

Batching: the dispatching thread collects each worker's changes into batches and hands over
whole batches (one queue operation and one thread wake-up per batch, not per row: under the GIL
the hand-off costs more than routing). A batch is handed over when it holds `batch_size`
changes, or `max_batch` while the caller says it is dispatching a backlog (`backlogged()`: fewer,
larger downstream transactions); `nudge()` hands over the partial ones, and a conflict wait
those of the workers it waits for (only: handing everyone a partial batch at every conflict
would cut the backlog into small transactions). A worker that finds more batches queued behind the
one it took commits them together too, up to `max_batch`, stopping at any marker.

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
        """The worker for a change with these keys, or None on a conflict (see holders()).

        `committed[w]` is the last sequence number worker w has committed; a key whose last
        change is committed is free again, so it no longer pins its worker."""
        held = -1
        relations = self._relations
        for key in keys:
            rel = relations.get(key)
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
        if self.worker_count == 1:
            return 0
        return zlib.crc32(keys[0].encode("utf-8", "surrogatepass")) % self.worker_count

    def holders(self, keys: Sequence[str], committed: Sequence[int]) -> list[int]:
        """The workers holding an uncommitted change that carries one of these keys."""
        out: list[int] = []
        for key in keys:
            rel = self._relations.get(key)
            if rel is not None and rel[1] > committed[rel[0]] and rel[0] not in out:
                out.append(rel[0])
        return out

    def record(self, keys: Sequence[str], worker: int, seq: int) -> None:
        rel = (worker, seq)
        relations = self._relations
        for key in keys:
            relations[key] = rel

    def prune(self, committed: Sequence[int]) -> None:
        """Forget keys whose last change is committed (they are free anyway)."""
        self._relations = {k: v for k, v in self._relations.items() if v[1] > committed[v[0]]}

    def reset(self) -> None:
        self._relations.clear()


class WorkerFailed(SluiceError):
    """A worker stopped on an error; the error itself is chained and re-raised by the caller."""


class _Flush:
    """A latch the dispatcher waits on until the workers it was sent to committed what they had."""

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


class Dispatcher(Generic[T]):
    """`worker_count` threads, each calling execute(worker, items) on batches it committed.

    execute must commit the batch (or raise); it runs in the worker's thread. One thread (the
    caller of dispatch/mark_done/nudge/flush) drives the dispatcher; applied() may be read from any.
    `queue_size` bounds the changes queued per worker (back-pressure on the dispatching thread).
    """

    def __init__(self, worker_count: int, batch_size: int,
                 execute: Callable[[int, list[T]], None], queue_size: int = 1024,
                 on_conflict: Callable[[], None] | None = None, name: str = "apply",
                 max_batch: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.worker_count, self.batch_size = worker_count, batch_size
        self.max_batch = max(batch_size, max_batch or batch_size)
        self._execute = execute
        self._on_conflict = on_conflict
        self.causality = Causality(worker_count)
        # Counted in the largest batches, so a backlog cannot queue max_batch / batch_size
        # times more changes (and lag) than queue_size says.
        depth = max(2, queue_size // self.max_batch)
        self._queues: list[queue.Queue[Any]] = [queue.Queue(depth) for _ in range(worker_count)]
        # committed[w]: last sequence number worker w committed (written by w only).
        self.committed = [0] * worker_count
        self._dispatched = [0] * worker_count
        # The batch each worker is being given (dispatching thread only).
        self._open: list[list[tuple[int, T]]] = [[] for _ in range(worker_count)]
        self._limit = batch_size
        # Per worker: (first seq, commit_ts) for each run of changes of one transaction.
        self._pending: list[collections.deque[tuple[int, int]]] = [
            collections.deque() for _ in range(worker_count)]
        self._last_ts = [0] * worker_count
        self._frontier = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._run, args=(w,), name=f"{name}-worker-{w}",
                                          daemon=True) for w in range(worker_count)]
        self.conflicts = 0          # changes whose keys were held by several workers
        self.flushes = 0            # waits for every worker (flush())
        self.waited_workers = 0     # workers waited for on conflicts, summed
        self._started = False

    # -- driving ------------------------------------------------------------------------------

    def start(self, frontier: int = 0) -> None:
        self._frontier = frontier
        for t in self._threads:
            t.start()
        self._started = True

    def dispatch(self, keys: Sequence[str], item: T, commit_ts: int) -> int:
        """Queue one change (blocks while the worker's queue is full); returns its worker."""
        if self._error is not None:
            raise self._error
        worker = self.causality.route(keys, self.committed)
        if worker is None:
            self.conflicts += 1
            if self._on_conflict is not None:
                self._on_conflict()
            holders = self.causality.holders(keys, self.committed)
            # Keep the change with the busiest holder; wait for the others to commit theirs.
            keep = max(holders, key=lambda w: self._dispatched[w] - self.committed[w])
            self._wait_for([w for w in holders if w != keep])
            worker = self.causality.route(keys, self.committed)
            assert worker is not None, "only one holder is left after the wait"
        with self._lock:
            seq = self._dispatched[worker] + 1
            self._dispatched[worker] = seq
            if self._last_ts[worker] != commit_ts:
                self._pending[worker].append((seq, commit_ts))
                self._last_ts[worker] = commit_ts
        self.causality.record(keys, worker, seq)
        if len(self.causality) > 200_000:
            self.causality.prune(self.committed)
        batch = self._open[worker]
        batch.append((seq, item))
        if len(batch) >= self._limit:
            self._send(worker)
        return worker

    def backlogged(self, on: bool) -> None:
        """While on, batches grow to max_batch before they are handed over (the caller has a
        backlog to dispatch: fewer, larger transactions); else batch_size."""
        self._limit = self.max_batch if on else self.batch_size

    def mark_done(self, commit_ts: int) -> None:
        """Every change of the transaction commit_ts (and of all before it) is dispatched."""
        with self._lock:
            if commit_ts > self._frontier:
                self._frontier = commit_ts

    def nudge(self) -> None:
        """Hand every worker its partial batch without waiting for it (end of input)."""
        self.check()
        for w in range(self.worker_count):
            self._send(w)

    def flush(self) -> None:
        """Wait until every worker committed everything dispatched; raises a worker's error."""
        self.check()
        self._wait_for(range(self.worker_count))
        self.flushes += 1
        self.check()
        self.causality.reset()

    def _wait_for(self, workers: Sequence[int]) -> None:
        workers = list(workers)
        if not workers:
            return
        latch = _Flush(len(workers))
        for w in workers:
            self._send(w)
            self._put(w, latch)
        latch.wait()
        if len(workers) < self.worker_count:
            self.waited_workers += len(workers)
        self.check()

    def _send(self, worker: int) -> None:
        batch = self._open[worker]
        if batch:
            self._open[worker] = []
            self._put(worker, batch)

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
        """Stop the workers after what is dispatched (not waiting for a stuck execute)."""
        if not self._started:
            return
        for w, q in enumerate(self._queues):
            try:
                batch, self._open[w] = self._open[w], []
                if batch:
                    q.put(batch, timeout=5)
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
        while True:
            item = q.get()
            if item is _STOP:
                return
            if isinstance(item, _Flush):
                item.done()
                continue
            batch: list[tuple[int, T]] = item
            marker = None
            # Backlogged: take the batches queued behind this one into the same transaction.
            while len(batch) < self.max_batch:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if isinstance(nxt, list):
                    batch = batch + nxt
                else:
                    marker = nxt
                    break
            self._commit(w, batch)
            if marker is _STOP:
                return
            if marker is not None:
                marker.done()

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
