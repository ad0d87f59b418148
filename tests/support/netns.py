"""Hosts for fault tests: Linux network namespaces joined by veth pairs to a bridge.

Each "host" is a namespace of this run (`<prefix>-<host>`) with `lo` and one `eth0` carrying
its own 10.x address; the other end of its veth is a port of a bridge that lives in a hub
namespace of the run as well. Nothing is created in the machine's own namespace, so the 10.x
addresses never leave the machine. Faults:

- `partition(host)` takes the host's bridge port down: nothing reaches it, nothing leaves
  (established connections hang, new ones time out) — a host cut off from the network;
- `cut(a, b)` adds blackhole routes on both sides for the other's address: packets between
  the two are dropped (established connections hang until their own timeouts, new connects fail
  at once), everything else still flows.

`Net` is a context manager and always deletes what it created (namespaces, and with them the
veths and the bridge), also when the test fails. Processes are started inside a host with
`argv(host, ...)` (`ip netns exec`), and `run_in(host, fn)` runs a Python callable on a thread
that entered the host's namespace (sockets it creates belong there).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import random
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pymysql

from tests.support.mariadb import MariaDBServer
from tests.support.procs import Proc, wait_until

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def netns_unavailable() -> str:
    """Why namespaces cannot be used here ("" when they can): a root-only probe that creates
    and deletes one namespace with a veth pair."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    name = f"slprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as e:
        return f"ip netns add does not work here: {e}"
    try:
        _ip("-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "b0")
        _ip("-n", name, "link", "set", "lo", "up")
    except RuntimeError as e:
        return f"veth pairs cannot be created in a namespace here: {e}"
    finally:
        _ip("netns", "del", name, check=False)
    return ""


def enter_netns(ns: str) -> None:
    """Move the calling thread (only it) into namespace `ns`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
    finally:
        os.close(fd)


class _NsThread:
    """One worker thread that entered a namespace (setns is per thread)."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"ns-{ns}",
                                                          initializer=self._enter)

    def _enter(self) -> None:
        enter_netns(self.ns)

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        return self.pool.submit(fn).result(timeout)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Net:
    """A bridge and one namespace per host, created by `__enter__`, deleted by `__exit__`."""

    def __init__(self, hosts: Sequence[str]) -> None:
        # Unique per run: the pid plus a random tail (interface names are per namespace, so
        # only the namespace names need it).
        self.prefix = f"sl{os.getpid() % 100000}{random.randrange(36 ** 3):03x}"
        self.subnet = f"10.213.{random.randrange(1, 255)}"
        self.hosts = list(hosts)
        self.index = {h: i + 1 for i, h in enumerate(self.hosts)}
        self.created: list[str] = []
        self.blackholes: set[tuple[str, str]] = set()
        self.down: set[str] = set()
        self._threads: dict[str, _NsThread] = {}

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def ip(self, host: str) -> str:
        return f"{self.subnet}.{self.index[host]}"

    def argv(self, host: str, *argv: str) -> list[str]:
        """`argv` run inside `host` (ip netns exec execs it: the pid is the command's own)."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def __enter__(self) -> "Net":
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _create(self) -> None:
        self._add_ns(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for host in self.hosts:
            ns, port = self.ns(host), self._port(host)
            self._add_ns(ns)
            _ip("-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.ip(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def _port(self, host: str) -> str:
        return f"h{self.index[host]}"

    def close(self) -> None:
        for t in self._threads.values():
            t.close()
        self._threads.clear()
        # Hosts first, the hub (and its bridge) last; a namespace still used by a process
        # disappears from /var/run/netns anyway and goes away with the process.
        for name in reversed(self.created):
            _ip("netns", "del", name, check=False)
        self.created.clear()

    # -- faults ------------------------------------------------------------------------------

    def partition(self, host: str) -> None:
        """Cut `host` off from every other host (its bridge port down)."""
        _ip("-n", self.hub, "link", "set", self._port(host), "down")
        self.down.add(host)

    def rejoin(self, host: str) -> None:
        _ip("-n", self.hub, "link", "set", self._port(host), "up")
        self.down.discard(host)

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts a and b (both directions); others unaffected."""
        for x, y in ((a, b), (b, a)):
            _ip("-n", self.ns(x), "route", "add", "blackhole", f"{self.ip(y)}/32")
            self.blackholes.add((x, y))

    def heal(self, a: str, b: str) -> None:
        for x, y in ((a, b), (b, a)):
            if (x, y) in self.blackholes:
                _ip("-n", self.ns(x), "route", "del", "blackhole", f"{self.ip(y)}/32")
                self.blackholes.discard((x, y))

    @contextlib.contextmanager
    def cutting(self, a: str, bs: Sequence[str]) -> Iterator[None]:
        """Cut a from each of bs for the body; healed afterwards, also on failure."""
        try:
            for b in bs:
                self.cut(a, b)
            yield
        finally:
            for b in bs:
                self.heal(a, b)

    @contextlib.contextmanager
    def partitioned(self, host: str) -> Iterator[None]:
        try:
            self.partition(host)
            yield
        finally:
            self.rejoin(host)

    # -- running Python inside a host -------------------------------------------------------

    def run_in(self, host: str, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """fn() on a thread inside `host`'s namespace (for sockets: urllib, pymysql, asyncio)."""
        if host not in self._threads:
            self._threads[host] = _NsThread(self.ns(host))
        return self._threads[host].call(fn, timeout)


class ChaosProxy:
    """A TCP proxy of the test's own inside one host (this kernel has no `tc netem`): clients
    connect to `host:port`, it forwards to `target`. While `delay_s` is set each chunk waits that
    long in each direction; while `reset_every_s` is set, every connection older than that is
    reset (RST, SO_LINGER 0) — a flaky link. Both off: a plain pipe."""

    def __init__(self, net: Net, host: str, port: int, target: tuple[str, int]) -> None:
        self.net, self.host, self.port, self.target = net, host, port, target
        self.delay_s = 0.0
        self.reset_every_s = 0.0
        self.resets = 0
        self.connections = 0
        self._loop: "asyncio.AbstractEventLoop | None" = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"proxy-{host}", daemon=True)

    @property
    def addr(self) -> tuple[str, int]:
        return self.net.ip(self.host), self.port

    def start(self) -> "ChaosProxy":
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            enter_netns(self.net.ns(self.host))
            loop = self._loop = asyncio.new_event_loop()
            server = loop.run_until_complete(
                asyncio.start_server(self._serve, self.net.ip(self.host), self.port))
        except BaseException as e:  # noqa: BLE001 - re-raised by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            ur, uw = await asyncio.wait_for(asyncio.open_connection(*self.target), 5)
        except (OSError, asyncio.TimeoutError):
            self._reset(cw)
            return
        born = time.monotonic()
        pipes = [asyncio.ensure_future(self._pipe(cr, uw)), asyncio.ensure_future(self._pipe(ur, cw))]
        try:
            while not all(p.done() for p in pipes):
                done, _ = await asyncio.wait(pipes, timeout=0.1,
                                             return_when=asyncio.FIRST_COMPLETED)
                if done:
                    break
                if self.reset_every_s and time.monotonic() - born > self.reset_every_s:
                    self.resets += 1
                    break
        finally:
            for p in pipes:
                p.cancel()
            self._reset(cw)
            self._reset(uw)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            chunk = await r.read(65536)
            if not chunk:
                return
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            w.write(chunk)
            await w.drain()

    @staticmethod
    def _reset(w: asyncio.StreamWriter) -> None:
        sock = w.get_extra_info("socket")
        with contextlib.suppress(OSError):
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.transport.abort()


class NsMariaDB(MariaDBServer):
    """A MariaDB inside a host, listening on the host's own address (port 3306); the test
    itself talks to it over its unix socket (a file: no network namespace involved), other
    hosts as root@'%' over TCP."""

    def __init__(self, net: Net, host: str, workdir: Path, server_id: int,
                 extra_args: list[str] | None = None) -> None:
        super().__init__(workdir, server_id=server_id, extra_args=extra_args)
        self.net, self.host = net, host
        self.port = 3306

    @property
    def address(self) -> str:
        return f"{self.net.ip(self.host)}:{self.port}"

    @property
    def socket_path(self) -> str:
        return str(self.workdir / "mysql.sock")

    def start(self) -> "NsMariaDB":
        fresh = not (self.datadir / "mysql").exists()
        if fresh:
            self._install()
        args = self._base_args() + [f"--bind-address={self.net.ip(self.host)}"]
        self.proc = Proc(f"mariadb-{self.host}", self.net.argv(self.host, "mariadbd", *args),
                         self.workdir / "mariadbd.log").start()

        def up() -> bool:
            assert self.proc is not None and self.proc.alive(), \
                f"mariadbd exited: {self.error_log()[-3000:]}"
            conn = pymysql.connect(unix_socket=self.socket_path, user="root",
                                   password="" if fresh else self.password)
            conn.close()
            return True
        wait_until(up, 60, 0.2, what=f"mariadbd in {self.host} to accept logins")
        if fresh:
            conn = pymysql.connect(unix_socket=self.socket_path, user="root", autocommit=True)
            try:
                with conn.cursor() as cur:
                    cur.execute(f"CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY '{self.password}'")
                    cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION")
                    cur.execute(f"ALTER USER 'root'@'localhost' IDENTIFIED BY '{self.password}'")
                    cur.execute("FLUSH PRIVILEGES")
            finally:
                conn.close()
        return self

    def connect(self, database: str | None = None, **kwargs: Any) -> pymysql.connections.Connection:
        kwargs.setdefault("autocommit", True)
        return pymysql.connect(unix_socket=self.socket_path, user=self.user,
                               password=self.password, database=database, charset="utf8mb4",
                               **kwargs)
