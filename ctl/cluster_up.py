"""`sluice cluster up`: MariaDB's first start, free ports, and starting each planned process
in turn until it is healthy.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sluice.core import pki
from sluice.core.errors import ConfigError, SluiceError, Unavailable
from sluice.core.ports import free_port

from .cluster_config import (ClusterSpec, Layout, ProcessPlan, client_security, cluster_security,
                             generated_certs, load_spec, plan, restart_policy, to_toml)
from .cluster_state import (PENDING, RUNNING, STOPPED, Recorded, State, locked, read_state,
                            running, write_state)
from .cluster_health import Health, port_open, wait_healthy
from .cluster_procs import (_down, _existing, _start_supervisor, _want, supervisor_running,
                            wait_started)
from .cluster_status import _print_status


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
                ports[key] = free_port(spec.host)
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
