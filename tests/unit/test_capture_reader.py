"""The capture's Assembler on synthetic event streams: transaction boundaries and the TableMap rule."""
from __future__ import annotations

from typing import Any

import pytest
from pymysqlreplication.event import QueryEvent, RotateEvent
from pymysqlreplication.row_event import TableMapEvent

from sluice.capture.reader import (Assembler, BinlogProtocolError, GtidImage, RowsImage,
                                   TableMapImage, UnknownTableId, XidImage)
from sluice.capture.schema import SchemaTracker, TableFilter
from tests.support.binlogs import LibraryColumn, LibraryOptionalMetadata


def ev(cls: type, **attrs: Any) -> Any:
    """A library event object with the attributes its parser would have set."""
    e = object.__new__(cls)
    e.packet = None
    e.timestamp = attrs.pop("timestamp", 1_700_000_000)
    for k, v in attrs.items():
        setattr(e, k, v)
    return e


def gtid(seq: int, flags: int = 12) -> Any:
    return GtidImage(0, 1, seq, flags, timestamp=1_700_000_000)


def table_map(table_id: int, table: str) -> Any:
    return TableMapImage(ev(TableMapEvent, table_id=table_id, schema="db", table=table,
                            columns=[LibraryColumn("id", 3)], null_bitmask=b"\x00",
                            optional_metadata=LibraryOptionalMetadata(),
                            dbms="mariadb"), timestamp=1_700_000_000)


def insert(table_id: int, value: int) -> Any:
    # one LONG column, FULL image: present bitmap 0b1, null bitmap 0b0, 4-byte little-endian value,
    # inside a packet-like buffer (the row images are read in place)
    data = b"header" + b"\x00" + value.to_bytes(4, "little", signed=True) + b"crc!"
    return RowsImage(1, table_id, 1, b"\x01", None, data, 6, len(data) - 4, timestamp=1_700_000_000)


def assembler() -> tuple[Assembler, list[str]]:
    cleared: list[str] = []
    a = Assembler(SchemaTracker("src", TableFilter()), on_txn_end=lambda: cleared.append("x"))
    a.feed(ev(RotateEvent, next_binlog="mariadb-bin.000007", position=4))
    return a, cleared


def test_rows_for_an_unknown_table_id_are_fatal_not_skipped() -> None:
    """A rows event is decoded only against a TableMap seen earlier in the same transaction; a
    rows event whose table_id has no TableMap there is fatal (UnknownTableId, naming the
    transaction's GTID and position), never skipped."""
    a, _ = assembler()
    a.feed(gtid(5))
    a.feed(table_map(70, "t"))
    a.feed(insert(70, 1))
    with pytest.raises(UnknownTableId) as e:
        a.feed(insert(71, 2))
    assert e.value.table_id == 71
    assert "GTID 0-1-5" in str(e.value) and "mariadb-bin.000007" in str(e.value)


def test_table_maps_live_for_one_transaction() -> None:
    """TableMaps are cached per transaction and cleared at XID: a later transaction that reuses a
    table_id without its own TableMap is refused, and the library's cache is cleared too."""
    a, cleared = assembler()
    a.feed(gtid(5))
    a.feed(table_map(70, "t"))
    a.feed(insert(70, 1))
    a.feed(table_map(71, "u"))          # a new TableMap mid-transaction
    a.feed(insert(71, 2))
    a.feed(insert(70, 3))               # the first one is still cached
    txn = a.feed(XidImage(1))
    assert txn is not None and cleared == ["x"]
    assert [(m.table_name, [c.after.columns[0].int for c in m.changes]) for m in txn.mutations] == [
        ("t", [1]), ("u", [2]), ("t", [3])]
    assert (txn.position.file_seq, txn.position.file_name) == (7, "mariadb-bin.000007")
    assert [(g.domain_id, g.server_id, g.seq_no) for g in txn.position.gtids] == [(0, 1, 5)]
    a.feed(gtid(6))
    with pytest.raises(UnknownTableId):
        a.feed(insert(70, 4))


def test_non_transactional_group_ends_at_commit_query_and_ddl_stands_alone() -> None:
    """MyISAM groups end with a COMMIT query (no XID); a standalone group (DDL) ends with its
    query; the GTID state carried in positions accumulates per domain."""
    a, _ = assembler()
    a.feed(gtid(8, flags=8))
    a.feed(table_map(70, "t"))
    a.feed(insert(70, 1))
    t1 = a.feed(ev(QueryEvent, query="COMMIT", schema=b"db"))
    assert t1 is not None and len(t1.mutations) == 1
    a.feed(gtid(9, flags=1 | 8 | 32))
    t2 = a.feed(ev(QueryEvent, query="CREATE TABLE x (id INT PRIMARY KEY)", schema=b"db"))
    assert t2 is not None and [d.table_name for d in t2.ddls] == ["x"]
    a.feed(GtidImage(3, 2, 40, 12))
    t3 = a.feed(XidImage(2))
    assert [(g.domain_id, g.seq_no) for g in t3.position.gtids] == [(0, 9), (3, 40)]


def test_a_missing_transaction_end_or_statement_dml_is_fatal() -> None:
    """Events that do not form transactions, or DML logged as a statement, stop the capture."""
    a, _ = assembler()
    a.feed(gtid(5))
    with pytest.raises(BinlogProtocolError):
        a.feed(gtid(6))
    b, _ = assembler()
    b.feed(gtid(5))
    with pytest.raises(BinlogProtocolError, match="statement-format DML"):
        b.feed(ev(QueryEvent, query="INSERT INTO t VALUES (1)", schema=b"db"))
