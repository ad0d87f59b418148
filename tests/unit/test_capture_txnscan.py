"""The native per-transaction reader (sluice_native.TxnScanner, native/src/txnscan.rs) against
the per-event path it short-cuts, on synthetic binlog packets: every whole transaction it reads
comes out exactly as the events one by one give it (position, rows bytes, sizes, the loop mark,
the Assembler's state after it); every group it cannot read whole (unknown table_id, a TableMap
the tracker never resolved, a row image that does not decode, a standalone GTID) it declines without consuming anything (a group the packets do
not finish it reports as such, so the reader can read more), and the per-event path then raises or
reads exactly as before."""
from __future__ import annotations

import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysqlreplication.event import RotateEvent
from pymysqlreplication.row_event import TableMapEvent

from sluice.capture.assembler import Assembler, SourceTxn, TxnImage
from sluice.capture.binlog_stream import _frame, _StrictTableMap
from sluice.capture.schema import SchemaTracker, TableFilter
from tests.support.binlogs import LibraryColumn, LibraryOptionalMetadata

_TS = 1_700_000_000
_GTID, _XID, _TABLE_MAP, _WRITE, _UPDATE, _DELETE = 162, 16, 19, 23, 24, 25
TABLES = {"t1": 101, "t2": 102, "skip": 103, "mark": 104, "late": 105}


def _library_table_map(table_id: int, table: str) -> Any:
    """The library's parse of a TableMap (id LONG NOT NULL, v LONGLONG NULL)."""
    e = object.__new__(TableMapEvent)
    e.packet, e.timestamp = None, _TS
    e.table_id, e.schema, e.table, e.dbms = table_id, "db", table, "mariadb"
    e.columns = [LibraryColumn("id", 3), LibraryColumn("v", 8)]
    e.null_bitmask, e.optional_metadata = b"\x02", LibraryOptionalMetadata()
    return e


class Binlog:
    """Synthetic binlog packets (OK byte + v4 header + body, no checksum) with growing log_pos."""

    def __init__(self) -> None:
        self.pos = 4
        self.parsed: dict[bytes, Any] = {}
        self.seq = 0

    def event(self, etype: int, body: bytes, ts: int = _TS) -> bytes:
        size = 19 + len(body)
        self.pos += size
        return b"\x00" + struct.pack("<IBIIIH", ts, etype, 1, size, self.pos, 0) + body

    def gtid(self, flags: int = 12) -> bytes:
        self.seq += 1
        return self.event(_GTID, struct.pack("<QIB", self.seq, 0, flags) + bytes(6))

    def xid(self) -> bytes:
        return self.event(_XID, struct.pack("<Q", self.seq))

    def table_map(self, table: str, table_id: int | None = None) -> bytes:
        tid = TABLES[table] if table_id is None else table_id
        body = tid.to_bytes(6, "little") + b"\x01\x00" + b"\x02db\x00" + bytes([len(table)]) + \
            table.encode() + b"\x00\x02\x03\x08\x00\x02"
        self.parsed.setdefault(body, _library_table_map(tid, table))
        return self.event(_TABLE_MAP, body)

    def rows(self, etype: int, table_id: int, images: list[tuple[int, int | None]],
             present: bytes = b"\x03", cut: int = 0) -> bytes:
        body = table_id.to_bytes(6, "little") + b"\x01\x00" + b"\x02" + present
        if etype == _UPDATE:
            body += present
        for rid, v in images:
            body += bytes([0x02 if v is None else 0]) + struct.pack("<i", rid)
            if v is not None:
                body += struct.pack("<q", v)
        return self.event(etype, body[:len(body) - cut] if cut else body)


def _tracker() -> SchemaTracker:
    return SchemaTracker("src", TableFilter(exclude_tables=[r"db\.skip"], ignored=["db.mark"]))


def _assembler(tracker: SchemaTracker) -> Assembler:
    a = Assembler(tracker)
    rot = object.__new__(RotateEvent)
    rot.packet, rot.timestamp, rot.next_binlog, rot.position = None, 0, "mariadb-bin.000003", 4
    a.feed(rot)
    return a


def _txn_view(t: SourceTxn) -> tuple:
    return (t.position.SerializeToString(), t.gtid, t.server_id, t.ts_ms, t.file, t.offset,
            [(m.table_id, m.schema_name, m.table_name, m.table_version, m.count,
              m.SerializeToString()) for m in t.mutations],
            [s.SerializeToString() for s in t.schema_snapshots], [d.SerializeToString() for d in t.ddls],
            t.size, t.prewrite_values("src"))


def read(packets: list[bytes], parsed: dict[bytes, Any], tracker: SchemaTracker, native: bool
         ) -> tuple[list[Any], int, tuple]:
    """What the reader does (capture/binlog_stream.py fetchone): at a GTID the scanner first
    (native), else each event framed and fed. -> (txn views and the error, if any, whole
    transactions read natively, the Assembler's state at the end)."""
    a = _assembler(tracker)
    tm = _StrictTableMap(a.where, parsed)
    out: list[Any] = []
    whole = 0
    i = 0
    try:
        while i < len(packets):
            p = packets[i]
            if native and p[5] == _GTID:
                got = tracker.scanner.scan(packets, i, False)
                if got is not None and got[1] is None:
                    # the group goes on past the packets (the reader would read more): here
                    # there is no more, so it is read event by event
                    assert got[0] == len(packets)
                    got = None
                if got is not None:
                    i, item = got
                    assert i > 0
                    out.append(_txn_view(a.feed(TxnImage(*item))))
                    whole += 1
                    continue
            i += 1
            image = _frame(p, tm, False)
            assert image is not None, "the synthetic binlog holds only natively framed events"
            r = a.feed(image)
            if r is not None:
                out.append(_txn_view(r))
    except Exception as e:  # noqa: BLE001 - both paths must fail the same way
        out.append((type(e).__name__, str(e)))
    return out, whole, (a.last_event_end, a.last_event_ts, dict(a.gtid_state), a.where())


def _warm(b: Binlog, tables: list[str]) -> list[bytes]:
    """Transactions mapping these tables (read event by event: they teach the scanner). The mark
    table goes alone: a marked transaction that declares shapes resets what is declared."""
    out = [b.gtid()]
    for t in tables:
        if t != "mark":
            out += [b.table_map(t), b.rows(_WRITE, TABLES[t], [(0, 0)])]
    out.append(b.xid())
    if "mark" in tables:
        out += [b.gtid(), b.table_map("mark"), b.rows(_WRITE, TABLES["mark"], [(0, 0)]), b.xid()]
    return out


def both(packets: list[bytes], parsed: dict[bytes, Any]) -> tuple[int, list[Any]]:
    by_event, none, state_a = read(packets, parsed, _tracker(), native=False)
    native, whole, state_b = read(packets, parsed, _tracker(), native=True)
    assert none == 0
    assert native == by_event
    assert state_b == state_a
    return whole, native


def test_whole_transactions_match_the_per_event_path() -> None:
    """Rows on two tables with a TableMap re-sent mid-transaction, UPDATE pairs, DELETEs, NULLs,
    a filtered table's rows (size only) and a transaction touching the mark table (dropped
    whole): after the first transaction taught the scanner, every later one is read whole."""
    b = Binlog()
    packets = _warm(b, ["t1", "t2", "skip", "mark"])
    packets += [b.gtid(), b.table_map("t1"), b.rows(_WRITE, 101, [(1, 10), (2, None)]),
                b.table_map("t2"), b.rows(_UPDATE, 102, [(0, 0), (0, -(2 ** 63))]),
                b.table_map("t1"), b.rows(_DELETE, 101, [(1, 10)]), b.rows(_WRITE, 101, [(3, 2 ** 63 - 1)]),
                b.table_map("skip"), b.rows(_WRITE, 103, [(5, 5)]), b.xid()]
    packets += [b.gtid(), b.table_map("t2"), b.table_map("mark"), b.rows(_WRITE, 102, [(9, 9)]),
                b.rows(_WRITE, 104, [(1, 1)]), b.xid()]
    packets += [b.gtid(), b.table_map("skip"), b.rows(_DELETE, 103, [(5, 5)]), b.xid()]
    whole, out = both(packets, b.parsed)
    assert whole == 3 and len(out) == 5
    assert [len(v[6]) for v in out] == [2, 0, 3, 0, 0]   # t1, t2, t1 runs; marked; filtered only
    assert out[4][9] > 0, "a filtered table's rows still count in the size"


def test_declined_groups_fail_or_read_exactly_as_event_by_event() -> None:
    """Each group the scanner cannot read whole is declined (nothing consumed) and the per-event
    path decides: the unknown table_id stays fatal, a bitmap or row that does not match its
    TableMap raises UndecodableRow, a TableMap never resolved is resolved there (and taught), a
    standalone group and a group the packets do not finish are read event by event."""
    cases: dict[str, tuple[list[bytes], Binlog]] = {}
    for case in ("unknown_table_id", "bad_bitmap", "short_row", "new_table", "standalone", "unfinished",
                 "other_table_id"):
        b = Binlog()
        p = _warm(b, ["t1"])
        if case == "unknown_table_id":
            p += [b.gtid(), b.table_map("t1"), b.rows(_WRITE, 999, [(1, 1)]), b.xid()]
        elif case == "bad_bitmap":
            p += [b.gtid(), b.table_map("t1"), b.rows(_WRITE, 101, [(1, 1)], present=b"\x01"), b.xid()]
        elif case == "short_row":
            p += [b.gtid(), b.table_map("t1"), b.rows(_WRITE, 101, [(1, 1)], cut=3), b.xid()]
        elif case == "new_table":
            p += [b.gtid(), b.table_map("late"), b.rows(_WRITE, 105, [(1, 1)]), b.xid()]
            p += [b.gtid(), b.table_map("late"), b.rows(_WRITE, 105, [(2, 2)]), b.xid()]
        elif case == "standalone":
            p += [b.gtid(flags=13), b.table_map("t1"), b.rows(_WRITE, 101, [(1, 1)]), b.xid()]
        elif case == "unfinished":
            p += [b.gtid(), b.table_map("t1"), b.rows(_WRITE, 101, [(1, 1)])]
        else:
            # t1 mapped under another table id: a body the scanner was never taught
            p += [b.gtid(), b.table_map("t1", 201), b.rows(_WRITE, 201, [(1, 1)]), b.xid()]
        cases[case] = (p, b)
    results = {case: both(p, b.parsed) for case, (p, b) in cases.items()}
    assert results["unknown_table_id"][1][-1][0] == "UnknownTableId"
    assert results["bad_bitmap"][1][-1][0] == "UndecodableRow"
    assert "FULL" in results["bad_bitmap"][1][-1][1]
    assert results["short_row"][1][-1][0] == "UndecodableRow"
    assert results["new_table"][0] == 1, "the second group of the new table is read whole"
    assert results["standalone"][0] == 0
    assert len(results["unfinished"][1]) == 1 and results["unfinished"][0] == 0
    assert results["other_table_id"][0] == 0 and len(results["other_table_id"][1]) == 2


_VALUES = st.one_of(st.none(), st.integers(-(2 ** 63), 2 ** 63 - 1))
_IMAGE = st.tuples(st.integers(-(2 ** 31), 2 ** 31 - 1), _VALUES)
_STATEMENT = st.tuples(st.sampled_from(["t1", "t2", "skip", "mark"]),
                       st.sampled_from([_WRITE, _UPDATE, _DELETE]),
                       st.lists(_IMAGE, min_size=1, max_size=4), st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_STATEMENT, min_size=1, max_size=6), min_size=1, max_size=6),
       st.sampled_from([None, "unknown_table_id", "short_row", "unfinished"]))
def test_random_transactions_match_the_per_event_path(txns: list[list[tuple]], breakage: str | None) -> None:
    """Random transactions (tables, kinds, values incl. NULL and the int64 extremes, TableMaps
    re-sent or not) and one random breakage at the end: the same transactions, bytes and errors
    as event by event, and every unbroken transaction after the first read whole."""
    b = Binlog()
    packets = _warm(b, ["t1", "t2", "skip", "mark"])
    for stmts in txns:
        packets.append(b.gtid())
        mapped: set[str] = set()
        for table, kind, images, remap in stmts:
            if table not in mapped or remap:
                packets.append(b.table_map(table))
                mapped.add(table)
            if kind == _UPDATE and len(images) % 2:
                images = images + images[:1]
            packets.append(b.rows(kind, TABLES[table], images))
        packets.append(b.xid())
    if breakage == "unknown_table_id":
        packets += [b.gtid(), b.table_map("t1"), b.rows(_WRITE, 777, [(1, 1)]), b.xid()]
    elif breakage == "short_row":
        packets += [b.gtid(), b.table_map("t2"), b.rows(_WRITE, 102, [(1, 1)], cut=1), b.xid()]
    elif breakage == "unfinished":
        packets += [b.gtid(), b.table_map("t2")]
    whole, out = both(packets, b.parsed)
    assert whole == len(txns)
    if breakage in ("unknown_table_id", "short_row"):
        assert out[-1][0] in ("UnknownTableId", "UndecodableRow")
