"""The cluster supervisor's restart policies, on real short-lived processes (`sh -c ...`)."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sluice.ctl.cluster_config import Layout
from sluice.ctl.cluster_state import (BACKOFF, EXITED, FAILED, PENDING, RUNNING, STOPPED, Recorded,
                                      State, running)
from sluice.ctl.supervisor import Supervisor


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    s = Supervisor(Layout(tmp_path))
    yield s
    for popen in s.children.values():      # nothing a test started survives it
        if popen.poll() is None:
            popen.kill()
            popen.wait(5)


def one(tmp_path: Path, cmd: str, restart: str, **params: float) -> State:
    argv = ["sleep", cmd.split()[-1]] if cmd.startswith("sleep") else ["sh", "-c", cmd]
    r = Recorded("p", "test", 0, 0.0, argv, "", str(tmp_path / "p.log"),
                 str(tmp_path / "p"), restart=restart, want="run", status=PENDING)
    return State(1, "", processes=[r], **{"max_attempts": 2, "delay": 0.05, "max_delay": 0.2,
                                           "window": 30.0, **params})  # type: ignore[arg-type]


def drive(sup: Supervisor, state: State, until: Callable[[Recorded], bool],
          timeout: float = 10.0) -> Recorded:
    """Run the supervisor's ticks on `state` until its process satisfies `until`."""
    end = time.monotonic() + timeout
    while True:
        state.processes[0] = sup.step(state.processes[0], state, time.time())
        if until(state.processes[0]):
            return state.processes[0]
        assert time.monotonic() < end, f"stuck at {state.processes[0]}"
        time.sleep(0.02)


def test_on_failure_restarts_with_backoff_then_gives_up_after_max_attempts(
        sup: Supervisor, tmp_path: Path) -> None:
    """on-failure restarts a process that exits non-zero, waiting longer each time, and gives
    up after max-attempts quick failures in a row, keeping the last exit code."""
    state = one(tmp_path, "exit 3", "on-failure")
    delays = []
    r = drive(sup, state, lambda r: r.status == BACKOFF)
    delays.append(r.next_start - time.time())
    r = drive(sup, state, lambda r: r.status == BACKOFF and r.failures == 2)
    delays.append(r.next_start - time.time())
    r = drive(sup, state, lambda r: r.status == FAILED)
    assert (r.restarts, r.failures, r.last_exit, r.exit_known) == (2, 3, 3, True)
    assert r.exit_text() == "3"
    assert 0.02 < delays[0] <= 0.05 < delays[1] <= 0.1, delays     # 0.05 s, then doubled
    assert drive(sup, state, lambda r: True) == r                    # failed stays down


def test_on_failure_leaves_a_clean_exit_down_and_always_restarts_it(
        sup: Supervisor, tmp_path: Path) -> None:
    """A clean exit (0) is not a failure for on-failure; `always` restarts it anyway."""
    r = drive(sup, one(tmp_path, "exit 0", "on-failure"), lambda r: r.status == EXITED)
    assert (r.restarts, r.last_exit) == (0, 0)
    r = drive(sup, one(tmp_path, "exit 0", "always"), lambda r: r.restarts == 2)
    assert r.last_exit == 0


def test_kill_9_is_a_failure_and_policy_no_keeps_it_dead(sup: Supervisor, tmp_path: Path) -> None:
    """A process killed by a signal ended badly: `no` leaves it dead, showing the signal;
    `on-failure` starts it again under a new pid."""
    state = one(tmp_path, "sleep 30", "no")
    r = drive(sup, state, lambda r: r.status == RUNNING and running(r))
    os.kill(r.pid, signal.SIGKILL)
    r = drive(sup, state, lambda r: r.status == EXITED)
    assert (r.last_exit, r.exit_text(), r.restarts) == (-9, "SIGKILL", 0)

    state = one(tmp_path, "sleep 30", "on-failure")
    first = drive(sup, state, lambda r: r.status == RUNNING and running(r))
    os.kill(first.pid, signal.SIGKILL)
    r = drive(sup, state, lambda r: r.restarts == 1 and r.status == RUNNING and running(r))
    assert r.pid != first.pid and r.exit_text() == "SIGKILL"


def test_stop_is_never_undone_by_the_policy(sup: Supervisor, tmp_path: Path) -> None:
    """want = stop: SIGTERM, recorded as stopped with its exit, and not restarted even under
    `always`."""
    state = one(tmp_path, "sleep 30", "always")
    r = drive(sup, state, lambda r: r.status == RUNNING and running(r))
    state.processes[0] = r.__class__(**{**r.__dict__, "want": "stop"})
    r = drive(sup, state, lambda r: r.status == STOPPED)
    assert (r.last_exit, r.exit_text()) == (-15, "SIGTERM")
    time.sleep(0.3)
    r = drive(sup, state, lambda r: True)
    assert r.status == STOPPED and not running(r) and r.restarts == 0
