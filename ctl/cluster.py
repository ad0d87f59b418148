"""`sluice cluster up|down|status|logs|stop|start|restart`: a whole local cluster from one TOML.

`up` plans the cluster (`sluice.ctl.cluster_config`: etcd, TSOs, pumps, MariaDB,
 drainers, one capture per source), writes each process's TOML into the
cluster dir, starts the cluster's supervisor (`sluice.ctl.supervisor`, detached: it outlives
`up`) and asks it to start each process in turn, waiting until each is healthy before the next:
etcd answers, every TSO answers (one is the leader), pumps and drainers are online and alive in
the registry, a standby drainer (`standby = true`: both instances run with `ha = true`) waits
with its standby key alive in etcd. The supervisor restarts a process that ends according to
its restart policy. On a partly running cluster `up` starts only what is missing. The state
file (`cluster.json`, `sluice.ctl.cluster_state`) records every pid, its command line, its start
time, its restarts and last exit code, and the ports.

Invariant: `down` stops the supervisor first (nothing is restarted behind it), then signals only
the processes this cluster started, each by its recorded pid and only while that pid still runs
the recorded command line with the recorded start time (a reused pid is never touched); it stops
them in reverse start order — SIGTERM, wait, then SIGKILL — and returns 0 only when none of them
is left.

The parts: ctl/cluster_procs.py (our processes, the supervisor seen from the CLI, `down`),
ctl/cluster_health.py, ctl/cluster_up.py, ctl/cluster_status.py (`status`, `logs`).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .cluster_config import Layout
from .cluster_state import (BACKOFF, EXITED, FAILED, PENDING, RUNNING, STOPPED, STOPPING, Recorded,
                            State, locked, read_state, running, write_state)
from .cluster_health import Health, _ended_since, capture_streaming, port_open, wait_healthy
from .cluster_procs import (POLL_S, _down, _ensure_supervisor, _existing, _start_supervisor,
                            _wait_gone, _want, cmd_down, describe_exit, down, stop_process,
                            supervisor_running, tail, wait_started, wait_stopped)
from .cluster_status import (_cell, _down_state, _follow, _is_ha, _print_status, _rows, cmd_logs,
                             cmd_status)
from .cluster_up import (_port_free, _record, _start_one, _wait_up, cmd_up,
                         mariadb_grant, mariadb_install, mariadb_login, up, write_ctl_config)

__all__ = ["add_arguments", "BACKOFF", "capture_streaming", "_cell", "cmd_down", "cmd_logs",
           "cmd_restart", "cmd_start", "cmd_status", "cmd_stop", "cmd_up", "DEFAULT_DIR",
           "describe_exit", "down", "_down", "_down_state", "_ended_since", "_ensure_supervisor",
           "_existing", "EXITED", "FAILED", "_follow", "Health", "_is_ha", "locked",
           "mariadb_grant", "mariadb_install", "mariadb_login", "PENDING", "POLL_S", "_port_free",
           "port_open", "_print_status", "read_state", "_record", "Recorded", "_rows", "run",
           "running", "RUNNING", "start_one", "_start_one", "_start_supervisor", "State",
           "stop_one", "stop_process", "STOPPED", "STOPPING", "supervisor_running", "tail", "up",
           "_wait_gone", "wait_healthy", "wait_started", "wait_stopped", "_wait_up", "_want",
           "write_ctl_config", "write_state"]

DEFAULT_DIR = ".sluice-cluster"


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=DEFAULT_DIR,
                        help=f"cluster directory: configs, data, logs, state (default ./{DEFAULT_DIR})")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sub.add_parser("up", parents=[common], help="start the cluster (or what of it is not "
                        "running) and wait until healthy")
    up.add_argument("--config", "-c", help="cluster TOML (defaults built in; see docs/cluster.md)")
    up.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a cluster key, e.g. --set pump.count=3")
    sub.add_parser("down", parents=[common], help="stop the supervisor and every process")
    st = sub.add_parser("status", parents=[common], help="a table of the cluster's processes")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    lg = sub.add_parser("logs", parents=[common], help="show (or follow) the processes' logs")
    lg.add_argument("process", nargs="?", help="one process (etcd, tso-1, pump-2, supervisor, "
                    "...); default all")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    lg.add_argument("-n", "--lines", type=int, default=20, help="lines of each log (default 20)")
    stop = sub.add_parser("stop", parents=[common], help="stop one process; it stays down "
                          "(no restart) until `start` or `up`")
    stop.add_argument("process", help="the process (see `status`)")
    start = sub.add_parser("start", parents=[common], help="start one stopped or dead process "
                           "and wait until healthy")
    start.add_argument("process", help="the process (see `status`)")
    rs = sub.add_parser("restart", parents=[common], help="stop and start one process, or every "
                        "process in order")
    rs.add_argument("process", nargs="?", help="the process; default: all")
    sub.add_parser("supervise", parents=[common])   # internal: started by `up`, no help line


def run(args: argparse.Namespace) -> int:
    layout = Layout(Path(args.dir).resolve())
    if args.action == "supervise":
        from .supervisor import supervise
        return supervise(layout)
    return {"up": cmd_up, "down": cmd_down, "status": cmd_status, "logs": cmd_logs,
            "stop": cmd_stop, "start": cmd_start, "restart": cmd_restart}[args.action](args, layout)


# ---------------------------------------------------------------------------------------------
# stop | start | restart
# ---------------------------------------------------------------------------------------------

def stop_one(layout: Layout, name: str) -> Recorded:
    """Stop `name` and keep it down (no restart) until `start`/`up`; returns its record."""
    state = _existing(layout)
    state.find(name)
    _want(layout, name, want="stop")
    if supervisor_running(state):
        return wait_stopped(layout, name, state.stop_timeout + 15)
    # No supervisor to do it: stop it here, by its verified pid.
    stop_process(state.find(name), state.stop_timeout)
    return _want(layout, name, status=STOPPED)


def start_one(layout: Layout, name: str) -> Recorded:
    """Start `name` (stopped, dead or given up) and wait until it is healthy."""
    state = _ensure_supervisor(layout)
    r = state.find(name)
    if running(r) and r.want == "run":
        print(f"  {name:<16} pid {r.pid:<7} {r.addr} (already running)")
        return r
    _want(layout, name, want="run", status=PENDING, failures=0)
    r = wait_started(layout, name, state.start_timeout)
    health = Health(state)
    try:
        _wait_up(layout, r, health, state.start_timeout, None)
    finally:
        health.close()
    print(f"  {name:<16} pid {r.pid:<7} {r.addr} started")
    return r


def cmd_stop(args: argparse.Namespace, layout: Layout) -> int:
    r = stop_one(layout, args.process)
    how = describe_exit(r)
    print(f"  {r.name:<16} pid {r.pid:<7} stopped{f' ({how})' if how else ''}")
    return 0


def cmd_start(args: argparse.Namespace, layout: Layout) -> int:
    start_one(layout, args.process)
    return 0


def cmd_restart(args: argparse.Namespace, layout: Layout) -> int:
    state = _existing(layout)
    names = [args.process] if args.process else [r.name for r in state.processes]
    for name in names:
        state.find(name)
    for name in reversed(names):
        r = stop_one(layout, name)
        print(f"  {name:<16} pid {r.pid:<7} stopped")
    for name in names:
        start_one(layout, name)
    return 0
