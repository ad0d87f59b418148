"""Transaction envelopes on the read path (PullBinlogsResp.txns) and the schema preamble through a
real drainer: real etcd, TSO, pump and drainer processes.

- A pump describes every binlog of a response by its transaction's envelope (the COMMIT's
  envelope plus a binlog count), or — for a response holding a piece of a split huge
  transaction — by none; the drainer merges, dedupes and filters positions from the envelopes.
- A drainer started long after a table's schema was written, and after GC passed it, still
  decodes that table's new rows (the pump's schema preamble).
"""
from __future__ import annotations

import dataclasses

import grpc
import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, NodeStatus, Registry
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS, commit, prewrite, pv
from tests.support.cluster import CLUSTER_ID, Cluster, read_file_sink, table_info
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(180)

PRODUCER = "capture-1"


def schema_value(info: pb.TableInfo) -> bytes:
    return pb.PrewriteValue(schema_snapshots=[info]).SerializeToString()


def row_value(info: pb.TableInfo, i: int, v: str) -> bytes:
    return pb.PrewriteValue(mutations=[pb.TableMutation(
        table_id=info.table_id, schema_name=info.schema_name, table_name=info.table_name,
        table_version=info.version, changes=[pb.RowChange(tp=pb.INSERT, after=pb.Row(
            columns=[pb.Datum(int=i), pb.Datum(str=v)]))])]).SerializeToString()


class Writer:
    """Whole transactions to one pump, like a capture: prewrite, then commit with a position."""

    def __init__(self, cluster: Cluster, pump: str) -> None:
        cluster.register_producer(PRODUCER)
        self.ts = TS(cluster.tso_addrs, CLUSTER_ID)
        self.ch, self.stub = cluster.pumps[pump].stub()

    def write(self, *payloads: bytes) -> int:
        return self.stub.WriteBinlogs(pb.WriteBinlogsReq(
            cluster_id=CLUSTER_ID, payloads=list(payloads)), timeout=30).served_watermark

    def txn(self, value: bytes, offset: int | None = None) -> int:
        s = self.ts.get()
        self.write(prewrite(s, value, producer=PRODUCER))
        c = self.ts.get()
        pos = pb.Position(file_seq=1, offset=offset) if offset is not None else None
        self.write(commit(s, c, producer=PRODUCER, position=pos))
        return c

    def close(self) -> None:
        self.ch.close()
        self.ts.close()


def test_every_response_binlog_is_described_by_its_transaction_envelope(cluster: Cluster
                                                                         ) -> None:
    """A pump describes every binlog of a response by its transaction's envelope (the COMMIT's
    envelope plus a binlog count), or — for a response holding a piece of a split huge
    transaction — by none."""
    cluster.start_pump()
    w = Writer(cluster, "pump-1")
    info = table_info(7, "shop", "items")
    after = w.ts.get()
    w.txn(schema_value(info), offset=100)
    for i in range(20):
        w.txn(row_value(info, i, f"v{i}"), offset=200 + i)
    mid = w.txn(row_value(info, 20, "last small one"), offset=300)
    wait_until(lambda: w.write() >= mid, 10, what="the pump to serve the small transactions")
    described, undescribed, seen = pull_checked(w, after, mid)
    assert undescribed == set() and described == 2 * 22
    assert seen == sorted(seen) and seen[-1] == mid

    # A 3 MiB transaction in two parts: more than one 2 MiB response, so it is split.
    s = w.ts.get()
    raw = pv("b" * (3 << 20))
    half = len(raw) // 2
    for part, chunk in enumerate((raw[:half], raw[half:])):
        w.write(pb.Binlog(tp=pb.PREWRITE, start_ts=s, producer_id=PRODUCER, part_no=part,
                          part_count=2, prewrite_value=chunk).SerializeToString())
    big = w.ts.get()
    w.write(commit(s, big, producer=PRODUCER))
    last = w.txn(row_value(info, 99, "after the big one"), offset=900)
    wait_until(lambda: w.write() >= last, 10, what="the pump to serve the last commit")
    described, undescribed, seen = pull_checked(w, mid, last)
    assert s in undescribed, "responses holding pieces of a split transaction have no envelopes"
    assert big not in seen
    w.close()


def pull_checked(w: Writer, after: int, upto: int) -> tuple[int, set[int], list[int]]:
    """(binlogs described by envelopes, start_ts of undescribed binlogs, commit_ts described)
    of PullBinlogs(after) up to watermark `upto`, each envelope checked against its binlogs."""
    described = 0
    undescribed: set[int] = set()
    seen: list[int] = []
    stream = w.stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=after),
                                timeout=30)
    for resp in stream:
        binlogs = [pb.Binlog.FromString(b) for b in resp.binlogs]
        if not resp.txns:
            undescribed.update(b.start_ts for b in binlogs if b.tp != pb.FAKE)
        else:
            assert sum(m.binlog_count for m in resp.txns) == len(binlogs)
            i = 0
            for m in resp.txns:
                txn = binlogs[i:i + m.binlog_count]
                i += m.binlog_count
                end = txn[-1]
                assert (m.tp, m.start_ts, m.commit_ts, m.producer_id) == \
                    (end.tp, end.start_ts, end.commit_ts, end.producer_id)
                assert m.position == (end.position.SerializeToString()
                                      if end.HasField("position") else b"")
                assert all(b.start_ts == m.start_ts for b in txn)
                if m.tp == pb.COMMIT:
                    assert [b.tp for b in txn] == [pb.PREWRITE] * (len(txn) - 1) + [pb.COMMIT]
                    seen.append(m.commit_ts)
                    described += len(txn)
        if resp.watermark >= upto:
            break
    stream.cancel()
    return described, undescribed, seen


def test_drainer_filters_positions_and_drops_copies_from_envelopes(cluster: Cluster) -> None:
    """Through a real drainer reading envelopes: a transaction at or below its producer's last
    applied position is dropped, a replica copy (same start_ts, same commit_ts) is applied
    once, and rows arrive decoded with their column names."""
    for p in ("pump-1", "pump-2"):
        cluster.start_pump(p)
    w1, w2 = Writer(cluster, "pump-1"), Writer(cluster, "pump-2")
    info = table_info(8, "shop", "carts")
    after = w1.ts.get()
    w1.txn(schema_value(info), offset=100)
    keep = w1.txn(row_value(info, 1, "one"), offset=200)
    replayed = w1.txn(row_value(info, 2, "replayed"), offset=150)   # behind: dropped
    # A replica: the same transaction on both pumps. The commit_ts is fetched after both
    # prewrite acks, as the protocol asks: fetched earlier, a pump's heartbeat can pass it.
    s = w1.ts.get()
    for w in (w1, w2):
        w.write(prewrite(s, row_value(info, 3, "copied"), producer=PRODUCER))
    c = w1.ts.get()
    for w in (w1, w2):
        w.write(commit(s, c, producer=PRODUCER, position=pb.Position(file_seq=1, offset=300)))
    d = cluster.start_drainer("drainer-meta", sink="file", **{"initial-commit-ts": after})

    def rows() -> list[tuple]:
        return [r for t in read_file_sink(d.out_dir) for r in t["rows"]]
    wait_until(lambda: len(rows()) >= 2, 60, what="the file sink to hold the rows")
    wait_until(lambda: any(t["commit_ts"] == c for t in read_file_sink(d.out_dir)), 30,
               what="the replicated transaction")
    assert rows() == [("shop.carts", "c", 1, "one"), ("shop.carts", "c", 3, "copied")]
    txns = read_file_sink(d.out_dir)
    assert keep in [t["commit_ts"] for t in txns] and replayed not in [t["commit_ts"] for t in txns]
    w1.close()
    w2.close()


def test_fresh_drainer_decodes_a_table_whose_schema_gc_passed_long_ago(cluster: Cluster,
                                                                      etcd) -> None:  # type: ignore[no-untyped-def]
    """A drainer with the file sink, started at a recent initial-commit-ts after GC removed
    everything around a table's schema, still decodes new rows of that table: values with
    column names (the pump's schema preamble)."""
    cluster.start_pump(**{"storage.segment-size": 8192, "gc-interval": 0.3,
                                 "gc-retention": 0.0})
    w = Writer(cluster, "pump-1")
    client = Etcd(etcd.endpoint)
    reg = Registry(client, CLUSTER_ID)
    # An old drainer whose durable checkpoint is all that holds GC back.
    reg.register(NodeStatus(node_id="old-drainer", kind=NodeKind.DRAINER,
                            addr="127.0.0.1:1", state=NodeState.ONLINE, checkpoint=1))
    info = table_info(42, "shop", "orders")
    schema_commit = w.txn(schema_value(info))
    other = table_info(43, "shop", "noise")
    w.txn(schema_value(other))
    for i in range(60):     # about 40 KiB: several segments after the schema's
        w.txn(row_value(other, i, "n" * 500))
    checkpoint = w.ts.get()
    wait_until(lambda: w.write() >= checkpoint, 10, what="watermark past the checkpoint")
    status = lambda: w.stub.Status(pb.PumpStatusReq(cluster_id=CLUSTER_ID), timeout=5)  # noqa: E731
    assert status().gc_ts < schema_commit
    reg.update(NodeKind.DRAINER, "old-drainer",
               lambda st: dataclasses.replace(st, checkpoint=checkpoint))
    wait_until(lambda: status().gc_ts >= checkpoint, 30, what="GC up to the old checkpoint")
    with pytest.raises(grpc.RpcError) as e:   # nothing at or after the schema is readable
        next(iter(w.stub.PullBinlogs(pb.PullBinlogsReq(
            cluster_id=CLUSTER_ID, after_commit_ts=schema_commit), timeout=10)))
    assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE

    d = cluster.start_drainer("drainer-fresh", sink="file", **{"initial-commit-ts": checkpoint})
    first = w.txn(row_value(info, 1, "alpha"))
    w.txn(row_value(info, 2, "beta"))
    wait_until(lambda: len(read_file_sink(d.out_dir)) >= 2, 60,
               what="the fresh drainer to write the new rows")
    txns = read_file_sink(d.out_dir)
    assert txns[0]["commit_ts"] == first
    assert [r for t in txns for r in t["rows"]] == [("shop.orders", "c", 1, "alpha"),
                                                    ("shop.orders", "c", 2, "beta")]
    assert "MissingSchema" not in d.proc.log_text()
    w.close()
    client.close()
