"""Failpoints: the SLUICE_FAILPOINTS grammar and what each action does."""
from __future__ import annotations

import asyncio
import os
import random
import subprocess
import time

import pytest

from sluice.core import failpoint
from sluice.core.errors import ConfigError, FailpointError
from tests.support.procs import PYTHON, REPO


@pytest.fixture(autouse=True)
def clean() -> None:
    yield
    for name in ("fp-a", "fp-b", "fp-c"):
        failpoint.disable(name)


def fires(name: str, n: int) -> list[bool]:
    """Hit failpoint `name` n times; which hits raised."""
    out = []
    for _ in range(n):
        try:
            failpoint.inject(name)
            out.append(False)
        except FailpointError:
            out.append(True)
    return out


def test_grammar() -> None:
    pts = failpoint.parse(" a=exit(137) ; b=sleep(3000);c=25%2*raise(boom)@3; d=off;e=pause;f=12.5%exit")
    assert set(pts) == {"a", "b", "c", "d", "e", "f"}
    assert (pts["a"].action, pts["a"].arg, pts["a"].pct, pts["a"].count, pts["a"].start) == \
        ("exit", "137", 100.0, None, 1)
    assert (pts["b"].action, pts["b"].arg) == ("sleep", "3000")
    assert (pts["c"].action, pts["c"].arg, pts["c"].pct, pts["c"].count, pts["c"].start) == \
        ("raise", "boom", 25.0, 2, 3)
    assert pts["d"].action == "off" and pts["e"].action == "pause"
    assert pts["f"].pct == 12.5 and pts["f"].arg == ""
    assert failpoint.parse("") == {} and failpoint.parse(" ; ") == {}


@pytest.mark.parametrize("bad", ["a", "a=", "=exit(1)", "a=explode", "a=exit(1", "a=3x*exit",
                                 "a=exit(1)@", "a=%exit", "a=sleep(1)@x"])
def test_bad_terms_name_the_term(bad: str) -> None:
    with pytest.raises(ConfigError) as e:
        failpoint.parse(f"ok=off;{bad}")
    assert repr(bad) in str(e.value) and "SLUICE_FAILPOINTS" in str(e.value)


def test_raise_with_message_and_off() -> None:
    failpoint.enable("fp-a", "raise(disk on fire)")
    with pytest.raises(FailpointError, match="disk on fire"):
        failpoint.inject("fp-a")
    failpoint.enable("fp-a", "off")
    failpoint.inject("fp-a")
    assert failpoint.active("fp-a")
    failpoint.disable("fp-a")
    assert not failpoint.active("fp-a")
    failpoint.inject("fp-a")
    failpoint.inject("never-configured")


def test_count_fires_at_most_n_times() -> None:
    failpoint.enable("fp-a", "2*raise")
    assert fires("fp-a", 5) == [True, True, False, False, False]


def test_start_at_kth_hit() -> None:
    failpoint.enable("fp-a", "raise@3")
    assert fires("fp-a", 5) == [False, False, True, True, True]
    failpoint.enable("fp-b", "2*raise@2")
    assert fires("fp-b", 5) == [False, True, True, False, False]


def test_probability() -> None:
    random.seed(7)
    failpoint.enable("fp-a", "0%raise")
    assert not any(fires("fp-a", 200))
    failpoint.enable("fp-b", "100%raise")
    assert all(fires("fp-b", 50))
    failpoint.enable("fp-c", "30%raise")
    n = sum(fires("fp-c", 2000))
    assert 450 < n < 750, n


def test_sleep_blocks_the_thread_for_ms() -> None:
    failpoint.enable("fp-a", "1*sleep(200)")
    t = time.monotonic()
    failpoint.inject("fp-a")
    assert 0.19 <= time.monotonic() - t < 2
    t = time.monotonic()
    failpoint.inject("fp-a")  # count used up
    assert time.monotonic() - t < 0.1


def test_async_sleep_does_not_block_the_loop() -> None:
    failpoint.enable("fp-a", "sleep(300)")

    async def main() -> tuple[float, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        task = asyncio.create_task(ticker())
        t = time.monotonic()
        await failpoint.ainject("fp-a")
        elapsed = time.monotonic() - t
        task.cancel()
        return elapsed, ticks

    elapsed, ticks = asyncio.run(main())
    assert elapsed >= 0.29 and ticks >= 5


def test_async_raise() -> None:
    failpoint.enable("fp-a", "raise(x)")
    with pytest.raises(FailpointError):
        asyncio.run(failpoint.ainject("fp-a"))


def run_child(spec: str, code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, failpoint.ENV: spec}
    env.pop("PYTHONUNBUFFERED", None)  # so "no flush" is observable
    return subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_exit_from_the_environment_is_immediate() -> None:
    """exit(code) ends the process at that point: no cleanup, no flush (like kill -9 there)."""
    code = ("import atexit, sys\n"
            "from sluice.core import failpoint\n"
            "atexit.register(lambda: print('cleanup ran', flush=True))\n"
            "sys.stdout.write('buffered, never flushed')\n"
            "failpoint.inject('before-ack')\n"
            "print('not reached')\n")
    r = run_child("other=off;before-ack=exit(42)", code)
    assert r.returncode == 42
    assert r.stdout == ""
    r = run_child("before-ack=2*exit(3)@2", "from sluice.core import failpoint\n"
                  "failpoint.inject('before-ack'); print('first hit passes', flush=True)\n"
                  "failpoint.inject('before-ack'); print('not reached')\n")
    assert r.returncode == 3 and r.stdout == "first hit passes\n"


def test_pause_holds_the_process_until_killed() -> None:
    env = {**os.environ, failpoint.ENV: "hold=pause"}
    p = subprocess.Popen([PYTHON, "-c", "from sluice.core import failpoint\n"
                          "print('at point', flush=True); failpoint.inject('hold'); print('not reached')"],
                         env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert p.stdout.readline() == "at point\n"  # type: ignore[union-attr]
        time.sleep(0.3)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait(10)
    assert p.returncode == -9


def test_a_bad_environment_fails_at_import() -> None:
    r = run_child("x=explode", "import sluice.core.failpoint")
    assert r.returncode != 0 and "cannot parse failpoint term 'x=explode'" in r.stderr
