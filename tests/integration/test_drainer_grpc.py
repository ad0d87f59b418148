"""The grpc sink: the drainer serves the merged stream (Drainer.PullBinlogs) to consumers, and
its checkpoint is what every registered consumer acknowledged (Drainer.Ack)."""
from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, Registry
from sluice.drainer.checkpoint import read_checkpoint
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from tests.support.binlogs import TS
from tests.support.cluster import (CLUSTER_ID, Cluster, TxnWriter, commits_in_order, drainer_pull,
                                   table_info)
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path_factory.mktemp("drainer-grpc"), etcd_module.endpoint)
    try:
        c.start_tso()
        for p in ("pump-1", "pump-2"):
            c.start_pump(p)
        yield c
    finally:
        c.stop()


def ack(addr: str, commit_ts: int, consumer: str = "c1") -> None:
    with grpc.insecure_channel(addr) as ch:
        pbg.DrainerStub(ch).Ack(pb.AckReq(cluster_id=CLUSTER_ID, consumer_id=consumer,
                                          commit_ts=commit_ts), timeout=5)


def test_grpc_sink_serves_the_merged_stream_and_checkpoints_at_the_lowest_ack(cluster: Cluster) -> None:
    """The grpc sink's checkpoint is the lowest commit_ts every registered consumer acknowledged:
    it does not move without an Ack, follows the Ack, survives a drainer restart (the consumer
    resumes from its ack), and a pull from before it is still served while the pumps hold it."""
    etcd = Etcd(cluster.etcd)
    reg = Registry(etcd, CLUSTER_ID)
    t = TS(cluster.tso_addrs, CLUSTER_ID)
    t0 = t.get()
    t.close()
    w = TxnWriter(cluster, [table_info(5, "g", "t")], seed=21)
    d = cluster.start_drainer("d-grpc", sink="grpc", **{"initial-commit-ts": t0,
                                                       "to.consumers": ["c1"]})
    w.declare("pump-1")
    w.write(600, ["pump-1", "pump-2"], group=200)
    want = sorted(a.commit_ts for a in w.acked)
    got = commits_in_order(drainer_pull(d.addr, t0, set(want)))
    assert got == want                       # merged: commit order, each once
    # No acknowledgement yet: the checkpoint stays at the start (pumps keep everything).
    wait_until(lambda: read_checkpoint(reg, "d-grpc") is not None, 5)
    assert read_checkpoint(reg, "d-grpc").commit_ts == t0
    mid = want[len(want) // 2]
    ack(d.addr, mid)
    wait_until(lambda: read_checkpoint(reg, "d-grpc").commit_ts == mid, 5, what="checkpoint = ack")
    # The status mirror is a second put after the checkpoint key (drainer/checkpoint.py).
    wait_until(lambda: reg.get(NodeKind.DRAINER, "d-grpc").status.checkpoint == mid, 5,
               what="status checkpoint = ack")
    # The buffer now holds only > mid; the pumps still hold it all: replayed, then the buffer.
    assert commits_in_order(drainer_pull(d.addr, t0, set(want), consumer="")) == want
    # Restart: the drainer resumes from the acknowledged point; the consumer gets the rest.
    d.proc.stop()
    assert d.proc.popen.returncode == 0
    w.write(100, ["pump-1", "pump-2"], group=100)
    d = cluster.start_drainer("d-grpc", sink="grpc")
    want = sorted(a.commit_ts for a in w.acked)
    rest = commits_in_order(drainer_pull(d.addr, mid, {c for c in want if c > mid}))
    assert rest == [c for c in want if c > mid]
    reg.set_state(NodeKind.DRAINER, "d-grpc", NodeState.CLOSING)
    wait_until(lambda: not d.proc.alive(), 10)
    w.close()
    etcd.close()


def test_grpc_sink_replays_below_its_buffer_and_is_out_of_range_only_after_pump_gc(
        tmp_path, etcd) -> None:  # type: ignore[no-untyped-def]
    """A pull from an after_commit_ts below the grpc sink's buffer is served whenever the pumps
    still hold it (re-read through a private merge, then the buffer); it is OUT_OF_RANGE only
    when a pump no longer holds it (GC), with the pump's reason."""
    c = Cluster(tmp_path, etcd.endpoint)
    try:
        c.start_tso()
        c.start_pump("pump-1", **{"storage.segment-size": 8192, "gc-interval": 0.3,
                                  "gc-retention": 0.0})
        c.start_pump("pump-2")
        t = TS(c.tso_addrs, CLUSTER_ID)
        t0 = t.get()
        t.close()
        w = TxnWriter(c, [table_info(6, "g", "r")], seed=5)
        d = c.start_drainer("d-replay", sink="grpc", **{"initial-commit-ts": t0,
                                                        "to.consumers": ["c1"]})
        w.declare("pump-1")
        w.write(400, ["pump-1", "pump-2"], group=50)
        want = sorted(a.commit_ts for a in w.acked)
        assert commits_in_order(drainer_pull(d.addr, t0, set(want))) == want
        q3 = want[3 * len(want) // 4]
        ack(d.addr, q3)
        # Replay: the buffer holds > q3 only; both pumps still hold everything after t0.
        assert commits_in_order(drainer_pull(d.addr, t0, set(want), consumer="")) == want
        # GC on pump-1 follows the drainer's checkpoint (q3): then t0 is gone from it.
        ch, stub = c.pumps["pump-1"].stub()
        status = lambda: stub.Status(pb.PumpStatusReq(cluster_id=CLUSTER_ID), timeout=5)  # noqa: E731
        wait_until(lambda: status().gc_ts > t0, 30, what="pump-1 GC past t0")
        gc_ts = status().gc_ts
        ch.close()
        with pytest.raises(grpc.RpcError) as e:
            drainer_pull(d.addr, t0, set(want), consumer="")
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "pump-1" in e.value.details() and "garbage-collected" in e.value.details()
        # From the GC ts on it is still there: replayed up to the buffer, then the buffer.
        rest = [x for x in want if x > gc_ts]
        assert commits_in_order(drainer_pull(d.addr, gc_ts, set(rest), consumer="")) == rest
        w.close()
    finally:
        c.stop()
