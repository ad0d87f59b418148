"""The Hive metastore as a Derby network server child process (Debian's derby jars).

Embedded Derby admits one JVM; the network server lets the sink's JVM, `sluice spark-sql` and
any other reader share one catalog (docs/spark.md). Tests and `sluice cluster` start it here;
it is stopped by its own pid only.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from sluice.core.errors import SluiceError, Unavailable

log = logging.getLogger(__name__)

DERBY_JARS = ("/usr/share/java/derby.jar", "/usr/share/java/derbynet.jar")
DERBY_CLIENT_JAR = "/usr/share/java/derbyclient.jar"
DERBY_MAIN = "org.apache.derby.drda.NetworkServerControl"

# Derby looks for a deadlock only after a lock wait of derby.locks.deadlockTimeout (20 s by
# default). JVMs opening the catalog at once (a drainer and its standby, `sluice spark-sql`,
# tests) have DataNucleus read JDBC metadata at the same time, and Derby's stored metadata
# statements then wait on each other's system-table locks: measured here, four JVMs took
# ~116 s for their first catalog statement by default and ~20 s with a 1 s check.
DERBY_SERVER_PROPS = ("-Dderby.locks.deadlockTimeout=1",)


def server_argv(java: str, home: str | Path, classpath: str, host: str, port: int) -> list[str]:
    """The network server's command line (also `sluice cluster`'s and docker-compose's)."""
    return [java, f"-Dderby.system.home={home}", *DERBY_SERVER_PROPS, "-Xmx256m", "-cp", classpath,
            DERBY_MAIN, "start", "-h", host, "-p", str(port), "-noSecurityManager"]


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


class DerbyServer:
    """`NetworkServerControl start` on host:port with its databases under `home`."""

    def __init__(self, home: str | Path, port: int, host: str = "127.0.0.1",
                 java: str = "java") -> None:
        self.home, self.port, self.host, self.java = Path(home), port, host, java
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> DerbyServer:
        for jar in DERBY_JARS:
            if not os.path.exists(jar):
                raise SluiceError(f"Derby jar {jar} is missing: install the Debian packages "
                                  "libderby-java and libderbyclient-java")
        self.home.mkdir(parents=True, exist_ok=True)
        logf = open(self.home / "derby-server.log", "ab")
        try:
            self.popen = subprocess.Popen(
                server_argv(self.java, self.home, ":".join(DERBY_JARS), self.host, self.port),
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        finally:
            logf.close()
        deadline = time.monotonic() + timeout
        while not _port_open(self.host, self.port):
            if self.popen.poll() is not None:
                raise Unavailable(f"Derby network server exited with {self.popen.returncode}; "
                                  f"see {self.home / 'derby-server.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise Unavailable(f"Derby network server not listening on {self.address} "
                                  f"after {timeout}s")
            time.sleep(0.1)
        log.info("derby metastore listening", extra={"fields": {"addr": self.address,
                                                                "pid": self.popen.pid}})
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        p = self.popen
        if p is None or p.poll() is not None:
            return
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
