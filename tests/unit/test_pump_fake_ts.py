"""A pump's heartbeat (pump/loops.py fake_binlog_loop): it uses the timestamp its last TSO check
fetched when that is recent, instead of one more TSO request (FAKE_REUSE_S), and an idle pump
fetches its own; while commits keep the served watermark fresh it writes no fake at all, and
once they stop the watermark is again never older than the interval plus a check."""
from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sluice.core.ts import compose, physical_ms
from sluice.proto import sluice_pb2 as pb
from sluice.pump import loops
from sluice.pump.storage.options import StorageConfig
from sluice.pump.storage.storage import Storage

SECOND = compose(1000)


class CountingTSO:
    """Both faces of the TSO a pump has: `fresh_ts` (the stager's check, blocking) and
    `get_ts` (the heartbeat's client); each answer is one second (of physical time) above the
    last, starting from `start`."""

    def __init__(self, start: int) -> None:
        self.last = start
        self.checks = 0
        self.heartbeat_fetches = 0

    def fresh_ts(self) -> int:
        self.checks += 1
        self.last += SECOND
        return self.last

    async def get_ts(self) -> int:
        self.heartbeat_fetches += 1
        self.last += SECOND
        return self.last


class ClockTSO:
    """A TSO on the wall clock: every answer is now (ms) with a logical counter, increasing."""

    def __init__(self) -> None:
        self.last = 0

    def fresh_ts(self) -> int:
        self.last = max(self.last + 1, compose(int(time.time() * 1000)))
        return self.last

    async def get_ts(self) -> int:
        return self.fresh_ts()


def _spy_fakes(st: Storage) -> list[tuple[float, int]]:
    """(monotonic s, ts) of every fake binlog written to st from now on."""
    written: list[tuple[float, int]] = []
    real_write = st.write

    async def spy(payloads: list[bytes], from_client: bool = False) -> int:
        for p in payloads:
            b = pb.Binlog.FromString(p)
            if b.tp == pb.FAKE:
                written.append((time.monotonic(), b.commit_ts))
        return await real_write(payloads, from_client)

    st.write = spy  # type: ignore[method-assign]
    return written


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _txn(start_ts: int, commit_ts: int) -> tuple[bytes, bytes]:
    return (pb.Binlog(tp=pb.PREWRITE, start_ts=start_ts, prewrite_value=b"v", producer_id="p",
                      producer_epoch=1).SerializeToString(),
            pb.Binlog(tp=pb.COMMIT, start_ts=start_ts, commit_ts=commit_ts, producer_id="p",
                      producer_epoch=1).SerializeToString())


@pytest.mark.timeout(30)
def test_a_heartbeat_reuses_a_recent_check_and_an_idle_one_fetches(tmp_path: Path) -> None:
    """After a write's TSO check (base + 1 s), the next heartbeat's fake binlog is written at
    that ts with no TSO request of its own (the watermark, at the commit, trails it by a
    second); later ones fetch a fresh ts — and never write the same fake ts twice."""
    base = compose(1_000_000)
    st = Storage.open(tmp_path / "p")
    tso = CountingTSO(base)
    st.tso = tso   # type: ignore[assignment]
    cfg = SimpleNamespace(pull_heartbeat_interval=0.05, heartbeat_interval=0.05)

    async def run() -> list[int]:
        prewrite, commit = _txn(base + 100, base + 500)
        await st.write([prewrite])
        await st.write([commit])
        assert tso.checks == 1   # the prewrite's start_ts asked; the commit's ts did not
        written = _spy_fakes(st)
        task = asyncio.create_task(loops.fake_binlog_loop(
            cfg, tso, st, starting=lambda: False, pulled=lambda: True))  # type: ignore[arg-type]
        t0 = time.monotonic()
        while len(written) < 3 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.01)
        await _stop(task)
        return [t for _, t in written]

    try:
        written = asyncio.run(run())
        assert written[0] == base + SECOND, written                    # the check's ts
        assert written[1:3] == [base + 2 * SECOND, base + 3 * SECOND], written  # fetched
        assert tso.heartbeat_fetches >= 2
        assert len(set(written)) == len(written)
    finally:
        st.close()


@pytest.mark.timeout(60)
def test_commits_that_keep_the_watermark_fresh_leave_no_fake_to_write(tmp_path: Path) -> None:
    """A transaction every 50 ms for 3 s with the pulled interval at 1 s: no fake binlog is
    written (before: one per interval, three or four); once the commits stop, the heartbeat
    writes fakes again, the first within the interval plus a check. Throughout, the served
    watermark trails the clock by less than the interval plus 0.5 s (slack for a loaded
    machine; the writes skip fsync, which this does not test)."""
    interval = 1.0
    st = Storage.open(tmp_path / "p", StorageConfig(sync=False, stop_write_at_available_space=0))
    tso = ClockTSO()
    st.tso = tso   # type: ignore[assignment]
    cfg = SimpleNamespace(pull_heartbeat_interval=interval, heartbeat_interval=interval)

    async def run() -> tuple[list[tuple[float, int]], float, float]:
        # A first commit, so the watermark starts fresh rather than at 0.
        await st.write(list(_txn(tso.fresh_ts(), tso.fresh_ts())))
        written = _spy_fakes(st)
        worst = 0.0

        async def watch() -> None:
            nonlocal worst
            while True:
                age = time.time() - physical_ms(st.served_watermark) / 1000.0
                worst = max(worst, age)
                await asyncio.sleep(0.02)

        heartbeat = asyncio.create_task(loops.fake_binlog_loop(
            cfg, tso, st, starting=lambda: False, pulled=lambda: True))  # type: ignore[arg-type]
        watcher = asyncio.create_task(watch())
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:
            # A producer's timestamps come from the TSO: the stager checks each against a
            # fresh one (the check the heartbeat measures the watermark's age from).
            start_ts = await tso.get_ts()
            await st.write(list(_txn(start_ts, await tso.get_ts())))
            await asyncio.sleep(0.05)
        stopped = time.monotonic()
        await asyncio.sleep(2.0)
        await _stop(heartbeat)
        await _stop(watcher)
        return written, stopped, worst

    try:
        written, stopped, worst = asyncio.run(run())
        during = [t for t, _ in written if t < stopped]
        after = [t for t, _ in written if t >= stopped]
        assert during == [], f"{len(during)} fakes while commits kept the watermark fresh"
        assert after, "no fake after the commits stopped"
        assert after[0] - stopped < interval + 0.5, after[0] - stopped
        assert worst < interval + 0.5, worst
    finally:
        st.close()
