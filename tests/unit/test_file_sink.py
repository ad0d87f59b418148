from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sluice.core import ts as tsmod
from sluice.core.errors import ConfigError, CorruptRecord, InvalidArgument
from sluice.core.rowcodec import python_to_datum
from sluice.drainer.sink import Checkpoint, SinkCheckpoint, load_sink
from sluice.drainer.sinks.file import FileSink, FileSinkConfig, list_files
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb

ORDERS = pb.TableInfo(
    table_id=10, schema_name="shop", table_name="orders", version=1,
    columns=[pb.ColumnInfo(name="id", data_type="bigint", column_type="bigint(20)"),
             pb.ColumnInfo(name="price", data_type="decimal", column_type="decimal(10,2)",
                           precision=10, scale=2, nullable=True),
             pb.ColumnInfo(name="gone", data_type="int", hidden=True, nullable=True),
             pb.ColumnInfo(name="state", data_type="enum", column_type="enum('new','paid')",
                           elements=["new", "paid"])],
    indexes=[pb.IndexInfo(name="PRIMARY", columns=["id"], primary=True)])
ITEMS = pb.TableInfo(
    table_id=11, schema_name="shop", table_name="items", version=1,
    columns=[pb.ColumnInfo(name="sku", data_type="varchar", column_type="varchar(32)", length=32),
             pb.ColumnInfo(name="at", data_type="datetime", column_type="datetime(6)", scale=6)],
    indexes=[pb.IndexInfo(name="PRIMARY", columns=["sku"], primary=True)])


def history() -> SchemaHistory:
    h = SchemaHistory()
    h.record(10, 1, ORDERS)
    h.record(11, 1, ITEMS)
    return h


def order(i: int, price: str | None = "9.99", state: str = "new") -> pb.Row:
    return pb.Row(columns=[python_to_datum(i), pb.Datum(decimal=price) if price else pb.Datum(null=True),
                           pb.Datum(null=True), python_to_datum(state)])


def item(sku: str) -> pb.Row:
    return pb.Row(columns=[python_to_datum(sku),
                           pb.Datum(datetime=pb.DateTimeValue(year=2024, month=1, day=2, hour=3))])


def txn(commit_ts: int, *mutations: pb.TableMutation, source: pb.SourceInfo | None = None,
        ddl: pb.DDL | None = None, snapshot_chunk: bool = False,
        snapshot: pb.SnapshotProgress | None = None) -> Txn:
    value = pb.PrewriteValue(mutations=list(mutations), snapshot_chunk=snapshot_chunk)
    if source is not None:
        value.source.CopyFrom(source)
    if ddl is not None:
        value.ddl.CopyFrom(ddl)
    return Txn(commit_ts=commit_ts, start_ts=commit_ts - 1, producer_id="cap", pump_id="pump-1",
               position=pb.Position(file_seq=1, offset=4, file_name="bin.000001", server_id=3),
               prewrite=value, snapshot=snapshot)


def orders(*changes: pb.RowChange) -> pb.TableMutation:
    return pb.TableMutation(table_id=10, schema_name="shop", table_name="orders", changes=list(changes))


def items(*changes: pb.RowChange) -> pb.TableMutation:
    return pb.TableMutation(table_id=11, schema_name="shop", table_name="items", changes=list(changes))


def insert(r: pb.Row) -> pb.RowChange:
    return pb.RowChange(tp=pb.INSERT, after=r)


def read_records(directory: Path) -> list[dict]:
    out = []
    for _, path in list_files(directory):
        for line in path.read_bytes().decode("utf-8").splitlines():
            out.append(json.loads(line))
    return out


def make_sink(tmp_path: Path, schema: SchemaHistory, **kw) -> FileSink:
    return FileSink(FileSinkConfig(dir=str(tmp_path / "out"), **kw), schema, source_name="mariadb1")


async def write(sink: FileSink, batches: list[list[Txn]], checkpoint: Checkpoint | None = None,
                close: bool = True) -> SinkCheckpoint:
    await sink.open(checkpoint or Checkpoint(commit_ts=0))
    for batch in batches:
        await sink.apply(batch)
    await sink.flush()
    cp = sink.checkpoint()
    if close:
        await sink.close()
    return cp


# ---------------------------------------------------------------------------------------------


def test_row_event_envelope_for_c_u_d(tmp_path: Path):
    cts = tsmod.compose(1_700_000_000_000, 5)
    t = txn(cts,
            orders(insert(order(1)),
                   pb.RowChange(tp=pb.UPDATE, before=order(1), after=order(1, "10.50", "paid"))),
            items(insert(item("a"))),
            orders(pb.RowChange(tp=pb.DELETE, before=order(1, None, "paid"))),
            source=pb.SourceInfo(name="", gtid="0-3-77", file="bin.000001", pos=4, server_id=3,
                                 ts_ms=1_700_000_000_123))
    asyncio.run(write(make_sink(tmp_path, history()), [[t]]))
    recs = read_records(tmp_path / "out")
    assert [r.get("status") or r["op"] for r in recs] == ["BEGIN", "c", "u", "c", "d", "END"]

    assert recs[0] == {"status": "BEGIN", "id": "0-3-77", "ts_ms": 1_700_000_000_123, "event_count": None,
                       "data_collections": None, "commit_ts": cts}
    create = recs[1]
    assert list(create) == ["before", "after", "source", "op", "ts_ms", "transaction"]
    assert create["before"] is None
    assert create["after"] == {"id": 1, "price": "9.99", "state": "new"}  # hidden column left out
    assert create["source"] == {
        "version": "sluice-0.1", "connector": "sluice", "name": "mariadb1", "ts_ms": 1_700_000_000_123,
        "snapshot": "false", "db": "shop", "table": "orders", "commit_ts": cts, "gtid": "0-3-77",
        "file": "bin.000001", "pos": 4, "server_id": 3, "row": 0}
    assert create["op"] == "c" and isinstance(create["ts_ms"], int)
    assert create["transaction"] == {"id": "0-3-77", "total_order": 1, "data_collection_order": 1}

    update = recs[2]
    assert update["before"] == {"id": 1, "price": "9.99", "state": "new"}
    assert update["after"] == {"id": 1, "price": "10.50", "state": "paid"}
    assert update["transaction"] == {"id": "0-3-77", "total_order": 2, "data_collection_order": 2}
    assert recs[3]["after"] == {"sku": "a", "at": "2024-01-02T03:00:00.000000Z"}
    assert recs[3]["source"]["table"] == "items" and recs[3]["source"]["row"] == 2
    assert recs[3]["transaction"] == {"id": "0-3-77", "total_order": 3, "data_collection_order": 1}
    delete = recs[4]
    assert delete["before"] == {"id": 1, "price": None, "state": "paid"} and delete["after"] is None
    assert delete["transaction"] == {"id": "0-3-77", "total_order": 4, "data_collection_order": 3}

    assert recs[5] == {"status": "END", "id": "0-3-77", "ts_ms": 1_700_000_000_123, "event_count": 4,
                       "data_collections": [{"data_collection": "shop.orders", "event_count": 3},
                                            {"data_collection": "shop.items", "event_count": 1}],
                       "commit_ts": cts}


def test_snapshot_reads_are_op_r_and_the_final_row_is_last(tmp_path: Path):
    chunk1 = txn(100, orders(pb.RowChange(tp=pb.READ, after=order(1))), snapshot_chunk=True,
                 snapshot=pb.SnapshotProgress(snapshot_id="s", finished=False))
    chunk2 = txn(101, orders(pb.RowChange(tp=pb.READ, after=order(2)),
                             pb.RowChange(tp=pb.READ, after=order(3))), snapshot_chunk=True,
                 snapshot=pb.SnapshotProgress(snapshot_id="s", finished=True))
    asyncio.run(write(make_sink(tmp_path, history()), [[chunk1, chunk2]]))
    rows = [r for r in read_records(tmp_path / "out") if "op" in r]
    assert [(r["op"], r["source"]["snapshot"]) for r in rows] == [("r", "true"), ("r", "true"), ("r", "last")]
    assert [r["after"]["id"] for r in rows] == [1, 2, 3]
    # No GTID: the transaction id is the start_ts.
    assert rows[0]["transaction"]["id"] == "99" and rows[1]["transaction"]["id"] == "100"
    assert rows[0]["before"] is None


def test_ddl_becomes_a_schema_change_record(tmp_path: Path):
    h = history()
    orders2 = pb.TableInfo()
    orders2.CopyFrom(ORDERS)
    orders2.version = 2
    ddls = [
        txn(200, ddl=pb.DDL(tp=pb.CREATE_TABLE, schema_name="shop", table_name="orders", table_id=10,
                            query="CREATE TABLE orders (...)", table_info=ORDERS)),
        txn(201, ddl=pb.DDL(tp=pb.ALTER_TABLE, schema_name="shop", table_name="orders", table_id=10,
                            query="ALTER TABLE orders DROP gone", table_info=orders2)),
        txn(202, ddl=pb.DDL(tp=pb.RENAME_TABLE, schema_name="shop", table_name="orders2", table_id=10,
                            old_schema_name="shop", old_table_name="orders",
                            query="RENAME TABLE orders TO orders2", table_info=orders2)),
        txn(203, ddl=pb.DDL(tp=pb.DROP_TABLE, schema_name="shop", table_name="orders2", table_id=10,
                            query="DROP TABLE orders2")),
        txn(204, ddl=pb.DDL(tp=pb.CREATE_DATABASE, schema_name="crm", query="CREATE DATABASE crm")),
    ]
    for t in ddls:  # the drainer records schema effects before the sink sees the batch
        h.apply(t)
    asyncio.run(write(make_sink(tmp_path, h), [ddls]))
    recs = read_records(tmp_path / "out")
    assert len(recs) == 5  # no BEGIN/END around a DDL
    create = recs[0]
    assert list(create) == ["source", "databaseName", "ddl", "tableChanges"]
    assert create["source"]["db"] == "shop" and create["source"]["table"] == "orders"
    assert create["source"]["commit_ts"] == 200 and create["source"]["snapshot"] == "false"
    assert create["databaseName"] == "shop" and create["ddl"] == "CREATE TABLE orders (...)"
    assert create["tableChanges"] == [{
        "type": "CREATE", "id": '"shop"."orders"',
        "table": {"primaryKeyColumnNames": ["id"], "columns": [
            {"name": "id", "typeName": "BIGINT", "typeExpression": "bigint(20)", "length": None,
             "scale": None, "optional": False, "position": 1, "enumValues": None},
            {"name": "price", "typeName": "DECIMAL", "typeExpression": "decimal(10,2)", "length": 10,
             "scale": 2, "optional": True, "position": 2, "enumValues": None},
            {"name": "state", "typeName": "ENUM", "typeExpression": "enum('new','paid')", "length": None,
             "scale": None, "optional": False, "position": 3, "enumValues": ["new", "paid"]},
        ]}}]
    assert recs[1]["tableChanges"][0]["type"] == "ALTER"
    rename = recs[2]["tableChanges"][0]
    assert (rename["type"], rename["id"], rename["previousId"]) == (
        "RENAME", '"shop"."orders2"', '"shop"."orders"')
    assert recs[3]["tableChanges"] == [{"type": "DROP", "id": '"shop"."orders2"', "table": None}]
    assert recs[4]["tableChanges"] == [] and recs[4]["ddl"] == "CREATE DATABASE crm"
    assert recs[4]["source"]["table"] is None


def test_transaction_metadata_counts_and_orders(tmp_path: Path):
    batch = [txn(300 + k, *[orders(insert(order(k * 10 + j))) for j in range(k + 1)],
                 items(*[insert(item(f"{k}-{j}")) for j in range(2)])) for k in range(3)]
    asyncio.run(write(make_sink(tmp_path, history()), [batch[:1], batch[1:]]))
    recs = read_records(tmp_path / "out")
    for k in range(3):
        txid = str(299 + k)
        mine = [r for r in recs if r.get("id") == txid or r.get("transaction", {}).get("id") == txid]
        begin, events, end = mine[0], mine[1:-1], mine[-1]
        assert (begin["status"], end["status"]) == ("BEGIN", "END")
        assert [e["transaction"]["total_order"] for e in events] == list(range(1, k + 4))
        per_table: dict[str, list[int]] = {}
        for e in events:
            per_table.setdefault(e["source"]["table"], []).append(e["transaction"]["data_collection_order"])
        assert per_table == {"orders": list(range(1, k + 2)), "items": [1, 2]}
        assert end["event_count"] == len(events) == k + 3
        assert end["data_collections"] == [{"data_collection": "shop.orders", "event_count": k + 1},
                                           {"data_collection": "shop.items", "event_count": 2}]


def test_rotation_by_size_never_splits_a_transaction(tmp_path: Path):
    batch = [txn(400 + k, orders(*[insert(order(k * 100 + j)) for j in range(5)])) for k in range(12)]
    limit = 6000  # three ~1.7 KB transactions per file
    cp = asyncio.run(write(make_sink(tmp_path, history(), max_file_size=limit), [batch[:5], batch[5:]]))
    files = list_files(tmp_path / "out")
    assert len(files) > 2
    assert [n for n, _ in files] == list(range(1, len(files) + 1))
    assert files[0][1].name == "binlog-000001.jsonl"
    for _, path in files:
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        assert lines[0]["status"] == "BEGIN" and lines[-1]["status"] == "END"
        assert path.stat().st_size <= limit
    assert cp == SinkCheckpoint(411, {"file": files[-1][1].name, "offset": files[-1][1].stat().st_size})


def test_each_transaction_appears_exactly_once_after_a_crash(tmp_path: Path):
    """Each transaction appears exactly once in the files after a crash."""
    all_txns = [txn(500 + k, orders(*[insert(order(k * 10 + j)) for j in range(4)])) for k in range(20)]

    async def scenario() -> None:
        # ~1.7 KB per transaction: three per file, so the checkpoint lands in the middle of one.
        first = make_sink(tmp_path, history(), max_file_size=6000)
        await first.open(Checkpoint(commit_ts=0))
        await first.apply(all_txns[:5])
        await first.flush()
        saved = first.checkpoint()  # what the drainer persists
        assert saved.commit_ts == 504
        # Work past the checkpoint reaches the disk (with rotation), then a torn tail, then kill -9.
        await first.apply(all_txns[5:14])
        await first.flush()
        await first.apply(all_txns[14:16])
        assert first.checkpoint().commit_ts == 513  # applied but unflushed work is not durable
        last = list_files(tmp_path / "out")[-1][1]
        with open(last, "ab") as f:
            f.write(b'{"before":null,"aft')
        # Whatever the dying process still buffered lands after the torn line: more junk.
        first._file.close()
        cp_file = tmp_path / "out" / saved.sink_state["file"]
        assert cp_file.stat().st_size > saved.sink_state["offset"]
        assert list_files(tmp_path / "out")[-1][1] != cp_file

        second = make_sink(tmp_path, history(), max_file_size=6000)
        resume = Checkpoint(commit_ts=saved.commit_ts, sink_state=saved.sink_state)
        await second.open(resume)
        assert second.checkpoint() == saved
        assert list_files(tmp_path / "out")[-1][1] == cp_file
        assert cp_file.stat().st_size == saved.sink_state["offset"]
        # The drainer resumes strictly after the inclusive checkpoint.
        await second.apply([t for t in all_txns if t.commit_ts > resume.commit_ts])
        await second.flush()
        await second.close()

    asyncio.run(scenario())
    recs = read_records(tmp_path / "out")  # every line parses: the torn tail is gone
    begins = [r["commit_ts"] for r in recs if r.get("status") == "BEGIN"]
    assert begins == [t.commit_ts for t in all_txns]
    ids = [r["after"]["id"] for r in recs if r.get("op") == "c"]
    assert ids == [k * 10 + j for k in range(20) for j in range(4)]


def test_checkpoints_are_inclusive(tmp_path: Path):
    """Checkpoints are inclusive: everything with commit_ts <= checkpoint is applied; the drainer
    resumes strictly after it."""
    async def scenario() -> None:
        sink = make_sink(tmp_path, history())
        await sink.open(Checkpoint(commit_ts=41))
        assert sink.checkpoint().commit_ts == 41
        await sink.apply([txn(42, orders(insert(order(1)))), txn(43, orders(insert(order(2))))])
        assert sink.checkpoint().commit_ts == 41
        await sink.flush()
        cp = sink.checkpoint()
        assert cp.commit_ts == 43
        # commit_ts 43 itself is on disk, at or before the checkpointed offset.
        path = tmp_path / "out" / cp.sink_state["file"]
        durable = path.read_bytes()[:cp.sink_state["offset"]].decode().splitlines()
        assert json.loads(durable[-1]) == {**json.loads(durable[-1]), "status": "END", "commit_ts": 43}
        await sink.close()

    asyncio.run(scenario())


def test_reopen_without_sink_state_keeps_existing_files(tmp_path: Path):
    asyncio.run(write(make_sink(tmp_path, history()), [[txn(600, orders(insert(order(1))))]]))
    before = (tmp_path / "out" / "binlog-000001.jsonl").read_bytes()
    cp = asyncio.run(write(make_sink(tmp_path, history()), [[txn(601, orders(insert(order(2))))]]))
    assert cp.sink_state["file"] == "binlog-000002.jsonl"
    assert (tmp_path / "out" / "binlog-000001.jsonl").read_bytes() == before


def test_a_checkpoint_beyond_the_file_is_data_loss(tmp_path: Path):
    sink = make_sink(tmp_path, history())
    cp = Checkpoint(commit_ts=9, sink_state={"file": "binlog-000003.jsonl", "offset": 100})
    with pytest.raises(CorruptRecord, match=r"binlog-000003\.jsonl at offset 100.*missing"):
        asyncio.run(sink.open(cp))
    with pytest.raises(InvalidArgument, match="bad checkpoint sink_state"):
        asyncio.run(make_sink(tmp_path, history()).open(
            Checkpoint(commit_ts=9, sink_state={"file": "../etc/passwd", "offset": 0})))


def test_missing_schema_fails_the_batch_without_touching_the_file(tmp_path: Path):
    async def scenario() -> None:
        sink = make_sink(tmp_path, SchemaHistory())
        await sink.open(Checkpoint(commit_ts=0))
        with pytest.raises(Exception, match="no schema for table id 10"):
            await sink.apply([txn(700, orders(insert(order(1))))])
        await sink.flush()  # still usable: nothing was written
        assert sink.checkpoint() == SinkCheckpoint(0, {"file": "binlog-000001.jsonl", "offset": 0})
        await sink.close()

    asyncio.run(scenario())


def test_checkpoint_json_round_trip():
    cp = Checkpoint(commit_ts=123, positions={"cap-1": "3:120:0"}, sink_state={"file": "f", "offset": 9},
                    schema=b"\x00\x01bin", dispatched_upper=456)
    assert Checkpoint.from_json(cp.to_json()) == cp
    assert Checkpoint.from_json(Checkpoint(commit_ts=1).to_json()) == Checkpoint(commit_ts=1)
    with pytest.raises(InvalidArgument, match="unreadable drainer checkpoint"):
        Checkpoint.from_json('{"positions": {}}')


def test_load_sink_by_name(tmp_path: Path):
    sink = load_sink("file", {"dir": str(tmp_path), "max-file-size": 4096, "fsync": False},
                     schema=SchemaHistory(), source_name="db1", epoch=3)
    assert isinstance(sink, FileSink)
    with pytest.raises(ConfigError, match="unknown sink 'kafka'"):
        load_sink("kafka", {})
    with pytest.raises(ConfigError, match="did you mean 'max-file-size'"):
        load_sink("file", {"dir": "x", "max-file-sise": 1}, schema=SchemaHistory())
    with pytest.raises(ConfigError, match="max-file-size must be positive"):
        load_sink("file", {"dir": "x", "max-file-size": 0}, schema=SchemaHistory())
