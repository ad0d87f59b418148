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
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from sluice.core import pki
from sluice.core import ts as tsmod
from sluice.core.errors import ConfigError, SluiceError, Unavailable

from .cluster_config import (ClusterSpec, Layout, ProcessPlan, client_security, cluster_security,
                             generated_certs, load_spec, plan, restart_policy, to_toml)
from .cluster_state import (BACKOFF, EXITED, FAILED, PENDING, RUNNING, STOPPED, STOPPING, Recorded,
                            State, locked, read_state, running, write_state)

DEFAULT_DIR = ".sluice-cluster"
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
# Health
# ---------------------------------------------------------------------------------------------

class Health:
    """Probes of one cluster's processes (etcd, TSO, registry), with the cluster's TLS."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.security = state.security_config()
        self._etcd: Any = None
        self._registry: Any = None

    @property
    def registry(self) -> Any:
        if self._registry is None:
            from sluice.core.etcd import Etcd
            from sluice.core.registry import Registry
            self._etcd = Etcd(self.state.etcd, self.security if self.security.enabled else None,
                              timeout=2)
            self._registry = Registry(self._etcd, self.state.cluster_id)
        return self._registry

    def close(self) -> None:
        if self._etcd is not None:
            self._etcd.close()

    def etcd_ready(self) -> bool:
        self.registry.etcd.revision()
        return True

    def tso_role(self, r: Recorded) -> str:
        """'leader' or 'standby' when the TSO answers GetTS; raises while it does not."""
        import grpc

        from sluice.core import grpcutil
        from sluice.proto import sluice_pb2 as pb
        from sluice.proto import sluice_pb2_grpc as pbg
        with grpcutil.sync_channel(r.addr, self.security) as ch:
            try:
                pbg.TSOStub(ch).GetTS(pb.GetTSReq(cluster_id=self.state.cluster_id, count=1),
                                      timeout=2)
                return "leader"
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and "leader" in (e.details() or ""):
                    return "standby"
                raise

    def node(self, kind: str, node_id: str) -> Any:
        from sluice.core.registry import NodeKind
        k = {"pump": NodeKind.PUMP, "drainer": NodeKind.DRAINER, "capture": NodeKind.PRODUCER}[kind]
        return self.registry.get(k, node_id)

    def drainer_role(self, r: Recorded) -> str:
        """An HA drainer instance's role: 'active' (it holds the leader key), 'standby' (its
        standby key is alive) or 'waiting' (neither yet: starting, or stopped)."""
        from sluice.drainer.ha import list_standbys, read_leader
        leader = read_leader(self.registry, r.node_id)
        if leader is not None and leader.addr == r.addr:
            return "active"
        return "standby" if r.addr in list_standbys(self.registry, r.node_id) else "waiting"

    def healthy(self, r: Recorded) -> bool:
        if r.kind == "drainer" and r.standby:
            # A standby serves nothing until it takes over; it is healthy once it waits in etcd.
            return self.drainer_role(r) in ("standby", "active")
        if r.kind == "etcd":
            return self.etcd_ready()
        if r.kind == "tso":
            return self.tso_role(r) in ("leader", "standby")
        if r.kind in ("pump", "drainer") and not r.standby:
            info = self.node(r.kind, r.node_id)
            return bool(info is not None and info.alive and info.state.value == "online")
        if r.kind == "capture" and r.metrics_addr:
            return capture_streaming(r.metrics_addr)
        return port_open(r.addr)

    def tso_leader_ready(self, tsos: list[Recorded]) -> bool:
        return any(self.tso_role(r) == "leader" for r in tsos)


def capture_streaming(metrics_addr: str) -> bool:
    """The capture passed its start-up checks and recovery and reads the binlog."""
    import urllib.request
    with urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return 'sluice_capture_state{state="streaming"} 1.0' in text


def port_open(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host or "127.0.0.1", int(port))) == 0


def wait_healthy(r: Recorded, check: Callable[[], bool], timeout: float, what: str,
                 layout: Layout | None = None) -> None:
    """Probe `check` until it passes; fail at once when r ends (or is restarted) meanwhile."""
    end = time.monotonic() + timeout
    last = ""
    while True:
        ended = _ended_since(r, layout)
        if ended is not None:
            how = describe_exit(ended)
            raise Unavailable(f"{r.name} exited during start-up{f' ({how})' if how else ''}; "
                              f"last lines of {r.log}:\n" + "\n".join(tail(r.log, 15)))
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - probed again until the deadline
            last = f" (last probe: {type(e).__name__}: {str(e)[:200]})"
        if time.monotonic() > end:
            raise Unavailable(f"{r.name} not {what} after {timeout:.0f}s{last}; see {r.log}")
        time.sleep(POLL_S)


def _ended_since(r: Recorded, layout: Layout | None) -> Recorded | None:
    """r's current record when the run r describes has ended, else None."""
    if layout is None:
        return None if running(r) else r
    state = read_state(layout)
    now = state.find(r.name) if state is not None else r
    if now.pid == r.pid and now.status == RUNNING and running(now):
        return None
    # The supervisor may not have noticed yet: wait for its record of how the run ended.
    deadline = time.monotonic() + 2
    while now.pid == r.pid and now.status == RUNNING and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = read_state(layout)
        now = state.find(r.name) if state is not None else r
    return now


# ---------------------------------------------------------------------------------------------
# MariaDB: a fresh datadir needs install-db and grants, as tests/support/mariadb.py does
# ---------------------------------------------------------------------------------------------

def mariadb_install(p: ProcessPlan) -> bool:
    """Initialise the datadir if it is new; True when it was."""
    data = Path(p.data_dir)
    tmp = data.parent.parent / "run" / "tmp"     # mariadb_plan's --tmpdir
    tmp.mkdir(parents=True, exist_ok=True)
    if (data / "mysql").exists():
        return False
    data.mkdir(parents=True, exist_ok=True)
    argv = ["mariadb-install-db", "--no-defaults", f"--datadir={data}",
            "--auth-root-authentication-method=normal", "--skip-test-db", f"--tmpdir={tmp}"]
    if os.geteuid() == 0:
        argv.append("--user=root")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    if out.returncode != 0:
        raise Unavailable(f"mariadb-install-db failed: {(out.stdout + out.stderr)[-1500:]}")
    return True


def mariadb_grant(spec: ClusterSpec, socket_path: Path) -> None:
    import pymysql
    conn = pymysql.connect(unix_socket=str(socket_path), user="root")
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'root'@%s IDENTIFIED BY %s",
                        (spec.host, spec.mariadb.root_password))
            cur.execute("ALTER USER 'root'@%s IDENTIFIED BY %s", (spec.host, spec.mariadb.root_password))
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@%s WITH GRANT OPTION", (spec.host,))
            cur.execute("FLUSH PRIVILEGES")
    finally:
        conn.close()


def mariadb_login(spec: ClusterSpec, addr: str) -> bool:
    import pymysql
    host, _, port = addr.rpartition(":")
    pymysql.connect(host=host, port=int(port), user="root", password=spec.mariadb.root_password,
                    connect_timeout=2).close()
    return True


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


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        # SO_REUSEADDR as the servers set it: a port in TIME_WAIT after `down` is still reusable.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


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
# up
# ---------------------------------------------------------------------------------------------

def cmd_up(args: argparse.Namespace, layout: Layout) -> int:
    return up(layout, args.config, args.overrides)


def up(layout: Layout, config: str | Path | None, overrides: list[str]) -> int:
    """Start the cluster of `config` (+ overrides) in layout and wait until every process is
    healthy; on a partly running cluster start only what is missing. On a failure stop what was
    started and return 1. `sluice demo` runs this too."""
    spec = load_spec(config, overrides)
    for d in ("conf", "data", "logs", "run"):
        (layout.root / d).mkdir(parents=True, exist_ok=True)
    if generated_certs(spec):
        # Secure by default: the cluster's own CA, node and client certificates (kept across
        # `up`s: a running process must keep trusting the same CA).
        made = pki.ensure(layout.certs, (spec.host,))
        if made:
            print(f"made certificates in {layout.certs}: {', '.join(made)}")
    old = read_state(layout)
    partly = old is not None and any(running(r) for r in old.processes)

    # Ports of a previous `up` are reused when free (pumps and drainers keep their addresses),
    # and always while part of the cluster runs: the running processes hold them.
    ports: dict[str, int] = {}
    previous = old.ports if old is not None else {}

    def port(key: str) -> int:
        if key not in ports:
            p = previous.get(key, 0)
            ok = p and (partly or _port_free(spec.host, p)) and p not in ports.values()
            ports[key] = p if ok else 0
            while not ports[key] or list(ports.values()).count(ports[key]) > 1:
                ports[key] = _free_port(spec.host)
        return ports[key]

    plans = plan(spec, layout, port)        # validates every config before anything starts
    for p in plans:
        if p.config_path:
            path = Path(p.config_path)
            path.write_text(to_toml(p.config))
            path.chmod(0o600)                # it may hold a password
    etcd_addr = next(p.addr for p in plans if p.kind == "etcd")
    sec = cluster_security(spec, layout)
    write_ctl_config(layout, spec, etcd_addr)
    with locked(layout):
        old = read_state(layout)
        kept = {r.name: r for r in (old.processes if old is not None else [])}
        planned = {p.name for p in plans}
        stray = [n for n, r in kept.items() if n not in planned and running(r)]
        if stray:
            raise ConfigError(f"cluster in {layout.root} runs {', '.join(stray)}, which "
                              "the config no longer has: `sluice cluster stop NAME` or "
                              "`sluice cluster down` first")
        changed = [p.name for p in plans if p.name in kept and running(kept[p.name])
                   and kept[p.name].argv != list(p.argv)]
        if changed:
            raise ConfigError(f"cluster in {layout.root} runs {', '.join(changed)} with another "
                              "command line than this config plans: `sluice cluster down` first")
        records = [_record(p, kept.get(p.name), restart_policy(spec, p)) for p in plans]
        rp = spec.restart_policy
        state = State(spec.cluster_id, etcd_addr,
                      {"ssl-ca": sec.ssl_ca, "ssl-cert": sec.ssl_cert, "ssl-key": sec.ssl_key}
                      if sec.enabled else {}, ports, spec.stop_timeout, records,
                      supervisor=old.supervisor if old is not None else None,
                      max_attempts=rp.max_attempts, delay=rp.delay, max_delay=rp.max_delay,
                      window=rp.window, start_timeout=spec.start_timeout)
        if not supervisor_running(state):
            _start_supervisor(layout, state)
        write_state(layout, state)
    health = Health(state)
    missing = [r.name for r in records if not running(r)]
    if partly:
        print(f"cluster {spec.cluster_id} in {layout.root} is partly running; starting "
              f"{', '.join(missing) or 'nothing: every process runs'}")
    else:
        print(f"starting cluster {spec.cluster_id} in {layout.root}")
    started = time.monotonic()
    try:
        for p in plans:
            _start_one(p, spec, layout, health)
        tsos = [r for r in _existing(layout).processes if r.kind == "tso"]
        if tsos:
            wait_healthy(tsos[0], lambda: health.tso_leader_ready(tsos), spec.start_timeout,
                         "serving as TSO leader")
    except (SluiceError, OSError) as e:
        print(f"sluice cluster up: {e}", file=sys.stderr)
        print("stopping what was started", file=sys.stderr)
        health.close()
        _down(layout, spec.stop_timeout, quiet=True)
        return 1
    print(f"cluster up in {time.monotonic() - started:.1f}s "
          f"({'mutual TLS' if sec.enabled else 'INSECURE: plaintext, no certificates'})")
    _print_status(_existing(layout), health, as_json=False)
    health.close()
    print(f"administer it: sluice ctl --cluster-dir {layout.root} pumps")
    return 0


def write_ctl_config(layout: Layout, spec: ClusterSpec, etcd_addr: str) -> None:
    """<dir>/ctl.toml: what `sluice ctl --cluster-dir DIR` (and the demo's hints) connect with."""
    client = client_security(spec, layout)
    conf: dict[str, Any] = {"etcd": etcd_addr, "cluster-id": spec.cluster_id}
    if client.enabled:
        conf["security"] = {"ssl-ca": client.ssl_ca, "ssl-cert": client.ssl_cert,
                            "ssl-key": client.ssl_key}
    layout.ctl_config.write_text(to_toml(conf))
    layout.ctl_config.chmod(0o600)


def _record(p: ProcessPlan, prev: Recorded | None, restart: str) -> Recorded:
    """p's record: the running one kept (adopted), else a new one not started yet."""
    if prev is not None and running(prev) and prev.argv == list(p.argv):
        return dataclasses.replace(prev, restart=restart, want="run", status=RUNNING)
    return Recorded(p.name, p.kind, 0, 0.0, list(p.argv), p.addr, p.log, p.data_dir,
                    p.config_path, p.metrics_addr, p.node_id, p.standby, restart=restart,
                    want="stop", status=STOPPED,
                    restarts=prev.restarts if prev is not None else 0,
                    last_exit=prev.last_exit if prev is not None else None,
                    exit_known=prev.exit_known if prev is not None else False)


def _start_one(p: ProcessPlan, spec: ClusterSpec, layout: Layout, health: Health) -> None:
    current = _existing(layout).find(p.name)
    if running(current):
        _wait_up(layout, current, health, spec.start_timeout, spec)
        print(f"  {p.name:<16} pid {current.pid:<7} {p.addr} (already running)")
        return
    fresh_db = p.kind == "mariadb" and mariadb_install(p)
    _want(layout, p.name, want="run", status=PENDING, failures=0)
    r = wait_started(layout, p.name, spec.start_timeout)
    if p.kind == "mariadb":
        wait_healthy(r, lambda: port_open(r.addr), spec.start_timeout, "listening", layout)
        if fresh_db:
            mariadb_grant(spec, layout.root / "run" / "mariadb.sock")
    _wait_up(layout, r, health, spec.start_timeout, spec)
    print(f"  {p.name:<16} pid {r.pid:<7} {p.addr}")


def _wait_up(layout: Layout, r: Recorded, health: Health, timeout: float,
             spec: ClusterSpec | None) -> None:
    if r.kind == "mariadb":
        if spec is None:
            wait_healthy(r, lambda: port_open(r.addr), timeout, "listening", layout)
        else:
            wait_healthy(r, lambda: mariadb_login(spec, r.addr), timeout, "accepting logins",
                         layout)
        return
    what = {"etcd": "ready", "tso": "answering GetTS", "pump": "online and alive",
            "drainer": "online and alive", "capture": "streaming"}.get(r.kind, "listening")
    if r.standby:
        what = "waiting as standby"
    wait_healthy(r, lambda: health.healthy(r), timeout, what, layout)


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


# ---------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------

def _down_state(r: Recorded) -> str:
    """The STATE of a process that does not run: what the supervisor knows, never the
    registry's last word (a killed pump stays `online` there until its key expires)."""
    if r.want == "stop" or r.status == STOPPED:
        return "stopped"
    return {BACKOFF: "restarting", FAILED: "failed", PENDING: "starting",
            STOPPING: "stopping"}.get(r.status, "dead")


def _rows(state: State, health: Health) -> list[dict[str, Any]]:
    rows = []
    for r in state.processes:
        up = running(r)
        row: dict[str, Any] = {"process": r.name, "pid": r.pid, "running": up, "state": "",
                               "alive": "", "restarts": r.restarts, "exit": r.exit_text(),
                               "restart": r.restart, "want": r.want, "address": r.addr,
                               "lag": ""}
        try:
            if not up:
                row["state"] = _down_state(r)
            elif r.kind == "etcd":
                row["state"] = "ready" if health.etcd_ready() else "down"
            elif r.kind == "tso":
                row["state"] = health.tso_role(r)
            elif r.kind in ("pump", "drainer", "capture"):
                info = health.node(r.kind, r.node_id)
                role = health.drainer_role(r) if r.kind == "drainer" and _is_ha(r) else ""
                if role:
                    row["role"] = role
                if role in ("standby", "waiting"):
                    row["state"] = role
                elif info is not None:
                    row["state"], row["alive"] = info.state.value, info.alive
                    if r.kind == "drainer":
                        row["lag"] = round(tsmod.lag_seconds(info.status.checkpoint), 1)
                        row["checkpoint"] = info.status.checkpoint
                else:
                    row["state"] = "unregistered"
            else:
                row["state"] = "listening" if port_open(r.addr) else "down"
        except Exception as e:  # noqa: BLE001 - status shows what it can
            row["state"] = f"? ({type(e).__name__})"
        rows.append(row)
    return rows


def _is_ha(r: Recorded) -> bool:
    """A drainer run as a member of an HA group (`standby = true` in its [[drainers]])."""
    if r.standby:
        return True
    try:
        import tomllib
        return bool(tomllib.loads(Path(r.config_path).read_text()).get("ha", False))
    except (OSError, ValueError):
        return False


def _print_status(state: State, health: Health, as_json: bool) -> list[dict[str, Any]]:
    rows = _rows(state, health)
    sup = state.supervisor
    supervised = supervisor_running(state)
    if as_json:
        print(json.dumps({"cluster_id": state.cluster_id, "etcd": state.etcd, "processes": rows,
                          "supervisor": {"pid": sup.pid if sup else 0, "running": supervised}},
                         indent=2))
        return rows
    cols = ("process", "pid", "running", "state", "alive", "restarts", "exit", "address", "lag")
    shown = [[_cell(f"{row[c]} ({row['role']})" if c == "state" and row.get("role") == "active"
                    else row[c], c) for c in cols] for row in rows]
    widths = [max(len(c), *(len(s[i]) for s in shown)) if shown else len(c)
              for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)).rstrip())
    for s in shown:
        print("  ".join(v.ljust(w) for v, w in zip(s, widths)).rstrip())
    if not supervised:
        print("supervisor not running: nothing is restarted (`sluice cluster up` starts it)")
    return rows


def _cell(v: Any, col: str) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if col == "lag" and v != "":
        return f"{v}s"
    if col == "restarts" and v == 0:
        return ""
    return str(v)


def cmd_status(args: argparse.Namespace, layout: Layout) -> int:
    state = read_state(layout)
    if state is None or not state.processes:
        print(f"no cluster running in {layout.root}")
        return 1
    health = Health(state)
    try:
        rows = _print_status(state, health, args.json)
    finally:
        health.close()
    # A process stopped on purpose is as it should be; one that should run and does not is not.
    return 0 if all(r["running"] for r in rows if r["want"] == "run") else 1


def cmd_logs(args: argparse.Namespace, layout: Layout) -> int:
    state = read_state(layout)
    if state is None:
        raise ConfigError(f"no cluster in {layout.root}")
    if args.process == "supervisor":
        targets = [("supervisor", str(layout.log("supervisor")))]
    elif args.process:
        targets = [(args.process, state.find(args.process).log)]
    else:
        targets = [(r.name, r.log) for r in state.processes]
        if not targets:   # after `down`: the logs are still there
            targets = [(p.stem, str(p)) for p in sorted((layout.root / "logs").glob("*.log"))]
    for name, path in targets:
        if len(targets) > 1:
            print(f"==> {name} ({path}) <==")
        for line in tail(path, args.lines):
            print(line)
    if args.follow:
        with contextlib.suppress(KeyboardInterrupt):
            for name, line in _follow(targets):
                print(f"{name:<14}| {line}" if len(targets) > 1 else line, flush=True)
    return 0


def _follow(targets: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    offsets = {}
    for _, path in targets:
        with contextlib.suppress(FileNotFoundError):
            offsets[path] = os.path.getsize(path)
    partial: dict[str, str] = {}
    while True:
        for name, path in targets:
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            offsets[path] = offsets.get(path, 0) + len(data)
            text = partial.pop(path, "") + data.decode(errors="replace")
            *lines, rest = text.split("\n")
            if rest:
                partial[path] = rest
            for line in lines:
                yield name, line
        time.sleep(0.2)
