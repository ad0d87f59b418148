"""The capture's binlog reader against a real MariaDB: types, transactions, TableMaps, DDL.

Each test writes into its own database, then reads the binlog from the GTID position taken
before its writes (non-blocking: the stream ends at the binlog's end).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sluice.capture.reader import BinlogReader, SourceTxn
from sluice.capture.schema import SchemaTracker, TableFilter, stable_table_id
from sluice.core import rowcodec
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb
from tests.support.mariadb import MariaDBServer

SOURCE = "src"


def gtid_pos(db: MariaDBServer) -> str:
    return str(db.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")


def read_since(db: MariaDBServer, gtid: str, tracker: SchemaTracker | None = None,
               table_filter: TableFilter | None = None) -> list[SourceTxn]:
    tracker = tracker or SchemaTracker(SOURCE, table_filter or TableFilter())
    reader = BinlogReader({"host": "127.0.0.1", "port": db.port, "user": db.user,
                           "password": db.password}, replica_server_id=4242, tracker=tracker,
                          gtid_state=gtid, blocking=False)
    try:
        return list(reader.transactions())
    finally:
        reader.close()


def as_txns(txns: list[SourceTxn]) -> Iterator[tuple[Txn, SchemaHistory]]:
    """Through the drainer's own decoding: prewrite + commit binlogs -> Txn, schema history."""
    history = SchemaHistory()
    for i, st in enumerate(txns):
        for j, value in enumerate(st.prewrite_values(SOURCE)):
            start_ts, commit_ts = 1000 + 10 * i + j, 1001 + 10 * i + j
            pre = pb.Binlog(tp=pb.PREWRITE, start_ts=start_ts, prewrite_value=value,
                            producer_id="cap", position=st.position)
            com = pb.Binlog(tp=pb.COMMIT, start_ts=start_ts, commit_ts=commit_ts, producer_id="cap",
                            position=st.position)
            txn = Txn.from_binlogs([pre.SerializeToString()], com.SerializeToString(), "pump-1")
            history.apply(txn)
            yield txn, history


ALL_TYPES = """
CREATE TABLE {db}.all_types (
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  d65 DECIMAL(65,30), d10 DECIMAL(10,2), d5 DECIMAL(5,5), d0 DECIMAL(20,0),
  f FLOAT, dbl DOUBLE,
  c CHAR(10), vc VARCHAR(300), tx TEXT, ltx LONGTEXT, lat VARCHAR(10) CHARACTER SET latin1,
  bn BINARY(4), vb VARBINARY(10), bl BLOB,
  dt DATE, dtm DATETIME(6), dtm0 DATETIME, ts TIMESTAMP(6) NULL DEFAULT NULL, ts0 TIMESTAMP NULL DEFAULT NULL,
  tm TIME(6), tm3 TIME(3), tm0 TIME, y YEAR,
  e ENUM('a','b','c'), s SET('x','y','z'), b BIT(12), b1 BIT(1), j JSON
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""

COLS = ["id", "ti", "tiu", "si", "siu", "mi", "miu", "i", "iu", "bi", "biu", "d65", "d10", "d5", "d0",
        "f", "dbl", "c", "vc", "tx", "ltx", "lat", "bn", "vb", "bl", "dt", "dtm", "dtm0", "ts", "ts0",
        "tm", "tm3", "tm0", "y", "e", "s", "b", "b1", "j"]

ROWS = [
    # minimums, zero dates, negative TIME, empty strings and SET
    (1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
     "-" + "9" * 35 + "." + "9" * 30, "-12345678.91", "-0.12345", "-99999999999999999999",
     -1.5, -1.7976931348623157e308, "", "", "", "", "", b"ab", b"", b"",
     "0000-00-00", "0000-00-00 00:00:00", "0000-00-00 00:00:00", "0000-00-00 00:00:00", "0000-00-00 00:00:00",
     "-838:59:59.000000", "-00:00:00.001", "-838:59:59", "0000", "a", "", 0, 0, "[]"),
    # maximums, zero parts, TIME beyond 24 h, utf8mb4, fractional seconds
    (2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807,
     18446744073709551615, "9" * 35 + "." + "9" * 30, "99999999.99", "0.99999", "12345678901234567890",
     3.4028234663852886e38, 2.2250738585072014e-308, "ten chars!", "😀 ünïcödé " + "x" * 200,
     "tëxt 🚀", "l" * 70000, "café", b"\x00\x01\x02\x03", b"\xff\x00", bytes(range(256)),
     "2020-00-15", "9999-12-31 23:59:59.999999", "2021-06-00 10:00:00", "2038-01-19 03:14:07.999999",
     "1970-01-01 00:00:01", "838:59:59.000000", "-00:00:01.500", "100:00:00", "2155", "c", "x,z",
     0xFFF, 1, '{"k": [1, "é", null], "n": 1.5}'),
    # every value NULL
    (3,) + (None,) * (len(COLS) - 1),
    # ordinary values with fractions that exercise each fsp width
    (4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "0.000000000000000000000000000001", "0.10", "0.00001", "0",
     1.1, 0.1, "a", "b", "c", "d", "e", b"x", b"y", b"z",
     "2024-02-29", "2024-02-29 12:34:56.000001", "2024-02-29 12:34:56", "2024-02-29 12:34:56.5",
     "2024-02-29 12:34:56", "-00:00:00.000001", "12:00:00.010", "-01:02:03", "1901", "b", "y", 0x5A5,
     0, '"s"'),
]


def mysql_text(d: pb.Datum, col: pb.ColumnInfo) -> str | None:
    """The decoded value rendered as MariaDB renders CAST(col AS CHAR) / HEX(col)."""
    kind = d.WhichOneof("value")
    if kind == "null":
        return None
    if kind in ("int", "uint"):
        return f"{d.int:04d}" if col.data_type == "year" else str(getattr(d, kind))
    if kind in ("decimal", "str", "json"):
        return getattr(d, kind)
    if kind == "double":
        return repr(d.double)
    if kind == "bytes":
        if col.data_type == "bit":   # HEX(bit) prints the number
            return format(int.from_bytes(d.bytes, "big"), "X")
        return d.bytes.hex().upper()
    if kind == "datetime":
        v = d.datetime
        if col.data_type == "date":
            return f"{v.year:04d}-{v.month:02d}-{v.day:02d}"
        s = f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
        return s + (f".{v.microsecond:06d}"[:col.scale + 1] if col.scale else "")
    if kind == "time":
        v = d.time
        s = f"{'-' if v.negative else ''}{v.hours:02d}:{v.minutes:02d}:{v.seconds:02d}"
        return s + (f".{v.microseconds:06d}"[:col.scale + 1] if col.scale else "")
    raise AssertionError(kind)


BINARY = {"bn", "vb", "bl", "b", "b1"}


def insert_all_types(cur: Any) -> None:
    """The torture rows into all_types, zero dates and zero parts allowed."""
    cur.execute("SET SESSION sql_mode = ''")
    marks = ",".join(["%s"] * len(COLS))
    for row in ROWS:
        cur.execute(f"INSERT INTO all_types ({','.join(COLS)}) VALUES ({marks})", row)

def test_every_type_round_trips_from_the_source_to_datum_and_back(mariadb_module: MariaDBServer) -> None:
    """Every value MySQL/MariaDB can store decodes to the Datum that `core.rowcodec` maps back to
    the same value: signed and unsigned extremes, exact decimals of any precision, zero dates and
    zero date parts, TIME beyond 24 hours and negative, fractional seconds, YEAR 0000, empty SET,
    utf8mb4 text, NULL — nothing is turned into NULL or approximated on the way."""
    db = mariadb_module
    db.execute("CREATE DATABASE cap_types")
    start = gtid_pos(db)
    db.execute(ALL_TYPES.format(db="cap_types"))
    conn = db.connect("cap_types")
    try:
        with conn.cursor() as cur:
            insert_all_types(cur)
            cur.execute("SET time_zone = '+00:00'")
            exprs = ",".join(f"HEX({c})" if c in BINARY else "CAST(f AS DOUBLE)" if c == "f"
                             else f"CAST({c} AS CHAR)" for c in COLS)
            cur.execute(f"SELECT {exprs} FROM all_types ORDER BY id")
            expected = cur.fetchall()
    finally:
        conn.close()

    txns = read_since(db, start)
    inserts = [t for t in txns if t.mutations]
    assert len(inserts) == len(ROWS)
    decoded = []
    for txn, history in as_txns(txns):
        for ev in txn.rows(history):
            assert ev.op == "c" and ev.table == "all_types"
            decoded.append((ev.after, ev.table_info))
    assert len(decoded) == len(ROWS)
    for (row, info), want in zip(decoded, expected):
        assert [c.name for c in info.columns] == COLS
        for col, datum, text in zip(info.columns, row.columns, want):
            got = mysql_text(datum, col)
            if col.name == "f" and text is not None:
                # FLOAT travels as its exact float32 value widened to a double, as MariaDB widens it.
                assert datum.double == float(text), col.name
            elif col.name == "dbl" and text is not None:
                assert datum.double == float(text), col.name
            elif col.name == "j" and text is not None:
                assert datum.WhichOneof("value") == "json" and datum.json == text
            else:
                assert got == text, f"row {row.columns[0].int} column {col.name}: {got!r} != {text!r}"
            # ... and through the row codec and back, losslessly
            assert rowcodec.python_to_datum(rowcodec.datum_to_python(datum, col), col) == datum, col.name
    # A chunk SELECT gives the binlog's Datums for the same stored rows (capture.snapshot.reader:
    # the window matches keys by them, and an op=r row must equal a later before image).
    from sluice.capture.snapshot.chunks import Chunk
    from sluice.capture.snapshot.keys import load_shape
    from sluice.capture.snapshot.reader import RowConverter, chunk_sql, read_chunk, snapshot_connect
    snap = snapshot_connect({"host": "127.0.0.1", "port": db.port, "user": db.user,
                             "password": db.password})
    try:
        shape = load_shape(snap, "cap_types", "all_types")
        whole = Chunk("cap_types.all_types", 0, None, (10**9,), last=True)
        chunk_rows = read_chunk(snap, shape, whole)
        sql, params = chunk_sql(shape, whole)
        with snap.cursor() as cur:   # the same SELECT through pymysql's tuples and RowConverter.row
            cur.execute(sql, params)
            tuple_rows = [RowConverter(shape.columns).row(r) for r in cur.fetchall()]
    finally:
        snap.close()
    assert tuple_rows == chunk_rows
    fi = COLS.index("f")
    for got, (want, _) in zip(chunk_rows, decoded, strict=True):
        # FLOAT is the one documented approximation: the server prints 6 significant digits.
        g, w = got.columns[fi], want.columns[fi]
        assert g.WhichOneof("value") == w.WhichOneof("value")
        assert g.double == pytest.approx(w.double, rel=1e-5)
        g.CopyFrom(w)
        assert got == want
    by_name = {c.name: c for c in decoded[0][1].columns}
    assert by_name["biu"].unsigned and not by_name["bi"].unsigned
    assert by_name["j"].data_type == "json"     # MariaDB's LONGTEXT + json_valid, from the DDL
    assert decoded[1][0].columns[COLS.index("biu")].uint == 18446744073709551615


def test_one_transaction_touching_three_tables_with_interleaved_table_maps(mariadb_module: MariaDBServer) -> None:
    """A rows event is decoded only against a TableMap seen earlier in the same transaction; a
    transaction over three tables, with TableMaps re-sent mid-transaction, comes out as one
    transaction with its rows in source order, and its position is its first (GTID) event."""
    db = mariadb_module
    db.execute("CREATE DATABASE cap_multi")
    for t in ("a", "b", "c"):
        db.execute(f"CREATE TABLE cap_multi.{t} (id INT PRIMARY KEY, v VARCHAR(20))")
    start = gtid_pos(db)
    conn = db.connect("cap_multi")
    try:
        with conn.cursor() as cur:
            conn.begin()
            cur.execute("INSERT INTO a VALUES (1, 'a1')")
            cur.execute("INSERT INTO b VALUES (1, 'b1')")
            cur.execute("INSERT INTO a VALUES (2, 'a2')")       # a's TableMap again, mid-transaction
            cur.execute("UPDATE c SET v = 'x' WHERE id = 99")   # no rows: no event
            cur.execute("INSERT INTO c VALUES (1, 'c1')")
            cur.execute("UPDATE b SET v = 'b1!' WHERE id = 1")
            cur.execute("DELETE FROM a WHERE id = 1")
            conn.commit()
    finally:
        conn.close()
    txns = read_since(db, start)
    assert len(txns) == 1
    (st,) = txns
    assert st.gtid == f"0-1-{int(start.split('-')[2]) + 1}"
    assert st.position.offset > 0 and st.position.file_seq >= 1
    assert [g.seq_no for g in st.position.gtids] == [int(st.gtid.split("-")[2])]
    assert {s.table_name for s in st.schema_snapshots} == {"a", "b", "c"}
    (txn, history), = as_txns(txns)
    rows = [(e.table, e.op, rowcodec.row_to_dict(e.after or e.before, e.table_info)) for e in txn.rows(history)]
    assert rows == [("a", "c", {"id": 1, "v": "a1"}), ("b", "c", {"id": 1, "v": "b1"}),
                    ("a", "c", {"id": 2, "v": "a2"}), ("c", "c", {"id": 1, "v": "c1"}),
                    ("b", "u", {"id": 1, "v": "b1!"}), ("a", "d", {"id": 1, "v": "a1"})]
    assert len({e.table_id for e in txn.rows(history)}) == 3
    assert txn.rows(history)[0].table_id == stable_table_id(SOURCE, "cap_multi", "a")


def test_mixed_innodb_and_myisam_groups(mariadb_module: MariaDBServer) -> None:
    """Non-transactional rows (MyISAM) form their own event group ending in a COMMIT query, with
    no XID; both kinds come out as whole transactions in binlog order."""
    db = mariadb_module
    db.execute("CREATE DATABASE cap_mixed")
    db.execute("CREATE TABLE cap_mixed.inno (id INT PRIMARY KEY) ENGINE=InnoDB")
    db.execute("CREATE TABLE cap_mixed.isam (id INT PRIMARY KEY) ENGINE=MyISAM")
    start = gtid_pos(db)
    conn = db.connect("cap_mixed")
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO isam VALUES (1)")
            conn.begin()
            cur.execute("INSERT INTO inno VALUES (1)")
            cur.execute("INSERT INTO isam VALUES (2)")
            cur.execute("INSERT INTO inno VALUES (2)")
            conn.commit()
    finally:
        conn.close()
    txns = read_since(db, start)
    got = [[(m.table_name, len(m.changes)) for m in t.mutations] for t in txns]
    # MariaDB logs the MyISAM statement of the mixed transaction as its own group, first.
    assert got == [[("isam", 1)], [("isam", 1)], [("inno", 2)]]
    seqs = [int(t.gtid.split("-")[2]) for t in txns]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    offsets = [(t.position.file_seq, t.position.offset) for t in txns]
    assert offsets == sorted(offsets)


def test_ddl_becomes_structured_table_info_and_rows_follow_the_new_shape(mariadb_module: MariaDBServer) -> None:
    """Table shape from the TableMap's FULL metadata plus the parsed DDL: CREATE/ALTER/RENAME/
    TRUNCATE/DROP come out as DDL binlogs with table info, and rows after an ALTER decode with
    the new shape through the drainer's schema history."""
    db = mariadb_module
    db.execute("CREATE DATABASE cap_ddl")
    start = gtid_pos(db)
    db.execute("CREATE TABLE cap_ddl.t (id INT PRIMARY KEY, j JSON, UNIQUE KEY uj (id, j(10)))")
    db.execute("INSERT INTO cap_ddl.t VALUES (1, '{}')")
    db.execute("ALTER TABLE cap_ddl.t ADD COLUMN n BIGINT UNSIGNED NOT NULL DEFAULT 7 AFTER id")
    db.execute("INSERT INTO cap_ddl.t VALUES (2, 8, '[1]')")
    db.execute("RENAME TABLE cap_ddl.t TO cap_ddl.t2")
    db.execute("INSERT INTO cap_ddl.t2 VALUES (3, 9, 'null')")
    db.execute("TRUNCATE TABLE cap_ddl.t2")
    db.execute("DROP TABLE cap_ddl.t2")
    txns = read_since(db, start)
    ddls = [(pb.DDLType.Name(d.tp), d.table_name) for t in txns for d in t.ddls]
    assert ddls == [("CREATE_TABLE", "t"), ("ALTER_TABLE", "t"), ("RENAME_TABLE", "t2"),
                    ("TRUNCATE_TABLE", "t2"), ("DROP_TABLE", "t2")]
    create = txns[0].ddls[0]
    assert [c.data_type for c in create.table_info.columns] == ["int", "json"]
    assert [(i.name, i.primary, i.unique) for i in create.table_info.indexes] == [
        ("PRIMARY", True, True), ("uj", False, True)]
    alter = txns[2].ddls[0]
    assert [c.name for c in alter.table_info.columns] == ["id", "n", "j"]
    assert alter.table_info.version > create.table_info.version
    rename = txns[4].ddls[0]
    assert (rename.old_table_name, rename.table_info.table_id) == ("t", stable_table_id(SOURCE, "cap_ddl", "t2"))
    decoded = []
    for txn, history in as_txns(txns):
        for ev in txn.rows(history):
            decoded.append((ev.table, rowcodec.row_to_dict(ev.after, ev.table_info)))
    assert decoded == [("t", {"id": 1, "j": "{}"}), ("t", {"id": 2, "n": 8, "j": "[1]"}),
                       ("t2", {"id": 3, "n": 9, "j": "null"})]
    # The rows matched the declared shapes: no extra schema snapshot was needed.
    assert all(not t.schema_snapshots for t in txns)


def test_filters_skip_tables_and_transactions_carrying_the_loop_mark(mariadb_module: MariaDBServer) -> None:
    """Filters: include/exclude databases and tables (regex). Loop prevention (core/marks.py):
    a transaction touching the mark table — every transaction a Sluice MySQL sink commits does —
    is dropped whole, and a DDL starting with the sink's `/* sluice-apply */` is not emitted
    (the table's shape still follows it); the position moves past both."""
    db = mariadb_module
    db.execute("CREATE DATABASE cap_filter")
    for t in ("keep", "skip_me", "sluice_mark"):
        db.execute(f"CREATE TABLE cap_filter.{t} (id INT PRIMARY KEY)")
    start = gtid_pos(db)
    conn = db.connect("cap_filter")
    try:
        with conn.cursor() as cur:
            conn.begin()
            for t in ("keep", "skip_me"):
                cur.execute(f"INSERT INTO {t} VALUES (1)")
            conn.commit()
            conn.begin()   # as a sink writes it: data plus its mark row
            for t in ("keep", "sluice_mark"):
                cur.execute(f"INSERT INTO {t} VALUES (2)")
            conn.commit()
            cur.execute("/* sluice-apply */ ALTER TABLE keep ADD COLUMN v INT NULL")
            conn.begin()
            cur.execute("INSERT INTO keep VALUES (3, 30)")
            conn.commit()
    finally:
        conn.close()
    flt = TableFilter(include_databases=["cap_filter"], exclude_tables=[r"cap_filter\.skip_.*"],
                      ignored=["cap_filter.sluice_mark"])
    txns = read_since(db, start, table_filter=flt)
    assert [[m.table_name for m in t.mutations] for t in txns] == [["keep"], [], [], ["keep"]]
    assert txns[0].size > 0
    assert txns[1].empty and txns[2].empty and not txns[2].ddls, "the sink's writes are skipped"
    assert txns[-1].gtid == gtid_pos(db), "the position moved past them"
    # The shape after the skipped DDL reaches the drainer with the next captured transaction.
    rows = [(ev.table, rowcodec.row_to_dict(ev.after, ev.table_info))
            for txn, history in as_txns(txns) for ev in txn.rows(history)]
    assert rows == [("keep", {"id": 1}), ("keep", {"id": 3, "v": 30})]

def test_native_event_framing_matches_the_library(mariadb_module: MariaDBServer) -> None:
    """The native framing of rows, GTID and XID events (sluice_native.parse_event, capture's
    strict reader) reads what mysql-replication's own parse reads from the same packets: the
    table id, the column count (packed: 300 columns take 3 bytes), both present bitmaps of an
    UPDATE, the row images byte for byte, the GTID (domain, server, sequence, flags) and the
    XID; the header's timestamp and end position too."""
    from pymysqlreplication.event import MariadbGtidEvent, XidEvent
    from pymysqlreplication.row_event import (DeleteRowsEvent, RowsEvent, UpdateRowsEvent,
                                              WriteRowsEvent)

    from sluice.capture.reader import (EVENTS, FixedBinLogStreamReader, GtidImage, RowsImage,
                                       StrictBinLogStreamReader, XidImage)
    db = mariadb_module
    db.execute("CREATE DATABASE IF NOT EXISTS framing")
    db.execute(ALL_TYPES.format(db="framing"))
    wide = ", ".join(f"c{i} TINYINT" for i in range(300))
    db.execute(f"CREATE TABLE framing.wide (id INT PRIMARY KEY, {wide})")
    start = gtid_pos(db)
    conn = db.connect("framing")
    try:
        with conn.cursor() as cur:
            insert_all_types(cur)
            cur.execute("UPDATE all_types SET vc = CONCAT(vc, 'x'), d10 = d10 + 1")
            cur.execute("DELETE FROM all_types WHERE id = 1")
    finally:
        conn.close()
    db.execute(f"INSERT INTO framing.wide VALUES (1, {', '.join(str(i % 100) for i in range(300))})")
    db.execute("UPDATE framing.wide SET c299 = NULL, c0 = -5")
    db.execute("DELETE FROM framing.wide")
    settings = {"host": "127.0.0.1", "port": db.port, "user": db.user, "password": db.password}
    kinds = {WriteRowsEvent: pb.INSERT, UpdateRowsEvent: pb.UPDATE, DeleteRowsEvent: pb.DELETE}

    library = []
    s = FixedBinLogStreamReader(dict(settings), server_id=4243, blocking=False, is_mariadb=True,
                                auto_position=start, enable_logging=False)
    for ev in s:
        head = (ev.timestamp, ev.packet.log_pos)
        if isinstance(ev, RowsEvent):
            pk = ev.packet
            rest = pk.read(ev.event_size - pk.read_bytes)
            library.append(("rows", kinds[type(ev)], ev.table_id, ev.number_of_columns,
                            ev.columns_present_bitmap, getattr(ev, "columns_present_bitmap2", None),
                            rest, head))
        elif isinstance(ev, MariadbGtidEvent):
            library.append(("gtid", ev.gtid, ev.flags, head))
        elif isinstance(ev, XidEvent):
            library.append(("xid", ev.xid, head))
    s.close()

    native = []
    s = StrictBinLogStreamReader(dict(settings), server_id=4244, blocking=False, is_mariadb=True,
                                 auto_position=start, only_events=EVENTS, enable_logging=False)
    for ev in s:
        head = (ev.timestamp, ev.log_pos) if isinstance(ev, (RowsImage, GtidImage, XidImage)) else None
        if isinstance(ev, RowsImage):
            native.append(("rows", ev.tp, ev.table_id, ev.number_of_columns, ev.present, ev.present2,
                           ev.data[ev.start:ev.end], head))
        elif isinstance(ev, GtidImage):
            native.append(("gtid", ev.gtid, ev.flags, head))
        elif isinstance(ev, XidImage):
            native.append(("xid", ev.xid, head))
    s.close()
    rows = [(e[1], e[3]) for e in native if e[0] == "rows"]
    assert {(pb.INSERT, 39), (pb.UPDATE, 39), (pb.DELETE, 39), (pb.INSERT, 301), (pb.UPDATE, 301),
            (pb.DELETE, 301)} == set(rows)
    assert sum(e[0] == "xid" for e in native) == len(ROWS) + 5
    assert native == library


@pytest.mark.timeout(60)
def test_wake_ends_a_read_waiting_on_an_idle_source(mariadb_module: MariaDBServer) -> None:
    """Invariant (clean stop): a reader's thread waiting on an idle source in the native socket
    read (no GIL held, the read timeout 51 s) returns within a second of `wake()`, as a lost
    connection, so a stopping capture joins it before closing the connection. A native read left
    waiting while the interpreter finalizes crashed the capture on its way back (exit -6/-11)."""
    import threading
    import time

    from sluice.capture.reader import SourceDisconnected

    db = mariadb_module
    db.execute("CREATE DATABASE IF NOT EXISTS wake")
    db.execute("CREATE TABLE IF NOT EXISTS wake.t (id INT PRIMARY KEY)")
    start = gtid_pos(db)
    db.execute("INSERT INTO wake.t VALUES (1)")
    reader = BinlogReader({"host": "127.0.0.1", "port": db.port, "user": db.user,
                           "password": db.password}, replica_server_id=4245,
                          tracker=SchemaTracker(SOURCE, TableFilter()), gtid_state=start,
                          heartbeat_s=5.0)
    got: list[object] = []

    def run() -> None:
        try:
            got.extend(reader.transactions())
        except BaseException as e:  # noqa: BLE001 - the test asserts what ended the read
            got.append(e)
    t = threading.Thread(target=run, name="wake-test-reader", daemon=True)
    try:
        t.start()
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got and isinstance(got[0], SourceTxn), f"the insert was not read: {got}"
        assert reader._stream._native is not None, "the native reader was not in use"
        t.join(1.0)
        assert t.is_alive(), "the read did not wait on the idle source: the test shows nothing"
        began = time.monotonic()
        reader.wake()
        t.join(5.0)
        assert not t.is_alive(), "wake() left the thread waiting in the read"
        assert time.monotonic() - began < 1.0
        assert isinstance(got[-1], SourceDisconnected), got[-1]
    finally:
        reader.close()
        t.join(60)
