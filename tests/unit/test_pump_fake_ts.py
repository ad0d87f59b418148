"""A pump's heartbeat uses the timestamp its last TSO check fetched when that is recent, instead
of one more TSO request (pump/loops.py FAKE_REUSE_S); an idle pump fetches its own."""
from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from types import SimpleNamespace

from sluice.proto import sluice_pb2 as pb
from sluice.pump import loops
from sluice.pump.storage.storage import Storage


class CountingTSO:
    """Both faces of the TSO a pump has: `fresh_ts` (the stager's check, blocking) and
    `get_ts` (the heartbeat's client); each answer is 1,000 above the last."""

    def __init__(self) -> None:
        self.last = 0
        self.checks = 0
        self.heartbeat_fetches = 0

    def fresh_ts(self) -> int:
        self.checks += 1
        self.last += 1000
        return self.last

    async def get_ts(self) -> int:
        self.heartbeat_fetches += 1
        self.last += 1000
        return self.last


def test_a_heartbeat_reuses_a_recent_check_and_an_idle_one_fetches(tmp_path: Path) -> None:
    """After a write's TSO check (ts 1000), the next heartbeat's fake binlog is written at 1000
    with no TSO request of its own; once the check is older than FAKE_REUSE_S, the heartbeat
    fetches a fresh ts (2000) — and never writes the same fake ts twice."""
    st = Storage.open(tmp_path / "p")
    tso = CountingTSO()
    st.tso = tso   # type: ignore[assignment]
    written: list[int] = []
    real_write = st.write

    async def spy(payloads: list[bytes], from_client: bool = False) -> int:
        for p in payloads:
            b = pb.Binlog.FromString(p)
            if b.tp == pb.FAKE:
                written.append(b.commit_ts)
        return await real_write(payloads, from_client)

    st.write = spy  # type: ignore[method-assign]
    cfg = SimpleNamespace(pull_heartbeat_interval=0.05, heartbeat_interval=0.05)

    async def run() -> None:
        await real_write([pb.Binlog(tp=pb.PREWRITE, start_ts=100, prewrite_value=b"v",
                                    producer_id="p", producer_epoch=1).SerializeToString()])
        await real_write([pb.Binlog(tp=pb.COMMIT, start_ts=100, commit_ts=500, producer_id="p",
                                    producer_epoch=1).SerializeToString()])
        assert tso.checks == 1   # the prewrite's start_ts asked; the commit's 500 < 1000 did not
        task = asyncio.create_task(loops.fake_binlog_loop(
            cfg, tso, st, starting=lambda: False, pulled=lambda: True))  # type: ignore[arg-type]
        t0 = time.monotonic()
        while len(written) < 3 and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(run())
        assert written[0] == 1000, written               # the check's ts, no request
        assert written[1:3] == [2000, 3000], written     # stale or used: fetched
        assert tso.heartbeat_fetches >= 2
        assert len(set(written)) == len(written)
    finally:
        st.close()
