from __future__ import annotations

import pytest

from sluice.core.rowcodec import python_to_datum, row_to_dict
from sluice.drainer.txn import CorruptSchemaHistory, CorruptTxn, MissingSchema, SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb


def table(table_id: int, db: str, name: str, version: int, *cols: str) -> pb.TableInfo:
    return pb.TableInfo(
        table_id=table_id, schema_name=db, table_name=name, version=version,
        columns=[pb.ColumnInfo(name=c, data_type="bigint" if c == "id" else "varchar") for c in cols],
        indexes=[pb.IndexInfo(name="PRIMARY", columns=["id"], primary=True)])


def row(*values) -> pb.Row:
    return pb.Row(columns=[python_to_datum(v) for v in values])


def binlogs(value: pb.PrewriteValue, start_ts: int, commit_ts: int, parts: int = 1,
            producer: str = "cap-1") -> tuple[list[bytes], bytes]:
    raw = value.SerializeToString()
    size = -(-len(raw) // parts)
    chunks = [raw[i * size:(i + 1) * size] for i in range(parts)]
    prewrites = [pb.Binlog(tp=pb.PREWRITE, start_ts=start_ts, prewrite_value=chunk, part_no=i,
                           part_count=parts if parts > 1 else 0, producer_id=producer).SerializeToString()
                 for i, chunk in enumerate(chunks)]
    commit = pb.Binlog(tp=pb.COMMIT, start_ts=start_ts, commit_ts=commit_ts, producer_id=producer,
                       position=pb.Position(file_seq=3, offset=120, file_name="mariadb-bin.000003"),
                       snapshot=pb.SnapshotProgress(snapshot_id="s1", chunks_done=2))
    return prewrites, commit.SerializeToString()


ORDERS = table(10, "shop", "orders", 1, "id", "name")


def orders_value(n: int) -> pb.PrewriteValue:
    return pb.PrewriteValue(
        source=pb.SourceInfo(name="src", gtid="0-1-42"),
        mutations=[pb.TableMutation(table_id=10, schema_name="shop", table_name="orders", table_version=1,
                                    changes=[pb.RowChange(tp=pb.INSERT, after=row(i, "x" * 200))
                                             for i in range(n)])])


def test_multi_part_prewrite_is_joined_in_part_order():
    """A Txn is built only from a COMMIT and every part of its PREWRITE, joined in part order;
    anything else is CorruptTxn naming pump, start_ts and commit_ts."""
    value = orders_value(20)
    prewrites, commit = binlogs(value, start_ts=100, commit_ts=105, parts=4)
    # Parts may arrive in any order (and a retried part twice); the join follows part_no.
    shuffled = [prewrites[2], prewrites[0], prewrites[3], prewrites[1], prewrites[2]]
    txn = Txn.from_binlogs(shuffled, commit, pump_id="pump-a")
    assert txn.prewrite == value
    assert (txn.start_ts, txn.commit_ts, txn.producer_id, txn.pump_id) == (100, 105, "cap-1", "pump-a")
    assert txn.position.file_name == "mariadb-bin.000003"
    assert txn.snapshot.snapshot_id == "s1"
    assert txn.source.gtid == "0-1-42" and not txn.is_ddl and txn.ddl is None

    with pytest.raises(CorruptTxn,
                       match=r"pump-a .*start_ts 100, commit_ts 105.*missing prewrite part\(s\) \[1\] of 4"):
        Txn.from_binlogs([prewrites[0], prewrites[2], prewrites[3]], commit, pump_id="pump-a")
    with pytest.raises(CorruptTxn, match="no prewrite"):
        Txn.from_binlogs([], commit, pump_id="pump-a")
    other, _ = binlogs(value, start_ts=99, commit_ts=105)
    with pytest.raises(CorruptTxn, match="not a prewrite of this transaction"):
        Txn.from_binlogs(other, commit, pump_id="pump-a")


def test_undecodable_payload_names_pump_start_ts_and_commit_ts():
    prewrites, commit = binlogs(orders_value(1), start_ts=7, commit_ts=9)
    bad_part = pb.Binlog(tp=pb.PREWRITE, start_ts=7, prewrite_value=b"\xff\xff\xff").SerializeToString()
    with pytest.raises(CorruptTxn) as e:
        Txn.from_binlogs([bad_part], commit, pump_id="pump-b")
    assert str(e.value).startswith("corrupt transaction from pump pump-b (start_ts 7, commit_ts 9): "
                                   "undecodable prewrite value")
    assert (e.value.pump_id, e.value.start_ts, e.value.commit_ts) == ("pump-b", 7, 9)
    with pytest.raises(CorruptTxn, match=r"pump pump-b \(start_ts \?, commit_ts \?\): undecodable commit"):
        Txn.from_binlogs(prewrites, b"\xff\xff\xff", pump_id="pump-b")
    with pytest.raises(CorruptTxn, match=r"start_ts 7, commit_ts 9\): undecodable prewrite binlog #0"):
        Txn.from_binlogs([b"\xff\xff"], commit, pump_id="pump-b")


def test_rows_translate_mutations_in_order():
    history = SchemaHistory()
    history.record(10, 50, ORDERS)
    value = pb.PrewriteValue(mutations=[
        pb.TableMutation(table_id=10, schema_name="shop", table_name="orders", changes=[
            pb.RowChange(tp=pb.INSERT, after=row(1, "a")),
            pb.RowChange(tp=pb.UPDATE, before=row(1, "a"), after=row(1, "b")),
        ]),
        pb.TableMutation(table_id=10, changes=[
            pb.RowChange(tp=pb.DELETE, before=row(1, "b")),
            pb.RowChange(tp=pb.READ, after=row(2, "c")),
        ]),
    ])
    txn = Txn(commit_ts=60, start_ts=55, producer_id="p", position=None, prewrite=value, snapshot=None,
              pump_id="x")
    events = txn.rows(history)
    assert [(e.op, e.seq, e.schema, e.table, e.table_id) for e in events] == [
        ("c", 0, "shop", "orders", 10), ("u", 1, "shop", "orders", 10),
        ("d", 2, "shop", "orders", 10), ("r", 3, "shop", "orders", 10)]
    assert events[0].before is None
    assert row_to_dict(events[0].after, events[0].table_info) == {"id": 1, "name": "a"}
    assert row_to_dict(events[1].before, ORDERS)["name"] == "a"
    assert events[2].after is None and events[3].before is None

    early = Txn(commit_ts=49, start_ts=48, producer_id="p", position=None, prewrite=value, snapshot=None,
                pump_id="x")
    with pytest.raises(MissingSchema, match=r"table id 10 \(shop\.orders\) at commit_ts 49"):
        early.rows(history)


def test_snapshot_chunk_inserts_are_reads():
    history = SchemaHistory()
    history.record(10, 1, ORDERS)
    value = pb.PrewriteValue(snapshot_chunk=True, mutations=[pb.TableMutation(
        table_id=10, changes=[pb.RowChange(tp=pb.INSERT, after=row(1, "a"))])])
    txn = Txn(commit_ts=5, start_ts=4, producer_id="p", position=None, prewrite=value, snapshot=None,
              pump_id="x")
    assert [e.op for e in txn.rows(history)] == ["r"]


def ddl_txn(commit_ts: int, ddl: pb.DDL) -> Txn:
    return Txn(commit_ts=commit_ts, start_ts=commit_ts - 1, producer_id="p", position=None,
               prewrite=pb.PrewriteValue(ddl=ddl), snapshot=None, pump_id="x")


def test_schema_history_answers_the_shape_in_force_at_commit_ts():
    """SchemaHistory answers with the table shape in force at commit_ts: the latest version with
    commit_ts <= the given commit_ts."""
    h = SchemaHistory()
    v1 = table(10, "shop", "orders", 1, "id", "name")
    v2 = table(10, "shop", "orders", 2, "id", "name", "price")
    h.apply(Txn(commit_ts=100, start_ts=99, producer_id="p", position=None,
                prewrite=pb.PrewriteValue(schema_snapshots=[v1]), snapshot=None, pump_id="x"))
    h.apply(ddl_txn(200, pb.DDL(tp=pb.ALTER_TABLE, schema_name="shop", table_name="orders",
                                query="ALTER TABLE orders ADD price varchar(9)", table_info=v2, table_id=10)))
    assert h.table_at(10, 99) is None
    assert h.table_at(10, 100) == v1
    assert h.table_at(10, 199) == v1
    assert h.table_at(10, 200) == v2
    assert h.table_at(10, 10**15) == v2
    assert h.table_at(11, 200) is None
    # A version recorded out of order (an older DDL applied late) still lands in commit order.
    v0 = table(10, "shop", "orders", 0, "id")
    h.record(10, 50, v0)
    assert h.table_at(10, 60) == v0 and h.table_at(10, 150) == v1


def test_rename_and_drop():
    h = SchemaHistory()
    v1 = table(10, "shop", "orders", 1, "id", "name")
    h.record(10, 100, v1)
    # RENAME with its table_info.
    renamed = table(10, "shop", "orders_old", 2, "id", "name")
    h.apply(ddl_txn(200, pb.DDL(tp=pb.RENAME_TABLE, schema_name="shop", table_name="orders_old",
                                old_schema_name="shop", old_table_name="orders", table_info=renamed)))
    # RENAME without table_info: names move under the same table id, the shape stays.
    h.apply(ddl_txn(300, pb.DDL(tp=pb.RENAME_TABLE, schema_name="archive", table_name="orders_2023",
                                old_schema_name="shop", old_table_name="orders_old")))
    assert h.table_at(10, 150).table_name == "orders"
    assert h.table_at(10, 250).table_name == "orders_old"
    at300 = h.table_at(10, 300)
    assert (at300.schema_name, at300.table_name, at300.table_id) == ("archive", "orders_2023", 10)
    assert list(at300.columns) == list(v1.columns)
    assert h.find("archive", "orders_2023", 300) == at300
    assert h.find("shop", "orders", 300) is None

    h.apply(ddl_txn(400, pb.DDL(tp=pb.DROP_TABLE, schema_name="archive", table_name="orders_2023")))
    assert h.table_at(10, 399) == at300
    assert h.table_at(10, 400) is None
    # Re-created under the same id later.
    h.apply(ddl_txn(500, pb.DDL(tp=pb.CREATE_TABLE, schema_name="shop", table_name="orders", table_info=v1)))
    assert h.table_at(10, 450) is None and h.table_at(10, 500) == v1

    h.record(20, 100, table(20, "tmp", "a", 1, "id"))
    h.record(21, 100, table(21, "tmp", "b", 1, "id"))
    h.apply(ddl_txn(600, pb.DDL(tp=pb.DROP_DATABASE, schema_name="tmp")))
    assert h.table_at(20, 600) is None and h.table_at(21, 600) is None
    assert h.table_at(20, 599) is not None and h.table_at(10, 600) == v1


def test_prune_keeps_the_version_in_force():
    h = SchemaHistory()
    for ts, version in [(100, 1), (200, 2), (300, 3)]:
        h.record(10, ts, table(10, "s", "t", version, "id"))
    h.record(11, 100, table(11, "s", "gone", 1, "id"))
    h.record(11, 150, None)
    h.prune(250)
    assert h.table_at(10, 250).version == 2
    assert h.table_at(10, 300).version == 3
    assert h.table_at(10, 199) is None  # older versions are gone
    assert len(h) == 2 and h.table_ids() == [10]


def test_schema_history_round_trips_through_bytes():
    h = SchemaHistory()
    h.record(10, 100, table(10, "shop", "orders", 1, "id", "name"))
    h.record(10, 200, None)
    h.record(12, 150, table(12, "shop", "items", 4, "id"))
    back = SchemaHistory.from_bytes(h.to_bytes())
    for table_id in (10, 12, 13):
        for ts in (99, 100, 150, 199, 200, 1000):
            assert back.table_at(table_id, ts) == h.table_at(table_id, ts)
    assert back.to_bytes() == h.to_bytes()
    with pytest.raises(CorruptSchemaHistory):
        SchemaHistory.from_bytes(b'{"format":1,"tables":{"10":[[1,"!!"]]}}')
    with pytest.raises(CorruptSchemaHistory):
        SchemaHistory.from_bytes(b"\x00garbage")
