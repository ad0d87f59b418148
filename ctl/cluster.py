"""`sluice cluster up|down|status|logs`: a whole local cluster from one TOML.

`up` plans the cluster (`sluice.ctl.cluster_config`: etcd, TSOs, pumps, MariaDB, drainers,
capture), writes each process's TOML into the cluster dir,
starts every process detached (its own session, so `up` returns and a Ctrl-C in the shell does
not reach them) with its own data dir and log file, and waits until each is healthy before the
next starts: etcd answers, every TSO answers (one is the leader), pumps and drainers are online
and alive in the registry, a standby drainer (`standby = true`: both instances run with
`ha = true`) waits with its standby key alive in etcd. The state file (`cluster.json`) records every pid, its command line,
its start time and the ports.

Invariant: `down` signals only the processes this cluster started, each by its recorded pid and
only while that pid still runs the recorded command line with the recorded start time (a reused
pid is never touched); it stops them in reverse start order — SIGTERM, wait, then SIGKILL — and
returns 0 only when none of them is left.
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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sluice.core import ts as tsmod
from sluice.core.errors import ConfigError, SluiceError, Unavailable
from sluice.core.tls import SecurityConfig

from .cluster_config import ClusterSpec, Layout, ProcessPlan, load_spec, plan, to_toml

DEFAULT_DIR = ".sluice-cluster"
STATE_VERSION = 1
POLL_S = 0.1


# ---------------------------------------------------------------------------------------------
# The state file
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recorded:
    """One started process as the state file keeps it."""

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


@dataclass
class State:
    cluster_id: int
    etcd: str
    security: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    stop_timeout: float = 15.0
    processes: list[Recorded] = field(default_factory=list)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["version"] = STATE_VERSION
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str, where: str) -> "State":
        try:
            d = json.loads(text)
            if d.pop("version", None) != STATE_VERSION:
                raise ValueError(f"state version is not {STATE_VERSION}")
            d["processes"] = [Recorded(**p) for p in d.get("processes", [])]
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


def read_state(layout: Layout) -> State | None:
    try:
        text = layout.state_file.read_text()
    except FileNotFoundError:
        return None
    return State.from_json(text, str(layout.state_file))


def write_state(layout: Layout, state: State) -> None:
    tmp = layout.state_file.with_suffix(".json.tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, layout.state_file)


# ---------------------------------------------------------------------------------------------
# Processes: ours, by pid and command line
# ---------------------------------------------------------------------------------------------

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


def start_process(p: ProcessPlan) -> Recorded:
    Path(p.data_dir).mkdir(parents=True, exist_ok=True)
    Path(p.log).parent.mkdir(parents=True, exist_ok=True)
    with open(p.log, "ab") as log:
        log.write(f"---- {time.strftime('%Y-%m-%dT%H:%M:%S')} sluice cluster starts "
                  f"{p.name}\n".encode())
        log.flush()
        popen = subprocess.Popen(list(p.argv), stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 cwd=p.data_dir)
    try:
        created = psutil.Process(popen.pid).create_time()
    except psutil.NoSuchProcess:
        created = 0.0
    # `up` returns while its children run on: they must not stay our zombies if `up` is a
    # long-lived caller (tests call it in-process too), so a thread reaps each one.
    import threading
    _CHILDREN[popen.pid] = popen
    threading.Thread(target=popen.wait, name=f"reap-{p.name}", daemon=True).start()
    return Recorded(p.name, p.kind, popen.pid, created, list(p.argv), p.addr, p.log, p.data_dir,
                    p.config_path, p.metrics_addr, p.node_id, p.standby)


# Children started by this process (pid -> Popen), so a start-up failure can say how it ended.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def exit_status(r: Recorded) -> str:
    """How a child of this process ended ("exit code 1", "killed by signal 9"), or ""."""
    popen = _CHILDREN.get(r.pid)
    code = popen.poll() if popen is not None else None
    if code is None:
        return ""
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


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


def wait_healthy(r: Recorded, check: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    last = ""
    while True:
        if not running(r):
            how = exit_status(r)
            raise Unavailable(f"{r.name} exited during start-up{f' ({how})' if how else ''}; "
                              f"last lines of {r.log}:\n"
                              + "\n".join(tail(r.log, 15)))
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - probed again until the deadline
            last = f" (last probe: {type(e).__name__}: {str(e)[:200]})"
        if time.monotonic() > end:
            raise Unavailable(f"{r.name} not {what} after {timeout:.0f}s{last}; see {r.log}")
        time.sleep(POLL_S)


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
    up = sub.add_parser("up", parents=[common], help="start the cluster and wait until healthy")
    up.add_argument("--config", "-c", help="cluster TOML (defaults built in; see docs/cluster.md)")
    up.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a cluster key, e.g. --set pump.count=3")
    sub.add_parser("down", parents=[common], help="stop every process of the cluster")
    st = sub.add_parser("status", parents=[common], help="a table of the cluster's processes")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    lg = sub.add_parser("logs", parents=[common], help="show (or follow) the processes' logs")
    lg.add_argument("process", nargs="?", help="one process (etcd, tso-1, pump-2, ...); default all")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    lg.add_argument("-n", "--lines", type=int, default=20, help="lines of each log (default 20)")


def run(args: argparse.Namespace) -> int:
    layout = Layout(Path(args.dir).resolve())
    return {"up": cmd_up, "down": cmd_down, "status": cmd_status, "logs": cmd_logs}[args.action](
        args, layout)


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


def cmd_up(args: argparse.Namespace, layout: Layout) -> int:
    return up(layout, args.config, args.overrides)


def up(layout: Layout, config: str | Path | None, overrides: list[str]) -> int:
    """Start the cluster of `config` (+ overrides) in layout and wait until every process is
    healthy; on a failure stop what was started and return 1. `sluice demo` runs this too."""
    spec = load_spec(config, overrides)
    old = read_state(layout)
    if old is not None:
        alive = [r.name for r in old.processes if running(r)]
        if alive:
            raise ConfigError(f"cluster in {layout.root} is already running ({', '.join(alive)}); "
                              "`sluice cluster status`, or `sluice cluster down` first")
    for d in ("conf", "data", "logs", "run"):
        (layout.root / d).mkdir(parents=True, exist_ok=True)

    # Ports of a previous `up` are reused when free: pumps and drainers keep their addresses.
    ports: dict[str, int] = {}
    previous = old.ports if old is not None else {}

    def port(key: str) -> int:
        if key not in ports:
            p = previous.get(key, 0)
            ports[key] = p if p and _port_free(spec.host, p) and p not in ports.values() else 0
            while not ports[key] or list(ports.values()).count(ports[key]) > 1:
                ports[key] = _free_port(spec.host)
        return ports[key]

    plans = plan(spec, layout, port)        # validates every config before anything starts
    for p in plans:
        if p.config_path:
            Path(p.config_path).write_text(to_toml(p.config))
    etcd_addr = next(p.addr for p in plans if p.kind == "etcd")
    sec = spec.security
    state = State(spec.cluster_id, etcd_addr,
                  {"ssl-ca": sec.ssl_ca, "ssl-cert": sec.ssl_cert, "ssl-key": sec.ssl_key}
                  if sec.enabled else {}, ports, spec.stop_timeout)
    write_state(layout, state)
    health = Health(state)
    print(f"starting cluster {spec.cluster_id} in {layout.root}")
    started = time.monotonic()
    try:
        for p in plans:
            _start_one(p, spec, layout, state, health)
        tsos = [r for r in state.processes if r.kind == "tso"]
        if tsos:
            wait_healthy(tsos[0], lambda: health.tso_leader_ready(tsos), spec.start_timeout,
                         "serving as TSO leader")
    except (SluiceError, OSError) as e:
        print(f"sluice cluster up: {e}", file=sys.stderr)
        print("stopping what was started", file=sys.stderr)
        health.close()
        _down(layout, state, spec.stop_timeout, quiet=True)
        return 1
    print(f"cluster up in {time.monotonic() - started:.1f}s")
    _print_status(state, health, as_json=False)
    health.close()
    return 0


def _start_one(p: ProcessPlan, spec: ClusterSpec, layout: Layout, state: State,
               health: Health) -> None:
    fresh_db = p.kind == "mariadb" and mariadb_install(p)
    r = start_process(p)
    state.processes.append(r)
    write_state(layout, state)             # recorded before waiting: `down` can always stop it
    t = spec.start_timeout
    if p.kind == "mariadb":
        wait_healthy(r, lambda: port_open(r.addr), t, "listening")
        if fresh_db:
            mariadb_grant(spec, layout.root / "run" / "mariadb.sock")
        wait_healthy(r, lambda: mariadb_login(spec, r.addr), t, "accepting logins")
    else:
        what = {"etcd": "ready", "tso": "answering GetTS", "pump": "online and alive",
                "drainer": "online and alive", "capture": "streaming"}.get(p.kind, "listening")
        if p.standby:
            what = "waiting as standby"
        wait_healthy(r, lambda: health.healthy(r), t, what)
    print(f"  {p.name:<16} pid {r.pid:<7} {p.addr}")


def cmd_down(args: argparse.Namespace, layout: Layout) -> int:
    return down(layout)


def down(layout: Layout, quiet: bool = False) -> int:
    """Stop every process the cluster in layout started (0: none is left)."""
    state = read_state(layout)
    if state is None:
        if not quiet:
            print(f"no cluster in {layout.root}")
        return 0
    return _down(layout, state, state.stop_timeout, quiet)


def _down(layout: Layout, state: State, timeout: float, quiet: bool = False) -> int:
    left = []
    for r in reversed(state.processes):
        outcome = stop_process(r, timeout)
        if not quiet:
            print(f"  {r.name:<16} pid {r.pid:<7} {outcome}")
        if outcome == "still running":
            left.append(r)
    # Keep the ports (a later `up` reuses them) but forget the pids: they are not ours any more.
    state.processes = left
    write_state(layout, state)
    if left:
        print(f"sluice cluster down: still running: {', '.join(r.name for r in left)}",
              file=sys.stderr)
        return 1
    if not quiet:
        print("cluster down")
    return 0


def _rows(state: State, health: Health) -> list[dict[str, Any]]:
    rows = []
    for r in state.processes:
        up = running(r)
        row: dict[str, Any] = {"process": r.name, "pid": r.pid, "running": up, "state": "",
                               "alive": "", "address": r.addr, "lag": ""}
        try:
            if r.kind == "etcd":
                row["state"] = "ready" if up and health.etcd_ready() else "down"
            elif r.kind == "tso":
                row["state"] = health.tso_role(r) if up else "down"
            elif r.kind in ("pump", "drainer", "capture"):
                info = health.node(r.kind, r.node_id)
                role = health.drainer_role(r) if r.kind == "drainer" and _is_ha(r) else ""
                if role:
                    row["role"] = role
                if role in ("standby", "waiting"):
                    row["state"] = role if up else "down"
                elif info is not None:
                    row["state"], row["alive"] = info.state.value, info.alive
                    if r.kind == "drainer":
                        row["lag"] = round(tsmod.lag_seconds(info.status.checkpoint), 1)
                        row["checkpoint"] = info.status.checkpoint
                else:
                    row["state"] = "unregistered"
            else:
                row["state"] = "listening" if up and port_open(r.addr) else "down"
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


def status_rows(layout: Layout) -> list[dict[str, Any]]:
    """`sluice cluster status --json`'s rows for the cluster in layout ([] when none runs)."""
    state = read_state(layout)
    if state is None or not state.processes:
        return []
    health = Health(state)
    try:
        return _rows(state, health)
    finally:
        health.close()


def _print_status(state: State, health: Health, as_json: bool) -> list[dict[str, Any]]:
    rows = _rows(state, health)
    if as_json:
        print(json.dumps({"cluster_id": state.cluster_id, "etcd": state.etcd, "processes": rows},
                         indent=2))
        return rows
    cols = ("process", "pid", "running", "state", "alive", "address", "lag")
    shown = [[_cell(f"{row[c]} ({row['role']})" if c == "state" and row.get("role") == "active"
                    else row[c], c) for c in cols] for row in rows]
    widths = [max(len(c), *(len(s[i]) for s in shown)) if shown else len(c)
              for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)).rstrip())
    for s in shown:
        print("  ".join(v.ljust(w) for v, w in zip(s, widths)).rstrip())
    return rows


def _cell(v: Any, col: str) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if col == "lag" and v != "":
        return f"{v}s"
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
    return 0 if all(r["running"] for r in rows) else 1


def cmd_logs(args: argparse.Namespace, layout: Layout) -> int:
    state = read_state(layout)
    if state is None:
        raise ConfigError(f"no cluster in {layout.root}")
    if args.process:
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
