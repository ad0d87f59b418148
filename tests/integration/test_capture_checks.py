"""`sluice capture` start-up checks against real, deliberately misconfigured MariaDB servers."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.mariadb import MariaDBServer, mariadb_server
from tests.support.procs import sluice_argv, wait_until


def check(db: MariaDBServer, *extra: str, user: str = "root", password: str | None = None) -> subprocess.CompletedProcess:
    sets = [f'source.port={db.port}', f'source.user="{user}"',
            f'source.password="{db.password if password is None else password}"', *extra]
    argv = sluice_argv("capture", "--check", *[a for s in sets for a in ("--set", s)])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def one_line_exit_2(out: subprocess.CompletedProcess, *needles: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_a_well_configured_source_passes(mariadb_module: MariaDBServer) -> None:
    """The test server (ROW, FULL image, FULL metadata, root) passes every check: exit 0."""
    out = check(mariadb_module)
    assert out.returncode == 0, out.stderr


def test_misconfigured_sources_fail_with_one_line_naming_the_fix(tmp_path: Path, mariadb_module: MariaDBServer) -> None:
    """The capture never streams from a source whose binlog could lose or misstate changes: binlog
    off, STATEMENT format, a missing privilege and a purged saved GTID each stop it with one line
    naming the fix, exit 2."""
    with mariadb_server(tmp_path / "nobinlog", binlog=False) as off:
        one_line_exit_2(check(off), "binary logging is off", "log-bin")
    with mariadb_server(tmp_path / "stmt", extra_args=["--binlog-format=STATEMENT"]) as stmt:
        one_line_exit_2(check(stmt), "binlog_format is STATEMENT", "binlog_format=ROW")
        stmt.execute("SET GLOBAL binlog_row_image=MINIMAL")
        stmt.execute("SET GLOBAL binlog_format=ROW")
        one_line_exit_2(check(stmt), "binlog_row_image is MINIMAL", "FULL")

    db = mariadb_module
    db.execute("CREATE USER IF NOT EXISTS 'capnopriv'@'127.0.0.1' IDENTIFIED BY 'pw'")
    db.execute("GRANT SELECT, BINLOG MONITOR ON *.* TO 'capnopriv'@'127.0.0.1'")
    one_line_exit_2(check(db, user="capnopriv", password="pw"), "lacks REPLICATION SLAVE",
                    "GRANT REPLICATION SLAVE")
    one_line_exit_2(check(db, user="root", password="wrong"), "access denied")

    # A saved GTID whose transactions were purged from the source.
    db.execute("CREATE DATABASE IF NOT EXISTS cap_purge")
    db.execute("CREATE TABLE IF NOT EXISTS cap_purge.t (id INT PRIMARY KEY)")
    db.execute("INSERT INTO cap_purge.t VALUES (1)")
    db.execute("FLUSH BINARY LOGS")
    newest = db.execute("SHOW BINARY LOGS")[-1][0]

    def purged() -> bool:
        # MariaDB keeps a log until its binlog checkpoint passed it (crash recovery): retry.
        db.execute(f"PURGE BINARY LOGS TO '{newest}'")
        return [r[0] for r in db.execute("SHOW BINARY LOGS")] == [newest]
    wait_until(purged, 20, what="older binlogs to be purged")
    one_line_exit_2(check(db, 'start-position="gtid:0-1-1"'), "no longer in the source's binlogs",
                    "purged")
    one_line_exit_2(check(db, 'start-position="gtid:0-1-999999"'), "ahead of the source")
