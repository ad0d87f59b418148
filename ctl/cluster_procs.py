"""`sluice cluster`: our processes, by pid and command line; the supervisor, seen from the
CLI; and `down` (the invariant in ctl/cluster.py).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from sluice.core.errors import ConfigError, Unavailable

from .cluster_config import Layout
from .cluster_state import (BACKOFF, EXITED, FAILED, RUNNING, STOPPED, Recorded, State, locked,
                            read_state, running, write_state)

POLL_S = 0.1


# ---------------------------------------------------------------------------------------------
# Processes: ours, by pid and command line
# ---------------------------------------------------------------------------------------------

def describe_exit(r: Recorded) -> str:
    """How r's last run ended ("exit code 1", "killed by SIGKILL", "exit status unknown")."""
    text = r.exit_text()
    if not text or text == "?":
        return "exit status unknown" if r.status in (EXITED, BACKOFF, FAILED) else ""
    return f"exit code {text}" if text.lstrip("-").isdigit() else f"killed by {text}"


def stop_process(r: Recorded, timeout: float) -> str:
    """SIGTERM, wait up to timeout, SIGKILL; by pid only and only while it is ours."""
    if not running(r):
        return "not running"
    with contextlib.suppress(ProcessLookupError):
        os.kill(r.pid, signal.SIGTERM)
    if _wait_gone(r, timeout):
        return "stopped"
    if running(r):
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.pid, signal.SIGKILL)
    return "killed" if _wait_gone(r, 10) else "still running"


def _wait_gone(r: Recorded, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not running(r):
            return True
        time.sleep(POLL_S)
    return not running(r)


def tail(path: str, n: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max(n, 1) * 400))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    return lines[-n:] if n > 0 else []


# ---------------------------------------------------------------------------------------------
# The supervisor, seen from the CLI
# ---------------------------------------------------------------------------------------------

def supervisor_running(state: State) -> bool:
    return state.supervisor is not None and running(state.supervisor)


def _start_supervisor(layout: Layout, state: State) -> None:
    """Start the cluster's supervisor; call with the state lock held and write `state` before
    releasing it (the supervisor runs only while the state file names it)."""
    argv = [sys.executable, "-m", "sluice.ctl.main", "cluster", "supervise", "--dir",
            str(layout.root)]
    log_path = layout.log("supervisor")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 cwd=layout.root)
    try:
        created = psutil.Process(popen.pid).create_time()
    except psutil.NoSuchProcess:
        created = 0.0
    # A long-lived caller (the demo, tests calling `up` in-process) must not keep it a zombie.
    threading.Thread(target=popen.wait, name="reap-supervisor", daemon=True).start()
    state.supervisor = Recorded("supervisor", "supervisor", popen.pid, created, argv, "",
                                str(log_path), str(layout.root))


def _ensure_supervisor(layout: Layout) -> State:
    with locked(layout):
        state = _existing(layout)
        if not supervisor_running(state):
            _start_supervisor(layout, state)
            write_state(layout, state)
    return state


def _existing(layout: Layout) -> State:
    state = read_state(layout)
    if state is None or not state.processes:
        raise ConfigError(f"no cluster in {layout.root}: `sluice cluster up` first")
    return state


def _want(layout: Layout, name: str, **changes: Any) -> Recorded:
    with locked(layout):
        state = _existing(layout)
        r = state.replace(name, **changes)
        write_state(layout, state)
    return r


def wait_started(layout: Layout, name: str, timeout: float) -> Recorded:
    """Wait until the supervisor has started `name` (after `_want(..., status=PENDING)`)."""
    end = time.monotonic() + timeout
    while True:
        state = _existing(layout)
        r = state.find(name)
        if r.status == RUNNING and running(r):
            return r
        if r.status in (EXITED, BACKOFF, FAILED):
            how = describe_exit(r)
            raise Unavailable(f"{name} exited during start-up{f' ({how})' if how else ''}; "
                              f"last lines of {r.log}:\n" + "\n".join(tail(r.log, 15)))
        if not supervisor_running(state):
            raise Unavailable(f"the cluster's supervisor is not running; see "
                              f"{layout.log('supervisor')}")
        if time.monotonic() > end:
            raise Unavailable(f"{name} not started after {timeout:.0f}s; see "
                              f"{layout.log('supervisor')}")
        time.sleep(POLL_S)


def wait_stopped(layout: Layout, name: str, timeout: float) -> Recorded:
    end = time.monotonic() + timeout
    while True:
        r = _existing(layout).find(name)
        if r.status == STOPPED and not running(r):
            return r
        if time.monotonic() > end:
            raise Unavailable(f"{name} (pid {r.pid}) not stopped after {timeout:.0f}s")
        time.sleep(POLL_S)


# ---------------------------------------------------------------------------------------------
# down
# ---------------------------------------------------------------------------------------------

def cmd_down(args: argparse.Namespace, layout: Layout) -> int:
    return down(layout)


def down(layout: Layout, quiet: bool = False) -> int:
    """Stop the supervisor, then every process the cluster in layout started (0: none is left)."""
    state = read_state(layout)
    if state is None:
        if not quiet:
            print(f"no cluster in {layout.root}")
        return 0
    return _down(layout, state.stop_timeout, quiet)


def _down(layout: Layout, timeout: float, quiet: bool = False) -> int:
    state = read_state(layout)
    if state is None:
        return 0
    if state.supervisor is not None:
        # First, so that nothing is restarted behind our back.
        outcome = stop_process(state.supervisor, timeout)
        if not quiet:
            print(f"  {'supervisor':<16} pid {state.supervisor.pid:<7} {outcome}")
    with locked(layout):
        state = read_state(layout) or state
    left = []
    for r in reversed(state.processes):
        if r.pid <= 0:
            continue
        outcome = stop_process(r, timeout)
        if not quiet:
            print(f"  {r.name:<16} pid {r.pid:<7} {outcome}")
        if outcome == "still running":
            left.append(r)
    # Keep the ports (a later `up` reuses them) but forget the pids: they are not ours any more.
    with locked(layout):
        state = read_state(layout) or state
        state.processes = [r for r in state.processes if r in left]
        state.supervisor = None
        write_state(layout, state)
    if left:
        print(f"sluice cluster down: still running: {', '.join(r.name for r in left)}",
              file=sys.stderr)
        return 1
    if not quiet:
        print("cluster down")
    return 0
