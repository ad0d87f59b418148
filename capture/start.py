"""What a capture reads from the source at start: the start-up checks, table definitions,
the earliest GTID state and where the first schema snapshot sits. docs/capture.md.
"""
from __future__ import annotations

from typing import Any

import pymysql

from sluice.capture import checks
from sluice.capture.config import CaptureConfig
from sluice.capture.reader import file_seq_of, parse_gtid_state
from sluice.capture.schema import TableFilter
from sluice.proto import sluice_pb2 as pb

_SYSTEM_DBS = ("mysql", "information_schema", "performance_schema", "sys")


def source_checks(config: CaptureConfig, saved_gtid: str | None) -> checks.SourceFacts:
    return checks.check_source(config.source.connection(), address=config.source.address(),
                               replica_server_id=config.source.server_id, saved_gtid=saved_gtid)



def read_table_definitions(params: dict[str, Any], table_filter: TableFilter
                           ) -> list[tuple[str, str, str]]:
    """(db, table, SHOW CREATE TABLE text) of every base table outside the system databases.

    Not only the captured ones: a table renamed into the filter later needs its model too.
    """
    conn = pymysql.connect(**params, autocommit=True, connect_timeout=5)
    out: list[tuple[str, str, str]] = []
    try:
        cur = conn.cursor()
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                    "WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN (%s, %s, %s, %s) "
                    "ORDER BY TABLE_SCHEMA, TABLE_NAME", _SYSTEM_DBS)
        for db, table in cur.fetchall():
            if not table_filter.captures_db(db) and not table_filter.captures(db, table):
                # Cheap skip for databases outside the filter; RENAME across databases into
                # the filter then declares from the TableMap instead of the DDL model.
                continue
            try:
                cur.execute(f"SHOW CREATE TABLE `{db.replace('`', '``')}`.`{table.replace('`', '``')}`")
            except pymysql.err.ProgrammingError as e:
                if e.args and e.args[0] == 1146:   # dropped since the listing
                    continue
                raise
            row = cur.fetchone()
            if row is not None:
                out.append((db, table, row[1]))
    finally:
        conn.close()
    return out

def earliest_state(oldest_gtid_list: str) -> str:
    """The GTID state at the start of the oldest binlog: one GTID per domain, the highest.

    Not "" when binlogs were purged: MariaDB refuses an empty start state for domains whose
    first transactions are gone, and the saved-position check would refuse it at a restart.
    """
    best: dict[int, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in oldest_gtid_list.split(","))):
        d, srv, n = (int(x) for x in part.split("-"))
        if d not in best or n > best[d][1]:
            best[d] = (srv, n)
    return ",".join(f"{d}-{srv}-{n}" for d, (srv, n) in sorted(best.items()))


def start_snapshot_position(start: str, facts: checks.SourceFacts, oldest_file: str) -> pb.Position:
    """Where the first-start schema snapshot sits: just before the first transaction streamed.

    GTID-only at the start state, so it compares by GTIDs with every streamed transaction (file
    coordinates read separately could be behind a transaction committed meanwhile). With an
    empty GTID state the binlogs hold no transaction yet: the start of the oldest binlog.
    """
    pos = pb.Position(server_id=facts.server_id)
    state = parse_gtid_state(start)
    if state:
        pos.gtids.extend(pb.GtidPos(domain_id=d, server_id=s, seq_no=n)
                         for d, (s, n) in sorted(state.items()))
    else:
        pos.file_seq, pos.offset, pos.file_name = file_seq_of(oldest_file), 4, oldest_file
    return pos


def _oldest_binlog(params: dict[str, Any]) -> str:
    conn = pymysql.connect(**params, autocommit=True, connect_timeout=5)
    try:
        cur = conn.cursor()
        cur.execute("SHOW BINARY LOGS")
        rows = cur.fetchall()
        return str(rows[0][0]) if rows else ""
    finally:
        conn.close()
