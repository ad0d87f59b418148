"""The state file of a local cluster (`cluster.json`): what runs, what should run, how it ended.

Two kinds of writer share the file: the CLI (`up`, `stop`, `start`, `restart`, `down`) says what
each process should do (`want`), and the cluster's supervisor (`sluice.ctl.supervisor`) records
what it did (pid, start time, restarts, last exit code). Every read-modify-write holds an
exclusive lock on `cluster.lock` and replaces the file atomically, so neither loses the other's
change and a reader never sees half a file.

Invariant: a recorded pid is trusted only while that pid still runs the recorded command line
with the recorded start time (`running`): a reused pid is never signalled nor counted as ours.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from sluice.core.errors import ConfigError
from sluice.core.tls import SecurityConfig

from .cluster_config import Layout

STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)       # version 1 had no supervision fields: they take their defaults

# Restart policies (compose's `restart`): never, after a failed exit, after any exit.
RESTART_POLICIES = ("no", "on-failure", "always")

# What the supervisor last did with a process (`Recorded.status`).
PENDING = "pending"              # the CLI asked for a start; the supervisor has not started it yet
RUNNING = "running"
STOPPING = "stopping"            # SIGTERM sent after `stop`/`restart`; SIGKILL after stop-timeout
STOPPED = "stopped"              # stopped on purpose (or never started): not restarted
EXITED = "exited"                # ended and its policy says no restart: dead until start/up
BACKOFF = "backoff"              # ended; restarted at next_start
FAILED = "failed"                # gave up after max-attempts quick failures in a row


@dataclass(frozen=True)
class Recorded:
    """One process of the cluster as the state file keeps it."""

    name: str
    kind: str
    pid: int
    create_time: float           # psutil's start time: with argv, tells our pid from a reused one
    argv: list[str]
    addr: str
    log: str
    data_dir: str
    config_path: str = ""
    metrics_addr: str = ""
    node_id: str = ""
    standby: bool = False
    restart: str = "on-failure"  # its restart policy
    want: str = "run"            # "run" | "stop": what the CLI asked for
    status: str = RUNNING
    restarts: int = 0            # restarts by the supervisor after an exit
    failures: int = 0            # exits in a row, each within restart-window of its start
    last_exit: int | None = None  # return code of its last run (negative: killed by that signal)
    exit_known: bool = False     # False: never ended, or ended while no supervisor watched it
    started_at: float = 0.0      # wall-clock time of its last start
    next_start: float = 0.0      # BACKOFF: wall-clock time of the next start
    stop_sent: float = 0.0       # STOPPING: when SIGTERM was sent

    def exit_text(self) -> str:
        """Its last exit as status shows it: "0", "1", "SIGKILL", "?" (unknown) or ""."""
        if not self.exit_known:
            return "?" if self.status in (EXITED, BACKOFF, FAILED) else ""
        code = self.last_exit
        if code is None:
            return ""
        if code < 0:
            import signal
            try:
                return signal.Signals(-code).name
            except ValueError:
                return f"signal {-code}"
        return str(code)


@dataclass
class State:
    cluster_id: int
    etcd: str
    security: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    stop_timeout: float = 15.0
    processes: list[Recorded] = field(default_factory=list)
    supervisor: Recorded | None = None
    # Restart policy parameters (cluster.toml [restart-policy]).
    max_attempts: int = 5
    delay: float = 1.0
    max_delay: float = 30.0
    window: float = 30.0
    start_timeout: float = 60.0

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["version"] = STATE_VERSION
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str, where: str) -> "State":
        try:
            d = json.loads(text)
            if d.pop("version", None) not in READABLE_VERSIONS:
                raise ValueError(f"state version is not {STATE_VERSION}")
            d["processes"] = [Recorded(**p) for p in d.get("processes", [])]
            if d.get("supervisor"):
                d["supervisor"] = Recorded(**d["supervisor"])
            return cls(**d)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{where}: not a cluster state file ({e}); remove it after making "
                              "sure none of its processes runs") from None

    def security_config(self) -> SecurityConfig:
        return SecurityConfig(**{k.replace("-", "_"): v for k, v in self.security.items()})

    def find(self, name: str) -> Recorded:
        for r in self.processes:
            if r.name == name:
                return r
        known = ", ".join(r.name for r in self.processes) or "none"
        raise ConfigError(f"no process {name!r} in this cluster (known: {known})")

    def replace(self, name: str, **changes: Any) -> Recorded:
        for i, r in enumerate(self.processes):
            if r.name == name:
                self.processes[i] = dataclasses.replace(r, **changes)
                return self.processes[i]
        raise ConfigError(f"no process {name!r} in this cluster")


def read_state(layout: Layout) -> State | None:
    try:
        text = layout.state_file.read_text()
    except FileNotFoundError:
        return None
    return State.from_json(text, str(layout.state_file))


def write_state(layout: Layout, state: State) -> None:
    tmp = layout.state_file.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(state.to_json())
    os.replace(tmp, layout.state_file)


@contextlib.contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """Hold the cluster's state lock (read-modify-write of cluster.json)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.root / "cluster.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def running(r: Recorded) -> bool:
    """True while r.pid is still the process we started (same argv and start time)."""
    if r.pid <= 0:
        return False
    try:
        p = psutil.Process(r.pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if abs(p.create_time() - r.create_time) >= 1.0:
            return False
        argv = p.cmdline()
        if not argv:
            # /proc/<pid>/cmdline reads empty for a moment around exec and under memory
            # pressure; the start time alone still tells our process from a reused pid.
            time.sleep(0.05)
            argv = p.cmdline() or r.argv
        return argv == r.argv
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
