"""`sluice demo`: a local cluster started, exercised and stopped in one command.

For now it shows the TSO (DESIGN §2.1): etcd and two `sluice tso` servers start as child processes
in a temporary directory on free ports; timestamps are requested through the batching client;
the leader is killed with SIGKILL; the standby takes over and timestamps keep increasing. Later
issues grow this into the full pipeline. The demo stops every process it started, by pid, and
exits 0 only when everything it checked held.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sluice.core import ts as tsmod
from sluice.core.errors import ConfigError, EtcdUnavailable
from sluice.core.etcd import Etcd
from sluice.core.tso_client import LeaderInfo, SyncTSOClient, read_leader

CLUSTER_ID = 1
LEASE_TTL = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--short", action="store_true",
                        help="fewer timestamps and no pauses (for tests and CI)")
    parser.add_argument("--keep-dir", action="store_true",
                        help="keep the temporary directory with the logs")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Child:
    """A process the demo started; stopped by its own pid only."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill9(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait(10)


def _show(label: str, ts: int) -> None:
    when = tsmod.to_datetime(ts).strftime("%H:%M:%S.%f")[:-3]
    print(f"  {label:<8} ts={ts}  physical={when}Z  logical={tsmod.logical(ts)}")


def _wait_leader(etcd: Etcd, timeout: float, not_name: str | None = None) -> LeaderInfo:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(EtcdUnavailable):
            info = read_leader(etcd, CLUSTER_ID)
            if info is not None and info.name != not_name:
                return info
        time.sleep(0.05)
    raise EtcdUnavailable(f"no TSO leader elected within {timeout:.0f}s")


def run(args: argparse.Namespace) -> int:
    if shutil.which("etcd") is None:
        raise ConfigError("etcd binary not found on PATH (install etcd-server, e.g. "
                          "`apt-get install etcd-server`)")
    tmp = Path(tempfile.mkdtemp(prefix="sluice-demo-"))
    children: list[_Child] = []
    try:
        return _demo(args, tmp, children)
    finally:
        for child in reversed(children):
            child.stop()
        if args.keep_dir:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _demo(args: argparse.Namespace, tmp: Path, children: list[_Child]) -> int:
    per_phase = 3 if args.short else 8
    client_port, peer_port = _free_port(), _free_port()
    endpoint = f"127.0.0.1:{client_port}"
    print(f"starting etcd on {endpoint} (data in {tmp})")
    children.append(_Child("etcd", [
        "etcd", "--name", "demo", "--data-dir", str(tmp / "etcd"),
        "--listen-client-urls", f"http://{endpoint}", "--advertise-client-urls", f"http://{endpoint}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-cluster", f"demo=http://127.0.0.1:{peer_port}", "--log-level", "warn",
    ], tmp / "etcd.log"))
    etcd = Etcd(endpoint, timeout=2)
    try:
        etcd.wait_ready(20)
        tsos: dict[str, _Child] = {}
        for name in ("tso-a", "tso-b"):
            addr = f"127.0.0.1:{_free_port()}"
            argv = [sys.executable, "-m", "sluice.ctl.main", "tso",
                    "--set", f"name='{name}'", "--set", f"addr='{addr}'",
                    "--set", f"etcd='{endpoint}'", "--set", f"cluster-id={CLUSTER_ID}",
                    "--set", f"lease-ttl={LEASE_TTL}", "--log-file", str(tmp / f"{name}.log")]
            tsos[name] = _Child(name, argv, tmp / f"{name}.out")
            children.append(tsos[name])
            print(f"starting {name} on {addr} (pid {tsos[name].pid})")
            if name == "tso-a":  # let the first one win, so the story reads the same every time
                _wait_leader(etcd, 20)
        leader = _wait_leader(etcd, 20)
        print(f"{leader.name} is the TSO leader (epoch {leader.epoch}); the other one is a standby")

        seen: list[int] = []
        with SyncTSOClient(None, CLUSTER_ID, etcd=etcd, deadline_s=20) as client:
            print(f"timestamps from {leader.name}:")
            for _ in range(per_phase):
                seen.append(client.get_ts())
                _show("", seen[-1])
            first, count = client.get_ts_range(1000)
            seen.extend((first, first + count - 1))
            _show("range", first)
            print(f"  ... a batch of {count} ends at {first + count - 1}")

            victim = tsos[leader.name]
            print(f"kill -9 {leader.name} (pid {victim.pid}), the leader")
            victim.kill9()
            killed = time.monotonic()
            seen.append(client.get_ts())     # blocks until the standby serves
            new = _wait_leader(etcd, 20, not_name=leader.name)
            print(f"{new.name} took over after {time.monotonic() - killed:.1f}s "
                  f"(epoch {new.epoch}, started above the window {leader.name} persisted)")
            _show("", seen[-1])
            for _ in range(per_phase - 1):
                seen.append(client.get_ts())
                _show("", seen[-1])

        if any(a >= b for a, b in zip(seen, seen[1:])):
            print("FAILED: timestamps went backwards across the failover", file=sys.stderr)
            return 1
        print(f"all {len(seen)} timestamps are strictly increasing across the failover")
        return 0
    finally:
        etcd.close()
