"""The database side of an application producer: pooled connections, their threads, open slots.

Blocking database work runs on the pool's own threads, one per open transaction (`size` of
each), so transactions waiting on row locks never starve anyone else's threads.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

import pymysql

T = TypeVar("T")
Connect = Callable[[], pymysql.connections.Connection]


def close_quietly(conn: pymysql.connections.Connection | None) -> None:
    if conn is None:
        return
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - a broken socket: the server aborts the session anyway
        conn._force_close()  # type: ignore[attr-defined]


class TxnPool:
    """Idle pymysql connections to the outbox database (autocommit off: the first statement
    after a COMMIT or ROLLBACK opens the next transaction), the threads that use them and the
    slots that bound how many transactions are open at once."""

    def __init__(self, connect: Connect, size: int, thread_name: str) -> None:
        self.connect, self.size = connect, size
        self._thread_name = thread_name
        self._idle: list[pymysql.connections.Connection] = []
        self._lock = threading.Lock()
        self._slots = asyncio.Semaphore(size)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.size, thread_name_prefix=self._thread_name)

    async def acquire_slot(self) -> None:
        await self._slots.acquire()

    def release_slot(self) -> None:
        self._slots.release()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run blocking database work on one of the pool's threads."""
        assert self._executor is not None, "TxnPool.start() was not called"
        return self._executor.submit(fn)

    def take_idle(self) -> pymysql.connections.Connection | None:
        """An idle connection, without blocking; None when there is none."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.open:
                    return conn
        return None

    def put(self, conn: pymysql.connections.Connection) -> None:
        with self._lock:
            if conn.open and len(self._idle) < self.size:
                self._idle.append(conn)
                return
        close_quietly(conn)

    async def close(self) -> None:
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.to_thread(executor.shutdown, True)
        await asyncio.to_thread(self._close_idle)

    def _close_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            close_quietly(conn)
