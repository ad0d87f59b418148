"""PullBinlogs with_schema: a drainer resuming after GC still gets every table's schema."""
from __future__ import annotations

import dataclasses

import grpc
import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, NodeStatus, Registry
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS, commit, decode, prewrite
from tests.support.cluster import CLUSTER_ID, Cluster
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)


def ddl_value(table_id: int) -> bytes:
    return pb.PrewriteValue(ddl=pb.DDL(
        tp=pb.CREATE_TABLE, table_id=table_id, schema_name="shop", table_name="orders",
        query="CREATE TABLE orders (id INT PRIMARY KEY)",
        table_info=pb.TableInfo(table_id=table_id, schema_name="shop", table_name="orders",
                                version=1, columns=[pb.ColumnInfo(name="id")]))
    ).SerializeToString()


def row_value(table_id: int, i: int) -> bytes:
    return pb.PrewriteValue(mutations=[pb.TableMutation(
        table_id=table_id, schema_name="shop", table_name="orders", table_version=1,
        changes=[pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[pb.Datum(int=i),
                                                                   pb.Datum(str="r" * 500)]))])]
    ).SerializeToString()


def pull(stub, after: int, with_schema: bool, upto: int  # type: ignore[no-untyped-def]
         ) -> tuple[list[pb.Binlog], list[pb.Binlog]]:
    """(schema_only binlogs, data binlogs without fakes) until the watermark reaches upto."""
    schema, data = [], []
    stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=after,
                                                with_schema=with_schema), timeout=20)
    try:
        for resp in stream:
            binlogs = [decode(b) for b in resp.binlogs]
            if resp.schema_only:
                assert not data, "schema history comes before the stream"
                assert resp.watermark <= after
                schema += binlogs
            else:
                data += [b for b in binlogs if b.tp != pb.FAKE]
                if resp.watermark >= upto:
                    return schema, data
    finally:
        stream.cancel()
    raise AssertionError("stream ended")


def test_schema_preamble_survives_gc_of_the_segments_around_it(cluster: Cluster, etcd) -> None:  # type: ignore[no-untyped-def]
    """A drainer starting at a checkpoint >= gc_ts with with_schema gets the schemas even after
    GC deleted the segments around them; without with_schema it does not."""
    pump = cluster.start_pump(**{"storage.segment-size": 8192, "gc-interval": 0.3,
                                 "gc-retention": 0.0})
    ch, stub = pump.stub()
    ts = TS(cluster.tso_addrs, CLUSTER_ID)

    def write(*payloads: bytes) -> int:
        return stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=CLUSTER_ID,
                                                    payloads=list(payloads)),
                                 timeout=10).served_watermark
    client = Etcd(etcd.endpoint)
    reg = Registry(client, CLUSTER_ID)
    # A drainer whose durable checkpoint bounds GC (registered once the pump is online, so the
    # pump does not wait to notify it).
    reg.register(NodeStatus(node_id="drainer-1", kind=NodeKind.DRAINER, addr="127.0.0.1:1",
                            state=NodeState.ONLINE, checkpoint=1))
    a = ts.get()
    write(prewrite(a, ddl_value(42)))
    schema_commit = ts.get()
    write(commit(a, schema_commit))
    for i in range(60):    # about 40 KiB of rows: several segments after the schema one
        s = ts.get()
        write(prewrite(s, row_value(42, i)))
        write(commit(s, ts.get()))
    checkpoint = ts.get()
    wait_until(lambda: write() >= checkpoint, 10, what="watermark past the checkpoint")
    status = lambda: stub.Status(pb.PumpStatusReq(cluster_id=CLUSTER_ID), timeout=5)  # noqa: E731
    assert status().gc_ts < schema_commit, "the drainer's checkpoint holds GC back"
    reg.update(NodeKind.DRAINER, "drainer-1",
               lambda st: dataclasses.replace(st, checkpoint=checkpoint))
    wait_until(lambda: status().gc_ts >= checkpoint, 20, what="GC up to the drainer checkpoint")
    with pytest.raises(grpc.RpcError) as e:
        pull(stub, schema_commit, False, checkpoint)
    assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE, "the schema's neighbours are gone"
    s = ts.get()
    write(prewrite(s, row_value(42, 1000)))
    last = ts.get()
    write(commit(s, last))

    schema, data = pull(stub, checkpoint, True, last)
    assert [(b.tp, b.start_ts) for b in schema] == [(pb.PREWRITE, a), (pb.COMMIT, a)]
    assert schema[1].commit_ts == schema_commit
    ddl = pb.PrewriteValue.FromString(schema[0].prewrite_value).ddl
    assert (ddl.table_id, ddl.table_name) == (42, "orders")
    assert [(b.tp, b.start_ts) for b in data] == [(pb.PREWRITE, s), (pb.COMMIT, s)]

    schema, data = pull(stub, checkpoint, False, last)
    assert schema == [] and [(b.tp, b.start_ts) for b in data] == [(pb.PREWRITE, s),
                                                                   (pb.COMMIT, s)]
    ch.close()
    client.close()
    ts.close()
