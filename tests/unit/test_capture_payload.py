"""The capture's Prewrite payloads, built as wire bytes (capture/payload.py), against the message
path they replaced.

The oracle is the old `SourceTxn.prewrite_values`, kept here: pb.TableMutation messages merged
from the native decoder's bytes event by event, copied into pb.PrewriteValue(s). Rule: every
payload decodes, field by field, to the oracle's message (and is the same bytes), on the torture
types' rows decoded natively and on random transactions (hypothesis): mutations of several tables
and events, schema snapshots, none, one or several DDLs, snapshot chunks, any source info.
"""
from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.capture.assembler import SourceTxn
from sluice.capture.payload import RowsMutation, change_count
from sluice.capture.types import RowDecoder, native_spec
from sluice.proto import sluice_pb2 as pb
from tests.unit.test_native_decode import MAX_ROW, MIN_ROW, TORTURE, image

Event = tuple[int, str, str, int, bytes]     # table_id, db, table, version, RowChange bytes


def oracle(txn_parts: dict[str, Any], events: list[Event], source_name: str) -> list[pb.PrewriteValue]:
    """The old path: TableMutation messages merged per rows event, copied into the value(s)."""
    muts: list[pb.TableMutation] = []
    for table_id, db, table, version, changes in events:
        if not (muts and muts[-1].table_id == table_id):
            muts.append(pb.TableMutation(table_id=table_id, schema_name=db, table_name=table,
                                         table_version=version))
        muts[-1].MergeFromString(changes)
    t = txn_parts
    src = pb.SourceInfo(name=source_name, server_id=t["server_id"], gtid=t["gtid"], file=t["file"],
                        pos=t["offset"], ts_ms=t["ts_ms"])
    if len(t["ddls"]) <= 1:
        v = pb.PrewriteValue(mutations=muts, schema_snapshots=t["schema_snapshots"], source=src,
                             snapshot_chunk=t["snapshot"] is not None)
        if t["ddls"]:
            v.ddl.CopyFrom(t["ddls"][0])
        return [v]
    out = [pb.PrewriteValue(ddl=d, source=src) for d in t["ddls"]]
    out[0].schema_snapshots.extend(t["schema_snapshots"])
    return out


def ours(txn_parts: dict[str, Any], events: list[Event], source_name: str) -> tuple[SourceTxn, list[bytes]]:
    """The new path, as the Assembler builds it: one RowsMutation per run of one table."""
    muts: list[RowsMutation] = []
    for table_id, db, table, version, changes in events:
        if not (muts and muts[-1].table_id == table_id):
            muts.append(RowsMutation(table_id, db, table, version))
        muts[-1].add(changes, len(pb.TableMutation.FromString(changes).changes))
    txn = SourceTxn(position=pb.Position(), mutations=tuple(muts), size=0, **txn_parts)
    return txn, txn.prewrite_values(source_name)


def check(txn_parts: dict[str, Any], events: list[Event], source_name: str) -> list[pb.PrewriteValue]:
    want = oracle(txn_parts, events, source_name)
    txn, got = ours(txn_parts, events, source_name)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        decoded = pb.PrewriteValue.FromString(g)
        assert decoded.ListFields() == w.ListFields()     # field by field
        assert decoded == w
        assert g == w.SerializeToString()                 # and byte for byte
    # What readers of the transaction see (snapshot windows, signal tables, metrics).
    flat = [m for v in want[:1] for m in v.mutations] if len(txn_parts["ddls"]) <= 1 else []
    if flat:
        assert [list(m.changes) for m in txn.mutations] == [list(m.changes) for m in flat]
        assert [change_count(m) for m in txn.mutations] == [len(m.changes) for m in flat]
    return want


def parts(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(gtid="0-1-7", server_id=1, ts_ms=1_700_000_000_000,
                                file="mariadb-bin.000003", offset=4242, schema_snapshots=(),
                                ddls=(), snapshot=None)
    base.update(over)
    return base


def torture_changes(tp: int) -> bytes:
    """The native decoder's `repeated RowChange` bytes for the torture rows."""
    dec = RowDecoder([native_spec(c.b, c.info, c.enc, f"db.t.{c.name}") for c in TORTURE], "db.t")
    rows = [image(TORTURE, MIN_ROW), image(TORTURE, MAX_ROW), image(TORTURE, [None] * len(TORTURE))]
    body = {pb.INSERT: b"".join(rows), pb.UPDATE: rows[0] + rows[1] + rows[1] + rows[2],
            pb.DELETE: rows[2] + rows[0]}[tp]
    data, n = dec.decode(body, tp)
    assert n == {pb.INSERT: 3, pb.UPDATE: 2, pb.DELETE: 2}[tp]
    return data


def test_torture_rows_make_the_same_payload_as_the_message_path() -> None:
    """Every payload decodes, field by field, to the old message path's PrewriteValue (and is the
    same bytes) for the torture types' natively decoded rows, events of one table merged."""
    ins, upd, dele = (torture_changes(tp) for tp in (pb.INSERT, pb.UPDATE, pb.DELETE))
    events = [(77, "db", "t", 3, ins), (77, "db", "t", 3, upd), (5, "ü", "ẞ表", 1, dele),
              (77, "db", "t", 3, dele)]
    want = check(parts(), events, "src")
    assert [len(m.changes) for m in want[0].mutations] == [5, 2, 2]
    info = pb.TableInfo(table_id=77, schema_name="db", table_name="t", version=3,
                        columns=[c.info for c in TORTURE], charset="utf8mb4", source="src")
    check(parts(schema_snapshots=(info,), snapshot=pb.SnapshotProgress()), events, "src")
    ddl = pb.DDL(tp=pb.DDLType.Value(pb.DDLType.keys()[1]), schema_name="db", table_name="t",
                 query="ALTER TABLE t ADD c INT", table_info=info, table_id=77)
    check(parts(schema_snapshots=(info,), ddls=(ddl,)), [], "")
    check(parts(ddls=(ddl, pb.DDL(), pb.DDL(table_name="x", table_id=-3))), events, "src")


def test_an_empty_transaction_and_empty_messages_keep_their_presence() -> None:
    """A transaction without rows still carries its source; empty DDL and TableInfo messages
    are present (not dropped) exactly as the message path writes them."""
    check(parts(gtid="", server_id=0, ts_ms=0, file="", offset=0), [], "")
    check(parts(schema_snapshots=(pb.TableInfo(),), ddls=(pb.DDL(),)), [], "s")
    check(parts(), [(0, "", "", 0, b"")], "s")


_text = st.text(max_size=12)
_i64 = st.integers(-(1 << 63), (1 << 63) - 1)
_datum = st.one_of(
    st.builds(lambda: pb.Datum(null=True)), st.builds(lambda v: pb.Datum(int=v), _i64),
    st.builds(lambda v: pb.Datum(uint=v), st.integers(0, (1 << 64) - 1)),
    st.builds(lambda v: pb.Datum(double=v), st.floats(allow_nan=False)),
    st.builds(lambda v: pb.Datum(str=v), _text), st.builds(lambda v: pb.Datum(bytes=v), st.binary(max_size=300)),
    st.builds(lambda v: pb.Datum(decimal=v), st.from_regex(r"-?[0-9]{1,40}\.[0-9]{0,10}", fullmatch=True)))
_row = st.builds(lambda cols: pb.Row(columns=cols), st.lists(_datum, max_size=6))
_change = st.one_of(st.builds(lambda a: pb.RowChange(tp=pb.INSERT, after=a), _row),
                    st.builds(lambda b, a: pb.RowChange(tp=pb.UPDATE, before=b, after=a), _row, _row),
                    st.builds(lambda b: pb.RowChange(tp=pb.DELETE, before=b), _row))
_event = st.builds(lambda tid, db, t, ver, chs: (tid, db, t, ver,
                                                 pb.TableMutation(changes=chs).SerializeToString()),
                   st.sampled_from([1, 2, 1 << 40, -5, 0]), _text, _text, _i64,
                   st.lists(_change, min_size=1, max_size=4))
_info = st.builds(lambda tid, name, v: pb.TableInfo(table_id=tid, table_name=name, version=v,
                                                    columns=[pb.ColumnInfo(name=name)]), _i64, _text, _i64)
_ddl = st.builds(lambda q, name, tid: pb.DDL(query=q, table_name=name, table_id=tid), _text, _text, _i64)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(_event, max_size=8), infos=st.lists(_info, max_size=3),
       ddls=st.lists(_ddl, max_size=3), chunk=st.booleans(), gtid=_text, file=_text,
       server_id=st.integers(0, (1 << 32) - 1), offset=st.integers(0, (1 << 64) - 1), ts_ms=_i64,
       name=_text)
def test_random_transactions_make_the_same_payload_as_the_message_path(
        events: list[Event], infos: list[pb.TableInfo], ddls: list[pb.DDL], chunk: bool, gtid: str,
        file: str, server_id: int, offset: int, ts_ms: int, name: str) -> None:
    """Random transactions (tables, ids including 0 and negative, versions, rows of every kind of
    value, snapshots, DDLs, source info at the fields' limits) give payloads equal, field by field
    and byte for byte, to the message path's."""
    check(parts(gtid=gtid, file=file, server_id=server_id, offset=offset, ts_ms=ts_ms,
                schema_snapshots=tuple(infos), ddls=tuple(ddls),
                snapshot=pb.SnapshotProgress() if chunk else None), events, name)
