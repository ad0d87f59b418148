"""A 200 MiB transaction through a pump process, killed -9 in the middle of writing it."""
from __future__ import annotations

import functools
import struct
import threading
from pathlib import Path

import psutil
import pytest

from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS, commit, decode, prewrite
from tests.support.cluster import CLUSTER_ID, Cluster

pytestmark = pytest.mark.timeout(150)

PART = 4 << 20
PARTS = 50          # 200 MiB
KILL_AFTER = 20     # parts acknowledged before the kill


class RSSWatch:
    """Samples a process's RSS in a thread; `peak` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.NoSuchProcess:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak - self.base


@functools.cache
def big_value() -> bytes:
    """A ~200 MiB serialized PrewriteValue (pumps check that the joined parts decode): one
    table mutation of 4 KiB rows, each row tagged with its number."""
    rows = PART * PARTS // 4100
    value = pb.PrewriteValue(schema_version=1, mutations=[pb.TableMutation(table_id=1, changes=[
        pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[
            pb.Datum(bytes=struct.pack(">I", r) * 1000)])) for r in range(rows)])])
    return value.SerializeToString()


def part_value(i: int) -> bytes:
    value = big_value()
    cut = -(-len(value) // PARTS)
    return value[i * cut:(i + 1) * cut]


def test_200mib_multipart_transaction_survives_kill9_with_bounded_memory(tmp_path: Path, etcd) -> None:  # type: ignore[no-untyped-def]
    """A 200 MiB transaction as multi-part prewrite round-trips through the pump, also across a
    kill -9 during its write, and the pump's memory stays bounded (RSS well below the txn)."""
    cluster = Cluster(tmp_path, etcd.endpoint)
    try:
        cluster.start_tso()
        pump = cluster.start_pump(**{"storage.segment-size": 64 << 20})
        ts = TS(cluster.tso_addrs, CLUSTER_ID)
        s = ts.get()

        def send(stub, i: int) -> None:  # type: ignore[no-untyped-def]
            stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=CLUSTER_ID, payloads=[
                prewrite(s, part_value(i), part_no=i, part_count=PARTS)]), timeout=30)

        ch, stub = pump.stub()
        watch = RSSWatch(pump.proc.pid)
        for i in range(KILL_AFTER):
            send(stub, i)
        grew_before_kill = watch.stop()
        pump.proc.kill9()
        ch.close()

        pump = cluster.start_pump(pump.node_id)
        ch, stub = pump.stub()
        watch = RSSWatch(pump.proc.pid)
        status = stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=s))
        assert status.state == pb.TXN_UNKNOWN, "the acknowledged parts survived the kill"
        for i in range(PARTS):   # the producer retries from part 0: stored parts are no-ops
            send(stub, i)
        c = ts.get()
        stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=CLUSTER_ID, payloads=[commit(s, c)]),
                          timeout=30)
        parts_seen = 0
        stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID), timeout=60)
        done = False
        for resp in stream:
            for raw in resp.binlogs:
                b = decode(raw)
                if b.tp == pb.PREWRITE:
                    assert b.part_no == parts_seen and b.start_ts == s
                    v = b.prewrite_value
                    assert v == part_value(parts_seen)
                    parts_seen += 1
                elif b.tp == pb.COMMIT:
                    assert (b.start_ts, b.commit_ts, parts_seen) == (s, c, PARTS)
                    done = True
            if done:
                break
        stream.cancel()
        grew = watch.stop()
        assert done, "the commit was not served"
        for label, g in (("writing before the kill", grew_before_kill),
                         ("writing and pulling after it", grew)):
            assert g < 120 << 20, f"pump RSS grew by {g >> 20} MiB {label} (txn is 200 MiB)"
        ch.close()
        ts.close()
    finally:
        cluster.stop()
