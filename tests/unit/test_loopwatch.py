"""core/loopwatch.py: a blocked event loop is reported while it is blocked, with the blocking
call's stack, and once more with how long it lasted when it runs again; a busy but running loop
is not."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from sluice.core.loopwatch import LoopWatch, watched

pytestmark = pytest.mark.timeout(30)


def block_the_loop_in_a_synchronous_call(seconds: float) -> None:
    time.sleep(seconds)


def test_a_blocked_loop_is_reported_with_the_blocking_stack(caplog: pytest.LogCaptureFixture) -> None:
    lasted: list[float] = []

    async def main() -> int:
        watch = LoopWatch("test", threshold=0.5, tick=0.05, on_stall=lasted.append).start()
        try:
            await asyncio.sleep(0.3)
            block_the_loop_in_a_synchronous_call(1.2)
            await asyncio.sleep(0.4)       # the watcher sees the loop run again
            return watch.stalls
        finally:
            watch.stop()

    with caplog.at_level(logging.WARNING, logger="sluice.core.loopwatch"):
        stalls = asyncio.run(main())
    assert stalls == 1 and len(lasted) == 1 and 1.0 <= lasted[0] <= 2.0, lasted
    text = caplog.text
    assert "test: event loop blocked for" in text
    assert "block_the_loop_in_a_synchronous_call" in text, "the warning names the blocking call"
    assert "event loop ran again after" in text


def test_a_running_loop_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    async def busy() -> str:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            await asyncio.sleep(0)           # busy, but callbacks keep running
        return "done"

    with caplog.at_level(logging.WARNING, logger="sluice.core.loopwatch"):
        assert asyncio.run(watched("busy", busy())) == "done"
    assert "blocked" not in caplog.text
