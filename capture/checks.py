"""Start-up checks of the source, like Debezium's MySQL connector: each failure is one line that
names the problem and the fix, and the capture exits 2 (SourceCheckFailed is a ConfigError).

Invariant: the capture never streams from a source whose binlog could lose or misstate changes:
binlog on, binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL, no binlog
compression, the needed privileges, log_slave_updates on a replica, and a saved GTID position that
the source still holds (not purged, not ahead of the source).
"""
from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import pymysql

from sluice.capture.reader import parse_gtid_state
from sluice.core.errors import ConfigError

log = logging.getLogger(__name__)


class SourceCheckFailed(ConfigError):
    """A source prerequisite is missing; the message says how to fix it."""


class SavedPositionPurged(SourceCheckFailed):
    """The saved GTID position is older than the oldest binlog (snapshot-mode when_needed takes
    a new snapshot instead of refusing)."""


@dataclasses.dataclass(frozen=True)
class SourceFacts:
    server_id: int
    version: str
    gtid_binlog_pos: str      # the source's current GTID position (what "latest" starts after)
    oldest_gtid_list: str     # GTID state at the start of the oldest binlog still on the source


def connect(params: dict[str, Any], address: str) -> pymysql.connections.Connection:
    try:
        return pymysql.connect(**params, autocommit=True, connect_timeout=5)
    except pymysql.err.OperationalError as e:
        code = e.args[0] if e.args else 0
        if code == 1045:
            raise SourceCheckFailed(f"source {address}: access denied for user "
                                    f"{params.get('user')!r}: check [source] user/password") from None
        raise SourceCheckFailed(f"source {address}: cannot connect ({e.args[-1]}): check [source] "
                                "host/port and that the server is running") from None


def _var(cur: Any, name: str) -> str | None:
    cur.execute("SHOW GLOBAL VARIABLES LIKE %s", (name,))
    row = cur.fetchone()
    return None if row is None else str(row[1])


_PRIV_ALIASES = {"REPLICATION CLIENT": "BINLOG MONITOR"}


def _grants(cur: Any) -> tuple[set[str], set[str]]:
    """(global privileges, databases with a SELECT grant) of the current user."""
    cur.execute("SHOW GRANTS")
    global_privs: set[str] = set()
    select_dbs: set[str] = set()
    for (line,) in cur.fetchall():
        m = re.match(r"GRANT (.+?) ON (\S+) TO ", line)
        if not m:
            continue
        privs = {p.strip().upper() for p in m.group(1).split(",")}
        privs = {_PRIV_ALIASES.get(p, p) for p in privs}
        on = m.group(2)
        if on == "*.*":
            global_privs |= privs
        elif "SELECT" in privs or "ALL PRIVILEGES" in privs:
            select_dbs.add(on.split(".")[0].strip("`"))
    return global_privs, select_dbs


def _has(privs: set[str], p: str) -> bool:
    return "ALL PRIVILEGES" in privs or p in privs


def _oldest_gtid_list(cur: Any) -> str:
    cur.execute("SHOW BINARY LOGS")
    logs = cur.fetchall()
    if not logs:
        return ""
    cur.execute(f"SHOW BINLOG EVENTS IN %s LIMIT 4", (logs[0][0],))
    for row in cur.fetchall():
        if row[2] == "Gtid_list":
            return row[5].strip("[] ")
    return ""


def _is_replica(cur: Any) -> bool:
    try:
        cur.execute("SHOW ALL SLAVES STATUS")
        return bool(cur.fetchall())
    except pymysql.err.OperationalError as e:
        if not e.args or e.args[0] != 1227:
            raise
    # Without REPLICA MONITOR (a minimal read-only capture user): a server that ever replicated
    # has a replica GTID position.
    cur.execute("SELECT @@GLOBAL.gtid_slave_pos")
    return bool(str(cur.fetchone()[0] or ""))


def check_source(params: dict[str, Any], *, address: str, replica_server_id: int,
                 saved_gtid: str | None, include_databases: list[str] | None = None) -> SourceFacts:
    """Run every check; raises SourceCheckFailed on the first failure."""
    conn = connect(params, address)
    try:
        cur = conn.cursor()
        cur.execute("SELECT VERSION(), @@server_id")
        version, server_id = cur.fetchone()
        if "mariadb" not in str(version).lower():
            raise SourceCheckFailed(f"source {address}: {version} is MySQL; this capture streams "
                                    "MariaDB (GTID auto-position) — MySQL sources are experimental "
                                    "and not enabled in this build")
        if (_var(cur, "log_bin") or "OFF").upper() != "ON":
            raise SourceCheckFailed(f"source {address}: binary logging is off: start the server with "
                                    "log-bin (e.g. log-bin=mariadb-bin) and restart it")
        fmt = (_var(cur, "binlog_format") or "").upper()
        if fmt != "ROW":
            raise SourceCheckFailed(f"source {address}: binlog_format is {fmt or 'unset'}, the "
                                    "capture needs ROW: SET GLOBAL binlog_format=ROW (and "
                                    "binlog-format=ROW in the server config)")
        image = (_var(cur, "binlog_row_image") or "FULL").upper()
        if image != "FULL":
            raise SourceCheckFailed(f"source {address}: binlog_row_image is {image}, the capture "
                                    "needs FULL: SET GLOBAL binlog_row_image=FULL")
        meta = _var(cur, "binlog_row_metadata")
        if meta is None or meta.upper() != "FULL":
            raise SourceCheckFailed(f"source {address}: binlog_row_metadata is {meta or 'unsupported'}, "
                                    "the capture needs FULL (column names and signedness in every "
                                    "TableMap): SET GLOBAL binlog_row_metadata=FULL (MariaDB >= 10.5)")
        if (_var(cur, "log_bin_compress") or "OFF").upper() == "ON":
            raise SourceCheckFailed(f"source {address}: log_bin_compress is ON; compressed binlog "
                                    "events are not supported: SET GLOBAL log_bin_compress=OFF")
        if int(server_id) == replica_server_id:
            raise SourceCheckFailed(f"source {address}: its server_id {server_id} equals the "
                                    "capture's replica server-id: set [source] server-id to a "
                                    "value no server in the topology uses")
        privs, select_dbs = _grants(cur)
        missing = [p for p in ("REPLICATION SLAVE", "BINLOG MONITOR") if not _has(privs, p)]
        if missing:
            raise SourceCheckFailed(f"source {address}: user {params.get('user')!r} lacks "
                                    f"{' and '.join(missing)}: GRANT {', '.join(missing)} ON *.* TO "
                                    "the capture user")
        if not _has(privs, "SELECT") and not select_dbs:
            raise SourceCheckFailed(f"source {address}: user {params.get('user')!r} lacks SELECT "
                                    "(needed to read table definitions and snapshots): GRANT SELECT "
                                    "ON the captured databases TO the capture user")
        if _is_replica(cur) and (_var(cur, "log_slave_updates") or "OFF").upper() != "ON":
            raise SourceCheckFailed(f"source {address}: it is a replica without log_slave_updates, "
                                    "so replicated changes never reach its binlog: start it with "
                                    "log-slave-updates=ON")
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        current = str(cur.fetchone()[0] or "")
        oldest = _oldest_gtid_list(cur)
        if saved_gtid is not None:
            _check_saved(address, saved_gtid, current, oldest)
        return SourceFacts(int(server_id), str(version), current, oldest)
    finally:
        conn.close()


def _check_saved(address: str, saved: str, current: str, oldest: str) -> None:
    s, cur, old = parse_gtid_state(saved), parse_gtid_state(current), parse_gtid_state(oldest)
    for domain, (_, first_seq) in old.items():
        have = s.get(domain)
        if have is None or have[1] < first_seq:
            where = f"{domain}-{have[0]}-{have[1]}" if have else f"nothing in domain {domain}"
            raise SavedPositionPurged(
                f"source {address}: the saved position ({where}) is no longer in the source's "
                f"binlogs (oldest binlog starts after {domain}-{old[domain][0]}-{first_seq}): "
                "transactions were purged; set snapshot-mode = \"when_needed\" to re-snapshot, "
                "or set a newer start with `sluice ctl position set`")
    for domain, (server, seq) in s.items():
        now = cur.get(domain)
        if now is None or now[1] < seq:
            raise SourceCheckFailed(
                f"source {address}: the saved position {domain}-{server}-{seq} is ahead of the "
                f"source ({current or 'empty'}): is this the same server? Fix [source] or reset the "
                "position with `sluice ctl position set`")
