"""Real processes for tests: free ports, child processes stopped by pid, an etcd server."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sluice.core.ports import free_port  # noqa: F401 - the tests take it from here

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def wait_until(cond: Callable[[], object], timeout: float = 10.0, interval: float = 0.05,
               what: str = "condition") -> object:
    end = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < end:
        try:
            value = cond()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}"
                       + (f" (last error: {last_exc!r})" if last_exc else ""))


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class Proc:
    """A child process we started; stopped only by its own pid (never by name)."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name, self.argv, self.log_path = name, list(argv), log_path
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.popen: subprocess.Popen | None = None

    def start(self) -> "Proc":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=self.env, cwd=self.cwd,
                                      start_new_session=True)
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait(10)  # type: ignore[union-attr]

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(10)
        return self.popen.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class EtcdServer:
    """A real etcd (Debian etcd-server) on free loopback ports, restartable on the same data."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: Proc | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> "EtcdServer":
        url = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc = Proc("etcd", [
            "etcd", "--name", "default", "--data-dir", str(self.workdir / "etcd-data"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--log-level", "warn",
        ], self.workdir / "etcd.log", env={"ETCD_UNSUPPORTED_ARCH": "", "ETCDCTL_API": "3"}).start()
        wait_until(lambda: port_open(self.client_port), 15, what="etcd to listen")
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        from sluice.core.etcd import Etcd
        client = Etcd(self.endpoint, timeout=2)
        try:
            client.wait_ready(15)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill9()

    def restart(self) -> None:
        self.stop()
        self.start()


def sluice_argv(*args: str) -> list[str]:
    """argv to run the `sluice` CLI from this venv."""
    return [PYTHON, "-m", "sluice.ctl.main", *args]
