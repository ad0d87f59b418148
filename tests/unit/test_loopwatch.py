"""core/loopwatch.py: a blocked event loop is reported while it is blocked, with the blocking
call's stack, and once more with how long it lasted when it runs again; a busy but running loop
is not."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

import threading

from sluice.core.loopwatch import LoopWatch, busiest, thread_cpu, watched

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


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_thread_that_used_the_cpu_during_a_stall_is_named(
        caplog: pytest.LogCaptureFixture) -> None:
    """The loop waits on a thread that burns CPU (as a loop starved of the GIL would): the
    recovery message names that thread, and the warning shows where the other threads are."""
    burnt, release = threading.Event(), threading.Event()

    def burner() -> None:
        burn(1.0)
        burnt.set()
        release.wait(10)      # alive until the recovery is logged: its /proc entry is read then

    async def main() -> None:
        watch = LoopWatch("test", threshold=0.3, tick=0.05).start()
        worker = threading.Thread(target=burner, name="cpu-burner")
        try:
            await asyncio.sleep(0.2)
            worker.start()
            burnt.wait(10)                 # blocks the loop while the burner runs
            await asyncio.sleep(0.3)
        finally:
            release.set()
            worker.join()
            watch.stop()

    with caplog.at_level(logging.WARNING, logger="sluice.core.loopwatch"):
        asyncio.run(main())
    text = caplog.text
    assert "other threads are in:" in text and "cpu-burner: burn (test_loopwatch.py" in text, text
    ran_again = [r.getMessage() for r in caplog.records if "ran again" in r.getMessage()]
    assert len(ran_again) == 1, ran_again
    assert "CPU seconds by thread since the warning: cpu-burner/" in ran_again[0], ran_again


def test_thread_cpu_reads_each_threads_own_time() -> None:
    seen: dict[str, float] = {}

    def counted() -> None:
        burn(0.3)
        seen.update(thread_cpu())

    t = threading.Thread(target=counted, name="counted")
    t.start()
    t.join()
    mine = [v for k, v in seen.items() if k.startswith("counted/")]
    assert len(mine) == 1 and 0.25 <= mine[0] <= 1.0, seen
    assert busiest({"a/1": 1.0, "b/2": 0.0}, {"a/1": 1.5, "b/2": 0.2}) == "a/1 0.50, b/2 0.20"


def test_a_running_loop_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    async def busy() -> str:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            await asyncio.sleep(0)           # busy, but callbacks keep running
        return "done"

    with caplog.at_level(logging.WARNING, logger="sluice.core.loopwatch"):
        assert asyncio.run(watched("busy", busy())) == "done"
    assert "blocked" not in caplog.text
