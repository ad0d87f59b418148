"""The supervisor of a local cluster: `sluice cluster supervise --dir DIR` (started by `up`).

One detached process per cluster dir. It starts the processes the CLI wants running, waits on
them, restarts one that ends according to its restart policy (`no`, `on-failure`, `always`,
exponential backoff from `delay` up to `max-delay`, at most `max-attempts` failures in a row,
each within `window` seconds of its start), stops the ones the CLI wants stopped (SIGTERM, then
SIGKILL after stop-timeout), and records what it did in the state file (`cluster_state`).

It outlives the CLI that started it; the processes outlive it (each has its own session): a
supervisor killed by kill -9 leaves the cluster running, and the next `up` starts a new one
that adopts the running processes (their exit codes are then unknown: they are not its
children) and starts the missing ones.

Invariant: only the supervisor starts a process of the cluster, and it signals only processes
whose pid `running` confirms as ours; it exits when the state file no longer names it as the
cluster's supervisor (`down` stops it first, then the processes by pid).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from sluice.core.log import kv

from .cluster_config import Layout
from .cluster_state import (BACKOFF, EXITED, FAILED, PENDING, RUNNING, STOPPED, STOPPING, Recorded,
                            State, locked, read_state, running, write_state)

log = logging.getLogger("sluice.ctl.supervisor")

TICK_S = 0.25


def spawn(r: Recorded, note: str = "") -> tuple[subprocess.Popen[bytes], float]:
    """Start r's command line detached (its own session), stdout and stderr into its log."""
    # Private, as etcd wants its data dir (it warns at every start otherwise).
    Path(r.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    Path(r.log).parent.mkdir(parents=True, exist_ok=True)
    with open(r.log, "ab") as out:
        out.write(f"---- {time.strftime('%Y-%m-%dT%H:%M:%S')} sluice cluster starts "
                  f"{r.name}{note}\n".encode())
        out.flush()
        popen = subprocess.Popen(list(r.argv), stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, cwd=r.data_dir)
    try:
        created = psutil.Process(popen.pid).create_time()
    except psutil.NoSuchProcess:
        created = 0.0
    return popen, created


class Supervisor:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        log.info("supervisor started", extra=kv(pid=os.getpid(), dir=str(self.layout.root)))
        while not self.stopping:
            with locked(self.layout):
                state = read_state(self.layout)
                if state is None or state.supervisor is None or state.supervisor.pid != os.getpid():
                    log.info("no longer the cluster's supervisor; exiting")
                    break
                changed = False
                now = time.time()
                for i, r in enumerate(state.processes):
                    new = self.step(r, state, now)
                    if new != r:
                        state.processes[i] = new
                        changed = True
                if changed:
                    write_state(self.layout, state)
            self._reap_forgotten(state)
            time.sleep(TICK_S)
        log.info("supervisor stopped; the processes keep running")
        return 0

    def _on_term(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def _reap_forgotten(self, state: State | None) -> None:
        """Reap children the state no longer names (after `down`), so none stays a zombie."""
        named = {r.pid for r in state.processes} if state is not None else set()
        for pid, popen in list(self.children.items()):
            if pid not in named and popen.poll() is not None:
                del self.children[pid]

    def _exit_code(self, r: Recorded) -> int | None:
        popen = self.children.get(r.pid)
        if popen is None:
            return None
        code = popen.poll()
        if code is not None:
            del self.children[r.pid]
        return code

    def step(self, r: Recorded, state: State, now: float) -> Recorded:
        """What to do with one process this tick; returns its new record."""
        child = self.children.get(r.pid)
        # Its own child: Popen knows best (an exec'd command line no longer matches argv).
        alive = child.poll() is None if child is not None else running(r)
        if r.want == "stop":
            if alive:
                if not r.stop_sent:
                    self._signal(r, signal.SIGTERM)
                    return dataclasses.replace(r, status=STOPPING, stop_sent=now)
                if now - r.stop_sent > state.stop_timeout:
                    self._signal(r, signal.SIGKILL)
                return r
            if r.status == STOPPED:
                return r
            code = self._exit_code(r)
            if r.status in (RUNNING, STOPPING):
                log.info("process stopped", extra=kv(process=r.name, pid=r.pid, exit=code))
                return dataclasses.replace(r, status=STOPPED, last_exit=code,
                                           exit_known=code is not None, stop_sent=0.0)
            return dataclasses.replace(r, status=STOPPED, stop_sent=0.0)

        if alive:
            if r.status != RUNNING:        # adopted from a previous supervisor
                return dataclasses.replace(r, status=RUNNING)
            if r.failures and now - r.started_at >= state.window:
                return dataclasses.replace(r, failures=0)
            return r
        if r.status in (RUNNING, STOPPING):
            return self._ended(r, state, now)
        if r.status == PENDING or (r.status == BACKOFF and now >= r.next_start):
            return self._start(r, now)
        return r                           # EXITED, FAILED, STOPPED, or BACKOFF not due yet

    def _ended(self, r: Recorded, state: State, now: float) -> Recorded:
        code = self._exit_code(r)
        # An adopted process's exit code is unknown: on-failure takes it as a failure.
        again = r.restart == "always" or (r.restart == "on-failure" and code != 0)
        failures = (0 if now - r.started_at >= state.window else r.failures) + 1
        ended = dataclasses.replace(r, last_exit=code, exit_known=code is not None,
                                    failures=failures, stop_sent=0.0)
        fields = dict(process=r.name, pid=r.pid, exit=code, policy=r.restart, failures=failures)
        if not again:
            log.warning("process exited; its restart policy keeps it down", extra=kv(**fields))
            return dataclasses.replace(ended, status=EXITED)
        if state.max_attempts and failures > state.max_attempts:
            log.error("process keeps failing; giving up (`sluice cluster start` restarts it)",
                      extra=kv(**fields, max_attempts=state.max_attempts))
            return dataclasses.replace(ended, status=FAILED)
        delay = min(state.delay * 2 ** (failures - 1), state.max_delay)
        log.warning("process exited; restarting", extra=kv(**fields, delay_s=delay))
        return dataclasses.replace(ended, status=BACKOFF, next_start=now + delay)

    def _start(self, r: Recorded, now: float) -> Recorded:
        restart = r.status == BACKOFF
        note = f" (restart {r.restarts + 1} after exit {r.exit_text() or '?'})" if restart else ""
        try:
            popen, created = spawn(r, note)
        except OSError as e:
            log.error("cannot start process", extra=kv(process=r.name, error=str(e)))
            return dataclasses.replace(r, status=EXITED, last_exit=127, exit_known=True)
        self.children[popen.pid] = popen
        log.info("process started", extra=kv(process=r.name, pid=popen.pid, restart=restart))
        return dataclasses.replace(r, pid=popen.pid, create_time=created, status=RUNNING,
                                   started_at=now, stop_sent=0.0,
                                   restarts=r.restarts + (1 if restart else 0))

    def _signal(self, r: Recorded, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.pid, sig)


def supervise(layout: Layout) -> int:
    from sluice.core import log as slog
    slog.setup("info", str(layout.log("supervisor")), process="supervisor")
    return Supervisor(layout).run()
