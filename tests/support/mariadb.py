"""A real MariaDB server (apt's mariadbd) for tests: own datadir, free port, stopped by pid.

Started with row binlogs and FULL row metadata so the same server can be a capture source, an
application database (outbox) or a sink downstream. A fresh datadir is initialised once per
`MariaDBServer` (mariadb-install-db, ~2-4 s); a module-scoped fixture is the usual unit.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql

from tests.support.procs import Proc, free_port, port_open, wait_until

ROOT_PASSWORD = "sluice-root"


class MariaDBServer:
    """One mariadbd on 127.0.0.1:<free port>; `root`/ROOT_PASSWORD is granted at 127.0.0.1."""

    def __init__(self, workdir: Path, server_id: int = 1, extra_args: list[str] | None = None,
                 binlog: bool = True) -> None:
        self.workdir = workdir
        self.datadir = workdir / "data"
        self.port = free_port()
        self.server_id = server_id
        self.binlog = binlog
        self.extra_args = list(extra_args or [])
        self.proc: Proc | None = None
        self.user, self.password = "root", ROOT_PASSWORD

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def dsn(self, database: str = "") -> str:
        return f"mysql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    @property
    def tmpdir(self) -> Path:
        """A private tmpdir: in a shared /tmp one server's temp-table files were seen removed
        under another's feet (a crash in ha_maria::drop_table, a failed install)."""
        d = self.workdir / "tmp"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _base_args(self) -> list[str]:
        args = [
            "--no-defaults", f"--datadir={self.datadir}", f"--port={self.port}",
            "--bind-address=127.0.0.1", f"--socket={self.workdir / 'mysql.sock'}",
            f"--pid-file={self.workdir / 'mysql.pid'}", "--skip-name-resolve",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
            "--max-allowed-packet=256M", f"--server-id={self.server_id}",
            "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=48M",
            "--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0",
            f"--log-error={self.workdir / 'error.log'}", f"--tmpdir={self.tmpdir}",
        ]
        if self.binlog:
            args += [f"--log-bin={self.datadir / 'mariadb-bin'}", "--binlog-format=ROW",
                     "--binlog-row-image=FULL", "--binlog-row-metadata=FULL", "--log-slave-updates"]
        if os.geteuid() == 0:
            args.append("--user=root")
        return args + self.extra_args

    def _install(self) -> None:
        self.datadir.mkdir(parents=True, exist_ok=True)
        argv = ["mariadb-install-db", "--no-defaults", f"--datadir={self.datadir}",
                "--auth-root-authentication-method=normal", "--skip-test-db",
                f"--tmpdir={self.tmpdir}"]
        if os.geteuid() == 0:
            argv.append("--user=root")
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")

    def start(self) -> "MariaDBServer":
        fresh = not (self.datadir / "mysql").exists()
        if fresh:
            self._install()
        self.proc = Proc("mariadb", ["mariadbd", *self._base_args()], self.workdir / "mariadbd.log").start()
        wait_until(lambda: port_open(self.port) or not self.proc.alive(), 60, what="mariadbd to listen")
        if not self.proc.alive():
            raise RuntimeError(f"mariadbd exited: {self.error_log()[-3000:]}")
        if fresh:
            self._bootstrap_grants()
        wait_until(self._ping, 30, what="mariadb to accept logins")
        return self

    def _bootstrap_grants(self) -> None:
        conn = pymysql.connect(unix_socket=str(self.workdir / "mysql.sock"), user="root")
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '{ROOT_PASSWORD}'")
                # mariadb-install-db may already have created root@127.0.0.1 without a password
                cur.execute(f"ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY '{ROOT_PASSWORD}'")
                cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
                cur.execute("FLUSH PRIVILEGES")
        finally:
            conn.close()

    def _ping(self) -> bool:
        conn = self.connect()
        conn.close()
        return True

    def connect(self, database: str | None = None, **kwargs: Any) -> pymysql.connections.Connection:
        return pymysql.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                               database=database, charset="utf8mb4", autocommit=True, **kwargs)

    def execute(self, sql: str, args: Any = None, database: str | None = None) -> list[tuple]:
        """Run one statement (autocommit) and return its rows."""
        conn = self.connect(database)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def error_log(self) -> str:
        with contextlib.suppress(FileNotFoundError):
            return (self.workdir / "error.log").read_text(errors="replace")
        return ""

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=30)

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill9()

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def mariadb_server(workdir: Path, **kwargs: Any) -> Iterator[MariaDBServer]:
    server = MariaDBServer(workdir, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()
