"""core/keywatch.py against a real etcd: a change is seen without polling, a quiet key costs no
Range request, and a watch lost to an etcd restart reads again and watches again."""
import asyncio
import time

from sluice.core.etcd import Etcd
from sluice.core.keywatch import KeyWatch


def _wait_due(w: KeyWatch, within: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        if w.wait(0.05):
            return time.monotonic() - t0
    return None


def test_key_and_prefix_changes(etcd):
    """A watched key is due at the first wait (the caller's first read), then only when it
    changed — not on every tick — or when `fallback` passed without a read."""
    c = Etcd(etcd.endpoint, timeout=2)
    try:
        key = KeyWatch(c, "/kw/leader", fallback=3.0)
        pre = KeyWatch(c, "/kw/nodes/", prefix=True, fallback=3.0)
        assert key.wait(0.05) and pre.wait(0.05)          # first read
        for _ in range(10):                               # quiet: ticks are not due
            assert not key.wait(0.05) and not pre.wait(0.05)
        c.put("/kw/leader", b"x")
        assert _wait_due(key, 2.0) is not None
        assert not pre.wait(0.05)                          # another key: not this prefix
        c.put("/kw/nodes/a/status", b"1")
        assert _wait_due(pre, 2.0) is not None
        c.delete("/kw/leader")                             # a lease ending deletes the key
        assert _wait_due(key, 2.0) is not None
        time.sleep(3.0)                                    # fallback: read even if quiet
        assert key.wait(0.01)
        key.cancel()
        pre.cancel()
    finally:
        c.close()


def test_etcd_restart_reads_again_and_watches_again(etcd):
    """A watch ended by an etcd restart makes the key due (the caller reads again); the next
    wait watches again, and a later change is seen through the new watch."""
    c = Etcd(etcd.endpoint, timeout=2)
    try:
        w = KeyWatch(c, "/kw/k", fallback=60.0)
        assert w.wait(0.05)
        etcd.restart()
        c.wait_ready(10)
        assert _wait_due(w, 10.0) is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:                 # until the new watch exists
            if not w.wait(0.2):
                break
        c.put("/kw/k", b"after")
        assert _wait_due(w, 3.0) is not None
        w.cancel()
    finally:
        c.close()


def test_async_wait(etcd):
    """wait_async wakes the event loop on a change, without a thread parked per waiter."""
    c = Etcd(etcd.endpoint, timeout=2)

    async def run() -> None:
        w = KeyWatch(c, "/kw/a", fallback=60.0)
        assert await w.wait_async(0.05)
        assert not await w.wait_async(0.1)
        await asyncio.to_thread(c.put, "/kw/a", b"1")
        t0 = time.monotonic()
        assert await w.wait_async(5.0)
        assert time.monotonic() - t0 < 2.0
        w.cancel()
    try:
        asyncio.run(run())
    finally:
        c.close()


def test_a_cancelled_waiter_ends_even_as_the_key_changes(etcd):
    """A task in wait_async ends when cancelled even if the change that wakes it lands in the
    same loop iteration (a node writing its own status as it stops): asyncio.wait_for on 3.11
    swallowed such a cancellation and the drainer never exited after going offline."""
    c = Etcd(etcd.endpoint, timeout=2)

    async def follow(w: KeyWatch) -> None:
        while True:
            await w.wait_async(0.05)

    async def run() -> None:
        w = KeyWatch(c, "/kw/c", fallback=60.0)
        await w.wait_async(0.05)
        for _ in range(50):
            task = asyncio.create_task(follow(w))
            await asyncio.sleep(0)
            w.wake()
            await asyncio.sleep(0)   # the flag's set() is scheduled: it and the cancel race
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2)
            assert task in done, "a cancelled waiter kept running"
        w.cancel()
    try:
        asyncio.run(run())
    finally:
        c.close()


def test_a_change_consumed_before_its_loop_wakeup_does_not_make_the_waiter_spin(etcd):
    """The watch thread flags a change and schedules the loop's wakeup; the caller's read can
    consume the change (`due`) before that wakeup runs. The late wakeup must not leave the
    waiter returning at once without suspending: a follower loop then spun on the event loop
    until `fallback` passed, again after every fallback read (drainers stalled ~5 s at a
    time, e2e bench)."""
    c = Etcd(etcd.endpoint, timeout=2)

    async def run() -> None:
        w = KeyWatch(c, "/kw/spin", fallback=60.0)
        assert await w.wait_async(0.05)                     # first read
        w.wake()            # flags the change, schedules the loop's wakeup (as the watch does)
        assert w.due()      # the caller consumes the change before that wakeup ran...
        await asyncio.sleep(0)                              # ...which runs now
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)
        t = asyncio.create_task(ticker())
        t0 = time.monotonic()
        waits = 0
        while time.monotonic() - t0 < 0.5 and waits < 1000:
            assert not await w.wait_async(0.1)
            waits += 1
        t.cancel()
        assert waits <= 6, f"{waits} waits returned in 0.5 s: the waiter does not wait"
        assert ticks >= 10, f"the loop ran other tasks {ticks} times in 0.5 s"
        w.cancel()
    try:
        asyncio.run(run())
    finally:
        c.close()
